//! rdmacm connections: listen / get_request / accept / reject, connect, disconnect, and the
//! connection's queue pair.
//!
//! Endpoints are made with `rdma_create_ep` (which resolves the address and the route, each
//! bounded by rdmacm's 2 s timeout) and then moved onto an event channel of their own with
//! `rdma_migrate_id`. That makes every later step asynchronous, so connecting, accepting and
//! waiting for a request each take a deadline instead of blocking on the CM's own retries, and
//! a connection's channel fd can be watched for the peer's disconnect.

use std::mem;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr;
use std::time::{Duration, Instant};

use rdmx_sys as sys;

use crate::addr::{sockaddr_to_std, AddrInfo, Side};
use crate::cq::{new_owner, poll_readable, set_nonblocking, CompletionQueue, Owner, WorkKind};
use crate::device::Device;
use crate::memory::{ProtectionDomain, RegisteredBuf, RemoteBuf};
use crate::srq::SharedReceiveQueue;
use crate::window::MemoryWindow;
use crate::{Error, Result};

/// Most private data a connect request carries over IB/RoCE (the CM's REQ keeps 36 of its 92
/// bytes for rdmacm's own header).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept carries.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Most private data a reject carries.
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// An rdmacm id together with the event channel it alone uses.
pub(crate) struct RawId {
    id: *mut sys::rdma_cm_id,
    channel: *mut sys::rdma_event_channel,
}

// SAFETY: rdmacm ids and channels may be used from any thread; rdma_get_cm_event reads the
// channel fd, which the kernel serialises.
unsafe impl Send for RawId {}
// SAFETY: as above.
unsafe impl Sync for RawId {}

fn new_channel(call: &'static str) -> Result<*mut sys::rdma_event_channel> {
    // SAFETY: no preconditions; returns an owned channel or NULL.
    let channel = unsafe { sys::rdma_create_event_channel() };
    if channel.is_null() {
        return Err(Error::last_os(
            call,
            "cannot create an rdmacm event channel (is rdma_ucm loaded? /dev/infiniband/rdma_cm)",
        ));
    }
    // SAFETY: channel is valid.
    if let Err(err) = set_nonblocking(unsafe { (*channel).fd }, call) {
        // SAFETY: channel was created above and has no ids.
        unsafe { sys::rdma_destroy_event_channel(channel) };
        return Err(err);
    }
    Ok(channel)
}

impl RawId {
    /// A fresh id on a fresh channel (TCP port space, RC QPs).
    pub(crate) fn create(call: &'static str) -> Result<Self> {
        let channel = new_channel(call)?;
        let mut id = ptr::null_mut();
        // SAFETY: channel is valid and id a valid out-pointer.
        let ret = unsafe {
            sys::rdma_create_id(
                channel,
                &mut id,
                ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 {
            let err = Error::last_os("rdma_create_id", "cannot create an rdmacm id");
            // SAFETY: the channel has no ids.
            unsafe { sys::rdma_destroy_event_channel(channel) };
            return Err(err);
        }
        Ok(RawId { id, channel })
    }

    /// Moves `id` (synchronous, or on someone else's channel) onto a channel of its own.
    /// On failure the id is destroyed.
    ///
    /// # Safety
    /// `id` must be a valid rdmacm id without a QP that nothing else will use or destroy, with
    /// every event already acknowledged.
    unsafe fn adopt(id: *mut sys::rdma_cm_id, call: &'static str) -> Result<Self> {
        let channel = match new_channel(call) {
            Ok(c) => c,
            Err(err) => {
                // SAFETY: the caller hands the id over to us.
                unsafe { sys::rdma_destroy_id(id) };
                return Err(err);
            }
        };
        // SAFETY: id and channel are valid.
        let ret = unsafe { sys::rdma_migrate_id(id, channel) };
        if ret != 0 {
            let err = Error::last_os(
                "rdma_migrate_id",
                "cannot move the rdmacm id to its own event channel",
            );
            // SAFETY: the id stays on its old channel; destroy it, then our unused channel.
            unsafe {
                sys::rdma_destroy_id(id);
                sys::rdma_destroy_event_channel(channel);
            }
            return Err(err);
        }
        Ok(RawId { id, channel })
    }

    pub(crate) fn id(&self) -> *mut sys::rdma_cm_id {
        self.id
    }

    fn fd(&self) -> RawFd {
        // SAFETY: channel is valid while self lives.
        unsafe { (*self.channel).fd }
    }

    fn context(&self) -> *mut sys::ibv_context {
        // SAFETY: id is valid while self lives.
        unsafe { (*self.id).verbs }
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: id is valid; rdma_get_local_addr returns a pointer into the id.
        unsafe { sockaddr_to_std(sys::rdma_get_local_addr(self.id).cast(), 0) }
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe { sockaddr_to_std(sys::rdma_get_peer_addr(self.id).cast(), 0) }
    }

    /// The next event on this id's channel, waiting until `deadline` (None: forever).
    fn next_event(&self, deadline: Option<Instant>, call: &'static str) -> Result<Option<CmEvent>> {
        loop {
            let mut event = ptr::null_mut();
            // SAFETY: the channel is valid and non-blocking; event is a valid out-pointer.
            let ret = unsafe { sys::rdma_get_cm_event(self.channel, &mut event) };
            if ret == 0 {
                // SAFETY: event is valid until acknowledged; CmEvent::take copies and acks it.
                return Ok(Some(unsafe { CmEvent::take(event) }));
            }
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock {
                return Err(Error::last_os(
                    "rdma_get_cm_event",
                    "cannot read the rdmacm event channel",
                ));
            }
            let remaining = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(r) if !r.is_zero() => Some(r),
                    _ => return Ok(None),
                },
            };
            if !poll_readable(self.fd(), remaining, call)? {
                return Ok(None);
            }
        }
    }
}

impl Drop for RawId {
    fn drop(&mut self) {
        // SAFETY: every event was acknowledged when taken, and the QP (if any) was destroyed by
        // its owner before this drop. The channel is ours alone and has no other id.
        unsafe {
            if sys::rdma_destroy_id(self.id) != 0 {
                log::error!(
                    "rdma_destroy_id failed: {}",
                    std::io::Error::last_os_error()
                );
            }
            sys::rdma_destroy_event_channel(self.channel);
        }
    }
}

/// The kind of an rdmacm event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmEventKind(pub u32);

impl CmEventKind {
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`.
    pub const CONNECT_REQUEST: Self =
        Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST.0);
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    pub const ESTABLISHED: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED.0);
    /// `RDMA_CM_EVENT_REJECTED`.
    pub const REJECTED: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED.0);
    /// `RDMA_CM_EVENT_DISCONNECTED`: the peer (or we) disconnected.
    pub const DISCONNECTED: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED.0);
    /// `RDMA_CM_EVENT_UNREACHABLE`.
    pub const UNREACHABLE: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_UNREACHABLE.0);
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    pub const CONNECT_ERROR: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_ERROR.0);
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    pub const DEVICE_REMOVAL: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL.0);
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the QP may be reused.
    pub const TIMEWAIT_EXIT: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT.0);

    /// The event's name from `rdma_event_str`.
    pub fn name(self) -> String {
        // SAFETY: rdma_event_str accepts any value and returns a static string.
        let s = unsafe { sys::rdma_event_str(sys::rdma_cm_event_type(self.0)) };
        if s.is_null() {
            return format!("event {}", self.0);
        }
        // SAFETY: checked non-NULL; static string.
        unsafe { std::ffi::CStr::from_ptr(s) }
            .to_string_lossy()
            .into_owned()
    }
}

/// An rdmacm event, copied out of rdmacm and already acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// The event's status (for rejects: the CM reject reason; otherwise 0 or a negative errno).
    pub status: i32,
    /// Private data carried by the event. IB/RoCE deliver it zero-padded to the message's
    /// maximum, so its length is not the length the peer sent.
    pub private_data: Vec<u8>,
    new_id: *mut sys::rdma_cm_id,
}

impl CmEvent {
    /// Copies what rdmx needs out of `event` and acknowledges it.
    ///
    /// # Safety
    /// `event` must come from `rdma_get_cm_event` and not be acknowledged yet.
    unsafe fn take(event: *mut sys::rdma_cm_event) -> CmEvent {
        // SAFETY: the caller guarantees event is valid and unacknowledged.
        let e = unsafe { &*event };
        let kind = CmEventKind(e.event.0);
        // SAFETY: for connection events param.conn is the active union member; the data pointer
        // is valid for private_data_len bytes until the event is acknowledged.
        let private_data = unsafe {
            let conn = e.param.conn;
            if conn.private_data.is_null() || conn.private_data_len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len.into(),
                )
                .to_vec()
            }
        };
        let new_id = if kind == CmEventKind::CONNECT_REQUEST {
            e.id
        } else {
            ptr::null_mut()
        };
        let out = CmEvent {
            kind,
            status: e.status,
            private_data,
            new_id,
        };
        // SAFETY: event is valid and acknowledged exactly once, here.
        if unsafe { sys::rdma_ack_cm_event(event) } != 0 {
            log::error!(
                "rdma_ack_cm_event failed: {}",
                std::io::Error::last_os_error()
            );
        }
        out
    }
}

/// How to build a connection's queue pair: which PD, CQ and SRQ it shares, and its depths.
#[derive(Clone)]
pub struct QpConfig {
    /// The protection domain (on the device the connection runs on).
    pub pd: ProtectionDomain,
    /// The completion queue for both sends and receives.
    pub cq: CompletionQueue,
    /// The shared receive queue; `None` gives the QP its own receive queue.
    pub srq: Option<SharedReceiveQueue>,
    /// Send queue depth.
    pub send_depth: u32,
    /// Receive queue depth (ignored with an SRQ).
    pub recv_depth: u32,
    /// Largest SEND copied inline into the work request (the provider may allow more or less).
    pub max_inline: u32,
}

impl QpConfig {
    /// A configuration sharing `pd`, `cq` and (optionally) `srq`, with modest default depths.
    pub fn new(
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        srq: Option<&SharedReceiveQueue>,
    ) -> Self {
        QpConfig {
            pd: pd.clone(),
            cq: cq.clone(),
            srq: srq.cloned(),
            send_depth: 64,
            recv_depth: 64,
            max_inline: 64,
        }
    }

    fn check(&self) -> Result<()> {
        if self.pd.device() != self.cq.device() {
            return Err(Error::invalid(
                "rdma_create_qp",
                "the PD and the CQ are on different devices",
            ));
        }
        if let Some(srq) = &self.srq {
            if srq.inner.pd.inner.pd != self.pd.inner.pd {
                return Err(Error::invalid(
                    "rdma_create_qp",
                    "the SRQ belongs to another protection domain",
                ));
            }
            if !std::sync::Arc::ptr_eq(&srq.inner.cq.inner, &self.cq.inner) {
                return Err(Error::invalid(
                    "rdma_create_qp",
                    "the SRQ completes on another CQ than the connection's",
                ));
            }
        }
        Ok(())
    }
}

/// A listening rdmacm endpoint.
pub struct Listener {
    raw: RawId,
    local: Option<SocketAddr>,
}

impl Listener {
    /// Binds to a passive address (`rdma_create_ep` with `RAI_PASSIVE`) and listens.
    pub fn bind(addr: &AddrInfo, backlog: i32) -> Result<Self> {
        if addr.side() != Side::Passive {
            return Err(Error::invalid(
                "rdma_create_ep",
                format!("{addr} was resolved for connecting, not for listening"),
            ));
        }
        let mut id = ptr::null_mut();
        // SAFETY: addr's list is valid; with no PD and no QP attributes rdma_create_ep only binds.
        let ret = unsafe {
            sys::rdma_create_ep(&mut id, addr.as_ptr(), ptr::null_mut(), ptr::null_mut())
        };
        if ret != 0 {
            return Err(Error::last_os(
                "rdma_create_ep",
                format!("cannot bind {addr} (address in use, or not on an RDMA device?)"),
            ));
        }
        // SAFETY: id is a fresh passive id with no QP; we take it over.
        let raw = unsafe { RawId::adopt(id, "rdma_create_ep")? };
        // SAFETY: the id is valid and bound.
        if unsafe { sys::rdma_listen(raw.id(), backlog) } != 0 {
            return Err(Error::last_os(
                "rdma_listen",
                format!("cannot listen on {addr}"),
            ));
        }
        let local = raw.local_addr();
        log::debug!("listening on {:?}", local);
        Ok(Listener { raw, local })
    }

    /// The bound address, with the port the system picked if it was 0.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// The device the listener is bound to (`None` when bound to a wildcard address).
    pub fn device(&self) -> Option<Device> {
        Device::from_context(self.raw.context())
    }

    /// The event channel's fd: readable when a request may be waiting.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's fd stays open until the channel is destroyed, which happens
        // only when `self` is dropped, so it outlives the borrow.
        unsafe { BorrowedFd::borrow_raw(self.raw.fd()) }
    }

    /// Waits up to `timeout` (`None`: forever) for a connection request. `Ok(None)` on timeout.
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<Option<ConnectionRequest>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let Some(event) = self.raw.next_event(deadline, "rdma_get_request")? else {
                return Ok(None);
            };
            if event.kind != CmEventKind::CONNECT_REQUEST || event.new_id.is_null() {
                log::warn!(
                    "listener {:?}: ignoring {} event (status {})",
                    self.local,
                    event.kind.name(),
                    event.status
                );
                continue;
            }
            // SAFETY: the request's new id is ours (its event is acknowledged and it has no QP).
            let raw = unsafe { RawId::adopt(event.new_id, "rdma_get_request")? };
            return Ok(Some(ConnectionRequest {
                peer: raw.peer_addr(),
                raw,
                private_data: event.private_data,
            }));
        }
    }
}

/// An incoming connection request, to accept or reject. Dropping it rejects it.
pub struct ConnectionRequest {
    raw: RawId,
    private_data: Vec<u8>,
    peer: Option<SocketAddr>,
}

impl ConnectionRequest {
    /// The private data the peer sent with its connect (zero-padded to 56 bytes on IB/RoCE).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The device the request arrived on: the PD used to accept it must be on this device.
    pub fn device(&self) -> Option<Device> {
        Device::from_context(self.raw.context())
    }

    /// Creates the QP from `config` (sharing its PD, CQ and SRQ) and accepts, sending
    /// `private_data` (at most 196 bytes); waits up to `timeout` for the connection to be
    /// established.
    pub fn accept(
        self,
        config: &QpConfig,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Connection> {
        check_private_data("rdma_accept", private_data, MAX_ACCEPT_PRIVATE_DATA)?;
        let peer = self.peer;
        let conn = Connection::with_qp(self.raw, config, self.private_data, "rdma_accept")?;
        let mut param = conn_param(private_data);
        // SAFETY: the id is valid with a QP; param and its private data live across the call.
        if unsafe { sys::rdma_accept(conn.raw.id(), &mut param) } != 0 {
            return Err(Error::last_os(
                "rdma_accept",
                format!("cannot accept the connection from {peer:?}"),
            ));
        }
        conn.wait_established(timeout, "rdma_accept", &format!("{peer:?}"))
    }

    /// Rejects the request, sending `private_data` (at most 148 bytes) to the peer.
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        check_private_data("rdma_reject", private_data, MAX_REJECT_PRIVATE_DATA)?;
        // SAFETY: the id is a valid, unaccepted request; the data lives across the call.
        let ret = unsafe {
            sys::rdma_reject(
                self.raw.id(),
                private_data.as_ptr().cast(),
                private_data.len() as u8,
            )
        };
        if ret != 0 {
            return Err(Error::last_os(
                "rdma_reject",
                format!("cannot reject the request from {:?}", self.peer),
            ));
        }
        Ok(())
    }
}

fn check_private_data(call: &'static str, data: &[u8], max: usize) -> Result<()> {
    if data.len() > max {
        return Err(Error::invalid(
            call,
            format!(
                "{} bytes of private data exceed the {max} bytes this message carries",
                data.len()
            ),
        ));
    }
    Ok(())
}

fn conn_param(private_data: &[u8]) -> sys::rdma_conn_param {
    sys::rdma_conn_param {
        private_data: if private_data.is_empty() {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        },
        private_data_len: private_data.len() as u8,
        // 255 asks rdmacm for the device's maximum outstanding RDMA READs in both directions.
        responder_resources: sys::RDMA_MAX_RESP_RES.0 as u8,
        initiator_depth: sys::RDMA_MAX_INIT_DEPTH.0 as u8,
        flow_control: 1,
        retry_count: 7,
        // Receiver-not-ready retries are a backstop only: rdmx's flow control keeps the SRQ fed.
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

/// Connects to `dst` (resolved for [`Side::Active`]): creates the endpoint with
/// `rdma_create_ep`, its QP from `config`, and sends `private_data` (at most 56 bytes) with the
/// request. Waits up to `timeout` for the peer's answer.
pub fn connect(
    dst: &AddrInfo,
    config: &QpConfig,
    private_data: &[u8],
    timeout: Duration,
) -> Result<Connection> {
    if dst.side() != Side::Active {
        return Err(Error::invalid(
            "rdma_create_ep",
            format!("{dst} was resolved for listening, not for connecting"),
        ));
    }
    check_private_data("rdma_connect", private_data, MAX_CONNECT_PRIVATE_DATA)?;
    let mut id = ptr::null_mut();
    // SAFETY: dst's list is valid; without QP attributes rdma_create_ep resolves the address
    // and route (bounded by its 2 s timeouts) and creates no QP.
    let ret =
        unsafe { sys::rdma_create_ep(&mut id, dst.as_ptr(), config.pd.inner.pd, ptr::null_mut()) };
    if ret != 0 {
        return Err(Error::last_os(
            "rdma_create_ep",
            format!("cannot resolve a route to {dst}"),
        ));
    }
    // SAFETY: id is a fresh active id with no QP, its events consumed by rdma_create_ep.
    let raw = unsafe { RawId::adopt(id, "rdma_create_ep")? };
    let conn = Connection::with_qp(raw, config, Vec::new(), "rdma_connect")?;
    let mut param = conn_param(private_data);
    // SAFETY: the id is valid with a QP; param and its private data live across the call.
    if unsafe { sys::rdma_connect(conn.raw.id(), &mut param) } != 0 {
        return Err(Error::last_os(
            "rdma_connect",
            format!("cannot connect to {dst}"),
        ));
    }
    conn.wait_established(timeout, "rdma_connect", &dst.to_string())
}

/// A connected reliable-connection QP with its rdmacm id.
///
/// Posting is thread-safe. Dropping it destroys the QP (the peer sees a disconnect), drops
/// the buffers of work still posted on it, then destroys the id.
pub struct Connection {
    raw: RawId,
    owner: Owner,
    config: QpConfig,
    qp_num: u32,
    max_inline: u32,
    peer_private_data: Vec<u8>,
}

impl Connection {
    fn with_qp(
        raw: RawId,
        config: &QpConfig,
        peer_private_data: Vec<u8>,
        call: &'static str,
    ) -> Result<Self> {
        config.check()?;
        if raw.context() != config.pd.device().context() {
            let on = Device::from_context(raw.context())
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
        attr.cap.max_send_sge = 1;
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

    fn wait_established(
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
            match event.kind {
                CmEventKind::ESTABLISHED => {
                    if !event.private_data.is_empty() {
                        self.peer_private_data = event.private_data;
                    }
                    log::debug!("connected with {peer} (qp {})", self.qp_num);
                    return Ok(self);
                }
                CmEventKind::REJECTED => {
                    let why = match event.status {
                        8 => format!(
                            "nobody listens at {peer} (the peer's CM rejected an unknown service)"
                        ),
                        28 => format!("the application at {peer} rejected the connection"),
                        s => format!("{peer} rejected the connection (CM reject reason {s})"),
                    };
                    return Err(Error::new(call, libc::ECONNREFUSED, why)
                        .with_reject_data(event.private_data));
                }
                CmEventKind::UNREACHABLE | CmEventKind::CONNECT_ERROR => {
                    return Err(Error::new(
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
                    ));
                }
                other => log::debug!("while connecting with {peer}: ignoring {}", other.name()),
            }
        }
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

    /// The connection's rdmacm event fd: readable when an event (e.g. the peer's disconnect)
    /// is waiting for [`Connection::next_event`].
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's fd stays open until the channel is destroyed, which happens
        // only when `self` is dropped, so it outlives the borrow.
        unsafe { BorrowedFd::borrow_raw(self.raw.fd()) }
    }

    /// The next rdmacm event of this connection (e.g. [`CmEventKind::DISCONNECTED`]), waiting
    /// up to `timeout` (`Some(Duration::ZERO)` to just check). `Ok(None)` on timeout.
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

    /// Posts a send work request and records its buffer in the CQ's table.
    fn post(&self, work: SendWork<'_>, cookie: u64) -> Result<(), (Error, Option<RegisteredBuf>)> {
        let (opcode, len, inline, remote) = (work.opcode, work.len, work.inline, work.remote);
        let mut sge = match (&work.buf, inline) {
            (Some(buf), _) => buf.sge(len),
            (None, Some(data)) => sys::ibv_sge {
                addr: data.as_ptr() as u64,
                length: data.len() as u32,
                lkey: 0,
            },
            (None, None) => sys::ibv_sge::default(),
        };
        let mut flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if opcode == sys::ibv_wr_opcode::IBV_WR_SEND && (len as u64) <= u64::from(self.max_inline) {
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        let wr_id = self
            .config
            .cq
            .record(self.owner, work.kind, cookie, work.buf);
        let mut wr = sys::ibv_send_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: i32::from(len > 0),
            opcode,
            send_flags: flags,
            ..Default::default()
        };
        if let Some(remote) = remote {
            wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
        }
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is valid; wr and sge live across the call. The local memory is either
        // copied now (inline) or owned by the buffer now recorded in the CQ's table, where it
        // stays — untouched by anyone else and never freed — until its completion is polled or
        // the QP is destroyed.
        let ret = unsafe { sys::ibv_post_send(self.qp(), &mut wr, &mut bad) };
        if ret != 0 {
            let buf = self.config.cq.unrecord(wr_id);
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
    /// buffer is needed. `data` must be at most [`Connection::max_inline`] bytes.
    pub fn post_send_inline(&self, data: &[u8], cookie: u64) -> Result<()> {
        if data.len() as u64 > u64::from(self.max_inline) {
            return Err(Error::invalid(
                "ibv_post_send",
                format!(
                    "{} bytes do not fit inline (at most {} on qp {})",
                    data.len(),
                    self.max_inline,
                    self.qp_num
                ),
            ));
        }
        let mut work = SendWork::new(
            "ibv_post_send",
            WorkKind::Send,
            sys::ibv_wr_opcode::IBV_WR_SEND,
            None,
            data.len(),
        );
        work.inline = Some(data);
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

struct SendWork<'a> {
    call: &'static str,
    kind: WorkKind,
    opcode: sys::ibv_wr_opcode,
    buf: Option<RegisteredBuf>,
    len: usize,
    inline: Option<&'a [u8]>,
    remote: Option<RemoteBuf>,
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
