//! # rdmx — message passing over RDMA, modelled on UCX's UCP
//!
//! ```text
//! Context ──worker()──▶ Worker ──connect(addr)──▶ Ep ──tag_send(tag, Vec<u8>)──▶ Request
//!                          │ └────listen(addr)──▶ Listener ──accept()──▶ Ep
//!                          └──tag_recv(tag, mask, Vec<u8>)──▶ Request ──wait()──▶ Done
//! ```
//!
//! * [`Context`]: configuration from the `RDMX_*` environment variables, overridden by
//!   [`ContextBuilder`]; [`Context::config`] lists every value with its source.
//! * [`Worker`]: one RDMA device's protection domain, completion queue, shared receive queue
//!   and buffer pools, and the progress engine. [`Worker::progress`] does the work;
//!   [`Worker::wait`] sleeps until there is some. Requests complete by progress — made by
//!   whoever waits on them, or by an optional progress thread.
//! * [`Ep`]: a reliable connection to a peer worker; [`Listener`]: accepts them.
//! * Tag messaging as in UCP: [`Ep::tag_send`] and [`Worker::tag_recv`] return a
//!   [`Request`] (test, wait, cancel); receives match `(msg_tag & mask) == (tag & mask)`
//!   (see *Semantics* below for ordering, cancel and close). Blocking helpers: [`Ep::send`],
//!   [`Worker::recv`],
//!   [`Worker::recv_vec`]; typed ones with serde + bincode: [`Ep::send_obj`],
//!   [`Worker::recv_obj`].
//! * Memory for one-sided operations, as UCP's `ucp_mem_map` and rkeys: [`Worker::mem_map`]
//!   maps a region with exactly the remote access asked for ([`RemoteAccess`]),
//!   [`MemHandle::pack_rkey`] packs its key for peers, [`Ep::unpack_rkey`] unpacks one
//!   ([`RemoteKey`]); the region is reached locally only by copies and atomic words (see
//!   [`MemHandle`] for why that is sound).
//!
//! ## Transports
//!
//! A worker runs its connections over RDMA (rdmacm + verbs: SRQ, RDMA READ) and over TCP,
//! with the same API, protocols and semantics, like UCX's tcp beside rc_verbs, and chooses
//! per connection: one worker holds RDMA and TCP endpoints at once. `RDMX_TRANSPORT` (or
//! [`ContextBuilder::transports`]) lists the transports in order of preference: `auto`
//! (default) is RDMA when rdmacm lists a device, then TCP; `rdma,tcp`, `tcp` and so on name
//! them; `rdma` alone where there is none is an error. [`Worker::connect`] uses the first
//! transport that reaches the peer (RDMA where a device routes to it and the peer listens
//! there), [`Worker::listen`] listens on each at one address and port (rdmacm's port space is
//! separate from TCP's), and [`Ep::transport`] says which an endpoint runs on. Each
//! connection has its transport's eager threshold and receive buffer size unless
//! `RDMX_EAGER_THRESHOLD` / `RDMX_RECV_BUF_SIZE` set them ([`Config::eager_threshold_for`]).
//! Over TCP a rendezvous keeps its shape: the receiver asks for the data and the
//! sender's progress engine streams it from the user's buffer (vectored writes, no staging
//! copy) straight into the receiver's buffer — so over TCP the *sender* must progress too
//! (on RDMA the READ is one-sided). Addresses are `host:port` on both.
//!
//! Underneath, [`proto`] is the sans-IO protocol engine (eager messages up to
//! `RDMX_EAGER_THRESHOLD`, rendezvous by RDMA READ above it, credit flow control) and
//! `conn` the safe rdmacm/verbs layer (`rdmx_conn`, present with the `rdma` feature).
//!
//! The `rdma` feature (on by default) brings RDMA; `--no-default-features` builds rdmx for
//! TCP alone, without rdma-core: the same API, where asking for RDMA is an error saying so.
//!
//! ## Example
//!
//! ```no_run
//! use rdmx::{Context, TAG_MASK_ALL};
//!
//! # fn main() -> rdmx::Result<()> {
//! let ctx = Context::new()?;
//! let server = ctx.worker()?;
//! let listener = server.listen("192.0.2.1:0")?;
//! let addr = listener.local_addr().unwrap().to_string();
//! let client = ctx.worker()?;
//! let t = std::thread::spawn(move || -> rdmx::Result<()> {
//!     let ep = client.connect(&addr)?;
//!     ep.send_obj(1, &("hello", 42u32))?;
//!     ep.tag_send(2, vec![7u8; 1 << 20]).wait()?; // 1 MiB: rendezvous
//!     ep.close()
//! });
//! let _ep = listener.accept()?;
//! let (greeting, info): ((String, u32), _) = server.recv_obj(1, TAG_MASK_ALL)?;
//! let big = server.tag_recv(2, TAG_MASK_ALL, vec![0; 1 << 20]).wait()?;
//! assert_eq!((greeting.1, info.tag, big.length), (42, 1, 1 << 20));
//! t.join().unwrap()?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Buffers and soundness
//!
//! Nonblocking calls take owned buffers (`Vec<u8>`): the buffer is moved into the
//! [`Request`] and handed back by [`Request::wait`] (or inside the error). While a request
//! runs only the worker can reach the buffer, so neither the NIC nor a peer can ever touch
//! memory the caller could free or reuse — `mem::forget` on a request leaks the buffer, and
//! dropping a request leaves it with the worker until the NIC is done. Borrowed slices are
//! only taken by blocking calls, which copy. A send may instead share its buffer
//! ([`Ep::tag_send_shared`], an `Arc<Vec<u8>>`): any number of sends, and the caller, hold
//! clones at once, and nobody can write the bytes while a clone is out (the NIC only reads
//! them; over RDMA the registration itself holds a clone, so forgetting a request cannot
//! free them under the NIC either).
//!
//! ## Many endpoints
//!
//! A worker serves any number of endpoints from one pool of receive buffers (its SRQ,
//! `RDMX_SRQ_DEPTH`; over TCP the pool bounds the frames in flight, and all connections
//! are read through one buffer). Nothing is reserved per endpoint: each peer's window of
//! frames in flight starts at a 128th of the pool's free buffers (at least 4) and doubles
//! on demand, up to `RDMX_CREDITS`, while the pool has buffers to spare; when it has none,
//! larger windows shrink as their credits come back. Past about 390 endpoints with the
//! defaults the initial windows overcommit the pool: an eighth more receive buffers are
//! held in reserve, and when the SRQ runs low the device says so
//! (`IBV_EVENT_SRQ_LIMIT_REACHED`), the reserve is posted and windows shrink, before the
//! SRQ runs dry; RC's RNR retry (over TCP, the socket's own flow control) holds a sender
//! back until a buffer is free. Receive memory does not grow with endpoints;
//! [`WorkerStats`] reports it, the pool's figures and the SRQ limit events.
//!
//! ## Memory registration
//!
//! Eager messages are copied through registered send buffers and the SRQ's receive
//! buffers. A rendezvous message needs NIC access to the user's buffer, in one of two ways:
//!
//! * [`RndvRegistration::PerOperation`] registers the user's buffer itself when the
//!   rendezvous starts and deregisters it when it ends: zero-copy, and the rkey a peer got
//!   stops working at once.
//! * [`RndvRegistration::Cache`] stages the data through regions of a registration cache
//!   (registered once, reused, at most `RDMX_RCACHE_SIZE` bytes kept): no registration on
//!   the data path, but a copy on each side (and, for sends, a wipe of the staged bytes).
//!
//! The default, [`RndvRegistration::Auto`] (`RDMX_RNDV_REG=auto`), uses the cache below
//! [`RndvRegistration::AUTO_CACHE_BELOW`] (64 KiB) and per-operation registration from
//! there up. It was chosen by measuring both on the rendezvous path with
//! `examples/rndv_reg.rs` on Soft-RoCE: a registration plus deregistration cost about
//! 200–260 µs whatever the size up to 1 MiB, a copy about 80 µs at 16 KiB and 300 µs at
//! 64 KiB, so two copies win below ~64 KiB and lose above (whole messages: the cache was
//! 18 % faster at 16 KiB, per-operation 6–13 % faster at 64 KiB–4 MiB, within the guest's
//! noise at 1 MiB). Exposing each send through a memory window (below) adds a window's
//! allocation and deallocation (60–115 µs in the guest, against 110–690 µs for a registration
//! and deregistration), one bind work request and, through the cache, a wipe of the staged
//! bytes: in two alternating runs of old and new code, 16 KiB messages through the cache took
//! 1305–1766 µs against 1175–1432 µs before, and from 64 KiB up (per-operation) the
//! difference was within the guest's noise.
//!
//! What stays readable: **a rendezvous key gives access to exactly the bytes of one message,
//! for the one peer it was sent to, while that message is in flight.** Over RDMA, on devices
//! with memory windows (rxe and current NICs), the buffer or staging region is registered
//! without any remote access and a type-2 window bound to that peer's QP exposes the message
//! for READ from the RTS until the transfer ends (ATS, cancel or disconnect), when the window
//! is deallocated — before the buffer is handed back or a staging region reused, and staging
//! regions are wiped before reuse (rxe checks a window's READs against the region under it, so
//! the rest of the region reads as zeros). On a device without windows, sends are registered
//! per operation whatever `RDMX_RNDV_REG` says, and deregistered when the transfer ends. Over
//! TCP an exposure is bound to its connection under a random key: a READ request naming a
//! buffer exposed to another endpoint closes the asking endpoint as a protocol error. Receive
//! buffers, READ targets and eager send buffers are never remotely accessible, and nothing
//! ever grants REMOTE_WRITE (rdmx-conn's `Access` cannot express it).
//!
//! ## Semantics: ordering, cancel, close
//!
//! * **Ordering.** Messages from one endpoint match receives in the order they were sent
//!   (MPI's non-overtaking rule), eager and rendezvous alike; messages from different
//!   endpoints interleave in arrival order. A receive matches the oldest arrived message
//!   that fits its tag and mask, and a message the oldest posted receive that fits it.
//!   Every receive says which endpoint its message came from ([`Done::conn`],
//!   [`RecvInfo::conn`], [`ProbeInfo::conn`], compared with [`Ep::id`]).
//! * **Matched probes.** [`Worker::probe_remove`] takes a message out of matching (MPI's
//!   `MPI_Mprobe`); [`Message::recv`] receives exactly it, so no other thread can take a
//!   probed message. [`Worker::recv_vec`] and [`Worker::recv_obj`] are built on it, with
//!   `_timeout` variants that give up when nothing matches in time.
//! * **Cancel.** A cancelled send is never received, and a cancelled receive never matches
//!   (MPI's rule). A send can be cancelled only until something of it left (queued for
//!   credits, or a rendezvous send before its announcement); afterwards
//!   [`Request::cancel`] returns false and the send completes normally. A receive can be
//!   cancelled until a message matched it.
//! * **Close.** [`Ep::close`] / [`Ep::close_timeout`] flush (wait for the endpoint's sends)
//!   up to a deadline, then disconnect; [`Ep::close_force`] disconnects at once and fails
//!   every pending request. Dropping the last handle of an endpoint never blocks: with
//!   nothing pending it closes at once, otherwise it lingers until its sends complete (at
//!   most the connect timeout, then they fail) and the worker closes it. Either way the
//!   peer's pending requests on that endpoint fail with [`Status::ConnectionClosed`].
//!
//! ## Threads
//!
//! [`Context`], [`Worker`], [`Ep`], [`Listener`] and [`Request`] are `Send` and `Sync`.
//! Any number of threads may send on one worker or endpoint: the protocol state is behind
//! one short-held lock, and each endpoint's work requests are posted under that endpoint's
//! own lock, never under the worker-wide one. Only one thread progresses at a time; others
//! calling [`Worker::progress`] meanwhile return at once, and threads blocked in
//! [`Request::wait`] sleep until the progressing thread completes their request.
//!
//! ## Waiting
//!
//! [`WaitMode::BusyPoll`] (default, `RDMX_WAIT_MODE=poll`) spins on the completion queue;
//! [`WaitMode::Event`] (`RDMX_WAIT_MODE=event`) sleeps in the classic arm / re-poll /
//! `ibv_get_cq_event` / `ibv_ack_cq_events` loop, together with the worker's rdmacm event
//! channel (one for all its RDMA connections, as UCX's worker has) and its TCP and
//! shared-memory connections' sockets, so an idle waiting worker uses no CPU.
//!
//! ## Async
//!
//! A [`Request`] is a [`Future`](std::future::Future) of what [`Request::wait`] returns:
//! polling it progresses the worker once and registers the task's waker, which the progress
//! call completing the request wakes (that task only). An event loop drives the worker
//! through its file descriptor ([`Worker::as_fd`](std::os::fd::AsFd::as_fd)) and
//! [`Worker::arm`] (UCP's `ucp_worker_get_efd` / `ucp_worker_arm`); with the `tokio` feature
//! (on by default) [`tokio::drive`] spawns that loop on a tokio runtime, in the worker's wait
//! mode: in event mode an idle worker costs no CPU. Dropping a request's future is dropping
//! the request (see [`Request`]): a receive not yet matched is cancelled, anything else
//! finishes detached, its buffer kept by the worker. Nothing blocks a task:
//! [`Worker::connect_nb`] is a future of the endpoint (its setup runs on a thread of a pool
//! for blocking calls, so many connections are set up at once), [`tokio::accept`] accepts
//! on a [`Listener`] through its fd ([`Listener::try_accept`] and
//! [`Listener::next_timeout`] for other loops), and [`Ep::flush_nb`] and [`Ep::close_nb`]
//! are futures of the flush and the close (UCP's `ucp_ep_close_nbx`).
//!
//! ## Failures
//!
//! Connecting to nothing fails within the connect timeout. When a peer disconnects or
//! dies, every pending request on that endpoint completes with
//! [`Status::ConnectionClosed`] (within seconds: rdmacm reports the disconnect, or the
//! NIC's retries run out); the worker's other endpoints are untouched.
//!
//! A peer that vanishes without a word (its node crashed, its cable was cut) is found by
//! the keepalive (`RDMX_KEEPALIVE_MS`, 1 s; [`Config::keepalive`]), like UCX's: the
//! transport's own check, answered by the peer's NIC or kernel rather than its application,
//! so a peer that is merely busy is never taken for dead. Over RDMA, a connection with
//! nothing posted for an interval posts a zero-length RDMA WRITE, and every queue pair
//! gives up after 6 unacknowledged tries of 134 ms (rdma_cm's defaults would be 2.1 s per try
//! and, on Soft-RoCE, 7 tries meaning for ever): the endpoint fails within 3 intervals
//! whether it was idle or busy. A cable pulled and put back within that retransmission
//! budget (7 tries: 0.94 s with the default 1 s, 3.8 s with `RDMX_KEEPALIVE_MS=4000`) is
//! ridden out — the retransmissions after it deliver everything, in order — and a longer cut
//! fails the endpoint cleanly on both sides. So with the defaults a 1 s cut fails the
//! connection (the QP's tries run out while the cable is out; across two Soft-RoCE nodes the
//! endpoint closed 1.6 s after the cut, every pending request failed on both nodes), and
//! with `RDMX_KEEPALIVE_MS=4000` it is ridden out; a longer keepalive tolerates longer
//! outages at the price of finding dead peers later. Over TCP, keepalive probes fail an
//! idle endpoint within 4 intervals (whole seconds); one with data unacknowledged fails at
//! TCP's retransmission limit (minutes). With `RDMX_KEEPALIVE_MS=0` nothing probes, and an
//! idle endpoint to a vanished peer stays up until it next sends. A peer's malformed
//! frame — too long for a receive buffer, a length that disagrees with the bytes, an unknown
//! opcode or version, an RTS advertising an empty, absurdly large (over 2^47 bytes) or
//! wrapping buffer — closes that endpoint only, and [`Ep::close_reason`] says what was
//! wrong. Errors are [`Error`]; logging goes through `log`.
//!
//! ## Bounds: what a peer can make a worker spend
//!
//! A worker is reachable by every process that can open a socket to it. Every resource a
//! peer can make it spend — memory, queue entries, file descriptors, time inside accept or
//! connect — has a bound that does not depend on what the peer declares, and reaching it
//! costs only that peer: its endpoint fails, or it waits on credit; never another peer or
//! the process. The accept path never blocks on one connection.
//!
//! | kind | what | default | set by | at the bound |
//! | --- | --- | --- | --- | --- |
//! | accept, connect | TCP connections a listener holds while their handshake (HELLO) arrives: a descriptor and under 1 KiB each, read only when they have input | 4096 per listener | `RDMX_MAX_PENDING_HANDSHAKES` | one more closes the oldest pending connection (so does `EMFILE` on accept); a client whose HELLO follows its connect, as rdmx's does, is read as soon as it is taken and is not held up |
//! | accept, connect | time a TCP connection taken by a listener has to send its whole HELLO; until then no one connection is waited on ([`Listener::accept`] takes and reads many at once) | the connect timeout, 5 s | `RDMX_CONNECT_TIMEOUT_MS` | the connection is closed and logged (a malformed HELLO at once); neither is an error of `accept` or `next_request`. Accepting then waits on no one peer either: see the next row |
//! | accept, connect | RDMA connect requests arrived and not yet taken by [`Listener::next_request`] or [`Listener::accept`]: each the kernel's new rdmacm id, no descriptor | 4096 per listener (its `rdma_listen` backlog; the kernel's `net.rdma_ucm.max_backlog` may cap it lower) | `RDMX_MAX_PENDING_HANDSHAKES` | one more is refused (the connector sees a rejection); before, 32 were kept whatever the backlog, and 128 connects at once lost requests past the 32nd |
//! | accept, connect | accepts under way ([`Listener::accept`]): requests answered whose setup waits on the peer — over RDMA for its last CM message (the RTU that establishes the connection), each holding a queue pair and the engine's admission (its initial credits) but no descriptor; over shared memory for the connector's doorbell, each holding the segment handed over and 2 descriptors (its TCP and Unix sockets) | 4096 per listener, each for the connect timeout (5 s) from its answer | `RDMX_MAX_PENDING_HANDSHAKES`, `RDMX_CONNECT_TIMEOUT_MS` | at its deadline the accept is dropped and logged (its connection closed, the admission undone); one more than the bound drops the oldest; meanwhile further requests are answered and the first connection set up is returned. The worker's progress moves them on too, so a connection established while no thread is in `accept` joins the worker at once, and deadlines pass whether or not `accept` is called again. [`ConnRequest::accept`], the application accepting one request it chose, waits for that one, up to the connect timeout |
//! | accept, connect | time a listener spends on `accept(2)` failing for want of descriptors or kernel memory (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) with no pending handshake to close for room | a back-off of 1 ms, doubling to 100 ms, between tries | fixed | nothing spins: the listening socket is not watched during a back-off; the connections wait in the kernel's backlog and are taken once a descriptor is free; a warning is logged once per episode, naming the limit; [`Listener::next_request`] returns the error when its timeout passes, [`Listener::accept`] goes on waiting; the listener is never failed |
//! | accept, connect | time an acceptor spends reaching a connector's hand-over socket (its backlog full) | the connect timeout | `RDMX_CONNECT_TIMEOUT_MS` | shared memory is declined with the reason (the connection stays TCP where TCP is allowed) |
//! | hand-over socket | who can connect to a worker's shared-memory hand-over socket | its user only (a socket in a 0700 directory; `SO_PEERCRED` checked) | fixed | another user's `connect` is refused by the kernel; a stream of another user (root's) is closed at once |
//! | hand-over socket | streams on the hand-over socket whose token has not arrived | 32, each until the connect timeout | fixed (`RDMX_CONNECT_TIMEOUT_MS`) | the oldest is closed; a stream is never waited on; none is kept while no connect of the worker is in flight |
//! | hand-over socket | streams on the hand-over socket under a token | one per connect of the worker in flight | fixed | a stream under a token no connect waits for is closed at once; a connect's is closed when it gives up |
//! | memory, queues | receive buffers a peer's handshake may declare (they size the frames sent to it) | 16 MiB (`rdmx_proto::MAX_RECV_BUF_SIZE`, TCP's largest frame) | fixed | the connection is rejected at connect, the reason naming the size |
//! | memory, queues | bytes one get of a peer's may ask (one reply, and what the worker allocates for it) | what a reply carries into the smaller of both sides' receive buffers, less the 40-byte header: 65 496 B over TCP, 8152 B over RDMA (whose gets the NIC serves), 16 384 B over shared memory | `RDMX_RECV_BUF_SIZE` (this side's) | the endpoint closes as a protocol error naming the sizes; a get whose key or bounds are refused allocates nothing |
//! | memory, queues | replies to a peer's one-sided operations waiting for credits | the peer's window: at most 64 over TCP, 1024 over shared memory (its ring's) | `RDMX_CREDITS` | each operation's credit is held until its reply leaves: the peer runs out of credits and waits |
//! | memory, queues | frames of one put or get of this side's out at once (a peer declaring tiny buffers and many credits sizes neither) | 64 | fixed | the operation waits for replies before its next frame |
//! | memory, queues | GETs a shared-memory peer has unanswered (rendezvous by copy: their answers wait for room in its ring) | 64 per connection | fixed | that peer's endpoint fails (protocol error); an rdmx reader holds its own GETs back past 64, so it never gets there |
//! | memory, queues | bytes waiting to go into a shared-memory ring the peer leaves full | 1024 frames (the ring's window) of the receive buffer size, 64 B more each: 16.1 MiB | `RDMX_RECV_BUF_SIZE` (on shared memory) | that peer's endpoint fails ("left its ring full"); a peer that returns credits only for frames it took never gets there |
//! | memory, queues | a TCP connection's output queue: what its peer asked for or was sent and has not read (GET replies, READ answers, frames); copied bytes and a slot per item, a READ answer's data being the send buffer itself ([`WorkerStats::send_queue_bytes`]) | 16 MiB per connection, or 4 × `RDMX_CREDITS` × TCP's `RDMX_RECV_BUF_SIZE` if more | fixed (follows those two) | the worker stops reading that peer ([`WorkerStats::paused_inputs`]) until it has read half: its requests wait in its own socket, held up by TCP's flow control, and are answered once it reads. A legitimate peer never reaches it: it can make a connection queue only its credit window of frames and the answers to its READs, at most 64 in flight per connection (`rdmx_proto::MAX_READS_PER_CONN`) |
//! | memory, queues | bytes held for messages that arrived before a matching receive (eager payloads, 64 B per message) | 64 MiB | `RDMX_MAX_UNEXPECTED` | the credits of each peer holding more than its share (an equal part per endpoint) are withheld as its messages arrive: its sends wait on credit (its ATS, RMA replies and credit updates still go) until the application receives; a worker holds at most twice the budget plus a window of eager frames per peer, and a peer that reconnects gets no fresh share (a window per connection) ([`Config::max_unexpected`]); a peer that sends on regardless fails its endpoint |
//! | descriptors | file descriptors per RDMA endpoint | 0: a worker's connections share its one rdmacm event channel (UCX's way), each getting only its own events | fixed | — (a connect holds one for a moment: rdmacm resolves the route on a channel of its own) |
//! | descriptors | file descriptors per TCP endpoint | 1 on each side, its socket: inherent | fixed | the process's limit: that connect fails, saying "too many open files (EMFILE): the process's descriptor limit (N) is reached", and a listener backs off until a descriptor is free (see above); other endpoints go on |
//! | descriptors | file descriptors per shared-memory endpoint | 2 on each side: its Unix socket (the peer's hang-up) and the peer worker's doorbell (eventfd); the setup's TCP socket and the segment's memfd are closed | fixed | as for TCP; the acceptor refuses the peer saying why |
//! | descriptors | the process's descriptor limit | the soft `RLIMIT_NOFILE` raised to the hard limit when a context is made (as Go's runtime does; logged at debug level) | `RDMX_RAISE_NOFILE` (`0`: left as it is) | as above: an error naming EMFILE and the limit, wherever a descriptor was needed |
//! | time | how long a rendezvous send's buffer stays exposed to a peer that does not read it | none (for ever, as UCP) | `RDMX_RNDV_TIMEOUT_MS` | the send fails with [`Status::TimedOut`] and its exposure is revoked (a later READ fails; over RDMA a READ in flight breaks that connection; over shared memory the buffer is kept until the endpoint closes); the endpoint stays up ([`Config::rndv_timeout`]) |
//!
//! The bounds are tested as a hostile peer would attack them (raw frames and handshakes,
//! idle and half-open sockets, floods, lies in the handshake), checking that the victim's
//! memory or counters stay within the bound while a legitimate peer connects and exchanges
//! messages: `tests/bounds` over TCP and shared memory; over RDMA (in the Soft-RoCE guest)
//! `tests/device_hostile.rs` (an accept its peer never completes, READs to a peer gone
//! silent, malformed frames) and the 1024-endpoint descriptor test of `tests/api`.
//!
//! These promises are tests: a peer process SIGKILLed during an eager stream and during a
//! rendezvous READ in either direction (every pending request fails within 5 s; memory
//! regions, file descriptors, buffers and connections return to where they were), 64
//! endpoints flooding an SRQ of 256 buffers (nothing lost, duplicated or reordered; no RNR),
//! 1024 endpoints on one worker with the defaults, each sending a burst at once,
//! connect/close churn, hostile frames, and the host suite under valgrind; across two
//! Soft-RoCE nodes joined by a wire: traffic both ways, the cable pulled mid-rendezvous (for
//! good, and for 1 s with each keepalive above), 1% packet loss, a peer process killed, the
//! peer node paused past the bound and crashed (every pending request fails within 5 s)
//! (`scripts/test`;
//! full-size campaigns in `scripts/stress`, the decoder fuzzing campaign in `scripts/fuzz`).

// A TCP-only build (`--no-default-features`) keeps the transport-neutral code whole; the
// RDMA halves of its paths are compiled out, leaving parameters and arms unused there.
#![cfg_attr(
    not(feature = "rdma"),
    allow(
        unused_variables,
        unused_assignments,
        unreachable_code,
        irrefutable_let_patterns,
        dead_code,
        clippy::let_unit_value
    )
)]

mod clock;
mod config;
mod connecting;
mod context;
mod ep;
mod ep_flush;
mod error;
mod fd_limit;
mod hot_lock;
mod listener;
mod message;
mod readiness;
mod request;
mod rma;
mod transport;
mod usermem;
mod worker;

pub use config::{
    Config, Entry, RndvRegistration, Source, WaitMode, CONNECT_TIMEOUT_VAR, CREDITS_VAR,
    DEVICE_VAR, EAGER_THRESHOLD_VAR, KEEPALIVE_VAR, MAX_PENDING_HANDSHAKES_VAR,
    PROGRESS_THREAD_VAR, RAISE_NOFILE_VAR, RCACHE_SIZE_VAR, RECV_BUF_SIZE_VAR, RNDV_REG_VAR,
    SEND_BUFS_VAR, SHM_CMA_VAR, SHM_EAGER_THRESHOLD, SHM_RECV_BUF_SIZE, SHM_RNDV_CHUNK,
    SRQ_DEPTH_VAR, TCP_EAGER_THRESHOLD, TCP_RECV_BUF_SIZE, TRANSPORT_VAR, WAIT_MODE_VAR,
};
pub use config::{MAX_UNEXPECTED_VAR, RNDV_TIMEOUT_VAR};
pub use connecting::Connecting;
pub use context::{Context, ContextBuilder};
pub use ep::Ep;
pub use ep_flush::{Closing, Flushing};
pub use error::{Error, Result, Status};
pub use listener::{ConnRequest, Listener};
pub use message::Message;
pub use request::{Done, Request};
pub use rma::{MemHandle, RemoteAccess, RemoteKey};
pub use transport::{Capabilities, Transport};
pub use worker::{LoopDriver, RecvInfo, Worker, WorkerStats};

#[cfg(feature = "tokio")]
pub mod tokio;

#[cfg(feature = "rdma")]
pub use rdmx_conn as conn;
pub use rdmx_proto as proto;
pub use rdmx_proto::{ConnId, ProbeInfo, Tag};

/// A mask that compares every tag bit: receive exactly the given tag.
pub const TAG_MASK_ALL: Tag = u64::MAX;
/// A mask that compares no bit: receive any tag.
pub const TAG_MASK_ANY: Tag = 0;

/// The librdmacm version this build was compiled against (from pkg-config).
pub const RDMACM_VERSION: &str = env!("RDMX_RDMACM_VERSION");
/// The libibverbs version this build was compiled against (from pkg-config).
pub const IBVERBS_VERSION: &str = env!("RDMX_IBVERBS_VERSION");
