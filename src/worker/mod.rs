//! The worker: the public [`Worker`] handle and API, and the types its parts share. The
//! parts, each in a module of its own:
//!
//! * `driver`: the [`Driver`] behind every handle, and its lock discipline (the protocol
//!   state under one short-held lock, posting after releasing it);
//! * `progress`: making progress and waiting for it;
//! * `executor`: carrying out the protocol engine's actions;
//! * `events`: what the transports report (completions, frames, connection events);
//! * `closing`: closing connections and reaping them;
//! * `one_sided`: starting one-sided operations, flushes and fences;
//! * `setup`: listening and connecting;
//! * `accepting`: accepts whose setup waits on the peer, which a listener keeps among many;
//! * `event_loop`: driving the worker from an event loop (its fd, arming it) and the tasks
//!   awaiting its requests.

mod accepting;
mod closing;
mod driver;
mod event_loop;
pub(crate) use event_loop::POLL_SPINS;
mod events;
mod executor;
#[cfg(test)]
mod in_memory_fabric_tests;
#[cfg(test)]
mod in_memory_tests;
mod one_sided;
mod progress;
mod requests;
mod setup;
mod sleepers;

pub(crate) use accepting::{PendingAccept, Started};
pub use event_loop::LoopDriver;
pub(crate) use one_sided::Start;
use requests::DoneFlags;
pub(crate) use requests::RequestKey;
use requests::RequestTable;
use sleepers::Sleepers;
pub(crate) use sleepers::WaitFor;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
#[cfg(feature = "rdma")]
use rdmx_conn::{AddrInfo, Device, Side};
use rdmx_proto::{
    Action, CloseReason, ConnId, ConnLimits, ConnStats, Engine, Handshake, ProbeInfo, RemoteBuf,
    RequestId, RequestKind, Status, Tag, UserBufId, VerbsFailure,
};
use smallvec::SmallVec;

use crate::config::{Config, WaitMode};
use crate::context::Context;
use crate::ep::Ep;
use crate::error::{rejected, Error, Result};
use crate::hot_lock::HotLock;
use crate::listener::Listener;
use crate::message::Message;
use crate::readiness::{Interest, Ready, Registry, Waker};
use crate::request::{Describe, Outcome, Request};
use crate::transport::{
    Conn, Deferred, Ifaces, LinkEvent, LockedIfaces, PollScratch, Queued, ReadOp, ReadPiece,
    RecvFrame, RmaWork, Transport, TransportLink, READ_KEY_MASK,
};
use crate::usermem::{SendData, UserMem};
use driver::Made;

const TOKEN_WAKER: u64 = 0;
/// A connection's own fd (TCP socket, shared memory's hang-up socket) is registered as
/// `TOKEN_CONN + its ConnId`; the tokens between `TOKEN_WAKER` and it are the transports'
/// worker-wide fds ([`Ifaces::ready`]), among them RDMA's one rdmacm event channel, through
/// which every RDMA connection's events come.
const TOKEN_CONN: u64 = 1 << 32;
/// How often a progressing worker checks its connections' rdmacm events (and looks after
/// closing connections).
const CM_CHECK_INTERVAL: Duration = Duration::from_millis(5);
/// How long a closing connection may take to drain before it is destroyed anyway.
const REAP_TIMEOUT: Duration = Duration::from_secs(2);

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
/// and each endpoint's work is posted under that endpoint's own lock, after the worker-wide
/// one is released — except a small frame on an RDMA endpoint with nothing queued, which is
/// posted at once (one doorbell).
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
    /// Receive buffers on the SRQ: the pool every endpoint's credit window is granted from.
    pub srq_depth: u32,
    /// Bytes the worker holds for receiving, independent of the number of endpoints: RDMA,
    /// the receive buffers on the SRQ; TCP, the one buffer all its connections are read
    /// through, plus what the connections hold between progress calls (a frame partly
    /// read, a few recycled frame buffers each).
    pub recv_buffer_bytes: u64,
    /// What the credit pool did so far: credits granted to peers now, grown on demand,
    /// requests it could not serve, credits taken back.
    pub credits: rdmx_proto::CreditStats,
    /// Times the SRQ ran low (`IBV_EVENT_SRQ_LIMIT_REACHED`) and its reserve of receive
    /// buffers was posted before it ran dry.
    pub srq_limit_events: u64,
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
    /// Bytes the worker holds for them (eager payloads, and 64 bytes per message): against
    /// [`crate::Config::max_unexpected`].
    pub unexpected_bytes: u64,
    /// Credits withheld from peers whose unexpected messages hold more than their share of
    /// [`crate::Config::max_unexpected`]: those peers' sends wait for them.
    pub withheld_credits: u64,
    /// User buffers the worker holds for requests not yet handed back (sends in flight,
    /// posted receives, rendezvous buffers a peer may still read).
    pub user_buffers: usize,
    /// Rendezvous READs issued and not yet complete.
    pub reads_in_flight: usize,
    /// Connections the worker still tracks, including closed ones whose last work is
    /// draining (they are reaped once it is done).
    pub connections: usize,
    /// Regions mapped for remote access ([`Worker::mem_map`]) and not yet unmapped.
    pub mapped_regions: usize,
    /// Bytes the connections' output queues hold for peers that have not read them yet, as
    /// counted against each connection's bound: over TCP its output queue (copied frames
    /// and small messages, and the queue's slots for items), over shared memory what waits
    /// for room in its send ring (frames, and answers to the peer's GETs); a READ or GET
    /// answer's data is the send buffer itself, not counted. See the crate docs, "Bounds".
    pub send_queue_bytes: u64,
    /// Connections whose input the worker stopped reading because their output queue went
    /// above its limit: their peers asked for more than they read.
    pub paused_inputs: usize,
}

/// What a completed receive got: the sender's tag and the message length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvInfo {
    /// The sender's tag.
    pub tag: Tag,
    /// The message length in bytes.
    pub length: usize,
    /// The endpoint it came from, as [`Ep::id`] names it.
    pub conn: Option<ConnId>,
}

pub(crate) struct Driver {
    /// This driver, for the hooks of resources made later (RDMA's event channel).
    me: Weak<Driver>,
    pub(crate) cfg: Config,
    mode: WaitMode,
    /// The transports this worker uses, in order of preference.
    pub(crate) transports: Vec<Transport>,
    /// Open links whose frames arrive on their own fd (progress reads the connections'
    /// readiness at every call only when there are some).
    fd_links: AtomicUsize,
    /// Open links.
    links: AtomicUsize,
    state: HotLock<Protocol>,
    /// The request table's done flags, which request handles read without a lock.
    pub(crate) done_flags: Arc<DoneFlags>,
    /// The transports' worker-wide parts used without the protocol lock.
    ifaces: Ifaces,
    /// The connections by id, readable without the protocol lock (readiness names them).
    conn_list: RwLock<HashMap<u64, Arc<Conn>>>,
    /// Held by the thread progressing; its buffers are reused call after call.
    progress_lock: HotLock<Scratch>,
    waiter: Mutex<()>,
    /// The regions mapped for remote access (`crate::rma`).
    pub(crate) regions: Arc<crate::rma::SharedRegions>,
    registry: Registry,
    waker: Waker,
    /// Threads asleep in waits, woken by what they wait for.
    sleepers: Sleepers,
    cm_due: AtomicBool,
    /// A link whose input was paused resumed with input it held back: the next
    /// housekeeping progress call polls the links that hold some (no readiness reports
    /// them; see [`Driver::resume_held`]).
    held_due: AtomicBool,
    last_cm_check: AtomicU64,
    next_timer: AtomicU64,
    failures_pending: AtomicBool,
    housekeeping_pending: AtomicBool,
    /// The accepts under way of the worker's listeners, which its progress moves on too
    /// (see `crate::listener`); whether there are listeners, told without the lock.
    accepts: Mutex<Vec<Weak<crate::listener::Accepts>>>,
    has_accepts: AtomicBool,
    pub(crate) progress_thread: AtomicBool,
    /// Drivers of the worker in event loops ([`Worker::count_loop_driver`]).
    loop_drivers: AtomicUsize,
    next_conn: AtomicU64,
    _ctx: Context,
}

/// What a progress call reuses, so that it allocates nothing when there is nothing new.
struct Scratch {
    ready: Vec<Ready>,
    /// What failed posts reported, in order.
    failed_posts: Vec<LinkEvent>,
    /// What the links reported, in order.
    events: Vec<LinkEvent>,
    /// Links whose input paused as their events were delivered, and the rest of their
    /// events, to give back to them (see `Driver::deliver_events`).
    holding: Vec<(ConnId, Vec<LinkEvent>)>,
    /// The links whose connection events came through a worker-wide channel (RDMA's).
    cm_ready: Vec<u64>,
    transport: PollScratch,
    /// What a progress call leaves for after the state lock, not made and dropped call after
    /// call: [`Driver::after_unlock`] leaves it empty but for its receive buffers to repost,
    /// which wait for a call that finds nothing to do (or [`REPOST_BATCH`] of them): off the
    /// path from a completion to its waiter.
    after: AfterUnlock,
    /// Progress calls in a row that found nothing, and the clock as the last full call read
    /// it (see [`Driver::progress_spinning`]).
    idle_calls: u32,
    last_now: u64,
}

/// How many receive buffers a progressing worker gathers at most before reposting them.
/// The SRQ holds thousands (`RDMX_SRQ_DEPTH`); these few are missing from it only until
/// the next progress call that finds no work.
const REPOST_BATCH: usize = 16;

/// A READ in flight (a rendezvous receive's), or a one-sided operation the NIC performs
/// (`rma`), under its key.
struct ReadCtx {
    conn: ConnId,
    request: RequestId,
    buf: UserBufId,
    off: u64,
    rma: bool,
    /// A one-sided operation through a bounce buffer: its bytes, and whether they are to be
    /// copied from the buffer into the request's (a get's).
    bounce: Option<(u64, bool)>,
}

/// How a READ or one-sided operation ended, as its link reported it.
#[derive(Clone, Copy)]
struct WorkEnd {
    ok: bool,
    /// The peer's NIC refused the access.
    refused: bool,
    /// An atomic operation's old value.
    value: u64,
}

impl WorkEnd {
    /// Failed, nothing more known (the work was lost or could not be posted).
    const FAILED: WorkEnd = WorkEnd {
        ok: false,
        refused: false,
        value: 0,
    };
}

struct Protocol {
    engine: Engine,
    /// Buffers of completed requests that a READ still targets.
    orphans: HashSet<UserBufId>,
    /// The requests the handles name, with their buffers and outcomes.
    requests: RequestTable,
    /// The transports' worker-wide state under this lock.
    ifaces: LockedIfaces,
    /// Buffers whose window could not be invalidated yet (a bind of it is still posted),
    /// with the completion of their request if it is done: released, and the completion
    /// handed out, once the window is dead.
    held: Vec<(UserBufId, Option<rdmx_proto::Completion>)>,
    /// The engine's unexpected arrivals as of the last wake-up.
    arrivals_seen: u64,
    /// The completion of a receive the engine completed as it was made
    /// (`RequestId::is_immediate`), for `Worker::tag_recv` to take.
    immediate_recv: Option<rdmx_proto::Completion>,
    conns: HashMap<ConnId, Arc<Conn>>,
    reads: HashMap<u64, ReadCtx>,
    next_read: u64,
    /// Closing connections and when they started closing (coarse clock, ns).
    closing: Vec<(ConnId, u64)>,
    /// Buffers of rendezvous sends over shared memory that timed out
    /// ([`Status::TimedOut`]): the peer may still read them by CMA, which cannot be refused,
    /// so they stay here, unchanged, until their connection is destroyed.
    kept: Vec<(ConnId, UserMem)>,
    /// Endpoints whose last handle was dropped with sends in flight, and when to give up
    /// on those (coarse clock, ns).
    lingering: Vec<(Arc<Conn>, u64)>,
}

/// Work to do after releasing the state lock.
#[derive(Default)]
struct AfterUnlock {
    /// Connections with output to post or write.
    flush: SmallVec<[Arc<Conn>; 2]>,
    /// Transport work (reposting receive buffers).
    deferred: Deferred,
    reaped: Vec<Arc<Conn>>,
    /// News a blocked thread may be waiting for (a message arrived unexpected, a send's
    /// work completed, a connection started closing): wake the threads waiting for news.
    news: bool,
    /// The request slots of requests that completed: wake the threads waiting for them.
    completed: SmallVec<[u32; 8]>,
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
        let mut engine = Engine::new(cfg.proto()?);
        // Peers' one-sided operations over messages reach the worker's mapped regions.
        let regions = Arc::new(crate::rma::SharedRegions::new());
        engine.set_rma_memory(regions.clone());
        let ifaces = Ifaces::new();
        let done_flags = Arc::new(DoneFlags::default());
        let registry = Registry::new().map_err(|e| Error::os("epoll_create1", e))?;
        let waker = Waker::new().map_err(|e| Error::os("eventfd", e))?;
        registry
            .add(waker.fd(), TOKEN_WAKER, Interest::Read)
            .map_err(|e| Error::os("epoll_ctl", e))?;
        let driver = Arc::new_cyclic(|me| Driver {
            me: me.clone(),
            mode: cfg.wait_mode(),
            transports: ctx.transports().to_vec(),
            fd_links: AtomicUsize::new(0),
            links: AtomicUsize::new(0),
            state: HotLock::new(Protocol {
                engine,
                orphans: HashSet::default(),
                requests: RequestTable::new(done_flags.clone()),
                ifaces: ifaces.locked(&cfg),
                held: Vec::new(),
                arrivals_seen: 0,
                immediate_recv: None,
                conns: HashMap::default(),
                reads: HashMap::default(),
                next_read: 0,
                closing: Vec::new(),
                kept: Vec::new(),
                lingering: Vec::new(),
            }),
            done_flags,
            ifaces,
            conn_list: RwLock::new(HashMap::default()),
            progress_lock: HotLock::new(Scratch {
                ready: Vec::with_capacity(64),
                failed_posts: Vec::new(),
                events: Vec::new(),
                holding: Vec::new(),
                cm_ready: Vec::new(),
                transport: PollScratch::new(),
                after: AfterUnlock::default(),
                idle_calls: 0,
                last_now: 0,
            }),
            waiter: Mutex::new(()),
            regions,
            registry,
            waker,
            sleepers: Sleepers::default(),
            cm_due: AtomicBool::new(false),
            held_due: AtomicBool::new(false),
            last_cm_check: AtomicU64::new(0),
            next_timer: AtomicU64::new(u64::MAX),
            failures_pending: AtomicBool::new(false),
            housekeeping_pending: AtomicBool::new(false),
            accepts: Mutex::new(Vec::new()),
            has_accepts: AtomicBool::new(false),
            progress_thread: AtomicBool::new(false),
            loop_drivers: AtomicUsize::new(0),
            next_conn: AtomicU64::new(1),
            cfg,
            _ctx: ctx.clone(),
        });
        #[cfg(feature = "rdma")]
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
                            if sh.progress_spinning() == 0 {
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
    /// completion channel, the rdmacm event channel of its RDMA connections, its other
    /// connections' sockets and the worker's wake-up fd.
    /// In [`WaitMode::BusyPoll`] it spins on [`Worker::progress`].
    pub fn wait(&self, timeout: Option<Duration>) -> Result<usize> {
        match self.driver.mode {
            WaitMode::Event => self.driver.wait_events(timeout),
            WaitMode::BusyPoll => {
                let deadline = timeout.map(|t| Instant::now() + t);
                loop {
                    let n = self.driver.progress_spinning();
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

    /// Posts a tag receive into `buf` (its length is the capacity): it matches the first
    /// message whose tag equals `tag` on the bits set in `mask` (`0` matches any tag), from
    /// any endpoint of this worker, in the order messages arrived. A message longer than
    /// `buf` completes the request with [`Status::Truncated`] and is dropped.
    // (Inlined into the caller, as `Request::wait` is: as a call, the 64-byte request went
    // back through memory, written with 8-byte stores, and the caller's copy of it into its
    // queue read it with 16-byte loads the CPU cannot forward from them; with both inlined,
    // `tag_recv` and the example's receive loop fell from 31 % to 18 % of the shared-memory
    // receiver's perf samples. Callgrind, shm round trip: 3912 -> 3853 for the two.)
    #[inline(always)]
    pub fn tag_recv(&self, tag: Tag, mask: Tag, buf: Vec<u8>) -> Request {
        let what = Describe {
            kind: RequestKind::Recv,
            tag,
        };
        let sh = &self.driver;
        let mut guard = sh.state.lock();
        let st = &mut *guard;
        if st.engine.unexpected_len() == 0 {
            // Nothing arrived that it could match (the common case of a receive made before
            // its message): only posted, with nothing to run, post or wake.
            let cap = buf.len() as u64;
            let Protocol {
                engine, requests, ..
            } = st;
            let slot = requests.insert_open(UserMem::Plain(buf), |bufid| {
                engine.tag_recv(tag, mask, bufid, cap)
            });
            // (Every locked section runs the actions it caused before it ends.)
            debug_assert!(!st.engine.has_actions());
            drop(guard);
            return Request::new(self, slot, what);
        }
        let mut buf = buf;
        if let Some(c) = st.engine.tag_recv_now(tag, mask, &mut buf) {
            // Its message had arrived eagerly: copied in already, the buffer never entering
            // the request table (the common case of a receiver that fell behind its sender).
            let more = st.engine.has_actions();
            drop(guard);
            if more {
                // Taking it gave a peer its withheld credits back: their CREDIT frames.
                sh.run_pending();
            }
            let outcome = Outcome::of(&c, buf);
            return Request::done(outcome);
        }
        let cap = buf.len() as u64;
        let bufid = st.new_buf(UserMem::Plain(buf));
        let id = st.engine.tag_recv(tag, mask, bufid, cap);
        let (made, mut out) = if id.is_immediate() {
            // Its message had arrived: copied and completed by the actions just queued; it
            // never takes a slot.
            let mut out = AfterUnlock::default();
            st.run_actions(&mut out);
            let buf = st.take_buf(bufid);
            let outcome = match st.immediate_recv.take() {
                Some(c) => Outcome::of(&c, buf),
                None => {
                    log::error!("receive {id:?} done at once reported no completion");
                    Outcome {
                        status: Status::ConnectionClosed,
                        kind: RequestKind::Recv,
                        length: 0,
                        tag,
                        buf,
                        conn: None,
                    }
                }
            };
            (Made::Done(outcome), out)
        } else {
            let slot = st.requests.open(bufid, id, None);
            if !st.engine.has_actions() {
                // Posted, no message having matched it (the common case of a receive made
                // before its message): nothing to run, post or wake.
                drop(guard);
                return Request::new(self, slot, what);
            }
            (Made::Pending(slot), AfterUnlock::default())
        };
        sh.run(st, &mut out);
        drop(guard);
        sh.finish(&mut out);
        made.into_request(self, what)
    }

    /// Receives into `buf`, blocking until a message matches (see [`Worker::tag_recv`]).
    pub fn recv(&self, tag: Tag, mask: Tag, buf: &mut [u8]) -> Result<RecvInfo> {
        let done = self.tag_recv(tag, mask, vec![0; buf.len()]).wait()?;
        buf[..done.length].copy_from_slice(&done.buf[..done.length]);
        Ok(RecvInfo {
            tag: done.tag,
            length: done.length,
            conn: done.conn,
        })
    }

    /// Receives the next matching message whatever its size, blocking until one arrives:
    /// probes for it and takes it out of matching at once (a matched probe), then receives it
    /// into a buffer of its exact length. Any number of threads may call it on one worker:
    /// each message goes to exactly one of them, and the others wait for the next.
    pub fn recv_vec(&self, tag: Tag, mask: Tag) -> Result<(Vec<u8>, RecvInfo)> {
        self.recv_vec_until(tag, mask, None)
    }

    /// [`Worker::recv_vec`], waiting at most `timeout` for a matching message:
    /// [`Error::Timeout`] if none arrived by then. A message found in time is received
    /// whole, however long its data takes to arrive (it left matching when it was found, so
    /// giving up on it would lose it; a dead connection still ends the wait).
    pub fn recv_vec_timeout(
        &self,
        tag: Tag,
        mask: Tag,
        timeout: Duration,
    ) -> Result<(Vec<u8>, RecvInfo)> {
        self.recv_vec_until(tag, mask, Some(timeout))
    }

    fn recv_vec_until(
        &self,
        tag: Tag,
        mask: Tag,
        timeout: Option<Duration>,
    ) -> Result<(Vec<u8>, RecvInfo)> {
        let sh = &self.driver;
        let mut found = None;
        // A matched probe: the message is taken out of matching as it is found, so no other
        // receiving thread can take it before it is received here.
        sh.wait_until(
            WaitFor::News,
            || {
                if found.is_none() {
                    // (No actions follow a probe; and `done` may run under the wake-up lock,
                    // so it must not run actions, which may wake.)
                    found = sh.state.lock().engine.probe_remove(tag, mask);
                }
                found.is_some()
            },
            timeout.map(|t| Instant::now() + t),
        );
        let Some(info) = found else {
            return Err(Error::Timeout(
                timeout.unwrap_or_default(),
                format!("no message matching tag {tag:#x} (mask {mask:#x}) arrived"),
            ));
        };
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
                conn: done.conn,
            },
        ))
    }

    /// Receives a value sent with [`Ep::send_obj`] (serde + bincode), blocking, with the
    /// message's tag and length (see [`Worker::recv_vec`]).
    pub fn recv_obj<T: serde::de::DeserializeOwned>(
        &self,
        tag: Tag,
        mask: Tag,
    ) -> Result<(T, RecvInfo)> {
        let (buf, info) = self.recv_vec(tag, mask)?;
        Ok((decode_obj(&buf[..info.length])?, info))
    }

    /// [`Worker::recv_obj`], waiting at most `timeout` for a matching message (see
    /// [`Worker::recv_vec_timeout`]).
    pub fn recv_obj_timeout<T: serde::de::DeserializeOwned>(
        &self,
        tag: Tag,
        mask: Tag,
        timeout: Duration,
    ) -> Result<(T, RecvInfo)> {
        let (buf, info) = self.recv_vec_timeout(tag, mask, timeout)?;
        Ok((decode_obj(&buf[..info.length])?, info))
    }

    /// A matched probe: takes the first unexpected message matching `tag`/`mask` out of
    /// matching (progressing once first), to be received exactly with [`Message::recv`] —
    /// no other receive, on any thread, can take it in between. `None` when none is there.
    pub fn probe_remove(&self, tag: Tag, mask: Tag) -> Option<Message> {
        self.progress();
        let info = self.driver.state.lock().engine.probe_remove(tag, mask)?;
        Some(Message::new(self, info))
    }

    /// Looks for an unexpected message matching `tag`/`mask` without receiving it.
    pub fn probe(&self, tag: Tag, mask: Tag) -> Option<ProbeInfo> {
        self.progress();
        self.driver.state.lock().engine.probe(tag, mask)
    }

    pub(crate) fn msg_recv(&self, info: ProbeInfo, buf: Vec<u8>) -> Request {
        let made = self.driver.with_protocol(|st| {
            // (Its capacity is the buffer's: one shorter than the message is Truncated.)
            let cap = buf.len() as u64;
            let bufid = st.new_buf(UserMem::Plain(buf));
            match st.engine.msg_recv(info.msg, bufid, cap) {
                Some(id) => Made::Pending(st.requests.open(bufid, id, None)),
                // Its connection is gone: refused at once, like a send on a closed endpoint.
                None => Made::Done(Outcome {
                    status: Status::ConnectionClosed,
                    kind: RequestKind::Recv,
                    length: 0,
                    tag: info.tag,
                    buf: st.take_buf(bufid),
                    conn: Some(info.conn),
                }),
            }
        });
        let what = Describe {
            kind: RequestKind::Recv,
            tag: info.tag,
        };
        made.into_request(self, what)
    }

    /// Resource figures, e.g. to check that receive memory does not grow with endpoints.
    pub fn stats(&self) -> WorkerStats {
        let sh = &self.driver;
        // The TCP read buffer is in the progress scratch; while another thread progresses,
        // it is counted at its size once used (64 KiB).
        let tcp_rbuf = sh
            .progress_lock
            .try_lock()
            .map_or(64 * 1024, |s| s.transport.tcp_rbuf.capacity() as u64);
        let (mut held, mut send_queue_bytes, mut paused_inputs) = (0, 0, 0);
        for c in sh.conn_list.read().values() {
            held += c.link.held_recv_bytes();
            send_queue_bytes += c.link.queued_bytes();
            paused_inputs += usize::from(c.link.input_paused());
        }
        let st = sh.state.lock();
        let usage = sh.ifaces.usage(&st.ifaces);
        WorkerStats {
            device: usage.device,
            eps: st.conns.len(),
            srq_depth: sh.cfg.srq_depth(),
            recv_buffer_bytes: usage.recv_buffer_bytes + tcp_rbuf + held,
            credits: st.engine.credit_stats(),
            srq_limit_events: usage.srq_limit_events,
            send_buffer_bytes: usage.send_buffer_bytes,
            rcache_bytes: usage.rcache_bytes,
            rcache_registrations: usage.rcache_registrations,
            pending_requests: st.engine.pending_requests(),
            unexpected_messages: st.engine.unexpected_len(),
            unexpected_bytes: st.engine.unexpected_bytes(),
            withheld_credits: st.engine.withheld_credits(),
            user_buffers: st.requests.buffers() + st.kept.len(),
            reads_in_flight: st.reads.len(),
            connections: sh.conn_list.read().len(),
            mapped_regions: sh.regions.lock().len(),
            send_queue_bytes: send_queue_bytes
                + sh.ifaces.shm.get().map_or(0, |s| s.queued_bytes() as u64),
            paused_inputs,
        }
    }
}

/// Decodes a value encoded by [`Ep::send_obj`].
fn decode_obj<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    use bincode::Options;
    Ok(crate::ep::codec().deserialize(bytes)?)
}
