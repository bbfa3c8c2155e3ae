//! Listeners: connection requests on each transport in use, and accepting them without
//! waiting on any one peer.
//!
//! A [`Listener`] watches, with one epoll set, the transports' listeners (TCP's, whose own
//! table holds the connections whose handshake is arriving; RDMA's rdmacm event channel),
//! a waker, and the accepts under way ([`pending`]). [`Listener::accept`] answers each
//! request as it comes and keeps those whose setup waits on the peer — over RDMA for its
//! last CM message (the RTU), over shared memory for the connector's doorbell — with a
//! deadline each, returning the first one set up while the others proceed.
//!
//! The accepts under way are also the worker's to move on ([`Accepts::sweep`], from its
//! progress's housekeeping): a connection established while no thread is in `accept` joins
//! the worker at once (its peer may be sending already: its frames are not left waiting
//! for a later `accept`), and one whose deadline passed is dropped, whether or not the
//! application calls `accept` again. What is set up waits for the next `accept`.

mod pending;

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
#[cfg(feature = "rdma")]
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ep::Ep;
use crate::error::{Error, Result};
use crate::readiness::{Interest, Ready, Registry, Waker};
use crate::transport::Transport;
use crate::worker::{Started, Worker};
use pending::Pending;

/// The epoll token of the RDMA listener's event channel.
#[cfg(feature = "rdma")]
const LISTEN_RDMA: u64 = 1;
/// The epoll token of the TCP listener.
const LISTEN_TCP: u64 = 2;
/// The epoll token of the waker.
const WAKER: u64 = 3;

/// Listens for connections, made by [`Worker::listen`]: on each transport in use, at one
/// address and port. `Send` and `Sync`.
pub struct Listener {
    worker: Worker,
    tcp: Option<rdmx_tcp::Listener>,
    /// The RDMA listener and the accepts under way, which the worker looks after too.
    accepts: Arc<Accepts>,
    /// Which listener is asked first for a request (they take turns).
    #[cfg(feature = "rdma")]
    rdma_first: AtomicBool,
}

/// A listener's accepts under way, and what tells when they have news: shared with its
/// worker, whose progress moves them on too (see the module docs).
pub(crate) struct Accepts {
    #[cfg(feature = "rdma")]
    rdma: Option<rdmx_conn::Listener>,
    /// Watches the listeners, the waker and the pending accepts' own descriptors.
    poll: Registry,
    /// Woken when another thread read what this listener's callers wait for (events of
    /// its RDMA channel, an endpoint set up for [`Listener::accept`]).
    waker: Arc<Waker>,
    /// The accepts whose setup waits on the peer.
    pending: Pending,
}

impl Listener {
    #[cfg(not(feature = "rdma"))]
    pub(crate) fn new(worker: Worker, tcp: Option<rdmx_tcp::Listener>) -> Result<Self> {
        Self::with(worker, tcp)
    }

    #[cfg(feature = "rdma")]
    pub(crate) fn new(
        worker: Worker,
        rdma: Option<rdmx_conn::Listener>,
        tcp: Option<rdmx_tcp::Listener>,
    ) -> Result<Self> {
        let (poll, waker) = Self::watching(tcp.as_ref())?;
        if let Some(r) = &rdma {
            poll.add(r.event_fd(), LISTEN_RDMA, Interest::Read)
                .map_err(|e| Error::os("epoll_ctl", e))?;
            // A thread that reads the channel for something of its own (a request, one
            // pending accept's events) may read what another waits for: it wakes them.
            let waker = waker.clone();
            r.on_ready(move || waker.wake());
        }
        let cfg = &worker.driver.cfg;
        let accepts = Arc::new(Accepts {
            rdma,
            poll,
            waker,
            pending: Pending::new(cfg.max_pending_handshakes(), cfg.connect_timeout()),
        });
        worker.driver.watch_accepts(&accepts);
        Ok(Listener {
            worker,
            tcp,
            accepts,
            rdma_first: AtomicBool::new(false),
        })
    }

    #[cfg(not(feature = "rdma"))]
    fn with(worker: Worker, tcp: Option<rdmx_tcp::Listener>) -> Result<Self> {
        let (poll, waker) = Self::watching(tcp.as_ref())?;
        let cfg = &worker.driver.cfg;
        let accepts = Arc::new(Accepts {
            poll,
            waker,
            pending: Pending::new(cfg.max_pending_handshakes(), cfg.connect_timeout()),
        });
        worker.driver.watch_accepts(&accepts);
        Ok(Listener {
            worker,
            tcp,
            accepts,
        })
    }

    /// The listener's epoll set, watching `tcp` and the waker.
    fn watching(tcp: Option<&rdmx_tcp::Listener>) -> Result<(Registry, Arc<Waker>)> {
        let os = |call| move |e| Error::os(call, e);
        let poll = Registry::new().map_err(os("epoll_create1"))?;
        let waker = Arc::new(Waker::new().map_err(os("eventfd"))?);
        poll.add(waker.fd(), WAKER, Interest::Read)
            .map_err(os("epoll_ctl"))?;
        if let Some(t) = tcp {
            poll.add(t.fd(), LISTEN_TCP, Interest::Read)
                .map_err(os("epoll_ctl"))?;
        }
        Ok((poll, waker))
    }

    /// The address it listens at (with the port chosen when it asked for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        if let Some(t) = &self.tcp {
            return t.local_addr();
        }
        #[cfg(feature = "rdma")]
        if let Some(r) = &self.accepts.rdma {
            return r.local_addr();
        }
        None
    }

    /// The transports it listens on, in the worker's order of preference.
    pub fn transports(&self) -> Vec<Transport> {
        #[cfg(feature = "rdma")]
        let rdma = self.accepts.rdma.is_some();
        #[cfg(not(feature = "rdma"))]
        let rdma = false;
        // (Shared-memory connections are set up over the TCP listener.)
        let serves = |t: &Transport| match t {
            Transport::Rdma => rdma,
            Transport::Tcp | Transport::Shm => self.tcp.is_some(),
            _ => false,
        };
        self.worker
            .driver
            .transports
            .iter()
            .copied()
            .filter(serves)
            .collect()
    }

    /// Waits up to `timeout` (`None`: without limit) for a connection request on any of its
    /// transports, to accept or reject. `Ok(None)` when the time passed.
    ///
    /// No one connection holds this up. Over TCP, each connection taken has the connect
    /// timeout (`RDMX_CONNECT_TIMEOUT_MS`) for its handshake to arrive, while others are
    /// taken and read meanwhile (at most `RDMX_MAX_PENDING_HANDSHAKES` wait at once; one
    /// more closes the oldest); a connection that sends nothing, too little, too slowly or
    /// something malformed is closed and logged, never returned as an error. An RDMA
    /// request is returned as it arrives.
    ///
    /// # Errors
    ///
    /// The listener's own; it stays usable. Among them, the process out of file descriptors
    /// (or memory) when the time passes with connections waiting that could not be taken
    /// for want of them (the TCP listener backs off meanwhile and takes them once some are
    /// freed; see [`rdmx_tcp::Listener::get_request`]).
    pub fn next_request(&self, timeout: Option<Duration>) -> Result<Option<ConnRequest>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut ready = Vec::new();
        loop {
            // (Accepts under way proceed whoever looks; what they set up waits for
            // `accept`, which is woken.)
            if let Some(ep) = self.accepts.progress(&ready) {
                self.accepts.queue(ep);
            }
            if let Some(req) = self.take_request()? {
                return Ok(Some(ConnRequest {
                    worker: self.worker.clone(),
                    req,
                }));
            }
            if !self.wait(&mut ready, deadline)? {
                return Ok(None);
            }
        }
    }

    /// Waits for the next connection request, accepts it, and returns the first endpoint
    /// set up. Never waits on one peer: each request is answered as it comes, and one whose
    /// setup waits on its peer — over RDMA for the connection to be established (the
    /// peer's last CM message), over shared memory for the connector's doorbell — is kept
    /// among the accepts under way, each with the connect timeout (`RDMX_CONNECT_TIMEOUT_MS`)
    /// from its answer, at most `RDMX_MAX_PENDING_HANDSHAKES` at once (one more drops the
    /// oldest), while further requests are taken and answered. One whose peer never does its
    /// part is dropped at its deadline (its connection closed, the worker's admission of it
    /// undone) and logged. Endpoints set up while another was being returned are returned
    /// by the next calls, first.
    ///
    /// A request that cannot be accepted — a peer with an incompatible or malformed rdmx
    /// handshake (rejected with the reason, as [`ConnRequest::accept`] does), or one whose
    /// connection failed while it was being set up — costs only that peer: it is logged
    /// (`log`, warning level) and the next request is awaited, as a UCP listener drops a
    /// connection request that fails. The process out of file descriptors is waited out
    /// (the TCP listener backs off and logs it; see [`Listener::next_request`]). Errors
    /// are the listener's own; to see each request's outcome, use `next_request` and
    /// [`ConnRequest::accept`].
    pub fn accept(&self) -> Result<Ep> {
        let mut ready = Vec::new();
        loop {
            if let Some(ep) = self.accept_step(&mut ready)? {
                return Ok(ep);
            }
            self.wait(&mut ready, None)?;
        }
    }

    /// [`Listener::accept`] without waiting: the endpoint of a request that came (answered
    /// now) or of an accept under way that has been set up meanwhile, else `Ok(None)`.
    /// Requests that came are answered either way, and one whose setup waits on its peer
    /// joins the accepts under way. With the listener's fd ([`Listener::as_fd`]) and
    /// [`Listener::next_timeout`], an event loop accepts without blocking: call this when
    /// the fd is readable or the timeout passes (`rdmx::tokio::accept` does).
    pub fn try_accept(&self) -> Result<Option<Ep>> {
        let mut ready = Vec::new();
        self.accepts.take_ready(&mut ready, Some(Duration::ZERO))?;
        self.accept_step(&mut ready)
    }

    /// How long an event loop may wait on the listener's fd before the accepts under way
    /// need [`Listener::try_accept`] for their deadlines; `None`: until the fd is readable.
    pub fn next_timeout(&self) -> Option<Duration> {
        let next = self.accepts.pending.next_deadline()?;
        Some(next.saturating_duration_since(Instant::now()))
    }

    /// One round of [`Listener::accept`]: the accepts under way moved on (those `ready`
    /// names have news), the requests that came answered; the first endpoint set up, or
    /// `None` when nothing more can be done without waiting.
    fn accept_step(&self, ready: &mut Vec<Ready>) -> Result<Option<Ep>> {
        loop {
            if let Some(ep) = self.accepts.progress(ready) {
                return Ok(Some(ep));
            }
            match self.take_request() {
                Ok(Some(req)) => {
                    let peer = req.peer_addr();
                    match self.worker.accept_start(req) {
                        Ok(Started::Ep(ep)) => return Ok(Some(ep)),
                        Ok(Started::Pending(p)) => self.accepts.add(p),
                        Err(e) => {
                            log::warn!("accepting {peer:?} failed: {e}; waiting for the next")
                        }
                    }
                    // (What else waits is looked at before sleeping.)
                    ready.clear();
                }
                Ok(None) => return Ok(None),
                Err(Error::Tcp(e)) if e.is_out_of_resources() => {
                    // (The TCP listener warned once and backs off: its descriptor is quiet
                    // until it tries again.)
                    log::debug!("{e}; waiting for descriptors to be freed");
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// How many TCP connections wait for their handshake (taken from the listening socket,
    /// their HELLO not all arrived); at most `RDMX_MAX_PENDING_HANDSHAKES`.
    pub fn pending_handshakes(&self) -> usize {
        self.tcp.as_ref().map_or(0, |t| t.pending_handshakes())
    }

    /// How many accepts [`Listener::accept`] has under way: answered, their setup waiting on
    /// the peer (an RDMA connection not yet established, a shared-memory connector's
    /// doorbell not yet come); at most `RDMX_MAX_PENDING_HANDSHAKES`.
    pub fn pending_accepts(&self) -> usize {
        self.accepts.pending.len()
    }

    /// The next request waiting on either listener, without waiting (they take turns at
    /// being asked first).
    fn take_request(&self) -> Result<Option<RawRequest>> {
        #[cfg(feature = "rdma")]
        if let Some(r) = &self.accepts.rdma {
            let first = self.rdma_first.fetch_xor(true, Ordering::Relaxed);
            if first {
                if let Some(req) = r.get_request(Some(Duration::ZERO))? {
                    return Ok(Some(RawRequest::Rdma(req)));
                }
            }
            if let Some(req) = self.take_tcp()? {
                return Ok(Some(req));
            }
            if !first {
                if let Some(req) = r.get_request(Some(Duration::ZERO))? {
                    return Ok(Some(RawRequest::Rdma(req)));
                }
            }
            return Ok(None);
        }
        self.take_tcp()
    }

    fn take_tcp(&self) -> Result<Option<RawRequest>> {
        match &self.tcp {
            Some(t) => Ok(t.get_request(Some(Duration::ZERO))?.map(RawRequest::Tcp)),
            None => Ok(None),
        }
    }

    /// Sleeps until something is ready (into `ready`), the earliest deadline of an accept
    /// under way, or `deadline`; false (without sleeping) once `deadline` has passed.
    fn wait(&self, ready: &mut Vec<Ready>, deadline: Option<Instant>) -> Result<bool> {
        let a = &self.accepts;
        let now = Instant::now();
        if deadline.is_some_and(|d| d <= now) {
            ready.clear();
            return Ok(false);
        }
        let until = match (deadline, a.pending.next_deadline()) {
            (Some(d), Some(p)) => Some(d.min(p)),
            (d, p) => d.or(p),
        };
        let timeout = until.map(|u| u.saturating_duration_since(now));
        a.take_ready(ready, timeout)?;
        Ok(true)
    }
}

/// The listener's file descriptor for an event loop: an epoll set, readable when a request
/// or an accept under way has news for [`Listener::try_accept`]. Watch it for input only;
/// never read it or close it.
impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.accepts.fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl Accepts {
    /// Waits up to `timeout` (`None`: for ever) for the listener's fds, into `ready`; the
    /// waker's wake-up taken.
    fn take_ready(&self, ready: &mut Vec<Ready>, timeout: Option<Duration>) -> Result<()> {
        self.poll
            .wait(ready, timeout)
            .map_err(|e| Error::os("epoll_wait", e))?;
        if ready.iter().any(|r| r.token == WAKER) {
            self.waker.drain();
        }
        Ok(())
    }

    /// The listener's epoll fd.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.poll.fd()
    }

    /// Moves the accepts under way on (those `ready`, the last wait's, or the RDMA
    /// listener's channel says have news), drops those past their deadline, and returns an
    /// endpoint set up, if one is.
    fn progress(&self, ready: &[Ready]) -> Option<Ep> {
        // (The caller takes the requests next, whether or not some came.)
        let news = |tokens: &mut Vec<u64>| {
            self.news(ready, tokens);
        };
        self.pending.progress(true, news, &self.poll)
    }

    /// Appends the tokens of the accepts under way that have news: those `ready` names, and
    /// those the RDMA listener's channel does (reading it). Returns whether connect requests
    /// came on that channel.
    fn news(&self, ready: &[Ready], tokens: &mut Vec<u64>) -> bool {
        tokens.extend(
            ready
                .iter()
                .filter(|r| pending::is_pending(r.token))
                .map(|r| r.token),
        );
        #[cfg(feature = "rdma")]
        if let Some(r) = &self.rdma {
            let from = tokens.len();
            if let Err(e) = r.take_ready(tokens) {
                log::error!("listener {:?}: {e}", r.local_addr());
            }
            return tokens[from..].contains(&rdmx_conn::Listener::REQUESTS);
        }
        false
    }

    /// Keeps `accept` among those under way.
    fn add(&self, accept: Box<crate::worker::PendingAccept>) {
        self.pending.add(accept, &self.poll);
    }

    /// Keeps `ep`, set up, for the next [`Listener::accept`], and wakes it.
    fn queue(&self, ep: Ep) {
        self.pending.queue(ep);
        self.waker.wake();
    }

    /// The worker's part (from its progress's housekeeping): moves the accepts under way
    /// on, as [`Listener::accept`] would, and keeps what is set up for it. Never waits.
    pub(crate) fn sweep(&self) {
        if self.pending.is_idle() {
            return;
        }
        // (Level-triggered: what this reports stays reported for a thread in `accept`.)
        let mut ready = Vec::new();
        if let Err(e) = self.poll.wait(&mut ready, Some(Duration::ZERO)) {
            log::debug!("listener: epoll_wait: {e}");
        }
        let mut requests = false;
        let news = |tokens: &mut Vec<u64>| requests = self.news(&ready, tokens);
        if let Some(ep) = self.pending.progress(false, news, &self.poll) {
            self.queue(ep);
        } else if requests {
            // (Read here, they no longer make the channel readable: a thread asleep in
            // `accept` is told.)
            self.waker.wake();
        }
    }
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.local_addr())
            .field("pending_accepts", &self.pending_accepts())
            .finish()
    }
}

/// An incoming connection request: [`ConnRequest::accept`] or [`ConnRequest::reject`] it.
pub struct ConnRequest {
    worker: Worker,
    req: RawRequest,
}

pub(crate) enum RawRequest {
    #[cfg(feature = "rdma")]
    Rdma(rdmx_conn::ConnectionRequest),
    Tcp(rdmx_tcp::ConnectionRequest),
}

impl RawRequest {
    pub(crate) fn transport(&self) -> Transport {
        match self {
            #[cfg(feature = "rdma")]
            RawRequest::Rdma(_) => Transport::Rdma,
            RawRequest::Tcp(_) => Transport::Tcp,
        }
    }

    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        match self {
            #[cfg(feature = "rdma")]
            RawRequest::Rdma(r) => r.peer_addr(),
            RawRequest::Tcp(r) => r.peer_addr(),
        }
    }

    pub(crate) fn private_data(&self) -> &[u8] {
        match self {
            #[cfg(feature = "rdma")]
            RawRequest::Rdma(r) => r.private_data(),
            RawRequest::Tcp(r) => r.private_data(),
        }
    }

    fn reject(self, data: &[u8]) -> Result<()> {
        match self {
            #[cfg(feature = "rdma")]
            RawRequest::Rdma(r) => Ok(r.reject(data)?),
            RawRequest::Tcp(r) => Ok(r.reject(data)?),
        }
    }
}

impl ConnRequest {
    /// The address of the peer asking.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.req.peer_addr()
    }

    /// The transport the request came over.
    pub fn transport(&self) -> Transport {
        self.req.transport()
    }

    /// Accepts: the connection joins the worker (sharing its SRQ on RDMA, and its credit
    /// pool on every transport: there is no limit on endpoints) and becomes an [`Ep`]. A
    /// peer with an incompatible protocol is rejected with the reason, and that is the
    /// error returned.
    ///
    /// This waits for this one request's setup to end, up to the connect timeout
    /// (`RDMX_CONNECT_TIMEOUT_MS`): over RDMA for the connection to be established (the
    /// peer's last CM message), over shared memory for the connector's doorbell. That is
    /// the application's choice of peer; [`Listener::accept`] never waits on one.
    pub fn accept(self) -> Result<Ep> {
        self.worker.accept_request(self.req)
    }

    /// Rejects the request; the peer's connect fails with "rejected".
    pub fn reject(self) -> Result<()> {
        self.req.reject(b"rdmx: rejected by the application")
    }
}

/// Rejects `req`, telling the peer why (truncated to what a reject carries), and returns
/// the reason.
pub(crate) fn reject_with(req: RawRequest, why: Error) -> Error {
    let mut text = format!("rdmx: {why}").into_bytes();
    #[cfg(feature = "rdma")]
    text.truncate(rdmx_conn::MAX_REJECT_PRIVATE_DATA);
    text.truncate(rdmx_tcp::MAX_PRIVATE_DATA);
    log::warn!("rejecting a connection from {:?}: {why}", req.peer_addr());
    if let Err(e) = req.reject(&text) {
        log::debug!("reject failed: {e}");
    }
    why
}
