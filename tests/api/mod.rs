//! The endpoint API test suite, shared by every transport: `tests/device_api.rs` runs it
//! over RDMA in the Soft-RoCE guest, `tests/tcp_api.rs` over TCP on the host. Each test
//! binary provides `crate::net()`, naming its transport and addresses.

use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

mod steady_state;
pub use steady_state::steady_state_messaging_allocates_nothing;

/// Every test binary of the suite counts heap allocations (dhat, idle unless a test starts
/// its profiler): see [`steady_state_messaging_allocates_nothing`].
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

use rdmx::{
    Context, ContextBuilder, Ep, Request, RndvRegistration, Status, Transport, WaitMode, Worker,
    TAG_MASK_ALL, TAG_MASK_ANY,
};

/// How long a test waits for something that should happen before calling it hung: 30 s, or
/// `RDMX_TEST_TIMEOUT_S` for slow runs (valgrind). A bound against hangs, never a timing
/// assertion.
pub fn long() -> Duration {
    // Read once: a test that counts allocations calls this in its measured loop.
    static LONG: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *LONG.get_or_init(|| {
        let secs = std::env::var("RDMX_TEST_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30);
        Duration::from_secs(secs)
    })
}

/// Where a test binary runs the suite.
pub struct Net {
    /// The transport under test.
    pub transport: Transport,
    /// The address servers listen on.
    pub addr_a: String,
    /// A second local address (RDMA: on the second device).
    pub addr_b: String,
}

/// Generates one `#[test]` per suite function, each with the attributes in brackets.
macro_rules! api_tests {
    ([$($attr:tt)*];) => {};
    ([$($attr:tt)*]; $name:ident $(, $rest:ident)* $(,)?) => {
        #[test]
        $($attr)*
        fn $name() {
            api::$name();
        }
        api_tests!([$($attr)*]; $($rest),*);
    };
}

/// Every test of the suite, with the given attributes (e.g. an `#[ignore]`).
macro_rules! all_api_tests {
    ($($attr:tt)*) => {
        api_tests!([$($attr)*];
            eager_and_rendezvous_expected,
            eager_and_rendezvous_unexpected,
            registration_cache_mode_and_small_threshold,
            per_operation_registration_mode,
            event_wait_mode_roundtrips_and_idles,
            wildcard_and_masked_tags,
            truncation_on_both_protocols,
            cancel_receive_and_rendezvous_send,
            several_threads_send_on_one_worker,
            many_eps_share_one_srq,
            peer_close_fails_pending_requests_only_on_that_ep,
            connect_failures_are_errors,
            progress_thread_completes_requests,
            typed_messages_and_second_device,
            peer_death_fails_pending_requests,
            flood_through_a_small_srq,
            connect_close_churn_leaks_nothing,
            several_threads_receive_on_one_worker,
            progress_thread_wakes_a_blocked_recv_vec,
            steady_state_messaging_allocates_nothing,
        );
    };
}

fn addr_a() -> String {
    crate::net().addr_a
}

fn addr_b() -> String {
    crate::net().addr_b
}

fn is_rdma() -> bool {
    crate::net().transport == Transport::Rdma
}

pub(crate) fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
}

/// The process environment as tests see it: only `RDMX_CONNECT_TIMEOUT_MS`, which slow
/// runs (valgrind) raise; tests set everything else explicitly.
pub fn test_env(var: &str) -> Option<String> {
    (var == rdmx::CONNECT_TIMEOUT_VAR)
        .then(|| std::env::var(var).ok())
        .flatten()
}

/// A builder that ignores the process environment except [`test_env`].
pub(crate) fn builder() -> ContextBuilder {
    Context::builder()
        .env_lookup(test_env)
        .transport(crate::net().transport)
        .srq_depth(1024)
        .credits(16)
}

thread_local! {
    /// The workers of the running test (each test runs on its own thread).
    static WORKERS: std::cell::RefCell<Vec<Worker>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A worker that [`finish`] progresses too.
fn new_worker(ctx: &Context) -> Worker {
    let w = ctx.worker().expect("worker");
    WORKERS.with(|v| v.borrow_mut().push(w.clone()));
    w
}

/// Waits for a request, failing the test instead of hanging when it never completes. The
/// test's other workers are progressed meanwhile: one thread plays both sides, and over
/// TCP a rendezvous also needs the sender's progress (it streams the data).
fn finish(r: Request) -> rdmx::Result<rdmx::Done> {
    let deadline = Instant::now() + long();
    while !r.wait_for(Duration::from_millis(1)) {
        assert!(
            Instant::now() < deadline,
            "request did not complete within {:?}: {r:?}",
            long()
        );
        WORKERS.with(|v| {
            for w in v.borrow().iter() {
                w.progress();
            }
        });
    }
    r.wait()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

/// A server worker listening on `ip`, and `n` client eps connected to it from one client
/// worker; returns (server worker, server eps, client worker, client eps).
fn connect_n(ctx: &Context, ip: &str, n: usize) -> (Worker, Vec<Ep>, Worker, Vec<Ep>) {
    let server = new_worker(ctx);
    let listener = server.listen(&format!("{ip}:0")).expect("listen");
    let addr = listener.local_addr().expect("bound").to_string();
    let client = new_worker(ctx);
    let c = client.clone();
    let t = thread::spawn(move || {
        (0..n)
            .map(|_| c.connect(&addr).expect("connect"))
            .collect::<Vec<_>>()
    });
    let server_eps = (0..n).map(|_| listener.accept().expect("accept")).collect();
    let client_eps = t.join().expect("client thread");
    (server, server_eps, client, client_eps)
}

pub(crate) fn pair(ctx: &Context) -> (Worker, Ep, Worker, Ep) {
    let (sw, mut se, cw, mut ce) = connect_n(ctx, &addr_a(), 1);
    (sw, se.remove(0), cw, ce.remove(0))
}

/// Sends every size both ways around the threshold and checks each byte; with the receive
/// posted first (`expected`) or the messages sent first (unexpected).
fn sizes_roundtrip(ctx: &Context, expected: bool) {
    let thr = ctx.config().eager_threshold() as usize;
    let sizes = [
        0,
        1,
        64,
        thr - 1,
        thr,
        thr + 1,
        65536,
        (1 << 20) + 3,
        (16 << 20) + 5,
    ];
    let (server, _sep, _client, cep) = pair(ctx);
    let mut recvs = Vec::new();
    if expected {
        for (i, &len) in sizes.iter().enumerate() {
            recvs.push(server.tag_recv(i as u64, TAG_MASK_ALL, vec![0; len]));
        }
    }
    let sends: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| cep.tag_send(i as u64, pattern(len, i as u8)))
        .collect();
    if !expected {
        // Let every message arrive (eager data, or the RTS of rendezvous) before receiving.
        let deadline = Instant::now() + long();
        while server.stats().unexpected_messages < sizes.len() {
            assert!(Instant::now() < deadline, "messages did not all arrive");
            server.progress();
        }
        let probed = server.probe(3, TAG_MASK_ALL).expect("probe sees message 3");
        assert_eq!(probed.len as usize, thr - 1);
        for (i, &len) in sizes.iter().enumerate() {
            recvs.push(server.tag_recv(i as u64, TAG_MASK_ALL, vec![0; len]));
        }
    }
    for (i, r) in recvs.into_iter().enumerate() {
        let done = finish(r).expect("receive ok");
        assert_eq!(done.length, sizes[i], "length of message {i}");
        assert_eq!(done.tag, i as u64);
        assert!(
            done.buf == pattern(sizes[i], i as u8),
            "payload of {} bytes differs",
            sizes[i]
        );
    }
    for (i, s) in sends.into_iter().enumerate() {
        let done = finish(s).expect("send ok");
        assert_eq!(done.buf.len(), sizes[i], "the send buffer comes back whole");
        assert!(
            done.buf == pattern(sizes[i], i as u8),
            "send buffer unchanged"
        );
    }
}

pub fn eager_and_rendezvous_expected() {
    init_log();
    sizes_roundtrip(&builder().build().unwrap(), true);
}

pub fn eager_and_rendezvous_unexpected() {
    init_log();
    sizes_roundtrip(&builder().build().unwrap(), false);
}

pub fn registration_cache_mode_and_small_threshold() {
    init_log();
    let ctx = builder()
        .rndv_registration(RndvRegistration::Cache)
        .eager_threshold(512)
        .build()
        .unwrap();
    sizes_roundtrip(&ctx, true);
    sizes_roundtrip(&ctx, false);
}

pub fn per_operation_registration_mode() {
    init_log();
    let ctx = builder()
        .rndv_registration(RndvRegistration::PerOperation)
        .build()
        .unwrap();
    sizes_roundtrip(&ctx, true);
    sizes_roundtrip(&ctx, false);
}

pub fn event_wait_mode_roundtrips_and_idles() {
    init_log();
    let ctx = builder().wait_mode(WaitMode::Event).build().unwrap();
    sizes_roundtrip(&ctx, true);
    let (server, _sep, _client, cep) = pair(&ctx);
    // A receive waited for in event mode: the waiting thread sleeps.
    let r = server.tag_recv(9, TAG_MASK_ALL, vec![0; 16]);
    let waiter = thread::spawn(move || {
        let before = thread_cpu_ticks();
        let done = r.wait().expect("receive");
        (done, thread_cpu_ticks() - before)
    });
    let idle = Duration::from_secs(2);
    thread::sleep(idle);
    cep.send(9, b"wake up").unwrap();
    let (done, ticks) = waiter.join().unwrap();
    assert_eq!(&done.buf[..done.length], b"wake up");
    let percent = ticks as f64 / (idle.as_secs_f64() * 100.0) * 100.0;
    println!("event-mode waiter used {ticks} CPU ticks (100/s) in {idle:?} asleep: {percent:.1} %");
    assert!(
        ticks <= 10,
        "an event-mode waiter must sleep, used {ticks} ticks"
    );
    // Ping-pong in event mode.
    for i in 0..50u64 {
        let r = server.tag_recv(100 + i, TAG_MASK_ALL, vec![0; 8]);
        cep.send(100 + i, &i.to_le_bytes()).unwrap();
        assert_eq!(finish(r).unwrap().buf, i.to_le_bytes());
    }
}

/// utime + stime of the calling thread, in clock ticks.
fn thread_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("thread stat");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // After the command name: state is field 3, utime 14, stime 15 (1-based).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

pub fn wildcard_and_masked_tags() {
    init_log();
    let ctx = builder().build().unwrap();
    let (server, _sep, _client, cep) = pair(&ctx);
    // Unexpected messages first, in this order.
    for (tag, body) in [(0x10u64, "a"), (0x21, "b"), (0x12, "c"), (0x30, "d")] {
        cep.send(tag, body.as_bytes()).unwrap();
    }
    let recv = |tag, mask| {
        let r = server.tag_recv(tag, mask, vec![0; 8]);
        assert!(r.wait_for(long()));
        let d = finish(r).unwrap();
        (
            d.tag,
            String::from_utf8(d.buf[..d.length].to_vec()).unwrap(),
        )
    };
    // High nibble 1: the first such message in arrival order.
    assert_eq!(recv(0x10, 0xf0), (0x10, "a".into()));
    assert_eq!(recv(0x1f, 0xf0), (0x12, "c".into()));
    // Wildcard: the oldest remaining.
    assert_eq!(recv(0, TAG_MASK_ANY), (0x21, "b".into()));
    assert_eq!(recv(0x30, TAG_MASK_ALL), (0x30, "d".into()));
    // Posted wildcard receives match in posting order.
    let r1 = server.tag_recv(0, TAG_MASK_ANY, vec![0; 8]);
    let r2 = server.tag_recv(0, TAG_MASK_ANY, vec![0; 8]);
    assert!(!r1.test() && !r2.is_done(), "nothing sent yet");
    cep.send(5, b"first").unwrap();
    cep.send(6, b"second").unwrap();
    assert_eq!(finish(r1).unwrap().tag, 5);
    assert_eq!(finish(r2).unwrap().tag, 6);
}

pub fn truncation_on_both_protocols() {
    init_log();
    let ctx = builder().build().unwrap();
    let thr = ctx.config().eager_threshold() as usize;
    let (server, _sep, _client, cep) = pair(&ctx);
    // Eager: the receiver gets Truncated (the sender already completed).
    let r = server.tag_recv(1, TAG_MASK_ALL, vec![0; 10]);
    cep.send(1, &pattern(100, 1)).unwrap();
    let mut err = finish(r).expect_err("truncated");
    assert_eq!(err.status(), Some(Status::Truncated));
    assert_eq!(err.take_buffer().len(), 10, "the buffer comes back");
    // Rendezvous: both sides fail, nothing delivered.
    let r = server.tag_recv(2, TAG_MASK_ALL, vec![0xee; thr + 100]);
    let s = cep.tag_send(2, pattern(thr * 4, 2));
    let mut err = finish(r).expect_err("truncated");
    assert_eq!(err.status(), Some(Status::Truncated));
    assert!(
        err.take_buffer().iter().all(|&b| b == 0xee),
        "nothing delivered"
    );
    let mut err = finish(s).expect_err("remote truncated");
    assert_eq!(err.status(), Some(Status::RemoteTruncated));
    assert_eq!(err.take_buffer(), pattern(thr * 4, 2));
    // The connection still works.
    let r = server.tag_recv(3, TAG_MASK_ALL, vec![0; 4]);
    cep.send(3, b"fine").unwrap();
    assert_eq!(finish(r).unwrap().buf, b"fine");
}

pub fn cancel_receive_and_rendezvous_send() {
    init_log();
    let ctx = builder().build().unwrap();
    let (server, sep, client, cep) = pair(&ctx);
    let r = server.tag_recv(1, TAG_MASK_ALL, vec![7; 32]);
    assert!(r.cancel(), "an unmatched receive can be cancelled");
    let mut err = finish(r).expect_err("cancelled");
    assert_eq!(err.status(), Some(Status::Cancelled));
    assert_eq!(err.take_buffer(), vec![7; 32]);
    // A rendezvous send nobody receives yet: cancel it; the late receiver sees ReadFailed.
    let big = pattern(1 << 20, 9);
    let s = cep.tag_send(2, big.clone());
    // Let the RTS arrive.
    let deadline = Instant::now() + long();
    while server.probe(2, TAG_MASK_ALL).is_none() {
        assert!(Instant::now() < deadline);
    }
    assert!(s.cancel());
    let mut err = finish(s).expect_err("cancelled");
    assert_eq!(err.status(), Some(Status::Cancelled));
    assert_eq!(
        err.take_buffer(),
        big,
        "the cancelled send's buffer comes back"
    );
    let r = server.tag_recv(2, TAG_MASK_ALL, vec![0; 1 << 20]);
    let err = finish(r).expect_err("the exposure is gone");
    assert_eq!(err.status(), Some(Status::ReadFailed));
    if is_rdma() {
        // On RC a READ refused by the peer's NIC puts the QP in the error state: the
        // connection is lost on both sides, and says so.
        let deadline = Instant::now() + long();
        while cep.is_connected() || sep.is_connected() {
            assert!(
                Instant::now() < deadline,
                "the broken connection was not noticed"
            );
            server.progress();
            client.progress();
        }
    } else {
        // Over TCP the refused READ is an answer like any other: the connection stays up.
        let r = server.tag_recv(4, TAG_MASK_ALL, vec![0; 8]);
        cep.send(4, b"alive").unwrap();
        assert_eq!(&finish(r).unwrap().buf[..5], b"alive");
        assert!(cep.is_connected() && sep.is_connected());
        drop(client);
    }
    // Dropping an unfinished receive cancels it: the next message goes to the next receive.
    let (server, _sep, _client, cep) = pair(&ctx);
    drop(server.tag_recv(3, TAG_MASK_ALL, vec![0; 8]));
    let r = server.tag_recv(3, TAG_MASK_ALL, vec![0; 8]);
    cep.send(3, b"x").unwrap();
    assert_eq!(finish(r).unwrap().length, 1);
    assert_eq!(server.stats().pending_requests, 0);
}

pub fn several_threads_send_on_one_worker() {
    init_log();
    let ctx = builder().build().unwrap();
    let thr = ctx.config().eager_threshold() as usize;
    let (server, _seps, _client, ceps) = connect_n(&ctx, &addr_a(), 2);
    const THREADS: u64 = 4;
    const PER: u64 = 150;
    let barrier = Arc::new(Barrier::new(THREADS as usize));
    let senders: Vec<_> = (0..THREADS)
        .map(|t| {
            let ep = ceps[(t % 2) as usize].clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                let mut reqs = Vec::new();
                for i in 0..PER {
                    // Mostly eager, every 10th message rendezvous.
                    let len = if i % 10 == 9 {
                        thr * 3
                    } else {
                        8 + (i as usize % 64)
                    };
                    let mut body = pattern(len, i as u8);
                    body[..8].copy_from_slice(&i.to_le_bytes());
                    reqs.push(ep.tag_send(t << 32 | i, body));
                }
                for r in reqs {
                    finish(r).expect("send");
                }
            })
        })
        .collect();
    let mut next: HashMap<u64, u64> = HashMap::new();
    for _ in 0..THREADS * PER {
        let r = server.tag_recv(0, TAG_MASK_ANY, vec![0; thr * 3]);
        assert!(r.wait_for(long()), "a message went missing");
        let d = finish(r).unwrap();
        let (t, i) = (d.tag >> 32, d.tag & 0xffff_ffff);
        let seq = u64::from_le_bytes(d.buf[..8].try_into().unwrap());
        assert_eq!(seq, i);
        let expect = next.entry(t).or_insert(0);
        // Each thread's messages arrive in its order (one thread uses one ep).
        assert_eq!(i, *expect, "thread {t}'s messages reordered");
        *expect += 1;
    }
    for s in senders {
        s.join().unwrap();
    }
    assert!(next.values().all(|&n| n == PER));
}

pub fn many_eps_share_one_srq() {
    init_log();
    let ctx = builder().srq_depth(1024).credits(16).build().unwrap();
    let server = new_worker(&ctx);
    let listener = server.listen(&format!("{}:0", addr_a())).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let client = new_worker(&ctx);
    let connect = |n: usize| {
        let c = client.clone();
        let a = addr.clone();
        let t = thread::spawn(move || (0..n).map(|_| c.connect(&a).unwrap()).collect::<Vec<_>>());
        let accepted: Vec<Ep> = (0..n).map(|_| listener.accept().unwrap()).collect();
        (accepted, t.join().unwrap())
    };
    let (mut sep, mut cep) = connect(1);
    let one = server.stats();
    let (s2, c2) = connect(31);
    sep.extend(s2);
    cep.extend(c2);
    let many = server.stats();
    println!("1 ep: {one:?}\n32 eps: {many:?}");
    assert_eq!(many.eps, 32);
    assert_eq!(
        one.recv_buffer_bytes, many.recv_buffer_bytes,
        "receive-buffer memory must not grow with endpoints"
    );
    if is_rdma() {
        assert_eq!(
            many.recv_buffer_bytes,
            1024 * u64::from(ctx.config().recv_buf_size())
        );
    } else {
        // TCP has no SRQ: frames are read into buffers allocated per message.
        assert_eq!(many.recv_buffer_bytes, 0);
    }
    // Every ep works, through the one SRQ.
    let recvs: Vec<_> = (0..32u64)
        .map(|i| server.tag_recv(i, TAG_MASK_ALL, vec![0; 16]))
        .collect();
    for (i, ep) in cep.iter().enumerate() {
        ep.send(i as u64, &(i as u64).to_le_bytes()).unwrap();
    }
    for (i, r) in recvs.into_iter().enumerate() {
        assert_eq!(finish(r).unwrap().buf[..8], (i as u64).to_le_bytes());
    }
    // The 65th ep would overrun the SRQ: 1024 / 16 = 64 admitted.
    let (s3, c3) = connect(32);
    assert_eq!(server.stats().eps, 64);
    let c = client.clone();
    let err = thread::spawn(move || c.connect(&addr).expect_err("SRQ full"));
    let err2 = listener.accept().expect_err("the server refuses");
    let err = err.join().unwrap();
    println!("65th connect: {err}\nserver: {err2}");
    assert!(err.to_string().contains("shared receive queue"), "{err}");
    assert!(err2.to_string().contains("shared receive queue"), "{err2}");
    drop((s3, c3, sep, cep));
}

pub fn peer_close_fails_pending_requests_only_on_that_ep() {
    init_log();
    let ctx = builder().build().unwrap();
    let (server, mut seps, _client, ceps) = connect_n(&ctx, &addr_a(), 2);
    // A rendezvous send on ep 0 that the peer never receives, then the peer closes ep 0.
    let pending = ceps[0].tag_send(1, pattern(1 << 20, 1));
    let deadline = Instant::now() + long();
    while server.probe(1, TAG_MASK_ALL).is_none() {
        assert!(Instant::now() < deadline);
    }
    let closed_at = Instant::now();
    seps.remove(0).close().unwrap();
    let mut err = finish(pending).expect_err("the peer closed");
    println!(
        "pending send failed {:?} after the peer closed",
        closed_at.elapsed()
    );
    assert_eq!(err.status(), Some(Status::ConnectionClosed));
    assert_eq!(err.take_buffer(), pattern(1 << 20, 1));
    assert!(closed_at.elapsed() < Duration::from_secs(5));
    assert!(!ceps[0].is_connected());
    // New sends on the closed ep fail at once, with the buffer back.
    let err = finish(ceps[0].tag_send(2, vec![1; 3])).expect_err("closed");
    assert_eq!(err.status(), Some(Status::ConnectionClosed));
    // The other ep keeps working, both ways.
    let r = server.tag_recv(3, TAG_MASK_ALL, vec![0; 1 << 20]);
    let s = ceps[1].tag_send(3, pattern(1 << 20, 3));
    // One thread drives both workers: the receive first (the server reads), then the send.
    assert_eq!(finish(r).unwrap().buf, pattern(1 << 20, 3));
    finish(s).unwrap();
}

pub fn connect_failures_are_errors() {
    init_log();
    let ctx = builder()
        .connect_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let worker = new_worker(&ctx);
    let start = Instant::now();
    let err = worker
        .connect(&format!("{}:1", addr_a()))
        .expect_err("nobody listens");
    println!("connect to a closed port: {err} ({:?})", start.elapsed());
    // A listener that rejects.
    let server = new_worker(&ctx);
    let listener = server.listen(&format!("{}:0", addr_a())).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let t = thread::spawn(move || worker.connect(&addr).expect_err("rejected"));
    listener
        .next_request(Some(long()))
        .unwrap()
        .expect("a request")
        .reject()
        .unwrap();
    let err = t.join().unwrap();
    assert!(
        err.to_string().contains("rejected by the application"),
        "{err}"
    );
    // Garbage addresses.
    assert!(server.connect("not an address").is_err());
    assert!(server.listen("192.0.2.1:99999").is_err());
}

pub fn progress_thread_completes_requests() {
    init_log();
    let ctx = builder().progress_thread(true).build().unwrap();
    let (server, _sep, _client, cep) = pair(&ctx);
    let r = server.tag_recv(1, TAG_MASK_ALL, vec![0; 1 << 20]);
    let s = cep.tag_send(1, pattern(1 << 20, 4));
    // Nobody calls progress or wait: the progress threads complete both.
    let deadline = Instant::now() + long();
    while !(r.is_done() && s.is_done()) {
        assert!(
            Instant::now() < deadline,
            "progress thread did not complete the requests"
        );
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(finish(r).unwrap().buf, pattern(1 << 20, 4));
    finish(s).unwrap();
}

pub fn typed_messages_and_second_device() {
    init_log();
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Job {
        id: u32,
        name: String,
        weights: Vec<f64>,
    }
    fn job_copy(j: &Job) -> Job {
        Job {
            id: j.id,
            name: j.name.clone(),
            weights: j.weights.clone(),
        }
    }
    let ctx = builder().build().unwrap();
    // On rxe1 this time.
    let (sw, mut se, _cw, mut ce) = connect_n(&ctx, &addr_b(), 1);
    let (sep, cep) = (se.remove(0), ce.remove(0));
    if is_rdma() {
        assert_eq!(sw.stats().device.as_deref(), Some("rxe1"));
    }
    let job = Job {
        id: 7,
        name: "train".into(),
        weights: (0..5000).map(f64::from).collect(), // 40 KB: rendezvous
    };
    // A blocking rendezvous send needs the receiver to progress: send from another thread.
    let sender = {
        let cep = cep.clone();
        let job = job_copy(&job);
        thread::spawn(move || cep.send_obj(5, &job))
    };
    let got: Job = sw.recv_obj(5, TAG_MASK_ALL).unwrap();
    assert_eq!(got, job);
    sender.join().unwrap().unwrap();
    sep.send_obj(6, &("ok", 1u8)).unwrap();
    let (word, n): (String, u8) = cep.worker().recv_obj(6, TAG_MASK_ALL).unwrap();
    assert_eq!((word.as_str(), n), ("ok", 1));
    // A message that is not the expected type is a decode error, not a panic.
    cep.send(7, b"\x01").unwrap();
    assert!(sw.recv_obj::<Job>(7, TAG_MASK_ALL).is_err());
}

/// Peer death: the peer process (this test binary again, in the peer role) is killed with
/// SIGKILL while a rendezvous send to it is pending; the send fails within 5 s and the
/// worker's other endpoint keeps working.
/// What a worker and the process hold: compared before and after a failure to show that
/// nothing leaks (memory regions, file descriptors, buffers, requests, connections).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    fds: usize,
    #[cfg(feature = "rdma")]
    mrs: rdmx::conn::RegistrationCount,
    eps: usize,
    connections: usize,
    pending_requests: usize,
    user_buffers: usize,
    unexpected_messages: usize,
    send_buffer_bytes: u64,
    rcache_bytes: u64,
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The resources of `w` and of this process (so run alone: see [`isolated`]).
pub fn resources(w: &Worker) -> Resources {
    let s = w.stats();
    Resources {
        fds: open_fds(),
        #[cfg(feature = "rdma")]
        mrs: rdmx::conn::live_registrations(),
        eps: s.eps,
        connections: s.connections,
        pending_requests: s.pending_requests,
        user_buffers: s.user_buffers,
        unexpected_messages: s.unexpected_messages,
        send_buffer_bytes: s.send_buffer_bytes,
        rcache_bytes: s.rcache_bytes,
    }
}

/// Progresses the test's workers until `w`'s resources are back to `base` (closed
/// connections are reaped once their last work drains), failing after 10 s.
pub fn settle(w: &Worker, base: &Resources) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        WORKERS.with(|v| {
            for w in v.borrow().iter() {
                w.progress();
            }
        });
        let now = resources(w);
        if &now == base {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "resources did not return:\n before {base:?}\n after  {now:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Runs test `name` in a process of its own with `RDMX_TEST_ROLE=role` (process-wide counts
/// such as file descriptors and memory regions must not see other tests), and checks it
/// passed.
pub(crate) fn isolated(name: &str, role: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--include-ignored",
            "--exact",
            name,
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RDMX_TEST_ROLE", role)
        .output()
        .expect("run the test in its own process");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "{name} ({role}) failed");
    assert!(text.contains("1 passed"), "{name} ({role}) did not run");
}

/// A peer process that dies by SIGKILL while requests on its ep are in flight.
struct Victim {
    child: std::process::Child,
    ep: Ep,
}

const VICTIM_BIG: usize = 64 << 20;

impl Victim {
    /// Starts the peer process in `role` and accepts its connection on `listener`; returns once
    /// the peer said READY (it is then in the middle of its role).
    fn start(listener: &rdmx::Listener, role: &str) -> Victim {
        use std::io::{BufRead, BufReader};
        let addr = listener.local_addr().unwrap().to_string();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--include-ignored",
                "--exact",
                "peer_death_fails_pending_requests",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("RDMX_TEST_ROLE", format!("victim:{role}:{addr}"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn the peer process");
        let ep = listener
            .next_request(Some(long()))
            .unwrap()
            .expect("the peer process connects")
            .accept()
            .unwrap();
        if role == "rndv-recv" {
            // Our receive is posted before the peer sends, so we READ at once.
            return Victim { child, ep };
        }
        ep.send(1, b"go").unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        assert!(
            lines.any(|l| l.is_ok_and(|l| l.contains("READY"))),
            "peer did not start"
        );
        Victim { child, ep }
    }

    fn kill(mut self) -> (Ep, Instant) {
        self.child.kill().expect("SIGKILL the peer");
        let at = Instant::now();
        self.child.wait().unwrap();
        (self.ep, at)
    }
}

/// The victim's side, in the child process.
fn victim(role: &str, addr: &str) {
    let ctx = builder().build().unwrap();
    let worker = new_worker(&ctx);
    let ep = worker.connect(addr).unwrap();
    match role {
        "eager-stream" => {
            worker.recv_vec(1, TAG_MASK_ALL).unwrap();
            println!("READY");
            // Take the stream slowly, so that the sender has a backlog when we die.
            loop {
                worker.recv_vec(2, TAG_MASK_ALL).unwrap();
                thread::sleep(Duration::from_millis(2));
            }
        }
        "rndv-send" => {
            worker.recv_vec(1, TAG_MASK_ALL).unwrap();
            let r = worker.tag_recv(2, TAG_MASK_ALL, vec![0; VICTIM_BIG]);
            println!("READY");
            let _ = r.wait();
        }
        "rndv-recv" => {
            worker.recv_vec(1, TAG_MASK_ALL).unwrap();
            let big = vec![5; VICTIM_BIG];
            ep.send(4, b"next").unwrap();
            let s = ep.tag_send(3, big);
            let _ = s.wait();
        }
        other => panic!("unknown victim role {other}"),
    }
    thread::sleep(long());
}

/// Waits at most 5 s after `killed_at` for every request; returns their results.
fn all_within_5s(reqs: Vec<Request>, killed_at: Instant) -> Vec<rdmx::Result<rdmx::Done>> {
    let deadline = killed_at + Duration::from_secs(5);
    let mut out = Vec::new();
    for r in reqs {
        while !r.wait_for(Duration::from_millis(1)) {
            assert!(
                Instant::now() < deadline,
                "a request on the dead peer's ep is still pending 5 s after SIGKILL: {r:?}"
            );
            WORKERS.with(|v| {
                for w in v.borrow().iter() {
                    w.progress();
                }
            });
        }
        out.push(r.wait());
    }
    println!("all requests done {:?} after SIGKILL", killed_at.elapsed());
    out
}

/// The worker's other endpoint still works, both ways: eager (inline and through the send
/// buffer pool) and rendezvous.
fn still_serves(server: &Worker, sep: &Ep, client: &Worker, cep: &Ep, seed: u8) {
    for len in [100, 4000, 1 << 20] {
        let r = server.tag_recv(9, TAG_MASK_ALL, vec![0; len]);
        let s = cep.tag_send(9, pattern(len, seed));
        assert_eq!(finish(r).unwrap().buf, pattern(len, seed));
        finish(s).unwrap();
        let r = client.tag_recv(10, TAG_MASK_ALL, vec![0; len]);
        let s = sep.tag_send(10, pattern(len, seed));
        assert_eq!(finish(r).unwrap().buf, pattern(len, seed));
        finish(s).unwrap();
    }
}

/// A peer process is SIGKILLed during an eager stream, while it reads a rendezvous message
/// from us, and while we read one from it. Every pending request on its ep fails within 5 s,
/// the worker's other ep keeps working, and memory regions, fds, buffers and connections
/// return to where they were.
pub fn peer_death_fails_pending_requests() {
    init_log();
    let role = std::env::var("RDMX_TEST_ROLE").unwrap_or_default();
    if let Some(rest) = role.strip_prefix("victim:") {
        let (role, addr) = rest.split_once(':').unwrap();
        return victim(role, addr);
    }
    if role != "survivor" {
        return isolated("peer_death_fails_pending_requests", "survivor");
    }
    let ctx = builder().build().unwrap();
    let (server, sep, client, cep) = pair(&ctx);
    let listener = server.listen(&format!("{}:0", addr_a())).unwrap();
    still_serves(&server, &sep, &client, &cep, 1);
    let base = resources(&server);
    println!("before: {base:?}");

    // 1. An eager stream: 2000 messages, most waiting for credits when the peer dies.
    let v = Victim::start(&listener, "eager-stream");
    let sends: Vec<Request> = (0..2000)
        .map(|i| v.ep.tag_send(2, vec![i as u8; 200 + (i % 7) * 500]))
        .collect();
    let deadline = Instant::now() + long();
    while sends.iter().filter(|r| r.is_done()).count() < 20 {
        assert!(Instant::now() < deadline, "the stream did not start");
        server.progress();
    }
    let (ep, killed_at) = v.kill();
    let results = all_within_5s(sends, killed_at);
    let failed = results.iter().filter(|r| r.is_err()).count();
    println!(
        "eager stream: {} delivered, {failed} failed",
        results.len() - failed
    );
    assert!(failed > 0, "the peer died with nothing pending");
    for e in results.into_iter().filter_map(|r| r.err()) {
        assert_eq!(e.status(), Some(Status::ConnectionClosed), "{e}");
    }
    drop(ep);
    still_serves(&server, &sep, &client, &cep, 2);
    settle(&server, &base);

    // 2. The peer is reading our rendezvous message when it dies.
    let v = Victim::start(&listener, "rndv-send");
    let send = v.ep.tag_send(2, pattern(VICTIM_BIG, 3));
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(if is_rdma() { 300 } else { 5 }) {
        server.progress();
    }
    assert!(
        !send.is_done(),
        "the read finished before the kill; make VICTIM_BIG larger"
    );
    let (ep, killed_at) = v.kill();
    let mut results = all_within_5s(vec![send], killed_at);
    let mut err = results.remove(0).expect_err("the reader died");
    assert_eq!(err.status(), Some(Status::ConnectionClosed), "{err}");
    assert_eq!(err.take_buffer().len(), VICTIM_BIG);
    drop(ep);
    still_serves(&server, &sep, &client, &cep, 4);
    settle(&server, &base);

    // 3. We are reading the peer's rendezvous message when it dies.
    let recv = server.tag_recv(3, TAG_MASK_ALL, vec![0; VICTIM_BIG]);
    let v = Victim::start(&listener, "rndv-recv");
    v.ep.send(1, b"go").unwrap();
    finish(server.tag_recv(4, TAG_MASK_ALL, vec![0; 4])).unwrap();
    let deadline = Instant::now() + long();
    while server.stats().reads_in_flight == 0 {
        assert!(Instant::now() < deadline, "the READ did not start");
        server.progress();
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(if is_rdma() { 300 } else { 5 }) {
        server.progress();
    }
    assert!(
        !recv.is_done(),
        "the read finished before the kill; make VICTIM_BIG larger"
    );
    let (ep, killed_at) = v.kill();
    let mut results = all_within_5s(vec![recv], killed_at);
    let err = results.remove(0).expect_err("the sender died");
    println!("receive failed: {err}");
    assert!(
        matches!(
            err.status(),
            Some(Status::ConnectionClosed) | Some(Status::ReadFailed)
        ),
        "{err}"
    );
    drop(ep);
    still_serves(&server, &sep, &client, &cep, 5);
    settle(&server, &base);
}

fn env_count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// RNR (receiver not ready) events the RDMA devices counted, when they expose them
/// (`hw_counters/*rnr*`); `None` where there is no such counter (TCP, or a device without).
fn rnr_events() -> Option<u64> {
    let mut total = None;
    for dev in std::fs::read_dir("/sys/class/infiniband").ok()?.flatten() {
        let Ok(ports) = std::fs::read_dir(dev.path().join("ports")) else {
            continue;
        };
        for port in ports.flatten() {
            let Ok(counters) = std::fs::read_dir(port.path().join("hw_counters")) else {
                continue;
            };
            for c in counters.flatten() {
                if !c.file_name().to_string_lossy().contains("rnr") {
                    continue;
                }
                if let Some(n) = std::fs::read_to_string(c.path())
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                {
                    *total.get_or_insert(0) += n;
                }
            }
        }
    }
    total
}

/// The size of message `seq` on ep `ep` in the flood: mostly small eager messages, some of
/// exactly the threshold, every 97th a rendezvous.
fn flood_len(ep: usize, seq: usize, threshold: usize) -> usize {
    match (ep * 7 + seq) % 97 {
        0 => threshold + 1 + seq % 1000,
        1 => threshold,
        k => (k * 37 + seq) % 1500,
    }
}

/// 64 endpoints flood one worker whose SRQ has 256 buffers (4 credits each): every message
/// arrives once, intact and in order per endpoint; the senders are held back by credits, so
/// the device counts no RNR (receiver not ready) event. `RDMX_FLOOD_MSGS` messages per
/// endpoint (CI: 300; `scripts/stress`: 10 000).
pub fn flood_through_a_small_srq() {
    init_log();
    let eps_n = 64;
    let per_ep = env_count("RDMX_FLOOD_MSGS", 300);
    let ctx = builder().srq_depth(256).credits(4).build().unwrap();
    let threshold = ctx.config().eager_threshold() as usize;
    let (server, _seps, client, ceps) = connect_n(&ctx, &addr_a(), eps_n);
    let rnr_before = rnr_events();
    let started = Instant::now();
    let total = eps_n * per_ep;
    let sender = thread::spawn(move || {
        let mut in_flight = std::collections::VecDeque::new();
        for seq in 0..per_ep {
            for (ep_i, ep) in ceps.iter().enumerate() {
                let len = flood_len(ep_i, seq, threshold);
                let tag = ((ep_i as u64) << 32) | seq as u64;
                in_flight.push_back(ep.tag_send(tag, pattern(len, (seq ^ ep_i) as u8)));
                if in_flight.len() >= 512 {
                    in_flight.pop_front().unwrap().wait().expect("send");
                }
            }
        }
        for r in in_flight {
            r.wait().expect("send");
        }
        drop(client);
        ceps
    });
    // Receives posted ahead, any tag; they match in the order posted, so waiting for them in
    // that order sees each endpoint's messages in the order they were matched.
    let mut next = vec![0usize; eps_n];
    let mut posted = std::collections::VecDeque::new();
    let post = |posted: &mut std::collections::VecDeque<Request>| {
        posted.push_back(server.tag_recv(0, TAG_MASK_ANY, vec![0; threshold + 1001]));
    };
    for _ in 0..128.min(total) {
        post(&mut posted);
    }
    for n in 0..total {
        let done = posted.pop_front().unwrap().wait().expect("receive");
        if n + posted.len() < total {
            post(&mut posted);
        }
        let (ep_i, seq) = ((done.tag >> 32) as usize, (done.tag & 0xffff_ffff) as usize);
        assert!(ep_i < eps_n, "tag {:#x}", done.tag);
        assert_eq!(
            seq, next[ep_i],
            "ep {ep_i}: out of order, lost or duplicated"
        );
        next[ep_i] += 1;
        let len = flood_len(ep_i, seq, threshold);
        assert_eq!(done.length, len);
        assert!(
            done.buf[..len] == pattern(len, (seq ^ ep_i) as u8)[..],
            "ep {ep_i} message {seq}: bytes differ"
        );
    }
    let ceps = sender.join().expect("sender");
    assert!(next.iter().all(|&n| n == per_ep));
    assert_eq!(
        server.stats().unexpected_messages,
        0,
        "nothing extra arrived"
    );
    let rnr_after = rnr_events();
    println!(
        "flood: {total} messages from {eps_n} eps through SRQ 256 in {:?}; RNR events {rnr_before:?} -> {rnr_after:?}",
        started.elapsed()
    );
    if let (Some(a), Some(b)) = (rnr_before, rnr_after) {
        assert_eq!(
            b - a,
            0,
            "the device saw RNR events: flow control let a sender overrun the SRQ"
        );
    } else if is_rdma() {
        println!("flood: this device exposes no RNR counter");
    }
    drop(ceps);
}

fn rss_kib() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Connect, exchange a message both ways, close: `RDMX_CHURN_CYCLES` times (CI: 200;
/// `scripts/stress`: 1000). File descriptors, memory regions, the worker's buffers and
/// connections return to where they were; resident memory stays flat.
pub fn connect_close_churn_leaks_nothing() {
    init_log();
    let role = std::env::var("RDMX_TEST_ROLE").unwrap_or_default();
    if role != "churn" {
        return isolated("connect_close_churn_leaks_nothing", "churn");
    }
    let cycles = env_count("RDMX_CHURN_CYCLES", 200);
    let ctx = builder().build().unwrap();
    let server = new_worker(&ctx);
    let client = new_worker(&ctx);
    let listener = server.listen(&format!("{}:0", addr_a())).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let cycle = |i: usize| {
        let c = client.clone();
        let a = addr.clone();
        let t = thread::spawn(move || c.connect(&a).expect("connect"));
        let sep = listener.accept().expect("accept");
        let cep = t.join().unwrap();
        let len = if i % 10 == 0 { 100_000 } else { 100 };
        let r = server.tag_recv(1, TAG_MASK_ALL, vec![0; len]);
        let s = cep.tag_send(1, pattern(len, i as u8));
        assert_eq!(finish(r).unwrap().buf, pattern(len, i as u8));
        finish(s).unwrap();
        let r = client.tag_recv(2, TAG_MASK_ALL, vec![0; 8]);
        sep.send(2, b"bye").unwrap();
        finish(r).unwrap();
        if i % 2 == 0 {
            cep.close().unwrap();
        } else {
            sep.close().unwrap();
        }
    };
    // Warm up (pools, caches, allocator), then measure.
    for i in 0..20 {
        cycle(i);
    }
    let quiet = |w: &Worker| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while w.stats().connections > 0 {
            assert!(Instant::now() < deadline, "connections were not reaped");
            server.progress();
            client.progress();
            thread::sleep(Duration::from_millis(2));
        }
    };
    quiet(&server);
    quiet(&client);
    let (base_s, base_c, rss0) = (resources(&server), resources(&client), rss_kib());
    let started = Instant::now();
    for i in 0..cycles {
        cycle(i);
    }
    quiet(&server);
    quiet(&client);
    settle(&server, &base_s);
    settle(&client, &base_c);
    let rss1 = rss_kib();
    println!(
        "churn: {cycles} connect/close cycles in {:?}; RSS {rss0} KiB -> {rss1} KiB; {base_s:?}",
        started.elapsed()
    );
    assert!(
        rss1 < rss0 + 16 * 1024,
        "resident memory grew by {} KiB over {cycles} cycles",
        rss1.saturating_sub(rss0)
    );
}

/// Runs `f` on a thread of its own and returns its result, failing the test if it takes
/// longer than [`long`] (a hang guard, not a timing).
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(long()) {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{what}: not done within {:?}", long()),
    }
}

/// Several threads call `recv_vec` on one worker at once, as UCP and MPI users do: every
/// message is received exactly once, by one of them, intact — a thread whose probed message
/// another thread took waits for the next one instead of failing (2 threads × 8 × 16 MiB,
/// then 4 threads × 2000 × 8 B; `RDMX_RECV_THREADS_MIB` sets the large size).
pub fn several_threads_receive_on_one_worker() {
    init_log();
    // In the emulated guest, threads spinning in poll mode starve rxe's kernel threads, which
    // move the rendezvous data: there the receivers sleep (event mode) instead.
    let mode = if is_rdma() {
        WaitMode::Event
    } else {
        WaitMode::BusyPoll
    };
    let ctx = builder().wait_mode(mode).build().unwrap();
    let (server, _sep, _client, cep) = pair(&ctx);
    // RDMX_RECV_THREADS_MIB shrinks the large messages for slow runs (valgrind). In the
    // emulated guest a debug build moves 16 × 16 MiB in about 100 s, so there they are 1 MiB
    // (any rendezvous size races the same way).
    let big = env_count("RDMX_RECV_THREADS_MIB", if is_rdma() { 1 } else { 16 }) << 20;
    for (threads, per_thread, len) in [(2usize, 8usize, big), (4, 2000, 8)] {
        let total = threads * per_thread;
        let started = Instant::now();
        let message = move |i: usize| {
            let mut m = pattern(len, i as u8);
            m[..8].copy_from_slice(&(i as u64).to_le_bytes());
            m
        };
        let sender = {
            let cep = cep.clone();
            thread::spawn(move || {
                let reqs: Vec<Request> = (0..total).map(|i| cep.tag_send(5, message(i))).collect();
                for r in reqs {
                    r.wait().expect("send");
                }
            })
        };
        let receivers: Vec<_> = (0..threads)
            .map(|t| {
                let server = server.clone();
                thread::spawn(move || {
                    (0..per_thread)
                        .map(|_| {
                            let (buf, info) =
                                server.recv_vec(5, TAG_MASK_ALL).unwrap_or_else(|e| {
                                    panic!("receiving thread {t}: {e}");
                                });
                            assert_eq!((info.length, buf.len()), (len, len));
                            let i = u64::from_le_bytes(buf[..8].try_into().unwrap()) as usize;
                            assert!(buf == message(i), "message {i} arrived intact");
                            i
                        })
                        .collect::<Vec<usize>>()
                })
            })
            .collect();
        let mut got = bounded("the receiving threads", move || {
            let got: Vec<usize> = receivers
                .into_iter()
                .flat_map(|r| r.join().expect("a receiving thread"))
                .collect();
            sender.join().expect("the sending thread");
            got
        });
        got.sort_unstable();
        assert_eq!(
            got,
            (0..total).collect::<Vec<_>>(),
            "{threads} threads × {per_thread} × {len} B: each message exactly once"
        );
        println!(
            "{threads} receiving threads × {per_thread} messages of {len} B: all received once \
             ({:?})",
            started.elapsed()
        );
    }
}

/// With progress threads, a blocking `recv_vec` ping-pong: a message that arrives before
/// its receive is posted completes no request, yet it must wake the thread blocked probing
/// for it (1000 round trips; a waiter left to a sleep slice instead would not finish
/// within the hang guard).
pub fn progress_thread_wakes_a_blocked_recv_vec() {
    init_log();
    let ctx = builder()
        .progress_thread(true)
        .wait_mode(WaitMode::Event)
        .build()
        .unwrap();
    let (server, sep, client, cep) = pair(&ctx);
    const ROUNDS: u64 = 1000;
    let echo = thread::spawn(move || {
        for _ in 0..ROUNDS {
            let (buf, info) = server.recv_vec(1, TAG_MASK_ALL).expect("ping");
            sep.send(2, &buf[..info.length]).expect("pong");
        }
    });
    bounded("1000 recv_vec round trips", move || {
        for i in 0..ROUNDS {
            cep.send(1, &i.to_le_bytes()).expect("ping");
            let (buf, _) = client.recv_vec(2, TAG_MASK_ALL).expect("pong");
            assert_eq!(buf, i.to_le_bytes());
        }
        echo.join().expect("the echo thread");
    });
}
