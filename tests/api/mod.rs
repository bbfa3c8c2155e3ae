//! The endpoint API test suite, shared by every transport: `tests/device_api.rs` runs it
//! over RDMA in the Soft-RoCE guest, `tests/tcp_api.rs` over TCP on the host. Each test
//! binary provides `crate::net()`, naming its transport and addresses.

use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

#[path = "../pattern/mod.rs"]
mod pattern;
pub use pattern::pattern;
#[path = "../cpu_ticks/mod.rs"]
mod cpu_ticks;
pub use cpu_ticks::thread_cpu_ticks;
mod descriptors;
mod endpoints;
mod memory_handles;
mod messaging;
mod one_sided;
mod peer_death;
mod steady_state;
mod threads;
mod two_sided;
pub use descriptors::*;
pub use endpoints::*;
pub use memory_handles::*;
pub use messaging::*;
pub use one_sided::*;
pub use peer_death::*;
pub use steady_state::steady_state_messaging_allocates_nothing;
pub use threads::*;
#[allow(unused_imports)] // Side: only the binaries that run a side per node name it
pub use two_sided::{accept_n, connect_retrying, two_sided, Endpoints, Peer, Side, Sides};

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
    /// Where the two sides of two-sided tests ([`two_sided`]) run.
    pub sides: Sides,
    /// The keepalive the suite's contexts get (`RDMX_KEEPALIVE_MS` through [`test_env`]);
    /// `None`: rdmx's default.
    pub keepalive_ms: Option<u64>,
    /// Further variables every context of the suite sees through [`test_env`] (e.g.
    /// `RDMX_SHM_CMA=0` to run the suite over shared memory's copy path).
    pub settings: Vec<(&'static str, &'static str)>,
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

/// The tests of the suite written two-sided ([`two_sided`]): they also run across the wire
/// (`tests/twonode_api.rs`), a side per node.
macro_rules! two_sided_api_tests {
    ($($attr:tt)*) => {
        api_tests!([$($attr)*];
            eager_and_rendezvous_expected,
            eager_and_rendezvous_unexpected,
            shared_sends_from_one_buffer,
            registration_cache_mode_and_small_threshold,
            per_operation_registration_mode,
            event_wait_mode_roundtrips_and_idles,
            wildcard_and_masked_tags,
            truncation_on_both_protocols,
            truncation_of_probed_messages,
            cancel_receive_and_rendezvous_send,
            receives_name_the_sending_endpoint,
            matched_probes_from_several_threads,
            progress_thread_wakes_a_blocked_recv_vec,
            several_threads_receive_on_one_worker,
            several_threads_send_on_one_worker,
            peer_close_fails_pending_requests_only_on_that_ep,
            close_modes_and_drop_never_block,
            progress_thread_completes_requests,
            flood_through_a_small_srq,
            overcommitted_srq_posts_its_reserve_and_loses_nothing,
            a_thousand_endpoints_on_one_worker,
            typed_messages_and_timeouts,
        );
    };
}

/// Every test of the suite, with the given attributes (e.g. an `#[ignore]`).
macro_rules! all_api_tests {
    ($($attr:tt)*) => {
        two_sided_api_tests!($($attr)*);
        api_tests!([$($attr)*];
            connect_failures_are_errors,
            second_address_serves_endpoints,
            peer_death_fails_pending_requests,
            connect_close_churn_leaks_nothing,
            a_thousand_endpoints_at_the_default_descriptor_limit,
            running_out_of_descriptors_is_said_as_such,
            steady_state_messaging_allocates_nothing,
            memory_handles_and_remote_keys,
            puts_and_gets_are_byte_exact,
            fetch_and_add_from_four_clients_is_exact,
            compare_and_swap_as_a_lock_keeps_a_counter_exact,
            bad_one_sided_accesses_fail_cleanly,
            flush_makes_puts_visible_and_fence_orders,
            unmap_during_remote_traffic,
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

/// The process environment as tests see it: `RDMX_CONNECT_TIMEOUT_MS`, which slow runs
/// (valgrind) raise, and `RDMX_KEEPALIVE_MS` (by hand; otherwise the binary's
/// [`Net::keepalive_ms`]), and the binary's [`Net::settings`]; tests set everything else
/// explicitly.
pub fn test_env(var: &str) -> Option<String> {
    if var == rdmx::CONNECT_TIMEOUT_VAR || var == rdmx::KEEPALIVE_VAR {
        if let Ok(value) = std::env::var(var) {
            return Some(value);
        }
    }
    if var == rdmx::KEEPALIVE_VAR {
        return crate::net().keepalive_ms.map(|ms| ms.to_string());
    }
    crate::net()
        .settings
        .iter()
        .find(|(k, _)| *k == var)
        .map(|(_, v)| v.to_string())
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

/// Progresses `worker` (probing) until a message matching `tag`/`mask` has arrived — for a
/// rendezvous message, its RTS — and says what it is; a bounded wait.
fn wait_for_message(worker: &Worker, tag: u64, mask: u64) -> rdmx::ProbeInfo {
    let deadline = Instant::now() + long();
    loop {
        if let Some(p) = worker.probe(tag, mask) {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "no message with tag {tag:#x} (mask {mask:#x}) arrived"
        );
    }
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

fn env_count(var: &str, default: usize) -> usize {
    let set = crate::net()
        .settings
        .iter()
        .find(|(k, _)| *k == var)
        .map(|(_, v)| v.to_string());
    set.or_else(|| std::env::var(var).ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
