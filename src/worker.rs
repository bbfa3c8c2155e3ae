//! The worker: one device's resources, the protocol engine, and the progress loop that
//! drives one with the other.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use rand::rngs::StdRng;
use rand::Rng;
use rdmx_conn::{
    Access, AddrInfo, CmEvent, CmEventKind, Device, MemoryWindow, Poller, RegisteredBuf, Side,
    Waker, WcStatus, WorkKind,
};
use rdmx_proto::{
    Action, CloseReason, ConnId, Engine, Handshake, ProbeInfo, RecvBufId, RemoteBuf, RequestId,
    RequestKind, Status, Tag, UserBufId, HEADER_LEN,
};

use crate::config::{Config, RndvRegistration, WaitMode};
use crate::context::Context;
use crate::ep::{Ep, Listener};
use crate::error::{rejected, Error, Result};
use crate::rdma::{Outgoing, Rdma, RdmaLink, SendPool, COOKIE_KIND, COOKIE_READ, COOKIE_SEND};
use crate::request::{Outcome, Request, RequestCell};
use crate::transport::{Conn, Link, Transport};
use crate::usermem::{RegCache, UserMem};

const TOKEN_WAKER: u64 = 0;
const TOKEN_CQ: u64 = 1;
/// A connection's channel fd is registered as `TOKEN_CONN + its ConnId`.
const TOKEN_CONN: u64 = 1 << 32;
/// How often a progressing worker checks its connections' rdmacm events.
const CM_CHECK_INTERVAL: Duration = Duration::from_millis(5);
/// How long a closing connection may take to drain before it is destroyed anyway.
const REAP_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a frame from a QP not (yet) known is kept before its buffer is reposted.
const PARK_TIMEOUT: Duration = Duration::from_secs(5);

/// A worker: the progress engine of rdmx, like UCP's worker.
///
/// It owns one RDMA device's protection domain, completion queue (with its completion
/// channel), shared receive queue with its pre-posted receive buffers, and pools of
/// registered send buffers, shared by all its endpoints. The device is the one named by
/// `RDMX_DEVICE`, or else the one of the first address the worker listens on or connects
/// to. Receive buffers are worker-wide, so their memory does not grow with the number of
/// endpoints.
///
/// `Worker` is a cheap handle (`Clone`), `Send` and `Sync`: any thread may send, receive,
/// progress or wait on it. Internally the protocol state sits behind one short-held lock,
/// and each endpoint's work is posted under that endpoint's own lock, never while holding
/// the worker-wide one.
///
/// ```no_run
/// # fn main() -> rdmx::Result<()> {
/// let ctx = rdmx::Context::new()?;
/// let worker = ctx.worker()?;
/// let ep = worker.connect("192.0.2.1:7000")?;
/// ep.send(7, b"hello")?;
/// let (reply, info) = worker.recv_vec(8, rdmx::TAG_MASK_ALL)?;
/// println!("{} bytes with tag {}", info.length, info.tag);
/// # drop(reply);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Worker {
    pub(crate) driver: Arc<Driver>,
}

/// What [`Worker::stats`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStats {
    /// The RDMA device, once chosen.
    pub device: Option<String>,
    /// Open endpoints.
    pub eps: usize,
    /// Receive buffers on the SRQ.
    pub srq_depth: u32,
    /// Bytes of receive buffers on the SRQ (independent of the number of endpoints).
    pub recv_buffer_bytes: u64,
    /// Bytes registered for send buffers.
    pub send_buffer_bytes: u64,
    /// Bytes held by the registration cache.
    pub rcache_bytes: u64,
    /// Regions the registration cache registered so far.
    pub rcache_registrations: u64,
    /// Requests not yet completed.
    pub pending_requests: usize,
    /// Messages that arrived before a matching receive.
    pub unexpected_messages: usize,
    /// User buffers the worker holds for requests not yet handed back (sends in flight,
    /// posted receives, rendezvous buffers a peer may still read).
    pub user_buffers: usize,
    /// Rendezvous READs issued and not yet complete.
    pub reads_in_flight: usize,
    /// Connections the worker still tracks, including closed ones whose last work is
    /// draining (they are reaped once it is done).
    pub connections: usize,
}

/// What a completed receive got: the sender's tag and the message length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvInfo {
    /// The sender's tag.
    pub tag: Tag,
    /// The message length in bytes.
    pub length: usize,
}

pub(crate) struct Driver {
    pub(crate) cfg: Config,
    mode: WaitMode,
    rndv: RndvRegistration,
    /// The transports this worker uses, in order of preference.
    pub(crate) transports: Vec<Transport>,
    /// Open TCP links (progress reads sockets only when there are some).
    tcp_links: AtomicUsize,
    state: Mutex<Protocol>,
    rdma: OnceLock<Rdma>,
    init: Mutex<()>,
    conn_list: RwLock<Vec<Arc<Conn>>>,
    progress_lock: Mutex<Vec<rdmx_conn::Completion>>,
    waiter: Mutex<()>,
    poller: Poller,
    waker: Waker,
    gen: Mutex<u64>,
    cv: Condvar,
    cm_due: AtomicBool,
    last_cm_check: AtomicU64,
    next_timer: AtomicU64,
    failures_pending: AtomicBool,
    housekeeping_pending: AtomicBool,
    pub(crate) progress_thread: AtomicBool,
    next_conn: AtomicU64,
    _ctx: Context,
}

struct Tracked {
    buf: UserBufId,
    cell: Arc<RequestCell>,
    conn: Option<Arc<Conn>>,
}

struct ReadCtx {
    conn: ConnId,
    request: RequestId,
    buf: UserBufId,
    off: u64,
}

/// A received frame's buffer, held while the engine's actions use it.
enum RecvBuf {
    /// An SRQ buffer, reposted afterwards.
    Rdma(RegisteredBuf),
    /// A frame read from a TCP link.
    Tcp(Vec<u8>),
}

impl std::ops::Deref for RecvBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            RecvBuf::Rdma(b) => b,
            RecvBuf::Tcp(v) => v,
        }
    }
}

/// A send buffer exposed over TCP, found by its key: only READ requests arriving on `conn`
/// may read it.
struct Exposure {
    buf: UserBufId,
    conn: ConnId,
}

/// TCP frames get receive-buffer ids from here up (SRQ buffers use their index).
const TCP_FRAME_IDS: u64 = 1 << 48;

struct Parked {
    qp: u32,
    id: u64,
    buf: RegisteredBuf,
    len: usize,
    /// When it was parked (coarse clock, ns).
    since: u64,
}

struct Protocol {
    engine: Engine,
    user_bufs: HashMap<UserBufId, UserMem>,
    orphans: HashSet<UserBufId>,
    reqs: HashMap<RequestId, Tracked>,
    next_buf: u64,
    recv_held: HashMap<u64, RecvBuf>,
    next_tcp_frame: u64,
    /// TCP exposures by their key (random, unique among live exposures).
    exposed: HashMap<u32, Exposure>,
    /// Where TCP exposure keys come from: a CSPRNG seeded by the OS, so that one key tells
    /// nothing about another.
    keys: StdRng,
    /// RDMA: the memory window through which each exposed send buffer is read.
    windows: HashMap<UserBufId, MemoryWindow>,
    /// Buffers whose window could not be invalidated yet (a bind of it is still posted),
    /// with the completion of their request if it is done: released, and the completion
    /// handed out, once the window is dead.
    held: Vec<(UserBufId, Option<(Tracked, rdmx_proto::Completion)>)>,
    /// The engine's unexpected arrivals as of the last wake-up.
    arrivals_seen: u64,
    parked: Vec<Parked>,
    conns: HashMap<ConnId, Arc<Conn>>,
    qp_map: HashMap<u32, ConnId>,
    reads: HashMap<u64, ReadCtx>,
    next_read: u64,
    send_pool: SendPool,
    rcache: RegCache,
    /// Closing connections and when they started closing (coarse clock, ns).
    closing: Vec<(ConnId, u64)>,
    spare_recv: Vec<(RegisteredBuf, u64)>,
}

/// Work to do after releasing the state lock.
#[derive(Default)]
struct AfterUnlock {
    flush: Vec<Arc<Conn>>,
    reposts: Vec<(RegisteredBuf, u64)>,
    reaped: Vec<Arc<Conn>>,
    /// Something a blocked thread may be waiting for happened (a request completed, a
    /// message arrived unexpected, a send's work completed, a connection started closing):
    /// wake the waiters.
    wake: bool,
}

impl AfterUnlock {
    fn flush(&mut self, cs: &Arc<Conn>) {
        if !self.flush.iter().any(|c| Arc::ptr_eq(c, cs)) {
            self.flush.push(cs.clone());
        }
    }
}

impl Worker {
    pub(crate) fn new(ctx: &Context) -> Result<Worker> {
        let cfg = ctx.config().clone();
        let engine = Engine::new(cfg.proto()?);
        let frame_len =
            (cfg.recv_buf_size() as usize).max(cfg.eager_threshold() as usize + HEADER_LEN);
        let poller = Poller::new()?;
        let waker = Waker::new()?;
        poller.add(waker.fd(), TOKEN_WAKER)?;
        let driver = Arc::new(Driver {
            mode: cfg.wait_mode(),
            rndv: cfg.rndv_registration(),
            transports: ctx.transports().to_vec(),
            tcp_links: AtomicUsize::new(0),
            state: Mutex::new(Protocol {
                engine,
                user_bufs: HashMap::default(),
                orphans: HashSet::default(),
                reqs: HashMap::default(),
                next_buf: 0,
                recv_held: HashMap::default(),
                next_tcp_frame: TCP_FRAME_IDS,
                exposed: HashMap::default(),
                keys: rand::make_rng(),
                windows: HashMap::default(),
                held: Vec::new(),
                arrivals_seen: 0,
                parked: Vec::new(),
                conns: HashMap::default(),
                qp_map: HashMap::default(),
                reads: HashMap::default(),
                next_read: 0,
                send_pool: SendPool::new(frame_len, cfg.send_bufs() as usize),
                rcache: RegCache::new(cfg.rcache_bytes()),
                closing: Vec::new(),
                spare_recv: Vec::new(),
            }),
            rdma: OnceLock::new(),
            init: Mutex::new(()),
            conn_list: RwLock::new(Vec::new()),
            progress_lock: Mutex::new(Vec::with_capacity(64)),
            waiter: Mutex::new(()),
            poller,
            waker,
            gen: Mutex::new(0),
            cv: Condvar::new(),
            cm_due: AtomicBool::new(false),
            last_cm_check: AtomicU64::new(0),
            next_timer: AtomicU64::new(u64::MAX),
            failures_pending: AtomicBool::new(false),
            housekeeping_pending: AtomicBool::new(false),
            progress_thread: AtomicBool::new(false),
            next_conn: AtomicU64::new(1),
            cfg,
            _ctx: ctx.clone(),
        });
        if let (true, Some(name)) = (
            driver.transports.contains(&Transport::Rdma),
            driver.cfg.device(),
        ) {
            let device = Device::by_name(name)?;
            driver.rdma_on(&device)?;
        }
        let worker = Worker { driver };
        if worker.driver.cfg.progress_thread() {
            worker.start_progress_thread()?;
        }
        Ok(worker)
    }

    /// Starts a progress thread for this worker (if it has none): requests then complete on
    /// their own, and blocking calls sleep until they do instead of progressing. The thread
    /// waits in the worker's wait mode (spinning in [`WaitMode::BusyPoll`]) and ends when
    /// the last handle to the worker is gone.
    pub fn start_progress_thread(&self) -> Result<()> {
        if self.driver.progress_thread.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let weak = Arc::downgrade(&self.driver);
        std::thread::Builder::new()
            .name("rdmx-progress".into())
            .spawn(move || loop {
                let Some(sh) = weak.upgrade() else { break };
                match sh.mode {
                    WaitMode::BusyPoll => {
                        for _ in 0..1024 {
                            if sh.progress() == 0 {
                                std::hint::spin_loop();
                            }
                        }
                    }
                    WaitMode::Event => {
                        if let Err(e) = sh.wait_events(Some(Duration::from_secs(1))) {
                            log::error!("progress thread: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                }
            })
            .map_err(|e| Error::Invalid(format!("cannot start the progress thread: {e}")))?;
        Ok(())
    }

    /// Makes progress: polls completions and connection events, runs the protocol and posts
    /// what it asks for. Returns how many events it handled (0: nothing happened). Never
    /// blocks; returns 0 at once when another thread is progressing.
    pub fn progress(&self) -> usize {
        self.driver.progress()
    }

    /// Sleeps until there is work or `timeout` passes (`None`: no limit), then progresses.
    ///
    /// In [`WaitMode::Event`] this is UCP's arm/wait: arm the completion queue, progress
    /// once more (a completion may have landed before the arming), then sleep on the
    /// completion channel, the connections' event channels and the worker's wake-up fd.
    /// In [`WaitMode::BusyPoll`] it spins on [`Worker::progress`].
    pub fn wait(&self, timeout: Option<Duration>) -> Result<usize> {
        match self.driver.mode {
            WaitMode::Event => self.driver.wait_events(timeout),
            WaitMode::BusyPoll => {
                let deadline = timeout.map(|t| Instant::now() + t);
                loop {
                    let n = self.progress();
                    if n > 0 || deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(n);
                    }
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// Wakes a thread sleeping in [`Worker::wait`] (from any thread).
    pub fn signal(&self) {
        self.driver.waker.wake();
    }

    /// The wait mode.
    pub fn wait_mode(&self) -> WaitMode {
        self.driver.mode
    }

    /// The effective configuration.
    pub fn config(&self) -> &Config {
        &self.driver.cfg
    }

    /// Listens at `addr` (`"host:port"`; port 0 picks a free port, see
    /// [`Listener::local_addr`]) on each transport in use: TCP, and RDMA where `addr` is an
    /// RDMA device's address (rdmacm's port space is separate from TCP's, so both listen at
    /// the same port). Where RDMA is the only transport, an address on no RDMA device is an
    /// error.
    pub fn listen(&self, addr: &str) -> Result<Listener> {
        let sh = &self.driver;
        let mut tcp = None;
        let mut addr = addr.to_string();
        if sh.transports.contains(&Transport::Tcp) {
            let l = rdmx_tcp::Listener::bind(&addr)?;
            if let Some(bound) = l.local_addr() {
                addr = bound.to_string();
            }
            tcp = Some(l);
        }
        let rdma = match sh.transports.contains(&Transport::Rdma) {
            false => None,
            true => match self.listen_rdma(&addr) {
                Ok(l) => Some(l),
                Err(e) if tcp.is_some() => {
                    log::info!("listening at {addr} over TCP only: {e}");
                    None
                }
                Err(e) => return Err(e),
            },
        };
        Listener::new(self.clone(), rdma, tcp)
    }

    fn listen_rdma(&self, addr: &str) -> Result<rdmx_conn::Listener> {
        let info = AddrInfo::resolve(addr, Side::Passive)?;
        let listener = rdmx_conn::Listener::bind(&info, 128)?;
        match listener.device() {
            Some(device) => {
                self.driver.rdma_on(&device)?;
            }
            None if self.driver.rdma.get().is_some() => {}
            None => {
                return Err(Error::Invalid(format!(
                    "{addr} is not on an RDMA device; listen on a device's address or set \
                     RDMX_DEVICE"
                )))
            }
        }
        Ok(listener)
    }

    /// Connects to a listener at `addr` (`"host:port"`) over the first transport in use that
    /// reaches it (RDMA when a device routes to `addr` and the peer listens there, else the
    /// next), waiting at most the configured connect timeout (`RDMX_CONNECT_TIMEOUT_MS`) per
    /// transport. Nobody listening, a rejection or an unreachable address is an error naming
    /// the address.
    pub fn connect(&self, addr: &str) -> Result<Ep> {
        let sh = &self.driver;
        let mut failure = None;
        for (i, &transport) in sh.transports.iter().enumerate() {
            let last = i + 1 == sh.transports.len();
            match self.connect_over(transport, addr) {
                Ok(ep) => return Ok(ep),
                // A peer that refused us on purpose is not asked again another way.
                Err(e) if last || matches!(e, Error::Rejected { .. }) => return Err(e),
                Err(e) => {
                    log::info!("connecting to {addr} over {transport}: {e}; trying the next");
                    failure.get_or_insert(e);
                }
            }
        }
        Err(failure.unwrap_or_else(|| Error::Invalid("no transport to connect with".into())))
    }

    fn connect_over(&self, transport: Transport, addr: &str) -> Result<Ep> {
        let sh = &self.driver;
        let handshake = sh.local_handshake(transport);
        let timeout = sh.cfg.connect_timeout();
        let id = sh.new_conn_id();
        let link = match transport {
            Transport::Tcp => {
                let link = rdmx_tcp::connect(addr, &handshake, timeout)
                    .map_err(|e| rejected(addr, e.reject_data()).unwrap_or_else(|| e.into()))?;
                Link::Tcp(link)
            }
            Transport::Rdma | Transport::Auto => {
                let dst = AddrInfo::resolve(addr, Side::Active)?;
                let rdma = match sh.rdma.get() {
                    Some(r) => r,
                    None => sh.rdma_on(&Device::for_route(&dst)?)?,
                };
                let conn = rdmx_conn::connect(&dst, &rdma.qp_config, &handshake, timeout)
                    .map_err(|e| rejected(addr, e.reject_data()).unwrap_or_else(|| e.into()))?;
                Link::Rdma(RdmaLink::new(id, conn, rdma.qp_config.send_depth))
            }
        };
        let peer = Handshake::decode(link.peer_private_data()).map_err(|e| {
            Error::Invalid(format!("{addr} accepted with an unusable handshake: {e}"))
        })?;
        sh.engine_up(id, &peer, transport)?;
        Ok(Ep::new(self.clone(), sh.add_conn(id, link)))
    }

    /// Posts a tag receive into `buf` (its length is the capacity): it matches the first
    /// message whose tag equals `tag` on the bits set in `mask` (`0` matches any tag), from
    /// any endpoint of this worker, in the order messages arrived. A message longer than
    /// `buf` completes the request with [`Status::Truncated`] and is dropped.
    pub fn tag_recv(&self, tag: Tag, mask: Tag, buf: Vec<u8>) -> Request {
        let cell = RequestCell::new(RequestKind::Recv, tag, None);
        self.driver.with_protocol(|st| {
            let cap = buf.len() as u64;
            let bufid = st.new_buf(UserMem::Plain(buf));
            let id = st.engine.tag_recv(tag, mask, bufid, cap);
            st.track(id, bufid, &cell, None);
        });
        Request {
            cell,
            worker: self.clone(),
        }
    }

    /// Receives into `buf`, blocking until a message matches (see [`Worker::tag_recv`]).
    pub fn recv(&self, tag: Tag, mask: Tag, buf: &mut [u8]) -> Result<RecvInfo> {
        let done = self.tag_recv(tag, mask, vec![0; buf.len()]).wait()?;
        buf[..done.length].copy_from_slice(&done.buf[..done.length]);
        Ok(RecvInfo {
            tag: done.tag,
            length: done.length,
        })
    }

    /// Receives the next matching message whatever its size, blocking until one arrives:
    /// probes for it and takes it out of matching at once (a matched probe), then receives it
    /// into a buffer of its exact length. Any number of threads may call it on one worker:
    /// each message goes to exactly one of them, and the others wait for the next.
    pub fn recv_vec(&self, tag: Tag, mask: Tag) -> Result<(Vec<u8>, RecvInfo)> {
        let sh = &self.driver;
        let mut found = None;
        // A matched probe: the message is taken out of matching as it is found, so no other
        // receiving thread can take it before it is received here.
        sh.wait_until(
            || {
                if found.is_none() {
                    // (No actions follow a probe; and `done` may run under the wake-up lock,
                    // so it must not run actions, which may wake.)
                    found = sh.state.lock().engine.probe_remove(tag, mask);
                }
                found.is_some()
            },
            None,
        );
        let info = found.expect("wait_until returns once found");
        // The length is the peer's claim: allocate it fallibly.
        let mut buf = Vec::new();
        let allocated = usize::try_from(info.len)
            .ok()
            .and_then(|len| buf.try_reserve_exact(len).ok().map(|()| len))
            .map(|len| buf.resize(len, 0))
            .is_some();
        if !allocated {
            // The message is ours and must be consumed: it is dropped as truncated.
            drop(self.msg_recv(info, Vec::new()));
            return Err(Error::Invalid(format!(
                "cannot allocate {} bytes for the message with tag {:#x}; it was dropped",
                info.len, info.tag
            )));
        }
        let request = self.msg_recv(info, buf);
        let done = request.wait()?;
        Ok((
            done.buf,
            RecvInfo {
                tag: done.tag,
                length: done.length,
            },
        ))
    }

    /// Receives a value sent with [`Ep::send_obj`] (serde + bincode), blocking.
    pub fn recv_obj<T: serde::de::DeserializeOwned>(&self, tag: Tag, mask: Tag) -> Result<T> {
        let (buf, info) = self.recv_vec(tag, mask)?;
        use bincode::Options;
        Ok(crate::ep::codec().deserialize(&buf[..info.length])?)
    }

    /// Looks for an unexpected message matching `tag`/`mask` without receiving it.
    pub fn probe(&self, tag: Tag, mask: Tag) -> Option<ProbeInfo> {
        self.progress();
        self.driver.state.lock().engine.probe(tag, mask)
    }

    fn msg_recv(&self, info: ProbeInfo, buf: Vec<u8>) -> Request {
        let cell = RequestCell::new(RequestKind::Recv, info.tag, None);
        self.driver.with_protocol(|st| {
            let bufid = st.new_buf(UserMem::Plain(buf));
            match st.engine.msg_recv(info.msg, bufid, info.len) {
                Some(id) => st.track(id, bufid, &cell, None),
                None => {
                    let buf = st.take_buf(bufid);
                    cell.finish(Outcome {
                        status: Status::ConnectionClosed,
                        length: 0,
                        tag: info.tag,
                        buf,
                    });
                }
            }
        });
        Request {
            cell,
            worker: self.clone(),
        }
    }

    /// Resource figures, e.g. to check that receive memory does not grow with endpoints.
    pub fn stats(&self) -> WorkerStats {
        let sh = &self.driver;
        let st = sh.state.lock();
        WorkerStats {
            device: sh.rdma.get().map(|r| r.device.name()),
            eps: st.conns.len(),
            srq_depth: sh.cfg.srq_depth(),
            recv_buffer_bytes: sh.rdma.get().map_or(0, |r| r.recv_bytes),
            send_buffer_bytes: st.send_pool.bytes,
            rcache_bytes: st.rcache.cached_bytes(),
            rcache_registrations: st.rcache.registrations,
            pending_requests: st.engine.pending_requests(),
            unexpected_messages: st.engine.unexpected_len(),
            user_buffers: st.user_bufs.len(),
            reads_in_flight: st.reads.len(),
            connections: sh.conn_list.read().len(),
        }
    }
}

impl Driver {
    pub(crate) fn eager_limit(&self, conn: ConnId) -> Option<u64> {
        self.state
            .lock()
            .engine
            .conn_stats(conn)
            .map(|s| s.eager_limit)
    }

    fn now_ns(&self) -> u64 {
        crate::clock::coarse_now_ns()
    }

    pub(crate) fn new_conn_id(&self) -> ConnId {
        ConnId(self.next_conn.fetch_add(1, Ordering::Relaxed))
    }

    /// The worker's resources, created on `device` if there are none yet.
    pub(crate) fn rdma_on(&self, device: &Device) -> Result<&Rdma> {
        if let Some(r) = self.rdma.get() {
            return self.same_device(r, device);
        }
        let _guard = self.init.lock();
        if let Some(r) = self.rdma.get() {
            return self.same_device(r, device);
        }
        let (rdma, bufs) = Rdma::new(device, &self.cfg)?;
        for (i, buf) in bufs.into_iter().enumerate() {
            rdma.srq.post_recv(buf, i as u64).map_err(|(e, _)| e)?;
        }
        if let Some(fd) = rdma.cq.event_fd() {
            self.poller.add(fd, TOKEN_CQ)?;
        }
        let _ = self.rdma.set(rdma);
        Ok(self.rdma.get().expect("just set"))
    }

    fn same_device<'a>(&self, r: &'a Rdma, device: &Device) -> Result<&'a Rdma> {
        if &r.device == device {
            Ok(r)
        } else {
            Err(Error::Invalid(format!(
                "this worker runs on {}, not {}; use one worker per device",
                r.device.name(),
                device.name()
            )))
        }
    }

    /// Registers an established connection the engine already knows as `id`.
    pub(crate) fn add_conn(&self, id: ConnId, link: Link) -> Arc<Conn> {
        let cs = Arc::new(Conn::new(id, link));
        if cs.tcp().is_some() {
            self.tcp_links.fetch_add(1, Ordering::AcqRel);
        }
        if let Err(e) = self.poller.add(cs.event_fd(), TOKEN_CONN + id.0) {
            log::warn!("cannot watch {id:?}'s connection events: {e}");
        }
        self.conn_list.write().push(cs.clone());
        self.with_protocol(|st| {
            st.conns.insert(id, cs.clone());
            let Some(qp) = cs.rdma().map(|l| l.conn.qp_num()) else {
                return;
            };
            st.qp_map.insert(qp, id);
            let parked: Vec<Parked> = {
                let (mine, rest) = std::mem::take(&mut st.parked)
                    .into_iter()
                    .partition(|p| p.qp == qp);
                st.parked = rest;
                mine
            };
            for p in parked {
                st.deliver(id, p.id, p.buf, p.len);
            }
        });
        log::debug!("{id:?} up with {:?}", cs.peer);
        cs
    }

    pub(crate) fn engine_up(&self, id: ConnId, peer: &Handshake, over: Transport) -> Result<()> {
        let limits = self.cfg.limits(over);
        Ok(self
            .state
            .lock()
            .engine
            .handle_connection_up_with(id, peer, limits)?)
    }

    pub(crate) fn engine_down(&self, id: ConnId) {
        self.with_protocol(|st| st.engine.handle_connection_down(id));
    }

    /// The handshake for a connection over `transport` (its receive buffer size).
    pub(crate) fn local_handshake(&self, transport: Transport) -> Vec<u8> {
        let limits = self.cfg.limits(transport);
        self.state
            .lock()
            .engine
            .local_handshake_for(&limits)
            .encode()
    }

    pub(crate) fn tag_send(
        &self,
        worker: &Worker,
        cs: &Arc<Conn>,
        tag: Tag,
        buf: Vec<u8>,
    ) -> Request {
        let cell = RequestCell::new(RequestKind::Send, tag, cs.peer);
        self.with_protocol(|st| {
            let len = buf.len() as u64;
            let bufid = st.new_buf(UserMem::Plain(buf));
            match st.engine.tag_send(cs.id, tag, bufid, len) {
                Ok(id) => {
                    cs.pending_sends.fetch_add(1, Ordering::AcqRel);
                    st.track(id, bufid, &cell, Some(cs));
                }
                Err(e) => {
                    log::debug!("tag_send on {:?}: {e}", cs.id);
                    let buf = st.take_buf(bufid);
                    cell.finish(Outcome {
                        status: Status::ConnectionClosed,
                        length: len,
                        tag,
                        buf,
                    });
                }
            }
        });
        Request {
            cell,
            worker: worker.clone(),
        }
    }

    pub(crate) fn cancel(&self, id: RequestId) -> bool {
        self.with_protocol(|st| st.engine.cancel(id))
    }

    /// Closes a connection locally (after the caller flushed it).
    pub(crate) fn close_conn(&self, id: ConnId) {
        // A connection the engine had already forgotten (peer gone) is closing already.
        self.with_protocol(|st| st.engine.close(id));
    }

    /// Runs `f` on the protocol state, then the actions it caused, under the state lock;
    /// then posts what they queued, after releasing it.
    fn with_protocol<R>(&self, f: impl FnOnce(&mut Protocol) -> R) -> R {
        let mut out = AfterUnlock::default();
        let result = {
            let mut st = self.state.lock();
            let result = f(&mut st);
            self.run(&mut st, &mut out);
            result
        };
        self.finish(out);
        result
    }

    fn run(&self, st: &mut Protocol, out: &mut AfterUnlock) {
        st.run_actions(self.rdma.get(), self.rndv, out);
        let arrivals = st.engine.unexpected_arrivals();
        if arrivals != st.arrivals_seen {
            // Threads waiting to probe (recv_vec) wait for exactly this.
            st.arrivals_seen = arrivals;
            out.wake = true;
        }
        self.housekeeping_pending.store(
            !st.closing.is_empty() || !st.parked.is_empty() || !st.held.is_empty(),
            Ordering::Release,
        );
        self.next_timer.store(
            st.engine.poll_timeout().unwrap_or(u64::MAX),
            Ordering::Release,
        );
    }

    /// Posts, reposts and wakes what the last locked section left to do.
    fn finish(&self, out: AfterUnlock) {
        for cs in &out.flush {
            if cs.flush() {
                self.failures_pending.store(true, Ordering::Release);
                self.waker.wake();
            }
        }
        if !out.reposts.is_empty() {
            if let Some(rdma) = self.rdma.get() {
                let mut failed = Vec::new();
                for (buf, id) in out.reposts {
                    if let Err((e, buf)) = rdma.srq.post_recv(buf, id) {
                        log::error!("reposting receive buffer {id}: {e}");
                        failed.push((buf, id));
                    }
                }
                if !failed.is_empty() {
                    self.state.lock().spare_recv.extend(failed);
                }
            }
        }
        if !out.reaped.is_empty() {
            let mut list = self.conn_list.write();
            for cs in &out.reaped {
                let _ = self.poller.remove(cs.event_fd());
                list.retain(|c| !Arc::ptr_eq(c, cs));
                if cs.tcp().is_some() {
                    self.tcp_links.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        drop(out.reaped);
        if out.wake {
            self.notify();
        }
    }

    fn notify(&self) {
        *self.gen.lock() += 1;
        self.cv.notify_all();
    }

    fn cm_check_due(&self, now: u64) -> bool {
        let last = self.last_cm_check.load(Ordering::Relaxed);
        if self.cm_due.swap(false, Ordering::AcqRel)
            || now.saturating_sub(last) >= CM_CHECK_INTERVAL.as_nanos() as u64
        {
            self.last_cm_check.store(now, Ordering::Relaxed);
            return true;
        }
        false
    }

    pub(crate) fn progress(&self) -> usize {
        let Some(mut wcs) = self.progress_lock.try_lock() else {
            return 0;
        };
        let rdma = self.rdma.get();
        wcs.clear();
        if let Some(r) = rdma {
            if let Err(e) = r.cq.poll(&mut wcs, 64) {
                log::error!("{e}");
            }
        }
        let now = self.now_ns();
        let mut cm_events: Vec<(ConnId, CmEvent)> = Vec::new();
        let housekeeping = self.cm_check_due(now);
        if housekeeping && self.rdma.get().is_some() {
            // Only connections whose event channel is readable have rdmacm news: one
            // epoll_wait for all of them, instead of a failing rdma_get_cm_event each.
            let mut ready = Vec::new();
            if let Err(e) = self.poller.wait(&mut ready, Some(Duration::ZERO)) {
                log::error!("checking the connections' events: {e}");
            }
            ready.retain(|&t| t >= TOKEN_CONN);
            for cs in self.conn_list.read().iter() {
                if !ready.contains(&(TOKEN_CONN + cs.id.0)) {
                    continue;
                }
                let Some(link) = cs.rdma() else { continue };
                loop {
                    match link.conn.next_event(Some(Duration::ZERO)) {
                        Ok(Some(ev)) => cm_events.push((cs.id, ev)),
                        Ok(None) => break,
                        Err(e) => {
                            log::debug!("events of {:?}: {e}", cs.id);
                            break;
                        }
                    }
                }
            }
        }
        let mut tcp_events: Vec<(Arc<Conn>, Vec<rdmx_tcp::Event>)> = Vec::new();
        if self.tcp_links.load(Ordering::Acquire) > 0 {
            // Readiness from epoll: only links with something to read are read.
            let mut ready = Vec::new();
            if let Err(e) = self.poller.wait(&mut ready, Some(Duration::ZERO)) {
                log::error!("checking the links' readiness: {e}");
            }
            for cs in self.conn_list.read().iter() {
                let Some(link) = cs.tcp() else { continue };
                if link.wants_write() && cs.flush() {
                    self.failures_pending.store(true, Ordering::Release);
                }
                if !ready.contains(&(TOKEN_CONN + cs.id.0)) {
                    continue;
                }
                let mut events = Vec::new();
                if let Err(e) = link.poll(&mut events) {
                    events.push(rdmx_tcp::Event::Closed {
                        reason: e.to_string(),
                    });
                }
                if !events.is_empty() {
                    tcp_events.push((cs.clone(), events));
                }
            }
        }
        let timer_due = now >= self.next_timer.load(Ordering::Acquire);
        let failures = self.failures_pending.swap(false, Ordering::AcqRel);
        if wcs.is_empty()
            && cm_events.is_empty()
            && tcp_events.is_empty()
            && !timer_due
            && !failures
            && !housekeeping
        {
            return 0;
        }
        let work =
            wcs.len() + cm_events.len() + tcp_events.iter().map(|e| e.1.len()).sum::<usize>();
        let mut out = AfterUnlock::default();
        {
            let mut st = self.state.lock();
            for wc in wcs.drain(..) {
                st.on_completion(wc, &mut out);
            }
            for (id, ev) in cm_events {
                st.on_cm_event(id, ev, &mut out);
            }
            for (cs, events) in tcp_events {
                for ev in events {
                    st.on_tcp_event(&cs, ev, &mut out);
                }
            }
            if failures {
                let list: Vec<Arc<Conn>> = st.conns.values().cloned().collect();
                for cs in list {
                    let Some(link) = cs.rdma() else { continue };
                    let items: Vec<Outgoing> = std::mem::take(&mut *link.failures.lock());
                    for item in items {
                        st.on_post_failure(&cs, item, &mut out);
                    }
                }
            }
            if timer_due {
                st.engine.handle_timeout(now);
            }
            if housekeeping {
                st.housekeeping(&mut out);
            }
            self.run(&mut st, &mut out);
        }
        drop(wcs);
        self.finish(out);
        work
    }

    /// Event-mode wait: arm, re-progress, sleep on every fd, take the events, progress.
    pub(crate) fn wait_events(&self, timeout: Option<Duration>) -> Result<usize> {
        let n = self.progress();
        if n > 0 {
            return Ok(n);
        }
        if let Some(r) = self.rdma.get() {
            r.cq.request_notify()?;
        }
        let n = self.progress();
        if n > 0 {
            return Ok(n);
        }
        let mut sleep = timeout;
        let next = self.next_timer.load(Ordering::Acquire);
        if next != u64::MAX {
            let until = Duration::from_nanos(next.saturating_sub(self.now_ns()));
            sleep = Some(sleep.map_or(until, |s| s.min(until)));
        }
        if self.tcp_links.load(Ordering::Acquire) > 0
            && self
                .conn_list
                .read()
                .iter()
                .any(|c| c.tcp().is_some_and(|l| l.wants_write()))
        {
            // Output waits for a full socket buffer to drain; the poller only watches reads.
            let tick = Duration::from_millis(1);
            sleep = Some(sleep.map_or(tick, |s| s.min(tick)));
        }
        if self.housekeeping_pending.load(Ordering::Acquire) {
            // Closing connections and parked frames are looked after periodically.
            let tick = Duration::from_millis(250);
            sleep = Some(sleep.map_or(tick, |s| s.min(tick)));
        }
        let mut tokens = Vec::new();
        self.poller.wait(&mut tokens, sleep)?;
        log::trace!("woke after sleeping up to {sleep:?}: {tokens:?}");
        for token in tokens {
            match token {
                TOKEN_WAKER => self.waker.drain(),
                TOKEN_CQ => {
                    if let Some(r) = self.rdma.get() {
                        r.cq.take_events()?;
                    }
                }
                _ => self.cm_due.store(true, Ordering::Release),
            }
        }
        Ok(self.progress())
    }

    /// Blocks until `done()` (true) or the deadline (false), progressing in the worker's
    /// wait mode — or sleeping on completions when a progress thread does the progress.
    pub(crate) fn wait_until(
        &self,
        mut done: impl FnMut() -> bool,
        deadline: Option<Instant>,
    ) -> bool {
        let slice = |max: Duration| -> Duration {
            deadline.map_or(max, |d| {
                d.saturating_duration_since(Instant::now()).min(max)
            })
        };
        loop {
            if done() {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            if self.progress_thread.load(Ordering::Acquire) {
                // Whatever a waiter waits for wakes it (see `AfterUnlock::wake`); the slice only
                // bounds a wait nothing would end.
                self.sleep_on_completions(&mut done, slice(Duration::from_secs(1)));
                continue;
            }
            match self.mode {
                WaitMode::BusyPoll => {
                    if self.progress() == 0 {
                        std::hint::spin_loop();
                    }
                }
                WaitMode::Event => {
                    if self.progress() > 0 {
                        continue;
                    }
                    if let Some(guard) = self.waiter.try_lock() {
                        if done() {
                            return true;
                        }
                        if let Err(e) = self.wait_events(Some(slice(Duration::from_secs(1)))) {
                            log::error!("waiting for events: {e}");
                        }
                        drop(guard);
                        // Hand the waiting over to another blocked thread, if any.
                        self.notify();
                    } else {
                        self.sleep_on_completions(&mut done, slice(Duration::from_millis(20)));
                    }
                }
            }
        }
    }

    fn sleep_on_completions(&self, done: &mut impl FnMut() -> bool, max: Duration) {
        let mut gen = self.gen.lock();
        let seen = *gen;
        if done() {
            return;
        }
        let deadline = Instant::now() + max;
        while *gen == seen {
            if self.cv.wait_until(&mut gen, deadline).timed_out() {
                break;
            }
        }
    }
}

impl Protocol {
    fn new_buf(&mut self, mem: UserMem) -> UserBufId {
        let id = UserBufId(self.next_buf);
        self.next_buf += 1;
        self.user_bufs.insert(id, mem);
        id
    }

    /// Records a request the engine accepted, with its buffer and (for sends) connection.
    fn track(
        &mut self,
        id: RequestId,
        buf: UserBufId,
        cell: &Arc<RequestCell>,
        conn: Option<&Arc<Conn>>,
    ) {
        let _ = cell.id.set(id);
        self.reqs.insert(
            id,
            Tracked {
                buf,
                cell: cell.clone(),
                conn: conn.cloned(),
            },
        );
    }

    fn take_buf(&mut self, id: UserBufId) -> Vec<u8> {
        self.user_bufs
            .remove(&id)
            .and_then(UserMem::into_vec)
            .unwrap_or_default()
    }

    fn deliver(&mut self, conn: ConnId, id: u64, buf: RegisteredBuf, len: usize) {
        let bytes = &buf[..len.min(buf.len())];
        self.engine.handle_frame(conn, RecvBufId(id), bytes);
        self.recv_held.insert(id, RecvBuf::Rdma(buf));
    }

    fn on_completion(&mut self, wc: rdmx_conn::Completion, out: &mut AfterUnlock) {
        let ok = wc.status.is_success();
        match (wc.kind, wc.cookie & COOKIE_KIND) {
            (WorkKind::Recv, _) => {
                let Some(buf) = wc.buffer else { return };
                let id = wc.cookie;
                if !ok {
                    if wc.status != WcStatus::FLUSHED {
                        out.reposts.push((buf, id));
                        // The QP is in the error state now: the connection is lost, typically
                        // because the peer sent more than a receive buffer holds.
                        let why = format!(
                            "a receive failed ({}): the peer sent a frame larger than the \
                             {}-byte receive buffer, or the connection broke",
                            wc.status.description(),
                            self.engine.config().recv_buf_size
                        );
                        log::warn!("{why}");
                        let cs = self
                            .qp_map
                            .get(&wc.qp_num)
                            .and_then(|id| self.conns.get(id))
                            .cloned();
                        if let Some(cs) = cs {
                            self.engine.handle_connection_down(cs.id);
                            self.start_closing(&cs, why, out);
                        }
                    }
                    return;
                }
                match self.qp_map.get(&wc.qp_num) {
                    Some(&conn) => self.deliver(conn, id, buf, wc.byte_len as usize),
                    None => self.parked.push(Parked {
                        qp: wc.qp_num,
                        id,
                        buf,
                        len: wc.byte_len as usize,
                        since: crate::clock::coarse_now_ns(),
                    }),
                }
            }
            (_, COOKIE_SEND) => {
                // A flushing endpoint waits for its sends' work to complete.
                out.wake = true;
                let conn = ConnId(wc.cookie & !COOKIE_KIND);
                if let Some(buf) = wc.buffer {
                    self.send_pool.give(buf);
                }
                if let Some(cs) = self.conns.get(&conn) {
                    if let Some(link) = cs.rdma() {
                        link.completed();
                    }
                    out.flush(cs);
                    if !ok && !cs.closing.load(Ordering::Acquire) {
                        log::warn!(
                            "send on {conn:?} to {:?} failed: {}",
                            cs.peer,
                            wc.status.description()
                        );
                    }
                }
                self.engine.handle_send_complete(conn, ok);
            }
            (WorkKind::Bind, _) => {
                // The bind's record (and with it, maybe, the window's last hold) is gone.
                self.release_held(out);
                let conn = ConnId(wc.cookie & !COOKIE_KIND);
                if let Some(cs) = self.conns.get(&conn) {
                    if let Some(link) = cs.rdma() {
                        link.completed();
                    }
                    out.flush(cs);
                    if !ok && !cs.is_closing() {
                        // The QP is in the error state: the connection fails as a whole.
                        log::warn!(
                            "binding a memory window on {conn:?} failed: {}",
                            wc.status.description()
                        );
                    }
                }
            }
            (_, COOKIE_READ) => {
                if !ok {
                    log::debug!("RDMA READ failed: {}", wc.status.description());
                }
                self.read_done(wc.cookie & !COOKIE_KIND, wc.buffer, ok, true, out);
            }
            _ => log::debug!("completion with unknown cookie {:#x}", wc.cookie),
        }
    }

    /// A READ completed (`posted`) or could not be posted: give its piece back and report it.
    fn read_done(
        &mut self,
        key: u64,
        buf: Option<RegisteredBuf>,
        ok: bool,
        posted: bool,
        out: &mut AfterUnlock,
    ) {
        let Some(r) = self.reads.remove(&key) else {
            return;
        };
        if let Some(cs) = self.conns.get(&r.conn).cloned() {
            match &cs.link {
                Link::Rdma(link) if posted => link.completed(),
                Link::Tcp(link) => {
                    // The link hands the destination back once no READ into it is left.
                    if let (Some(vec), Some(mem)) =
                        (link.reclaim(r.buf.0), self.user_bufs.get_mut(&r.buf))
                    {
                        *mem = UserMem::Plain(vec);
                    }
                }
                Link::Rdma(_) => {}
            }
            out.flush(&cs);
        }
        if let (Some(buf), Some(mem)) = (buf, self.user_bufs.get_mut(&r.buf)) {
            mem.put_back(r.off, buf);
        }
        if self.orphans.contains(&r.buf) {
            if self.user_bufs.get(&r.buf).map_or(true, |m| !m.in_flight()) {
                self.orphans.remove(&r.buf);
                self.user_bufs.remove(&r.buf);
            }
            return;
        }
        self.engine.handle_read_complete(r.request, r.off, ok);
    }

    /// A connection is destroyed with RDMA READs still posted on it: they will never complete,
    /// and their targets go with its QP. Each is reported failed and its piece written off, so
    /// that the buffer it belongs to is freed (or its request failed) instead of waiting for
    /// ever.
    fn reads_lost_with(&mut self, conn: ConnId, out: &mut AfterUnlock) {
        let lost: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, r)| r.conn == conn)
            .map(|(&k, _)| k)
            .collect();
        if !lost.is_empty() {
            log::debug!("{conn:?}: {} READs lost with the connection", lost.len());
        }
        for key in lost {
            let buf = self.reads[&key].buf;
            if let Some(mem) = self.user_bufs.get_mut(&buf) {
                mem.lose_piece();
            }
            self.read_done(key, None, false, true, out);
        }
    }

    fn on_post_failure(&mut self, cs: &Arc<Conn>, item: Outgoing, out: &mut AfterUnlock) {
        match item {
            Outgoing::Frame { buf, .. } => {
                self.send_pool.give(buf);
                self.engine.handle_send_complete(cs.id, false);
            }
            Outgoing::Inline(_) => self.engine.handle_send_complete(cs.id, false),
            Outgoing::Read { target, cookie, .. } => {
                self.read_done(cookie & !COOKIE_KIND, Some(target), false, false, out)
            }
            Outgoing::Bind(_) => {
                // The RTS behind it would announce a key that grants nothing.
                self.engine.handle_connection_down(cs.id);
                self.start_closing(cs, "cannot bind a memory window".to_string(), out);
            }
            Outgoing::Disconnect => {}
        }
    }

    fn on_cm_event(&mut self, id: ConnId, ev: CmEvent, out: &mut AfterUnlock) {
        match ev.kind {
            CmEventKind::DISCONNECTED | CmEventKind::DEVICE_REMOVAL => {
                let Some(cs) = self.conns.get(&id).cloned() else {
                    return;
                };
                if !cs.closing.load(Ordering::Acquire) {
                    log::info!("{id:?}: {:?} disconnected ({})", cs.peer, ev.kind.name());
                }
                self.engine.handle_connection_down(id);
                let why = if ev.kind == CmEventKind::DISCONNECTED {
                    "the peer disconnected (rdmacm DISCONNECTED)"
                } else {
                    "the RDMA device was removed"
                };
                self.start_closing(&cs, why.to_string(), out);
            }
            other => log::debug!("{id:?}: {}", other.name()),
        }
    }

    fn start_closing(&mut self, cs: &Arc<Conn>, reason: String, out: &mut AfterUnlock) {
        cs.close_reason.lock().get_or_insert(reason);
        if !cs.closing.swap(true, Ordering::AcqRel) {
            out.wake = true;
            // RDMA disconnects after what is queued is posted; TCP shuts the socket down
            // once everything is written (Conn::flush).
            if let Some(link) = cs.rdma() {
                link.push(Outgoing::Disconnect);
            }
            out.flush(cs);
            self.closing.push((cs.id, crate::clock::coarse_now_ns()));
        }
    }

    /// Destroys drained closing connections; reposts frames parked too long; retries
    /// failed reposts.
    fn housekeeping(&mut self, out: &mut AfterUnlock) {
        let now = crate::clock::coarse_now_ns();
        let after =
            |since: u64, limit: Duration| now.saturating_sub(since) > limit.as_nanos() as u64;
        let mut keep = Vec::new();
        for (id, since) in std::mem::take(&mut self.closing) {
            let Some(cs) = self.conns.get(&id).cloned() else {
                continue;
            };
            if cs.idle() || after(since, REAP_TIMEOUT) {
                if !cs.idle() {
                    log::debug!("{id:?}: destroying with work still posted or unwritten");
                }
                self.reclaim_lent(&cs);
                self.conns.remove(&id);
                self.qp_map.retain(|_, c| *c != id);
                self.reads_lost_with(id, out);
                out.reaped.push(cs);
            } else {
                keep.push((id, since));
            }
        }
        self.closing = keep;
        let (old, fresh): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| after(p.since, PARK_TIMEOUT));
        self.parked = fresh;
        for p in old {
            log::debug!("dropping a frame from unknown qp {}", p.qp);
            out.reposts.push((p.buf, p.id));
        }
        out.reposts.append(&mut self.spare_recv);
        // A destroyed QP dropped the binds still posted on it.
        self.release_held(out);
    }

    fn run_actions(&mut self, rdma: Option<&Rdma>, mode: RndvRegistration, out: &mut AfterUnlock) {
        while let Some(action) = self.engine.poll_action() {
            match action {
                Action::SendFrame {
                    conn,
                    frame,
                    payload,
                } => self.send_frame(rdma, conn, frame.as_bytes(), payload, out),
                Action::ExposeSendBuffer { request, buf, len } => {
                    let conn = self.reqs.get(&request).and_then(|p| p.conn.clone());
                    let exposed = match (rdma, conn) {
                        (_, None) => Err("the send's connection is gone".to_string()),
                        (_, Some(cs)) if cs.tcp().is_some() => self.expose_tcp(buf, cs.id),
                        (Some(r), Some(cs)) => self.expose_rdma(r, mode, &cs, buf, len, out),
                        (None, Some(_)) => Err("no RDMA resources".to_string()),
                    };
                    match exposed {
                        Ok(remote) => self.engine.handle_send_buffer_exposed(request, remote),
                        Err(e) => {
                            log::warn!("cannot expose a {len}-byte send buffer: {e}");
                            self.engine.handle_send_buffer_expose_failed(request);
                        }
                    }
                }
                Action::ReleaseSendBuffer { buf, .. } => {
                    if !self.release(buf, 0) {
                        self.held.push((buf, None));
                    }
                }
                Action::RdmaRead {
                    conn,
                    request,
                    remote,
                    len,
                    dst,
                    dst_offset,
                } => {
                    if let Err(e) =
                        self.post_read(rdma, mode, conn, request, remote, len, dst, dst_offset, out)
                    {
                        log::warn!("cannot read {len} bytes on {conn:?}: {e}");
                        self.engine.handle_read_complete(request, dst_offset, false);
                    }
                }
                Action::CopyFromRecvBuf {
                    src,
                    src_offset,
                    len,
                    dst,
                    dst_offset,
                } => {
                    let copied = match (self.recv_held.get(&src.0), self.user_bufs.get_mut(&dst)) {
                        (Some(b), Some(mem)) => b
                            .get(src_offset..src_offset + len)
                            .is_some_and(|data| mem.write_at(dst_offset, data)),
                        _ => false,
                    };
                    if !copied {
                        log::error!("eager copy of {len} bytes into {dst:?} out of range");
                    }
                }
                Action::CopyToUser {
                    dst,
                    dst_offset,
                    data,
                } => {
                    let copied = self
                        .user_bufs
                        .get_mut(&dst)
                        .is_some_and(|mem| mem.write_at(dst_offset, &data));
                    if !copied {
                        log::error!("copy of {} bytes into {dst:?} out of range", data.len());
                    }
                }
                Action::RepostRecv { buf } => {
                    if let Some(RecvBuf::Rdma(b)) = self.recv_held.remove(&buf.0) {
                        out.reposts.push((b, buf.0));
                    }
                }
                Action::Complete(c) => self.complete(c, out),
                Action::CloseConnection { conn, reason } => {
                    let why = match &reason {
                        CloseReason::Local => "closed locally".to_string(),
                        CloseReason::ProtocolError(e) => format!("protocol error: {e}"),
                        CloseReason::PeerError(status) => {
                            format!("the peer reported an error ({status:?}) and closed")
                        }
                        CloseReason::SendFailed => {
                            "a send or READ failed: the connection is broken".to_string()
                        }
                    };
                    match &reason {
                        CloseReason::Local => log::debug!("{conn:?}: closed locally"),
                        _ => log::warn!("{conn:?}: closing: {why}"),
                    }
                    if let Some(cs) = self.conns.get(&conn).cloned() {
                        self.start_closing(&cs, why, out);
                    }
                }
            }
        }
        // Every frame's buffer is reposted by the engine at once; anything left is a bug in
        // the driver or the engine, so put it back rather than lose SRQ depth.
        if !self.recv_held.is_empty() {
            log::error!("{} receive buffers were not reposted", self.recv_held.len());
            out.reposts
                .extend(self.recv_held.drain().filter_map(|(id, b)| match b {
                    RecvBuf::Rdma(b) => Some((b, id)),
                    RecvBuf::Tcp(_) => None,
                }));
        }
    }

    fn send_frame(
        &mut self,
        rdma: Option<&Rdma>,
        conn: ConnId,
        frame: &[u8],
        payload: Option<rdmx_proto::PayloadRef>,
        out: &mut AfterUnlock,
    ) {
        let Some(cs) = self.conns.get(&conn).cloned() else {
            log::debug!("frame for closed {conn:?} dropped");
            return;
        };
        let data: &[u8] = match payload {
            Some(p) => match self
                .user_bufs
                .get(&p.buf)
                .and_then(|m| m.head(p.len as usize))
            {
                Some(d) => d,
                None => {
                    log::error!("eager payload of {} bytes unavailable", p.len);
                    return;
                }
            },
            None => &[],
        };
        let link = match &cs.link {
            Link::Tcp(link) => {
                link.queue_frame(frame, data);
                out.flush(&cs);
                return;
            }
            Link::Rdma(link) => link,
        };
        let total = frame.len() + data.len();
        let item = if total <= link.max_inline() {
            let mut v = Vec::with_capacity(total);
            v.extend_from_slice(frame);
            v.extend_from_slice(data);
            Outgoing::Inline(v)
        } else {
            let Some(rdma) = rdma else { return };
            if total > self.send_pool.buf_len() {
                log::error!("a {total}-byte frame exceeds the send buffers");
                return;
            }
            let mut buf = match self.send_pool.take(&rdma.pd) {
                Ok(b) => b,
                Err(e) => {
                    log::error!("no send buffer: {e}");
                    self.engine.handle_send_complete(conn, false);
                    return;
                }
            };
            buf[..frame.len()].copy_from_slice(frame);
            buf[frame.len()..total].copy_from_slice(data);
            Outgoing::Frame { buf, len: total }
        };
        link.push(item);
        out.flush(&cs);
    }

    #[allow(clippy::too_many_arguments)]
    fn post_read(
        &mut self,
        rdma: Option<&Rdma>,
        mode: RndvRegistration,
        conn: ConnId,
        request: RequestId,
        remote: RemoteBuf,
        len: u64,
        dst: UserBufId,
        dst_offset: u64,
        out: &mut AfterUnlock,
    ) -> Result<(), String> {
        let cs = self
            .conns
            .get(&conn)
            .cloned()
            .ok_or("the connection is closed")?;
        let key = self.next_read;
        if let Link::Tcp(link) = &cs.link {
            // Lend the destination to the link, which writes the READ data straight into it.
            let mem = self
                .user_bufs
                .get_mut(&dst)
                .ok_or("the receive buffer is gone")?;
            if let UserMem::Plain(vec) = std::mem::replace(mem, UserMem::Lent) {
                link.lend(dst.0, vec);
            }
            if let Err(e) = link.expect_read(key, dst.0, dst_offset as usize, len as usize) {
                if let Some(vec) = link.reclaim(dst.0) {
                    *mem = UserMem::Plain(vec);
                }
                return Err(e.to_string());
            }
            link.queue_read_request(key, remote.addr, remote.rkey, len);
        }
        self.next_read = (self.next_read + 1) & !COOKIE_KIND;
        self.reads.insert(
            key,
            ReadCtx {
                conn,
                request,
                buf: dst,
                off: dst_offset,
            },
        );
        let link = match &cs.link {
            Link::Tcp(_) => {
                out.flush(&cs);
                return Ok(());
            }
            Link::Rdma(link) => link,
        };
        let rdma = rdma.ok_or("no RDMA resources")?;
        let mem = self
            .user_bufs
            .get_mut(&dst)
            .ok_or("the receive buffer is gone")?;
        if let Err(e) = mem.register(mode, &rdma.pd, &mut self.rcache, Access::LOCAL_WRITE, true) {
            self.reads.remove(&key);
            return Err(e);
        }
        let Some(target) = mem.take_range(dst_offset, len) else {
            self.reads.remove(&key);
            return Err("the READ falls outside the receive buffer".into());
        };
        link.push(Outgoing::Read {
            target,
            len: len as usize,
            remote: rdmx_conn::RemoteBuf {
                addr: remote.addr,
                len: len as u32,
                rkey: remote.rkey,
            },
            cookie: COOKIE_READ | key,
        });
        out.flush(&cs);
        Ok(())
    }

    /// Ends a buffer's exposure or registration (copying `copy_back` bytes back from a
    /// staged receive), leaving it plain memory when nothing else holds it.
    ///
    /// The buffer's memory window goes first: it kills the rkey, and neither the buffer nor
    /// a staging region may be reused while a window over it could still be bound. False when
    /// the window cannot be invalidated yet (its bind is still posted): then nothing is
    /// released, and the caller must try again once completions were polled.
    fn release(&mut self, buf: UserBufId, copy_back: u64) -> bool {
        if let Some(window) = self.windows.remove(&buf) {
            if let Err(window) = window.invalidate() {
                self.windows.insert(buf, window);
                return false;
            }
        }
        let Some(mem) = self.user_bufs.get_mut(&buf) else {
            return true;
        };
        if let Some(key) = mem.exposure_key() {
            self.exposed.remove(&key);
        }
        mem.unregister(&mut self.rcache, copy_back);
        true
    }

    /// Retries what waited for a window to die (see [`Protocol::release`]).
    fn release_held(&mut self, out: &mut AfterUnlock) {
        for (buf, done) in std::mem::take(&mut self.held) {
            let copy_back = match &done {
                Some((_, c)) if c.status == Status::Ok => c.length,
                _ => 0,
            };
            if !self.release(buf, copy_back) {
                self.held.push((buf, done));
            } else if let Some((p, c)) = done {
                self.hand_back(p, c, out);
            }
        }
    }

    /// RDMA: makes `len` bytes of a send buffer readable by the peer of `cs` alone, while the
    /// rendezvous runs. Where the device has memory windows, the buffer is registered
    /// without remote access and a window bound to the connection's QP exposes exactly the
    /// message (posted before the RTS, so it is in place when the peer reads). Otherwise the
    /// buffer is registered in place with remote read for this one operation (never through
    /// the cache, whose regions outlive the message).
    fn expose_rdma(
        &mut self,
        rdma: &Rdma,
        mode: RndvRegistration,
        cs: &Arc<Conn>,
        buf: UserBufId,
        len: u64,
        out: &mut AfterUnlock,
    ) -> Result<RemoteBuf, String> {
        let link = cs.rdma().ok_or("not an RDMA connection")?;
        let mem = self
            .user_bufs
            .get_mut(&buf)
            .ok_or("the send buffer is gone")?;
        if !rdma.windows {
            mem.register(
                RndvRegistration::PerOperation,
                &rdma.pd,
                &mut self.rcache,
                Access::REMOTE_READ,
                false,
            )?;
            let r = mem.remote().ok_or("no remote key")?;
            return Ok(RemoteBuf {
                addr: r.addr,
                rkey: r.rkey,
            });
        }
        mem.register(mode, &rdma.pd, &mut self.rcache, Access::WINDOW_READ, false)?;
        let head = mem
            .registered()
            .ok_or("the send buffer is not registered")?;
        let len = usize::try_from(len).map_err(|_| "the message is too long")?;
        let window = MemoryWindow::new(head, len).map_err(|e| e.to_string())?;
        let remote = RemoteBuf {
            addr: window.addr(),
            rkey: window.rkey(),
        };
        link.push(Outgoing::Bind(window.clone()));
        out.flush(cs);
        self.windows.insert(buf, window);
        Ok(remote)
    }

    /// TCP: exposes a send buffer to READ requests arriving on `conn`, under a fresh random
    /// key; addresses are offsets into the buffer.
    fn expose_tcp(&mut self, buf: UserBufId, conn: ConnId) -> Result<RemoteBuf, String> {
        let mem = self
            .user_bufs
            .get_mut(&buf)
            .ok_or("the send buffer is gone")?;
        let UserMem::Plain(vec) = std::mem::replace(mem, UserMem::Lost) else {
            return Err("the send buffer is already exposed".into());
        };
        let key = loop {
            let k = self.keys.next_u32();
            if k != 0 && !self.exposed.contains_key(&k) {
                break k;
            }
        };
        *mem = UserMem::Exposed {
            data: Arc::new(vec),
            key,
        };
        self.exposed.insert(key, Exposure { buf, conn });
        Ok(RemoteBuf { addr: 0, rkey: key })
    }

    /// TCP: answers a peer's READ request from the buffer exposed to that peer under the
    /// request's key, streaming straight from it. A key exposed to another endpoint is a
    /// protocol error that closes the asking endpoint; anything else that does not name
    /// bytes exposed to it (an unknown key, a range past the buffer) gets a failure.
    fn answer_read(
        &mut self,
        cs: &Arc<Conn>,
        read_id: u64,
        (addr, rkey, len): (u64, u32, u64),
        out: &mut AfterUnlock,
    ) {
        let Some(link) = cs.tcp() else { return };
        let exposure = self.exposed.get(&rkey);
        if exposure.is_some_and(|e| e.conn != cs.id) {
            log::warn!(
                "{:?}: {:?} asked to READ a buffer exposed to another endpoint",
                cs.id,
                cs.peer
            );
            link.queue_read_data(read_id, false, None);
            out.flush(cs);
            self.tcp_down(
                cs,
                "protocol error: READ request for a buffer exposed to another endpoint".to_string(),
                out,
            );
            return;
        }
        let data = exposure
            .and_then(|e| match self.user_bufs.get(&e.buf) {
                Some(UserMem::Exposed { data, .. }) => Some(data.clone()),
                _ => None,
            })
            .filter(|d| {
                addr.checked_add(len)
                    .is_some_and(|end| end <= d.len() as u64)
            });
        match data {
            Some(d) => link.queue_read_data(read_id, true, Some((d, addr as usize, len as usize))),
            None => {
                log::debug!("{:?}: READ request for bytes not exposed", cs.id);
                link.queue_read_data(read_id, false, None);
            }
        }
        out.flush(cs);
    }

    fn on_tcp_event(&mut self, cs: &Arc<Conn>, ev: rdmx_tcp::Event, out: &mut AfterUnlock) {
        match ev {
            rdmx_tcp::Event::Frame(bytes) => {
                if cs.is_closing() {
                    return;
                }
                let id = self.next_tcp_frame;
                self.next_tcp_frame += 1;
                self.engine.handle_frame(cs.id, RecvBufId(id), &bytes);
                self.recv_held.insert(id, RecvBuf::Tcp(bytes));
            }
            rdmx_tcp::Event::ReadRequest {
                read_id,
                addr,
                rkey,
                len,
            } => self.answer_read(cs, read_id, (addr, rkey, len), out),
            rdmx_tcp::Event::ReadDone { read_id, ok } => {
                self.read_done(read_id, None, ok, true, out)
            }
            rdmx_tcp::Event::Closed { reason } => {
                if !cs.is_closing() {
                    log::info!("{:?}: {:?} closed: {reason}", cs.id, cs.peer);
                }
                self.tcp_down(cs, format!("connection lost: {reason}"), out);
            }
        }
    }

    /// TCP: takes back every buffer lent to the link as a READ destination.
    fn reclaim_lent(&mut self, cs: &Conn) {
        if let Some(link) = cs.tcp() {
            for (key, vec) in link.reclaim_all() {
                if let Some(mem) = self.user_bufs.get_mut(&UserBufId(key)) {
                    *mem = UserMem::Plain(vec);
                }
            }
        }
    }

    /// TCP: the link is gone. Its requests fail, its lent buffers come back, and every READ
    /// it owed is reported failed.
    fn tcp_down(&mut self, cs: &Arc<Conn>, reason: String, out: &mut AfterUnlock) {
        self.engine.handle_connection_down(cs.id);
        self.reclaim_lent(cs);
        let owed: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, r)| r.conn == cs.id)
            .map(|(&k, _)| k)
            .collect();
        for key in owed {
            self.read_done(key, None, false, true, out);
        }
        self.start_closing(cs, reason, out);
    }

    fn complete(&mut self, c: rdmx_proto::Completion, out: &mut AfterUnlock) {
        let Some(p) = self.reqs.remove(&c.request) else {
            return;
        };
        if let Some(cs) = &p.conn {
            cs.pending_sends.fetch_sub(1, Ordering::AcqRel);
        }
        if !self.release(p.buf, if c.status == Status::Ok { c.length } else { 0 }) {
            // A bind of its window is still posted: the buffer comes back once it is dead.
            self.held.retain(|(b, _)| *b != p.buf);
            self.held.push((p.buf, Some((p, c))));
            return;
        }
        self.hand_back(p, c, out);
    }

    /// Hands a completed request its buffer (released already) and its outcome.
    fn hand_back(&mut self, p: Tracked, c: rdmx_proto::Completion, out: &mut AfterUnlock) {
        let buf = match self.user_bufs.remove(&p.buf) {
            Some(mem) => {
                if mem.in_flight() {
                    // A READ into it was never reported (connection died): the worker keeps
                    // it until the READ completes or the connection is destroyed.
                    self.user_bufs.insert(p.buf, mem);
                    self.orphans.insert(p.buf);
                    Vec::new()
                } else {
                    mem.into_vec().unwrap_or_default()
                }
            }
            None => Vec::new(),
        };
        p.cell.finish(Outcome {
            status: c.status,
            length: c.length,
            tag: c.tag,
            buf,
        });
        out.wake = true;
    }
}
