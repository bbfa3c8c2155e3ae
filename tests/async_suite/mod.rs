//! The async suite, shared by every transport: requests awaited as futures on a
//! multi-thread tokio runtime, each worker driven by `rdmx::tokio::drive`.
//! `tests/tcp_async.rs` and `tests/shm_async.rs` run it on the host, `tests/device_async.rs`
//! over RDMA in the Soft-RoCE guest. Each binary provides `crate::net()`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

#[path = "../cpu_ticks/mod.rs"]
mod cpu_ticks;
use cpu_ticks::thread_cpu_ticks;

use rdmx::{ConnId, Context, Ep, Request, Transport, WaitMode, Worker, TAG_MASK_ALL};

/// Where a binary runs the suite.
pub struct Net {
    /// The transport under test.
    pub transport: Transport,
    /// The address servers listen on.
    pub addr: String,
    /// Round trips of [`a_million_round_trips_lose_no_wake_up`].
    pub rounds: usize,
    /// Connects started at once in [`many_connects_proceed_at_once`].
    pub connects: usize,
}

/// How long a test waits for what should happen before calling it hung (a bound against
/// hangs, never a timing assertion): 60 s, or `RDMX_TEST_TIMEOUT_S`.
pub fn long() -> Duration {
    let secs = std::env::var("RDMX_TEST_TIMEOUT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
}

/// A count from the environment (`name`), else `default`: smaller runs under valgrind.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
}

/// A context of the suite's transport in `mode`.
fn context(mode: WaitMode) -> Context {
    Context::builder()
        .env_lookup(|v| {
            std::env::var(v)
                .ok()
                .filter(|_| v == rdmx::CONNECT_TIMEOUT_VAR)
        })
        .transport(crate::net().transport)
        .wait_mode(mode)
        .build()
        .expect("a context")
}

/// A multi-thread runtime of 4 threads, `f` run on it under the hang guard.
fn run<F: std::future::Future<Output = ()> + Send + 'static>(f: F) {
    run_guarded(f, long())
}

/// [`run`] with the hang guard `guard`.
fn run_guarded<F: std::future::Future<Output = ()> + Send + 'static>(f: F, guard: Duration) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        tokio::time::timeout(guard, f).await.expect("the test hung");
    });
}

/// A server and a client worker of `ctx`, each driven on the current runtime, and `n`
/// endpoints between them (client side, then server side by id).
struct Pair {
    server: Worker,
    client: Worker,
    ceps: Vec<Ep>,
    seps: HashMap<ConnId, Ep>,
    _drivers: (rdmx::tokio::Driver, rdmx::tokio::Driver),
}

async fn pair(ctx: &Context, n: usize) -> Pair {
    let server = ctx.worker().unwrap();
    let client = ctx.worker().unwrap();
    let drivers = (
        rdmx::tokio::drive(&server).unwrap(),
        rdmx::tokio::drive(&client).unwrap(),
    );
    let listener = server
        .listen(&format!("{}:0", crate::net().addr))
        .expect("listen");
    let addr = listener.local_addr().expect("bound").to_string();
    // (Connects are set up off the runtime's threads; the accepts answer each as it comes.)
    let connecting: Vec<_> = (0..n).map(|_| client.connect_nb(&addr)).collect();
    let mut seps = HashMap::new();
    for i in 0..n {
        let ep = tokio::time::timeout(long() / 2, rdmx::tokio::accept(&listener))
            .await
            .unwrap_or_else(|_| panic!("accept {i} of {n} hung"))
            .expect("accept");
        seps.insert(ep.id(), ep);
    }
    let mut ceps = Vec::new();
    for (i, c) in connecting.into_iter().enumerate() {
        let ep = tokio::time::timeout(long() / 2, c)
            .await
            .unwrap_or_else(|_| panic!("connect {i} of {n} hung"))
            .expect("connect");
        ceps.push(ep);
    }
    assert_eq!(ceps[0].transport(), crate::net().transport);
    Pair {
        server,
        client,
        ceps,
        seps,
        _drivers: drivers,
    }
}

/// An endpoint from `client` to `server`, made without a runtime (connect and accept block):
/// the client's side, then the server's.
fn connected(server: &Worker, client: &Worker) -> (Ep, Ep) {
    let listener = server
        .listen(&format!("{}:0", crate::net().addr))
        .expect("listen");
    let addr = listener.local_addr().unwrap().to_string();
    let c = client.clone();
    let cep = std::thread::spawn(move || c.connect(&addr).unwrap());
    let sep = listener.accept().unwrap();
    (cep.join().unwrap(), sep)
}

const REPLY: u64 = 1 << 62;

/// 1000 tasks, each doing round trips over 8 endpoints they share with the others, while
/// 1000 server tasks answer each on the endpoint the message came from: every message
/// arrives once, with its bytes, and nothing is left over (in both wait modes).
pub fn a_thousand_tasks_share_endpoints() {
    init_log();
    for mode in [WaitMode::BusyPoll, WaitMode::Event] {
        run(async move {
            let tasks = env_count("RDMX_ASYNC_TASKS", 1000) as u64;
            let rounds = 10u64;
            let p = Arc::new(pair(&context(mode), 8).await);
            let mut all = Vec::new();
            for t in 0..tasks {
                let q = p.clone();
                all.push(tokio::spawn(async move {
                    let p = q;
                    for r in 0..rounds {
                        let tag = (t << 16) | r;
                        let got = p
                            .server
                            .tag_recv(tag, TAG_MASK_ALL, vec![0; 64])
                            .await
                            .expect("the server's receive");
                        assert_eq!(&got.buf[..got.length], &tag.to_le_bytes()[..]);
                        let ep = &p.seps[&got.conn.expect("the sending endpoint")];
                        ep.tag_send(REPLY | tag, (!tag).to_le_bytes().to_vec())
                            .await
                            .expect("the answer");
                    }
                }));
                let p = p.clone();
                all.push(tokio::spawn(async move {
                    for r in 0..rounds {
                        let tag = (t << 16) | r;
                        let ep = &p.ceps[(t + r) as usize % p.ceps.len()];
                        let reply = p.client.tag_recv(REPLY | tag, TAG_MASK_ALL, vec![0; 64]);
                        ep.tag_send(tag, tag.to_le_bytes().to_vec())
                            .await
                            .expect("the client's send");
                        let got = reply.await.expect("the answer");
                        assert_eq!(&got.buf[..got.length], &(!tag).to_le_bytes()[..]);
                    }
                }));
            }
            let deadline = tokio::time::Instant::now() + long() / 2;
            while all.iter().any(|t| !t.is_finished()) {
                if tokio::time::Instant::now() > deadline {
                    let left = all.iter().filter(|t| !t.is_finished()).count();
                    panic!(
                        "{mode:?}: {left} tasks of {} stalled; server {:?}, client {:?}",
                        all.len(),
                        p.server.stats(),
                        p.client.stats()
                    );
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for t in all {
                t.await.expect("a task");
            }
            for w in [&p.server, &p.client] {
                assert!(w.probe(0, 0).is_none(), "a message left over");
                assert_eq!(w.stats().unexpected_messages, 0);
            }
            println!(
                "{mode:?}: {tasks} client and {tasks} server tasks, {rounds} round trips each"
            );
        });
    }
}

/// Receives dropped before they match leave their messages for the next receive; one
/// dropped while `select!` chose a timer, likewise. A rendezvous receive dropped while its
/// data is being read, and a rendezvous send dropped while its receiver reads it, go on
/// detached: their buffers stay with the worker, the peer's side completes, and the next
/// messages on the same endpoint arrive.
pub fn dropped_futures_leave_no_trap() {
    init_log();
    run(async move {
        let p = pair(&context(WaitMode::Event), 1).await;
        let (cep, sep) = (&p.ceps[0], p.seps.values().next().unwrap());

        // Before match: polled once (it registers its waker), then dropped.
        let recv = p.server.tag_recv(1, TAG_MASK_ALL, vec![0; 16]);
        assert!(tokio::time::timeout(Duration::from_millis(20), recv)
            .await
            .is_err());
        // In a select! that a timer wins.
        tokio::select! {
            r = p.server.tag_recv(1, TAG_MASK_ALL, vec![0; 16]) => panic!("nothing was sent: {r:?}"),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        cep.tag_send(1, b"still here".to_vec()).await.unwrap();
        let got = p
            .server
            .tag_recv(1, TAG_MASK_ALL, vec![0; 16])
            .await
            .unwrap();
        assert_eq!(&got.buf[..got.length], b"still here");

        // A rendezvous receive dropped mid-transfer: its READs go on into the worker's
        // buffer; the sender completes; the next message arrives.
        let big = 16 << 20;
        let send = cep.tag_send(2, vec![7u8; big]);
        let recv = tokio::spawn(p.server.tag_recv(2, TAG_MASK_ALL, vec![0; big]));
        while p.server.stats().reads_in_flight == 0 && !recv.is_finished() {
            tokio::task::yield_now().await;
        }
        println!("receive dropped mid-transfer: {}", !recv.is_finished());
        recv.abort();
        let _ = recv.await;
        send.await.expect("the sender's side completes");
        cep.tag_send(3, b"next".to_vec()).await.unwrap();
        let got = p
            .server
            .tag_recv(3, TAG_MASK_ALL, vec![0; 16])
            .await
            .unwrap();
        assert_eq!(&got.buf[..got.length], b"next");

        // A rendezvous send dropped while it is read: the receiver gets every byte.
        let send = tokio::spawn(sep.tag_send(4, vec![9u8; big]));
        let recv = p.client.tag_recv(4, TAG_MASK_ALL, vec![0; big]);
        while p.client.stats().reads_in_flight == 0 && !send.is_finished() {
            tokio::task::yield_now().await;
        }
        println!("send dropped while read: {}", !send.is_finished());
        send.abort();
        let got = recv.await.expect("the receive completes");
        assert!(got.length == big && got.buf.iter().all(|&b| b == 9));

        // Nothing is left behind: no request, READ or user buffer.
        let deadline = tokio::time::Instant::now() + long();
        loop {
            let s = p.server.stats();
            if s.reads_in_flight == 0 && s.user_buffers == 0 && s.pending_requests == 0 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "left behind: {s:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
}

/// A task awaiting a receive on an idle worker in event mode sleeps: its thread (a
/// current-thread runtime, the driver on it too) uses no more CPU over 2 s than a sleeping
/// thread does, then the message wakes it.
pub fn an_idle_async_worker_sleeps() {
    init_log();
    let ctx = context(WaitMode::Event);
    let server = ctx.worker().unwrap();
    let (cep, sep) = connected(&server, &ctx.worker().unwrap());
    let idle = Duration::from_secs(2);
    let waiter = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let _driver = rdmx::tokio::drive(&server).unwrap();
            let before = thread_cpu_ticks();
            let got = tokio::time::timeout(long(), server.tag_recv(9, TAG_MASK_ALL, vec![0; 16]))
                .await
                .expect("woken")
                .expect("received");
            (got, thread_cpu_ticks() - before)
        })
    });
    std::thread::sleep(idle);
    cep.send(9, b"wake up").unwrap();
    let (got, ticks) = waiter.join().unwrap();
    assert_eq!(&got.buf[..got.length], b"wake up");
    println!("an async receive on an idle worker used {ticks} CPU ticks (100/s) in {idle:?}");
    // Polling would use all 200; the blocking event-mode waiter's bound, for the same
    // reasons (tests/api's event_wait_mode_roundtrips_and_idles).
    assert!(ticks <= 40, "the task must sleep: {ticks} ticks of 200");
    drop(sep);
}

/// No wake-up is lost: a ping-pong of round trips between two tasks on two event-mode
/// workers (10^6 over shared memory, `Net::rounds`; `RDMX_ASYNC_ROUNDS` overrides), each
/// message completing a receive whose task may be registering its waker at that moment.
/// A lost wake-up stalls a round trip: each must end within the hang guard.
pub fn a_million_round_trips_lose_no_wake_up() {
    init_log();
    let rounds = env_count("RDMX_ASYNC_ROUNDS", crate::net().rounds) as u64;
    // (The whole run's guard: a stall is caught by each round trip's.)
    run_guarded(
        async move {
            let p = Arc::new(pair(&context(WaitMode::Event), 1).await);
            let q = p.clone();
            let echo = tokio::spawn(async move {
                let sep = q.seps.values().next().unwrap();
                for i in 0..rounds {
                    let got = q
                        .server
                        .tag_recv(i, TAG_MASK_ALL, vec![0; 8])
                        .await
                        .unwrap();
                    sep.tag_send(i, got.buf).await.unwrap();
                }
            });
            let start = std::time::Instant::now();
            for i in 0..rounds {
                let reply = p.client.tag_recv(i, TAG_MASK_ALL, vec![0; 8]);
                p.ceps[0]
                    .tag_send(i, i.to_le_bytes().to_vec())
                    .await
                    .unwrap();
                let got = tokio::time::timeout(long(), reply)
                    .await
                    .unwrap_or_else(|_| panic!("round trip {i} stalled"))
                    .unwrap();
                assert_eq!(got.buf, i.to_le_bytes());
            }
            echo.await.unwrap();
            println!(
                "{rounds} async round trips in event mode, {:?} each",
                start.elapsed() / rounds as u32
            );
        },
        long() * 100,
    );
}

/// Requests made on workers with no driver (nor progress thread) still complete as
/// futures: polled again at once, each drives its worker itself; so do a flush and a close
/// waited for by a thread (`Flushing::wait`, `Closing::wait`).
pub fn futures_complete_without_a_driver() {
    init_log();
    let ctx = context(WaitMode::BusyPoll);
    let server = ctx.worker().unwrap();
    let (cep, sep) = connected(&server, &ctx.worker().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ep = cep.clone();
    rt.block_on(async move {
        let recv: Request = server.tag_recv(5, TAG_MASK_ALL, vec![0; 8]);
        let send = cep.tag_send(5, 5u64.to_le_bytes().to_vec());
        let (got, sent) = tokio::time::timeout(long(), async { tokio::join!(recv, send) })
            .await
            .expect("no driver needed");
        assert_eq!(got.unwrap().buf, 5u64.to_le_bytes());
        sent.unwrap();
    });
    // The nonblocking flush and close, waited for by a thread: each drives the worker.
    let big = ep.tag_send(6, vec![1u8; 1 << 20]);
    let server_side = std::thread::spawn({
        let server = sep.worker().clone();
        move || server.recv_vec(6, TAG_MASK_ALL).unwrap().0.len()
    });
    ep.flush_nb().wait().expect("flushed");
    assert_eq!(server_side.join().unwrap(), 1 << 20);
    big.wait().unwrap();
    ep.close_nb().wait().expect("closed");
    assert!(!ep.is_connected());
}

/// The event-loop protocol on its own (no runtime): a worker counted as loop-driven before
/// it connects, in either wait mode, is armed once idle (`arm` says true), and its fd then
/// becomes readable when the peer sends — over shared memory too, whose peers ring its
/// doorbell only if told it may sleep. After progress takes the message, arming again
/// works. (In busy-poll mode the worker's rings would otherwise tell their producers that
/// it never sleeps, and nothing would wake the loop: its driver slept until a timer.)
pub fn an_armed_worker_is_woken_by_its_peer() {
    init_log();
    for mode in [WaitMode::BusyPoll, WaitMode::Event] {
        let ctx = context(mode);
        let server = ctx.worker().unwrap();
        let _driven = server.count_loop_driver();
        let (cep, _sep) = connected(&server, &ctx.worker().unwrap());
        for round in 0..3u64 {
            let recv = server.tag_recv(round, TAG_MASK_ALL, vec![0; 8]);
            let deadline = std::time::Instant::now() + long();
            while !server.arm().expect("arm") {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{mode:?}: never armed"
                );
            }
            cep.send(round, &round.to_le_bytes()).unwrap();
            let mut fds = [rustix::event::PollFd::new(
                &server,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::time::Timespec {
                tv_sec: long().as_secs() as i64,
                tv_nsec: 0,
            };
            let n = rustix::event::poll(&mut fds, Some(&timeout)).expect("poll");
            assert_eq!(
                n, 1,
                "{mode:?}, round {round}: the peer's message woke the fd"
            );
            while !recv.is_done() {
                server.progress();
            }
            assert_eq!(recv.wait().unwrap().buf, round.to_le_bytes());
        }
    }
}

mod rma_drop;
mod setup;
pub use rma_drop::*;
pub use setup::*;

/// The suite's tests, each with `$attr` (`#[ignore]` where the transport is missing).
macro_rules! async_tests {
    (@each [$($attr:tt)*];) => {};
    (@each [$($attr:tt)*]; $name:ident $(, $rest:ident)* $(,)?) => {
        #[test]
        $($attr)*
        fn $name() {
            async_suite::$name();
        }
        async_tests!(@each [$($attr)*]; $($rest),*);
    };
    ($($attr:tt)*) => {
        async_tests!(@each [$($attr)*];
            a_thousand_tasks_share_endpoints,
            dropped_futures_leave_no_trap,
            an_idle_async_worker_sleeps,
            a_million_round_trips_lose_no_wake_up,
            futures_complete_without_a_driver,
            an_armed_worker_is_woken_by_its_peer,
            many_connects_proceed_at_once,
            a_dead_address_blocks_no_task,
            flush_and_close_are_futures,
            dropped_rma_futures_leave_no_trap,
        );
    };
}
