//! rdmacm connections: listen / get_request / accept / reject, connect, disconnect, and the
//! connection's queue pair.
//!
//! Endpoints are made with `rdma_create_ep` (which resolves the address and the route, each
//! bounded by rdmacm's 2 s timeout) and then moved with `rdma_migrate_id` onto an
//! [`EventChannel`]: a listener's own, and for connections the one their [`QpConfig`] names,
//! which all of a worker's connections share (so a connection costs no descriptor). That
//! makes every later step asynchronous, so connecting, accepting and waiting for a request
//! each take a deadline instead of blocking on the CM's own retries, and the channel can be
//! watched for the peers' disconnects.
//!
//! Accepting need not wait at all: [`ConnectionRequest::accept_start`] answers the request
//! and returns an [`Accepting`], which stays on its listener's channel (its events make the
//! listener's [`Listener::event_fd`] readable, and [`Listener::take_ready`] names it) until
//! the peer's last message (the RTU) establishes it; then [`Accepting::finish`] moves it
//! onto its connection's channel. A listener can so have many accepts under way and never
//! wait on one peer.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::ptr;
use std::time::{Duration, Instant};

use rdmx_sys as sys;

use crate::addr::{AddrInfo, Side};
use crate::channel::{CmEventKind, EventChannel, RawId};
use crate::connection::Connection;
use crate::cq::CompletionQueue;
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

/// How to build a connection: which PD, CQ and SRQ its queue pair shares, their depths, and
/// the event channel its rdmacm id moves onto — what a worker's connections share.
#[derive(Clone)]
pub struct QpConfig {
    /// The protection domain (on the device the connection runs on).
    pub pd: ProtectionDomain,
    /// The completion queue for both sends and receives.
    pub cq: CompletionQueue,
    /// The shared receive queue; `None` gives the QP its own receive queue.
    pub srq: Option<SharedReceiveQueue>,
    /// The rdmacm event channel the connection's events arrive on: one for all of a
    /// worker's connections, so that none costs a descriptor of its own.
    pub events: EventChannel,
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
    /// A configuration sharing `pd`, `cq`, (optionally) `srq` and the event channel
    /// `events`, with modest default depths.
    pub fn new(
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        srq: Option<&SharedReceiveQueue>,
        events: &EventChannel,
    ) -> Self {
        QpConfig {
            pd: pd.clone(),
            cq: cq.clone(),
            srq: srq.cloned(),
            events: events.clone(),
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

/// A listening rdmacm endpoint, on an event channel of its own (one descriptor per listener),
/// which its requests and their [`Accepting`]s share until they are established.
pub struct Listener {
    raw: RawId,
    local: Option<SocketAddr>,
}

impl Listener {
    /// The token [`Listener::take_ready`] reports when connect requests wait to be taken
    /// with [`Listener::get_request`].
    pub const REQUESTS: u64 = u64::MAX;

    /// Binds to a passive address (`rdma_create_ep` with `RAI_PASSIVE`) and listens, keeping
    /// up to `backlog` connect requests until they are taken (`rdma_listen`'s backlog, and
    /// the most of them its channel holds; one more is refused).
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
            return Err(Error::last_rdmacm(
                "rdma_create_ep",
                format!("cannot bind {addr} (address in use, or not on an RDMA device?)"),
            ));
        }
        let channel = EventChannel::new()?;
        // SAFETY: id is a fresh passive id with no QP; we take it over.
        let raw = unsafe { RawId::adopt(id, &channel, "rdma_create_ep")? };
        // (Connect requests are news for whoever watches the channel: see `on_ready`.)
        raw.set_token(Listener::REQUESTS);
        // Connect requests not yet taken are kept up to the backlog (each holds the kernel's
        // new id; past it, one more is refused), not a connection's handful of events.
        raw.set_queue_limit(usize::try_from(backlog).unwrap_or(1));
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

    /// The device the listener is bound to (`None` when bound to a wildcard address). An
    /// error when rdmacm cannot list its devices (e.g. the process is out of descriptors).
    pub fn device(&self) -> Result<Option<Device>> {
        Device::from_context(self.raw.context())
    }

    /// The event channel's fd: readable when a request, or an event of an [`Accepting`] of
    /// this listener, may be waiting.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.raw.channel().event_fd()
    }

    /// Reads the listener's channel (without waiting) and appends the tokens of the
    /// [`Accepting`]s that got events since the last call (each once; named by
    /// [`Accepting::set_event_token`]), and [`Listener::REQUESTS`] if connect requests
    /// arrived. [`Accepting::poll`] each; [`Listener::get_request`] takes the requests.
    pub fn take_ready(&self, tokens: &mut Vec<u64>) -> Result<()> {
        self.raw.channel().take_ready(tokens)
    }

    /// Sets the hook called when a thread waiting on the listener's channel (a
    /// [`Listener::get_request`] or [`Accepting::poll`]) read events that
    /// [`Listener::take_ready`] reports, so that whoever sleeps on [`Listener::event_fd`] —
    /// which may not be readable any more — is woken to look. Set once; returns false (and
    /// drops `hook`) if a hook was set already.
    pub fn on_ready(&self, hook: impl Fn() + Send + Sync + 'static) -> bool {
        self.raw.channel().on_ready(hook)
    }

    /// Waits up to `timeout` (`None`: forever) for a connection request. `Ok(None)` on timeout.
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<Option<ConnectionRequest>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let Some(event) = self.raw.next_event(deadline, "rdma_get_request")? else {
                return Ok(None);
            };
            let Some(new_id) = event
                .new_id
                .filter(|_| event.kind == CmEventKind::CONNECT_REQUEST)
            else {
                log::warn!(
                    "listener {:?}: ignoring {} event (status {})",
                    self.local,
                    event.kind.name(),
                    event.status
                );
                continue;
            };
            // (It stays on this listener's channel until it is accepted.)
            let raw = RawId::of_request(new_id, self.raw.channel());
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

    /// Whether the request arrived on `device` (without listing the devices, as
    /// [`ConnectionRequest::device`] does).
    pub fn is_on(&self, device: &Device) -> bool {
        self.raw.context() == device.context()
    }

    /// The device the request arrived on: the PD used to accept it must be on this device.
    /// An error when rdmacm cannot list its devices (e.g. the process is out of
    /// descriptors).
    pub fn device(&self) -> Result<Device> {
        Device::from_context(self.raw.context())?.ok_or_else(|| {
            Error::new(
                "rdma_get_request",
                libc::ENODEV,
                "the request arrived on a device rdmacm does not list",
            )
        })
    }

    /// Moves the request onto `config`'s event channel, creates the QP from `config`
    /// (sharing its PD, CQ and SRQ) and accepts, sending `private_data` (at most 196 bytes);
    /// waits up to `timeout` for the connection to be established: for this one peer (to
    /// accept many at once without waiting on any, see [`ConnectionRequest::accept_start`]).
    pub fn accept(
        mut self,
        config: &QpConfig,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Connection> {
        let peer = self.peer;
        self.raw.move_to(&config.events, "rdma_accept")?;
        let conn = self.answer(config, private_data)?;
        conn.wait_established(timeout, "rdma_accept", &format!("{peer:?}"))
    }

    /// Creates the QP from `config` (sharing its PD, CQ and SRQ) and accepts, sending
    /// `private_data` (at most 196 bytes), without waiting: the connection is established
    /// when the peer's answer (the CM's RTU) arrives, which [`Accepting::poll`] tells. Until
    /// then it stays on the listener's event channel (its events make
    /// [`Listener::event_fd`] readable); [`Accepting::finish`] moves it onto `config`'s.
    /// A peer that never answers costs its `Accepting` only, for as long as it is kept.
    pub fn accept_start(self, config: &QpConfig, private_data: &[u8]) -> Result<Accepting> {
        let peer = self.peer;
        let conn = self.answer(config, private_data)?;
        Ok(Accepting {
            conn,
            peer,
            established: false,
        })
    }

    /// The QP, and `rdma_accept` sending `private_data` (nothing waited for).
    fn answer(self, config: &QpConfig, private_data: &[u8]) -> Result<Connection> {
        check_private_data("rdma_accept", private_data, MAX_ACCEPT_PRIVATE_DATA)?;
        let peer = self.peer;
        let conn = Connection::with_qp(self.raw, config, self.private_data, "rdma_accept")?;
        conn.set_ack_timeout(config.ack_timeout, "rdma_accept")?;
        let mut param = conn_param(private_data, config);
        // SAFETY: the id is valid with a QP; param and its private data live across the call.
        // (The id is asynchronous, as every id here is: rdma_accept sends the answer and
        // returns.)
        if unsafe { sys::rdma_accept(conn.raw.id(), &mut param) } != 0 {
            return Err(Error::last_os(
                "rdma_accept",
                format!("cannot accept the connection from {peer:?}"),
            ));
        }
        Ok(conn)
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

/// A connection accepted with [`ConnectionRequest::accept_start`] and not yet established:
/// [`Accepting::poll`] it when its listener's [`Listener::take_ready`] names it, then
/// [`Accepting::finish`] it. Dropping it destroys its QP and id (the peer's connect fails).
pub struct Accepting {
    conn: Connection,
    peer: Option<SocketAddr>,
    established: bool,
}

impl Accepting {
    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Names this accept by `token` (not 0, nor [`Listener::REQUESTS`]) among those its
    /// listener's [`Listener::take_ready`] reports as having events.
    pub fn set_event_token(&self, token: u64) {
        self.conn.set_event_token(token);
    }

    /// Takes this accept's events, without waiting: `Ok(true)` once the connection is
    /// established (then [`Accepting::finish`] it), `Ok(false)` while it is not. An error
    /// when it failed: the peer rejected or abandoned it, or the CM gave up waiting for it.
    pub fn poll(&mut self) -> Result<bool> {
        while !self.established {
            let now = Some(Instant::now());
            let Some(event) = self.conn.raw.next_event(now, "rdma_accept")? else {
                return Ok(false);
            };
            let peer = format!("{:?}", self.peer);
            self.established = self.conn.on_connect_event(event, "rdma_accept", &peer)?;
        }
        Ok(true)
    }

    /// Waits up to `timeout` for the connection to be established, then finishes it.
    pub fn wait(self, timeout: Duration) -> Result<Connection> {
        let conn = match self.established {
            true => self.conn,
            false => {
                let peer = format!("{:?}", self.peer);
                self.conn.wait_established(timeout, "rdma_accept", &peer)?
            }
        };
        Accepting {
            conn,
            peer: self.peer,
            established: true,
        }
        .finish()
    }

    /// The connection, once [`Accepting::poll`] said it is established: moved onto the
    /// event channel of the [`QpConfig`] it was accepted with. An error if it is not
    /// established, or cannot be moved (it is dropped then).
    pub fn finish(mut self) -> Result<Connection> {
        if !self.established {
            return Err(Error::invalid(
                "rdma_accept",
                format!("the connection from {:?} is not established", self.peer),
            ));
        }
        let events = self.conn.config().events.clone();
        self.conn.raw.move_to(&events, "rdma_migrate_id")?;
        Ok(self.conn)
    }
}

impl std::fmt::Debug for Accepting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accepting")
            .field("peer", &self.peer)
            .field("established", &self.established)
            .finish()
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
/// `rdma_create_ep` (its address and route resolved on a channel of rdmacm's, which it
/// closes), moves it onto `config`'s event channel, creates its QP from `config`, and sends
/// `private_data` (at most 56 bytes) with the request. Waits up to `timeout` for the peer's
/// answer.
pub fn connect(
    dst: &AddrInfo,
    config: &QpConfig,
    private_data: &[u8],
    timeout: Duration,
) -> Result<Connection> {
    let conn = send_request(dst, config, private_data)?;
    conn.wait_established(timeout, "rdma_connect", &dst.to_string())
}

/// [`connect`] up to the request sent: the connection, not yet established (its answer comes
/// as events on `config`'s channel).
pub(crate) fn send_request(
    dst: &AddrInfo,
    config: &QpConfig,
    private_data: &[u8],
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
        return Err(Error::last_rdmacm(
            "rdma_create_ep",
            format!("cannot resolve a route to {dst}"),
        ));
    }
    // SAFETY: id is a fresh active id with no QP, its events consumed by rdma_create_ep.
    let raw = unsafe { RawId::adopt(id, &config.events, "rdma_create_ep")? };
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
    Ok(conn)
}
