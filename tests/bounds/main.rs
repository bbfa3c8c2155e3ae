//! The bounds on what a peer can make a worker spend — memory, queue entries, file
//! descriptors, time inside accept or connect — each tried as a hostile or careless peer
//! would (raw frames over TCP, raw records over shared memory, idle sockets, floods, lies in
//! the handshake). Every test asserts that the victim's memory (its RSS, or the worker's own
//! counters) stays within a stated bound while the attack runs, and that a legitimate peer
//! connects and exchanges messages meanwhile. One module per bound.

mod accept;
mod accept_waits;
mod get_reply;
mod raw_tcp;
mod rndv_timeout;
mod shm_gets;
mod shm_handover;
mod shm_raw;
mod tcp_output;
mod unexpected;

use std::time::{Duration, Instant};

use rdmx::proto::rma::KeyRef;
use rdmx::proto::wire::{FrameBuf, Handshake, Header, Opcode, RmaBody};
use rdmx::{Context, Done, Ep, Listener, Request, Transport, Worker, TAG_MASK_ALL};

/// A hang guard for the tests (not a timing: nothing is asserted against it but progress).
pub const LONG: Duration = Duration::from_secs(60);
/// A mebibyte.
pub const MIB: usize = 1 << 20;

/// Logs to the test's output (`RUST_LOG`), and starts the binary's hang guard: a test
/// blocked in a call without a deadline (an `accept`, a `wait`) would otherwise hold the
/// run for ever. The whole binary takes well under a minute; after [`HANG_GUARD`] it is
/// ended with a message (a bound against hangs, not a timing).
pub fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
    static GUARD: std::sync::Once = std::sync::Once::new();
    GUARD.call_once(|| {
        std::thread::spawn(|| {
            std::thread::sleep(HANG_GUARD);
            eprintln!("tests/bounds: still running after {HANG_GUARD:?}: a test hangs");
            std::process::abort();
        });
    });
}

/// How long the binary may run before [`init_log`]'s guard ends it.
pub const HANG_GUARD: Duration = Duration::from_secs(15 * 60);

/// The tests' environment: the connect and keepalive variables only (as the API suite).
pub fn test_env(var: &str) -> Option<String> {
    if var == rdmx::CONNECT_TIMEOUT_VAR || var == rdmx::KEEPALIVE_VAR {
        return std::env::var(var).ok();
    }
    None
}

/// A context over `transport` with `settings` (`RDMX_*` variable, value) on top of the
/// defaults, ignoring the environment but for [`test_env`].
pub fn context(transport: Transport, settings: &[(&str, &str)]) -> Context {
    let mut b = Context::builder().env_lookup(test_env).transport(transport);
    for (var, value) in settings {
        b = b.set(var, value);
    }
    b.build().expect("context")
}

/// A worker of `ctx` listening on loopback, its listener and the listener's address.
pub fn listening(ctx: &Context) -> (Worker, Listener, String) {
    let w = ctx.worker().expect("worker");
    let l = w.listen("127.0.0.1:0").expect("listen");
    let addr = l.local_addr().expect("bound").to_string();
    (w, l, addr)
}

/// Takes the next connection request on `listener` and accepts it: the victim's endpoint.
/// (A hang guard: at most [`LONG`] for the request, where `Listener::accept` would wait for
/// ever, and a request that fails is this test's failure, not skipped.)
pub fn accept_one(listener: &Listener) -> Ep {
    listener
        .next_request(Some(LONG))
        .expect("the listener")
        .unwrap_or_else(|| panic!("no connection request within {LONG:?}"))
        .accept()
        .expect("the victim accepts")
}

/// A new worker of `ctx` connects to `addr`, where `listener` accepts it: (that worker, its
/// endpoint, the endpoint `listener` accepted).
pub fn connected(ctx: &Context, listener: &Listener, addr: &str) -> (Worker, Ep, Ep) {
    let w = ctx.worker().expect("worker");
    let c = w.clone();
    let a = addr.to_string();
    let t = std::thread::spawn(move || c.connect(&a).expect("connect"));
    let accepted = accept_one(listener);
    let ep = t.join().expect("connector");
    (w, ep, accepted)
}

/// Progresses `workers` until `done` holds (a hang guard after [`LONG`], naming `what`).
pub fn progress_until(workers: &[&Worker], what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "hung waiting for {what}");
        for w in workers {
            w.progress();
        }
    }
}

/// [`Request::wait`], for at most [`LONG`] (a hang guard naming `what`).
pub fn wait_within(r: Request, what: &str) -> rdmx::Result<Done> {
    assert!(r.wait_for(LONG), "{what}: not done within {LONG:?}");
    r.wait()
}

/// This process's resident set, in bytes (`/proc/self/statm`).
pub fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's resident field");
    pages * 4096
}

/// Held by a test while it measures [`rss`] or makes the process's memory move by much (a
/// flood, large messages), so that such tests run one at a time (the process's resident
/// set counts every test's memory). A test that failed while holding it does not poison
/// the others.
pub fn measuring() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Asserts that this process's resident set grew by less than `bound` bytes since `base`
/// (an [`rss`] taken before), saying how much `when`.
pub fn assert_grown_within(base: usize, bound: usize, when: &str) {
    let grown = rss().saturating_sub(base);
    println!("{when}: the victim grew by {} KiB", grown / 1024);
    assert!(
        grown < bound,
        "{when}: the victim grew by {} MiB (bound {} MiB)",
        grown / MIB,
        bound / MIB
    );
}

/// The rdmx handshake an rdmx engine with the default configuration sends, for a raw peer
/// to alter before it connects ([`raw_tcp::connect`], [`shm_raw::connect`], or its own
/// HELLO to `rdmx_tcp::connect`).
pub fn default_handshake() -> Handshake {
    rdmx::proto::Engine::new(Default::default()).local_handshake()
}

/// A raw peer's connection to a victim, carrying whole rdmx frames built by hand
/// ([`raw_tcp::RawTcp`] over TCP, [`shm_raw::RawShm`] over shared memory).
pub trait RawWire {
    /// The victim's rdmx handshake, from its TCP ACCEPT.
    fn victim(&self) -> Handshake;
    /// Queues `frame` (whole: header and payload) for the victim.
    fn send(&mut self, frame: &[u8]);
    /// Sends what is queued and appends the frames the victim sent to `frames`; false once
    /// the victim closed the connection.
    fn poll(&mut self, frames: &mut Vec<Vec<u8>>) -> bool;

    /// Progresses `victim` until this peer receives a frame `pick` takes; returns what it
    /// took. (The frames before it are read and dropped.)
    fn expect<T>(&mut self, victim: &Worker, mut pick: impl FnMut(&[u8]) -> Option<T>) -> T
    where
        Self: Sized,
    {
        let deadline = Instant::now() + LONG;
        let mut frames = Vec::new();
        loop {
            assert!(Instant::now() < deadline, "the frame never came");
            victim.progress();
            assert!(self.poll(&mut frames), "the victim closed the connection");
            for f in frames.drain(..) {
                if let Some(t) = pick(&f) {
                    return t;
                }
            }
        }
    }
}

/// A GET frame numbered `seq`, for request `sreq`: `len` bytes at `offset` of `key`'s
/// region, granting the victim `grant` credits.
pub fn get_frame(seq: u32, sreq: u64, grant: u16, key: KeyRef, offset: u64, len: u64) -> FrameBuf {
    let mut h = Header::new(Opcode::Get);
    h.seq = seq;
    h.tag = offset;
    h.sreq = sreq;
    h.credits = grant;
    h.payload_len = RmaBody::LEN as u32;
    FrameBuf::encode_rma(&h, &RmaBody { key, word: len })
}

/// One eager round trip and one rendezvous message of `MIB` between `a` (on worker `wa`)
/// and `b` (on `wb`): what a legitimate peer does while an attack runs. Both workers are
/// progressed by this thread (neither may have a progress thread of its own busy elsewhere).
pub fn exchange(wa: &Worker, a: &Ep, wb: &Worker, b: &Ep) {
    for len in [64, MIB] {
        for (from, fw, tw) in [(a, wa, wb), (b, wb, wa)] {
            let r = tw.tag_recv(0x900d, TAG_MASK_ALL, vec![0; len]);
            let s = from.tag_send(0x900d, vec![0x5a; len]);
            progress_until(&[fw, tw], "the legitimate exchange", || {
                r.is_done() && s.is_done()
            });
            s.wait().expect("legitimate send");
            let got = r.wait().expect("legitimate receive");
            assert!(
                got.buf.iter().all(|&x| x == 0x5a),
                "bytes of the legitimate message"
            );
        }
    }
}

/// The helpers above work: a TCP connection exchanges eager and rendezvous messages.
#[test]
fn a_legitimate_pair_exchanges_messages() {
    init_log();
    let ctx = context(Transport::Tcp, &[]);
    let (server, listener, addr) = listening(&ctx);
    let (client, cep, sep) = connected(&ctx, &listener, &addr);
    exchange(&client, &cep, &server, &sep);
    assert!(rss() > 0);
    assert!(default_handshake().recv_buf_size > 0);
}
