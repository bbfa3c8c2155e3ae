//! The bounds on what a peer can make a worker spend — memory, queue entries, file
//! descriptors, time inside accept or connect — each tried as a hostile or careless peer
//! would (raw frames over TCP, raw records over shared memory, idle sockets, floods, lies in
//! the handshake). Every test asserts that the victim's memory (its RSS, or the worker's own
//! counters) stays within a stated bound while the attack runs, and that a legitimate peer
//! connects and exchanges messages meanwhile. One module per bound.

mod get_reply;

use std::time::{Duration, Instant};

mod tcp_output;

use rdmx::{Context, Ep, Listener, Transport, Worker, TAG_MASK_ALL};

mod accept;
mod accept_waits;
mod shm_gets;
mod shm_handover;
mod shm_raw;

/// A hang guard for the tests (not a timing: nothing is asserted against it but progress).
pub const LONG: Duration = Duration::from_secs(60);
/// A mebibyte.
pub const MIB: usize = 1 << 20;

/// Logs to the test's output (`RUST_LOG`).
pub fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
}

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

/// The rdmx handshake an rdmx engine with the default configuration sends, as bytes a raw
/// peer can alter before connecting with `rdmx_tcp::connect`.
pub fn default_handshake() -> rdmx::proto::wire::Handshake {
    rdmx::proto::Engine::new(Default::default()).local_handshake()
}

/// One eager round trip and one rendezvous message of `MIB` between `a` (on worker `wa`)
/// and `b` (on `wb`): what a legitimate peer does while an attack runs. Both workers are
/// progressed by this thread (neither may have a progress thread of its own busy elsewhere).
pub fn exchange(wa: &Worker, a: &Ep, wb: &Worker, b: &Ep) {
    let deadline = Instant::now() + LONG;
    for len in [64, MIB] {
        for (from, fw, tw) in [(a, wa, wb), (b, wb, wa)] {
            let r = tw.tag_recv(0x900d, TAG_MASK_ALL, vec![0; len]);
            let s = from.tag_send(0x900d, vec![0x5a; len]);
            while !(r.is_done() && s.is_done()) {
                assert!(Instant::now() < deadline, "the legitimate exchange hung");
                fw.progress();
                tw.progress();
            }
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
    let client = ctx.worker().unwrap();
    let c = client.clone();
    let t = std::thread::spawn(move || c.connect(&addr).unwrap());
    let sep = listener.accept().unwrap();
    let cep = t.join().unwrap();
    exchange(&client, &cep, &server, &sep);
    assert!(rss() > 0);
    assert!(default_handshake().recv_buf_size > 0);
}
