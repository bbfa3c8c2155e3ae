//! An established rdmacm connection: its reliable-connection queue pair, posting sends,
//! receives, READs and memory-window binds, disconnecting, and the drop order that keeps
//! posted buffers alive until the QP is gone.

use std::mem;
use std::net::SocketAddr;
use std::ptr;
use std::time::{Duration, Instant};

use rdmx_sys as sys;

use crate::channel::{CmEvent, CmEventKind, RawId};
use crate::cm::QpConfig;
use crate::cq::{new_owner, AtomicOp, Owner, WorkKind, UNRECORDED};
use crate::device::Device;
use crate::memory::{RegisteredBuf, RemoteBuf};
use crate::window::MemoryWindow;
use crate::{Error, Result};

/// A connected reliable-connection QP with its rdmacm id.
///
/// Posting is thread-safe. Dropping it destroys the QP (the peer sees a disconnect), drops
/// the buffers of work still posted on it, then destroys the id.
pub struct Connection {
    pub(crate) raw: RawId,
    owner: Owner,
    config: QpConfig,
    qp_num: u32,
    max_inline: u32,
    peer_private_data: Vec<u8>,
}

impl Connection {
    pub(crate) fn with_qp(
        raw: RawId,
        config: &QpConfig,
        peer_private_data: Vec<u8>,
        call: &'static str,
    ) -> Result<Self> {
        config.check()?;
        if raw.context() != config.pd.device().context() {
            let on = Device::from_context(raw.context())
                .ok()
                .flatten()
                .map(|d| d.name())
                .unwrap_or_else(|| "?".into());
            return Err(Error::invalid(
                call,
                format!(
                    "the connection runs on device {on} but the PD is on {}",
                    config.pd.device().name()
                ),
            ));
        }
        let mut attr = sys::ibv_qp_init_attr {
            send_cq: config.cq.inner.cq,
            recv_cq: config.cq.inner.cq,
            srq: config.srq.as_ref().map_or(ptr::null_mut(), |s| s.inner.srq),
            qp_type: sys::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 1,
            ..Default::default()
        };
        attr.cap.max_send_wr = config.send_depth;
        attr.cap.max_recv_wr = if config.srq.is_some() {
            0
        } else {
            config.recv_depth
        };
        // (An inline send may gather its bytes from up to this many pieces.)
        attr.cap.max_send_sge = INLINE_PIECES as u32;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = config.max_inline;
        // SAFETY: the id is valid without a QP; the PD, CQ and SRQ are valid and on the id's
        // device (checked above), and the Connection keeps them alive longer than the QP.
        if unsafe { sys::rdma_create_qp(raw.id(), config.pd.inner.pd, &mut attr) } != 0 {
            return Err(Error::last_os(
                "rdma_create_qp",
                format!(
                    "cannot create a QP (send depth {}, inline {})",
                    config.send_depth, config.max_inline
                ),
            ));
        }
        // SAFETY: rdma_create_qp succeeded, so id->qp is a valid QP.
        let qp_num = unsafe { (*(*raw.id()).qp).qp_num };
        Ok(Connection {
            raw,
            owner: new_owner(),
            config: config.clone(),
            qp_num,
            max_inline: attr.cap.max_inline_data,
            peer_private_data,
        })
    }

    pub(crate) fn wait_established(
        mut self,
        timeout: Duration,
        call: &'static str,
        peer: &str,
    ) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(event) = self.raw.next_event(Some(deadline), call)? else {
                return Err(Error::new(
                    call,
                    libc::ETIMEDOUT,
                    format!("no connection with {peer} within {timeout:?}"),
                ));
            };
            if self.on_connect_event(event, call, peer)? {
                return Ok(self);
            }
        }
    }

    /// Takes one event of a connection being set up: true once it is established, false
    /// for an event that changes nothing; an error when it failed.
    pub(crate) fn on_connect_event(
        &mut self,
        event: CmEvent,
        call: &'static str,
        peer: &str,
    ) -> Result<bool> {
        match event.kind {
            CmEventKind::ESTABLISHED => {
                if !event.private_data.is_empty() {
                    self.peer_private_data = event.private_data;
                }
                log::debug!(
                    "connected with {peer} (qp {}; ACK timeout exponent and retry count \
                     in force: {:?})",
                    self.qp_num,
                    self.ack_timers()
                );
                Ok(true)
            }
            CmEventKind::REJECTED => {
                let why = match event.status {
                    8 => format!(
                        "nobody listens at {peer} (the peer's CM rejected an unknown service)"
                    ),
                    28 => format!("the application at {peer} rejected the connection"),
                    s => format!("{peer} rejected the connection (CM reject reason {s})"),
                };
                Err(Error::new(call, libc::ECONNREFUSED, why).with_reject_data(event.private_data))
            }
            CmEventKind::UNREACHABLE | CmEventKind::CONNECT_ERROR => Err(Error::new(
                call,
                if event.kind == CmEventKind::UNREACHABLE {
                    libc::EHOSTUNREACH
                } else {
                    libc::ECONNABORTED
                },
                format!(
                    "connection with {peer} failed: {} (status {})",
                    event.kind.name(),
                    event.status
                ),
            )),
            other => {
                log::debug!("while connecting with {peer}: ignoring {}", other.name());
                Ok(false)
            }
        }
    }

    /// What the connection was made with.
    pub(crate) fn config(&self) -> &QpConfig {
        &self.config
    }

    /// The QP number (completions carry it as [`crate::Completion::qp_num`]).
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Largest SEND that goes inline (copied at post time).
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// The private data the peer sent (its connect request, or its accept), zero-padded.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.raw.peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.raw.local_addr()
    }

    /// Names this connection by `token` (not 0) among those
    /// [`crate::EventChannel::take_ready`] reports as having events waiting.
    pub fn set_event_token(&self, token: u64) {
        self.raw.set_token(token);
    }

    /// The next rdmacm event of this connection (e.g. [`CmEventKind::DISCONNECTED`]), waiting
    /// up to `timeout` (`Some(Duration::ZERO)` to just check) on its event channel, which
    /// other connections share: only this connection's events are returned. `Ok(None)` on
    /// timeout.
    pub fn next_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        self.raw
            .next_event(timeout.map(|t| Instant::now() + t), "rdma_get_cm_event")
    }

    /// Disconnects: the QP goes to the error state, so posted work completes as flushed (its
    /// buffers come back through the CQ), and the peer gets a disconnect event.
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: the id is valid and connected (or already disconnected, which rdmacm reports
        // as an error that we pass on).
        if unsafe { sys::rdma_disconnect(self.raw.id()) } != 0 {
            return Err(Error::last_os(
                "rdma_disconnect",
                format!("cannot disconnect qp {}", self.qp_num),
            ));
        }
        Ok(())
    }

    /// The QP's ACK timeout exponent and retry count as the device holds them (rdma_cm sets
    /// them at RTS; a passive side's may come from the active side's request), or `None` if
    /// the device cannot say.
    pub(crate) fn ack_timers(&self) -> Option<(u8, u8)> {
        let mut attr = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        let mask =
            sys::ibv_qp_attr_mask::IBV_QP_TIMEOUT.0 | sys::ibv_qp_attr_mask::IBV_QP_RETRY_CNT.0;
        // SAFETY: the QP is valid while self lives; attr and init are valid structs the call
        // fills in.
        let ret = unsafe { sys::ibv_query_qp(self.qp(), &mut attr, mask as i32, &mut init) };
        (ret == 0).then_some((attr.timeout, attr.retry_cnt))
    }

    /// Moves the QP to the error state without any CM exchange (for [`crate::fault::silence`]).
    pub(crate) fn move_to_error(&self) -> Result<()> {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_ERR,
            ..Default::default()
        };
        // SAFETY: the QP is valid while self lives; attr is a valid attribute struct and the
        // mask names the one field set.
        let ret = unsafe {
            sys::ibv_modify_qp(
                self.qp(),
                &mut attr,
                sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
            )
        };
        if ret != 0 {
            return Err(Error::from_ret(
                "ibv_modify_qp",
                ret,
                format!("cannot move qp {} to the error state", self.qp_num),
            ));
        }
        Ok(())
    }

    fn qp(&self) -> *mut sys::ibv_qp {
        // SAFETY: the id is valid and its QP lives until drop.
        unsafe { (*self.raw.id()).qp }
    }

    /// Posts a send work request and records its buffer in the CQ's table (an inline SEND,
    /// which holds nothing once posted, is not recorded: see [`crate::cq`]).
    fn post(&self, work: SendWork<'_>, cookie: u64) -> Result<(), (Error, Option<RegisteredBuf>)> {
        let (opcode, len, inline, remote) = (work.opcode, work.len, work.inline, work.remote);
        let mut sges = [sys::ibv_sge::default(); INLINE_PIECES];
        let mut num_sge = 0;
        match (&work.buf, inline) {
            (Some(buf), _) => {
                sges[0] = buf.sge(len);
                num_sge = usize::from(len > 0);
            }
            (None, Some(pieces)) => {
                // (Empty pieces are left out: a zero-length entry says nothing.)
                for p in pieces.iter().filter(|p| !p.is_empty()) {
                    sges[num_sge] = sys::ibv_sge {
                        addr: p.as_ptr() as u64,
                        length: p.len() as u32,
                        lkey: 0,
                    };
                    num_sge += 1;
                }
            }
            (None, None) => {}
        }
        let mut flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if opcode == sys::ibv_wr_opcode::IBV_WR_SEND && (len as u64) <= u64::from(self.max_inline) {
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        let unrecorded = work.buf.is_none() && work.kind == WorkKind::Send;
        let wr_id = if unrecorded {
            cookie | UNRECORDED
        } else {
            self.config
                .cq
                .record(self.owner, work.kind, cookie, work.buf)
        };
        let mut wr = sys::ibv_send_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: sges.as_mut_ptr(),
            num_sge: num_sge as i32,
            opcode,
            send_flags: flags,
            ..Default::default()
        };
        match (remote, work.atomic) {
            (Some(remote), Some((compare_add, swap))) => {
                wr.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: remote.addr,
                    compare_add,
                    swap,
                    rkey: remote.rkey,
                };
            }
            (Some(remote), None) => {
                wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
            }
            _ => {}
        }
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is valid; wr and sges live across the call. The local memory is either
        // copied now (inline) or owned by the buffer now recorded in the CQ's table, where it
        // stays — untouched by anyone else and never freed — until its completion is polled or
        // the QP is destroyed.
        let ret = unsafe { sys::ibv_post_send(self.qp(), &mut wr, &mut bad) };
        if ret != 0 {
            let buf = if unrecorded {
                None
            } else {
                self.config.cq.unrecord(wr_id)
            };
            return Err((
                Error::from_ret(
                    work.call,
                    ret,
                    format!("cannot post on qp {} (send queue full?)", self.qp_num),
                ),
                buf,
            ));
        }
        Ok(())
    }

    /// Sets the QP's ACK timeout exponent (see [`QpConfig::ack_timeout`]) before the
    /// connection is made; `None` leaves rdma_cm's default.
    pub(crate) fn set_ack_timeout(&self, exponent: Option<u8>, call: &'static str) -> Result<()> {
        let Some(mut value) = exponent else {
            return Ok(());
        };
        // SAFETY: the id is valid; value lives across the call and its size is passed.
        let ret = unsafe {
            sys::rdma_set_option(
                self.raw.id(),
                sys::RDMA_OPTION_ID.0 as i32,
                sys::RDMA_OPTION_ID_ACK_TIMEOUT.0 as i32,
                (&mut value as *mut u8).cast(),
                std::mem::size_of::<u8>(),
            )
        };
        if ret != 0 {
            return Err(Error::last_os(
                call,
                format!(
                    "cannot set the ACK timeout (exponent {value}) on qp {}",
                    self.qp_num
                ),
            ));
        }
        Ok(())
    }

    /// Posts a liveness probe: a zero-length RDMA WRITE. It touches no memory on either side
    /// (a zero-length operation carries no address and the peer checks no key for it), but
    /// like any RC work it needs the peer's acknowledgement — from its NIC, not its
    /// application — so it completes with `IBV_WC_RETRY_EXC_ERR` when the peer is dead or
    /// unreachable (after [`QpConfig::retry_count`] tries of [`QpConfig::ack_timeout`]).
    /// Its completion has [`WorkKind::Write`] and no buffer.
    pub fn post_probe(&self, cookie: u64) -> Result<()> {
        let mut work = SendWork::new(
            "ibv_post_send",
            WorkKind::Write,
            sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            None,
            0,
        );
        work.remote = Some(RemoteBuf {
            addr: 0,
            len: 0,
            rkey: 0,
        });
        self.post(work, cookie).map_err(|(e, _)| e)
    }

    /// SENDs the first `len` bytes of `buf` (inline when `len` is at most
    /// [`Connection::max_inline`]). The completion hands the buffer back.
    pub fn post_send(
        &self,
        buf: RegisteredBuf,
        len: usize,
        cookie: u64,
    ) -> Result<(), (Error, RegisteredBuf)> {
        if len > buf.len() {
            let err = Error::invalid(
                "ibv_post_send",
                format!("send of {len} bytes from a {}-byte buffer", buf.len()),
            );
            return Err((err, buf));
        }
        let work = SendWork::new(
            "ibv_post_send",
            WorkKind::Send,
            sys::ibv_wr_opcode::IBV_WR_SEND,
            Some(buf),
            len,
        );
        self.post(work, cookie)
            .map_err(|(e, b)| (e, b.expect("the buffer comes back with the error")))
    }

    /// SENDs `data` inline: the bytes are copied into the work request, so no registered
    /// buffer is needed. `data` must be at most [`Connection::max_inline`] bytes, and `cookie`
    /// below 2^63.
    ///
    /// Nothing is recorded for it (it holds nothing once posted): its completion is made from
    /// its `wr_id` alone, so, unlike recorded work's, it is reported even if it surfaces after
    /// its QP was destroyed.
    pub fn post_send_inline(&self, data: &[u8], cookie: u64) -> Result<()> {
        self.post_send_inline_gather(&[data], cookie)
    }

    /// [`Connection::post_send_inline`] of the bytes of `pieces` one after the other (at
    /// most [`INLINE_PIECES`] of them, e.g. a header and its payload), gathered from where
    /// they are as the work request is made: no staging copy.
    pub fn post_send_inline_gather(&self, pieces: &[&[u8]], cookie: u64) -> Result<()> {
        if pieces.len() > INLINE_PIECES {
            return Err(Error::invalid(
                "ibv_post_send",
                format!(
                    "an inline send gathers at most {INLINE_PIECES} pieces (got {})",
                    pieces.len()
                ),
            ));
        }
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        if cookie & UNRECORDED != 0 {
            return Err(Error::invalid(
                "ibv_post_send",
                format!("an inline send's cookie must be below 2^63 (got {cookie:#x})"),
            ));
        }
        if len as u64 > u64::from(self.max_inline) {
            return Err(Error::invalid(
                "ibv_post_send",
                format!(
                    "{len} bytes do not fit inline (at most {} on qp {})",
                    self.max_inline, self.qp_num
                ),
            ));
        }
        let mut work = SendWork::new(
            "ibv_post_send",
            WorkKind::Send,
            sys::ibv_wr_opcode::IBV_WR_SEND,
            None,
            len,
        );
        work.inline = Some(pieces);
        self.post(work, cookie).map_err(|(e, _)| e)
    }

    /// RDMA READs `len` bytes of the peer's `remote` buffer into the start of `target`
    /// (registered with [`crate::Access::LOCAL_WRITE`]). The completion hands `target` back.
    pub fn post_read(
        &self,
        target: RegisteredBuf,
        len: usize,
        remote: RemoteBuf,
        cookie: u64,
    ) -> Result<(), (Error, RegisteredBuf)> {
        if !target.access().local_write {
            return Err((
                Error::invalid(
                    "ibv_post_send",
                    "an RDMA READ target needs Access::LOCAL_WRITE",
                ),
                target,
            ));
        }
        self.post_one_sided(WorkKind::Read, target, len, remote, cookie)
    }

    /// RDMA WRITEs the first `len` bytes of `source` into the peer's `remote` buffer (which the
    /// peer must have registered for remote write; rdmx itself never grants that).
    pub fn post_write(
        &self,
        source: RegisteredBuf,
        len: usize,
        remote: RemoteBuf,
        cookie: u64,
    ) -> Result<(), (Error, RegisteredBuf)> {
        self.post_one_sided(WorkKind::Write, source, len, remote, cookie)
    }

    /// Applies the atomic operation `op` to the peer's 8-byte word at `remote_addr` (a
    /// multiple of 8, in a region registered for remote atomics, [`crate::WordRegion`]),
    /// writing its old value, native-endian, into the first 8 bytes of `result` (registered
    /// with [`crate::Access::LOCAL_WRITE`]). The completion ([`WorkKind::Atomic`]) hands
    /// `result` back.
    pub fn post_atomic(
        &self,
        result: RegisteredBuf,
        remote_addr: u64,
        rkey: u32,
        op: AtomicOp,
        cookie: u64,
    ) -> Result<(), (Error, RegisteredBuf)> {
        if !result.access().local_write || result.len() < 8 || remote_addr % 8 != 0 {
            let err = Error::invalid(
                "ibv_post_send",
                format!(
                    "an atomic operation needs an 8-byte result buffer with Access::LOCAL_WRITE \
                     (got {} bytes) and an 8-byte aligned remote word (got {remote_addr:#x})",
                    result.len()
                ),
            );
            return Err((err, result));
        }
        let (opcode, operands) = match op {
            AtomicOp::FetchAdd(v) => (sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, (v, 0)),
            AtomicOp::CompareSwap { expected, new } => (
                sys::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
                (expected, new),
            ),
        };
        let mut work = SendWork::new("ibv_post_send", WorkKind::Atomic, opcode, Some(result), 8);
        work.remote = Some(RemoteBuf {
            addr: remote_addr,
            len: 8,
            rkey,
        });
        work.atomic = Some(operands);
        self.post(work, cookie)
            .map_err(|(e, b)| (e, b.expect("the buffer comes back with the error")))
    }

    /// Posts an RDMA READ or WRITE of `len` bytes between `local` and `remote`.
    fn post_one_sided(
        &self,
        kind: WorkKind,
        local: RegisteredBuf,
        len: usize,
        remote: RemoteBuf,
        cookie: u64,
    ) -> Result<(), (Error, RegisteredBuf)> {
        let (opcode, what, dir) = match kind {
            WorkKind::Read => (
                sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
                "RDMA READ",
                ["into", "from"],
            ),
            _ => (
                sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                "RDMA WRITE",
                ["from", "into"],
            ),
        };
        if len > local.len() || len as u64 > u64::from(remote.len) {
            let err = Error::invalid(
                "ibv_post_send",
                format!(
                    "{what} of {len} bytes {} {} bytes {} a {}-byte remote buffer",
                    dir[0],
                    local.len(),
                    dir[1],
                    remote.len
                ),
            );
            return Err((err, local));
        }
        let mut work = SendWork::new("ibv_post_send", kind, opcode, Some(local), len);
        work.remote = Some(remote);
        self.post(work, cookie)
            .map_err(|(e, b)| (e, b.expect("the buffer comes back with the error")))
    }

    /// Binds `window` on this connection's QP: once the bind has run (work requests run in
    /// order, so before anything posted after it), the peer of this connection — and no
    /// other — may RDMA READ the window's bytes with [`MemoryWindow::rkey`] until the window
    /// is dropped. Its completion has [`WorkKind::Bind`] and no buffer. A window is bound
    /// once.
    pub fn post_bind(&self, window: &MemoryWindow, cookie: u64) -> Result<()> {
        if window.pd_ptr() != self.config.pd.inner.pd {
            return Err(Error::invalid(
                "ibv_post_send",
                "the memory window's region is in another protection domain than the QP",
            ));
        }
        if !window.claim_bind() {
            return Err(Error::invalid(
                "ibv_post_send",
                "this memory window was already bound (a type-2 window binds once)",
            ));
        }
        let wr_id = self
            .config
            .cq
            .record_bind(self.owner, cookie, window.inner.clone());
        let mut wr = sys::ibv_send_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
            opcode: sys::ibv_wr_opcode::IBV_WR_BIND_MW,
            send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.__bindgen_anon_2.bind_mw = window.bind_wr();
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is valid and wr lives across the call. The window and the region it
        // exposes stay alive (the record just made holds the window, the window its region)
        // until the bind's completion is polled or the QP is destroyed.
        let ret = unsafe { sys::ibv_post_send(self.qp(), &mut wr, &mut bad) };
        if ret != 0 {
            self.config.cq.unrecord(wr_id);
            return Err(Error::from_ret(
                "ibv_post_send",
                ret,
                format!("cannot bind a memory window on qp {}", self.qp_num),
            ));
        }
        Ok(())
    }

    /// Posts a receive on the connection's own receive queue (only for connections made
    /// without an SRQ; with one, post on the SRQ).
    pub fn post_recv(&self, buf: RegisteredBuf, cookie: u64) -> Result<(), (Error, RegisteredBuf)> {
        if self.config.srq.is_some() {
            return Err((
                Error::invalid(
                    "ibv_post_recv",
                    "this connection receives through its SRQ; post there",
                ),
                buf,
            ));
        }
        if !buf.access().local_write {
            return Err((
                Error::invalid("ibv_post_recv", "receive buffers need Access::LOCAL_WRITE"),
                buf,
            ));
        }
        let mut sge = buf.sge(buf.len());
        let wr_id = self
            .config
            .cq
            .record(self.owner, WorkKind::Recv, cookie, Some(buf));
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: as for sends: the buffer is held in the CQ's table until it completes or the
        // QP is destroyed.
        let ret = unsafe { sys::ibv_post_recv(self.qp(), &mut wr, &mut bad) };
        if ret != 0 {
            let buf = self.config.cq.unrecord(wr_id).expect("recorded just above");
            return Err((
                Error::from_ret(
                    "ibv_post_recv",
                    ret,
                    format!("cannot post a receive on qp {}", self.qp_num),
                ),
                buf,
            ));
        }
        Ok(())
    }
}

/// The most pieces [`Connection::post_send_inline_gather`] gathers a send from.
pub const INLINE_PIECES: usize = 2;

struct SendWork<'a> {
    call: &'static str,
    kind: WorkKind,
    opcode: sys::ibv_wr_opcode,
    buf: Option<RegisteredBuf>,
    len: usize,
    inline: Option<&'a [&'a [u8]]>,
    remote: Option<RemoteBuf>,
    /// An atomic operation's operands: compare-or-add, swap.
    atomic: Option<(u64, u64)>,
}

impl SendWork<'_> {
    fn new(
        call: &'static str,
        kind: WorkKind,
        opcode: sys::ibv_wr_opcode,
        buf: Option<RegisteredBuf>,
        len: usize,
    ) -> Self {
        SendWork {
            call,
            kind,
            opcode,
            buf,
            len,
            inline: None,
            remote: None,
            atomic: None,
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let qp = self.qp();
        let ret = if crate::fault::take_qp_destroy_failure() {
            libc::EBUSY
        } else {
            // SAFETY: qp is the QP rdma_create_qp made for this id, destroyed once, here.
            // (rdma_destroy_qp would do the same but ignore a failure.)
            unsafe { sys::ibv_destroy_qp(qp) }
        };
        if ret != 0 {
            // The QP may still be live: the NIC may go on writing the buffers posted on it,
            // and it still uses the CQ, SRQ and PD. Leak all of them rather than free memory
            // the NIC may touch; the id is destroyed without its QP.
            let leaked = self.config.cq.leak_owner(self.owner);
            log::error!(
                "ibv_destroy_qp of qp {} failed ({}): leaking its {leaked} posted buffers",
                self.qp_num,
                std::io::Error::from_raw_os_error(ret)
            );
            mem::forget(self.config.clone());
        } else {
            // The NIC no longer uses any buffer posted on the QP: their records can be dropped.
            self.config.cq.forget_owner(self.owner);
        }
        // SAFETY: the id is valid; its QP is destroyed (or deliberately leaked), so the id
        // must not refer to it any more.
        unsafe { (*self.raw.id()).qp = ptr::null_mut() };
        // Then `raw` destroys the id (the kernel sends a DREQ if still connected) and its
        // channel, and the PD, CQ and SRQ references are released.
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("qp_num", &self.qp_num)
            .field("peer", &self.peer_addr())
            .finish()
    }
}
