//! rdmacm connections: listen / get_request / accept / reject, connect, disconnect, and the
//! connection's queue pair.
//!
//! Endpoints are made with `rdma_create_ep` (which resolves the address and the route, each
//! bounded by rdmacm's 2 s timeout) and then moved onto an event channel of their own with
//! `rdma_migrate_id`. That makes every later step asynchronous, so connecting, accepting and
//! waiting for a request each take a deadline instead of blocking on the CM's own retries, and
//! a connection's channel fd can be watched for the peer's disconnect.

use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr;
use std::time::{Duration, Instant};

use rdmx_sys as sys;

use crate::addr::{sockaddr_to_std, AddrInfo, Side};
use crate::connection::Connection;
use crate::cq::{poll_readable, set_nonblocking, CompletionQueue};
use crate::device::Device;
use crate::memory::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
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

    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: channel is valid while self lives.
        unsafe { (*self.channel).fd }
    }

    pub(crate) fn context(&self) -> *mut sys::ibv_context {
        // SAFETY: id is valid while self lives.
        unsafe { (*self.id).verbs }
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: id is valid; rdma_get_local_addr returns a pointer into the id.
        unsafe { sockaddr_to_std(sys::rdma_get_local_addr(self.id).cast(), 0) }
    }

    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe { sockaddr_to_std(sys::rdma_get_peer_addr(self.id).cast(), 0) }
    }

    /// The next event on this id's channel, waiting until `deadline` (None: forever).
    pub(crate) fn next_event(
        &self,
        deadline: Option<Instant>,
        call: &'static str,
    ) -> Result<Option<CmEvent>> {
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
    /// How often the QP retransmits work the peer does not acknowledge before it completes
    /// it with `IBV_WC_RETRY_EXC_ERR` (rdma_cm's `retry_count`, 0..=7). Default 6: Soft-RoCE
    /// (rxe) treats 7 as "retry forever", so a QP to a dead or unreachable peer would never
    /// report anything.
    pub retry_count: u8,
    /// The QP's ACK timeout, as the exponent `e` of 4.096 µs × 2^e (`RDMA_OPTION_ID_ACK_TIMEOUT`,
    /// at most 31): how long each try waits for the peer's acknowledgement. `None` keeps
    /// rdma_cm's default, from the path (on RoCE exponent 19, about 2.1 s per try, so an
    /// unreachable peer surfaces after about 16 s); 14 is 67 ms per try, about 0.5 s in all.
    pub ack_timeout: Option<u8>,
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
            retry_count: 6,
            ack_timeout: None,
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.retry_count > 7 || self.ack_timeout.is_some_and(|t| t > 31) {
            return Err(Error::invalid(
                "rdma_connect",
                format!(
                    "retry count {} (0..=7) or ACK timeout exponent {:?} (0..=31) out of range",
                    self.retry_count, self.ack_timeout
                ),
            ));
        }
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
        conn.set_ack_timeout(config.ack_timeout, "rdma_accept")?;
        let mut param = conn_param(private_data, config);
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

fn conn_param(private_data: &[u8], config: &QpConfig) -> sys::rdma_conn_param {
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
        retry_count: config.retry_count,
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
    conn.set_ack_timeout(config.ack_timeout, "rdma_connect")?;
    let mut param = conn_param(private_data, config);
    // SAFETY: the id is valid with a QP; param and its private data live across the call.
    if unsafe { sys::rdma_connect(conn.raw.id(), &mut param) } != 0 {
        return Err(Error::last_os(
            "rdma_connect",
            format!("cannot connect to {dst}"),
        ));
    }
    conn.wait_established(timeout, "rdma_connect", &dst.to_string())
}
