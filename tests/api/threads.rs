//! Several threads on one worker: sending, receiving, and a progress thread.

use super::*;

/// Four threads send on two endpoints of one worker at once, mostly eager and every tenth
/// message rendezvous; every message arrives, each thread's in its order.
pub fn several_threads_send_on_one_worker() {
    two_sided("several_threads_send_on_one_worker", |p| {
        let ctx = builder().build().unwrap();
        let thr = ctx.config().eager_threshold() as usize;
        const THREADS: u64 = 4;
        const PER: u64 = 150;
        let (w, eps) = p.endpoints(&ctx, 2);
        if !p.is_server() {
            let barrier = Arc::new(Barrier::new(THREADS as usize));
            let senders: Vec<_> = (0..THREADS)
                .map(|t| {
                    let ep = eps[(t % 2) as usize].clone();
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
            for s in senders {
                s.join().unwrap();
            }
            p.barrier();
            return;
        }
        let mut next: HashMap<u64, u64> = HashMap::new();
        for _ in 0..THREADS * PER {
            let r = w.tag_recv(0, TAG_MASK_ANY, vec![0; thr * 3]);
            let d = finish(r).expect("a message went missing");
            let (t, i) = (d.tag >> 32, d.tag & 0xffff_ffff);
            let seq = u64::from_le_bytes(d.buf[..8].try_into().unwrap());
            assert_eq!(seq, i);
            let expect = next.entry(t).or_insert(0);
            // Each thread's messages arrive in its order (one thread uses one ep).
            assert_eq!(i, *expect, "thread {t}'s messages reordered");
            *expect += 1;
        }
        assert!(next.values().all(|&n| n == PER));
        p.barrier();
    });
}

pub fn progress_thread_completes_requests() {
    two_sided("progress_thread_completes_requests", |p| {
        let ctx = builder().progress_thread(true).build().unwrap();
        let (w, eps) = p.endpoints(&ctx, 1);
        let r = if p.is_server() {
            w.tag_recv(1, TAG_MASK_ALL, vec![0; 1 << 20])
        } else {
            eps[0].tag_send(1, pattern(1 << 20, 4))
        };
        // Nobody calls progress or wait: the progress threads complete both.
        let deadline = Instant::now() + long();
        while !r.is_done() {
            assert!(
                Instant::now() < deadline,
                "progress thread did not complete the request"
            );
            thread::sleep(Duration::from_millis(5));
        }
        let done = r.wait().unwrap();
        if p.is_server() {
            assert_eq!(done.buf, pattern(1 << 20, 4));
        }
        p.barrier();
    });
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

/// The wait mode of tests with several receiving threads: in the emulated guest, threads
/// spinning in poll mode starve rxe's kernel threads, which move the rendezvous data, so
/// there they sleep (event mode) instead.
fn receivers_wait_mode() -> WaitMode {
    if is_rdma() {
        WaitMode::Event
    } else {
        WaitMode::BusyPoll
    }
}

/// Message `i` of `len` bytes (at least 8): its index, then a pattern seeded by it.
fn numbered(i: usize, len: usize) -> Vec<u8> {
    let mut m = pattern(len, i as u8);
    m[..8].copy_from_slice(&(i as u64).to_le_bytes());
    m
}

/// The index of a message made by [`numbered`].
fn number_of(m: &[u8]) -> usize {
    u64::from_le_bytes(m[..8].try_into().expect("an 8-byte index")) as usize
}

/// Joins the receiving threads (each returning the indices of the messages it got) within
/// the hang guard: every index received, sorted.
fn received_by(what: &str, receivers: Vec<thread::JoinHandle<Vec<usize>>>) -> Vec<usize> {
    let mut got = bounded(what, move || {
        receivers
            .into_iter()
            .flat_map(|r| r.join().expect("a receiving thread"))
            .collect::<Vec<usize>>()
    });
    got.sort_unstable();
    got
}

/// Several threads call `recv_vec` on one worker at once, as UCP and MPI users do: every
/// message is received exactly once, by one of them, intact — a thread whose probed message
/// another thread took waits for the next one instead of failing (2 threads × 8 × 16 MiB,
/// then 4 threads × 2000 × 8 B; `RDMX_RECV_THREADS_MIB` sets the large size).
pub fn several_threads_receive_on_one_worker() {
    two_sided("several_threads_receive_on_one_worker", |p| {
        let ctx = builder().wait_mode(receivers_wait_mode()).build().unwrap();
        let (w, eps) = p.endpoints(&ctx, 1);
        // RDMX_RECV_THREADS_MIB shrinks the large messages for slow runs (valgrind). In the
        // emulated guest a debug build moves 16 × 16 MiB in about 100 s, so there they are 1 MiB
        // (any rendezvous size races the same way).
        let big = env_count("RDMX_RECV_THREADS_MIB", if is_rdma() { 1 } else { 16 }) << 20;
        for (threads, per_thread, len) in [(2usize, 8usize, big), (4, 2000, 8)] {
            let total = threads * per_thread;
            let started = Instant::now();
            let message = move |i: usize| numbered(i, len);
            if !p.is_server() {
                let reqs: Vec<Request> =
                    (0..total).map(|i| eps[0].tag_send(5, message(i))).collect();
                for r in reqs {
                    r.wait().expect("send");
                }
                p.barrier();
                continue;
            }
            let receivers: Vec<_> = (0..threads)
                .map(|t| {
                    let server = w.clone();
                    thread::spawn(move || {
                        (0..per_thread)
                            .map(|_| {
                                let (buf, info) =
                                    server.recv_vec(5, TAG_MASK_ALL).unwrap_or_else(|e| {
                                        panic!("receiving thread {t}: {e}");
                                    });
                                assert_eq!((info.length, buf.len()), (len, len));
                                let i = number_of(&buf);
                                assert!(buf == message(i), "message {i} arrived intact");
                                i
                            })
                            .collect::<Vec<usize>>()
                    })
                })
                .collect();
            let got = received_by("the receiving threads", receivers);
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
            p.barrier();
        }
    });
}

/// With progress threads, a blocking `recv_vec` ping-pong: a message that arrives before
/// its receive is posted completes no request, yet it must wake the thread blocked probing
/// for it (1000 round trips; a waiter left to a sleep slice instead would not finish
/// within the hang guard).
pub fn progress_thread_wakes_a_blocked_recv_vec() {
    two_sided("progress_thread_wakes_a_blocked_recv_vec", |p| {
        let ctx = builder()
            .progress_thread(true)
            .wait_mode(WaitMode::Event)
            .build()
            .unwrap();
        let (w, eps) = p.endpoints(&ctx, 1);
        const ROUNDS: u64 = 1000;
        let ep = eps[0].clone();
        if p.is_server() {
            bounded("1000 recv_vec echoes", move || {
                for _ in 0..ROUNDS {
                    let (buf, info) = w.recv_vec(1, TAG_MASK_ALL).expect("ping");
                    ep.send(2, &buf[..info.length]).expect("pong");
                }
            });
        } else {
            bounded("1000 recv_vec round trips", move || {
                for i in 0..ROUNDS {
                    ep.send(1, &i.to_le_bytes()).expect("ping");
                    let (buf, _) = w.recv_vec(2, TAG_MASK_ALL).expect("pong");
                    assert_eq!(buf, i.to_le_bytes());
                }
            });
        }
        p.barrier();
    });
}

/// Matched probes (`MPI_Mprobe` / `MPI_Mrecv`) from four threads on one worker: each takes
/// a message out of matching, sizes a buffer from the probe and receives exactly that
/// message; none is taken twice or lost, eager and rendezvous alike. A probed message
/// dropped unreceived is discarded, and the next probe finds the next message.
pub fn matched_probes_from_several_threads() {
    two_sided("matched_probes_from_several_threads", |p| {
        let ctx = builder().wait_mode(receivers_wait_mode()).build().unwrap();
        let (server, eps) = p.endpoints(&ctx, 1);
        let (threads, per_thread) = (4usize, 50usize);
        let total = threads * per_thread;
        // Every fifth message is rendezvous (1 MiB on both transports); the others vary in size.
        let len_of = |i: usize| if i % 5 == 4 { 1 << 20 } else { 8 + 37 * i };
        let message = move |i: usize| numbered(i, len_of(i));
        if !p.is_server() {
            let reqs: Vec<Request> = (0..total)
                .map(|i| eps[0].tag_send(0x500 + (i % 7) as u64, message(i)))
                .collect();
            for r in reqs {
                r.wait().expect("send");
            }
            eps[0].send(0x600, b"first").unwrap();
            eps[0].send(0x600, b"second").unwrap();
            p.barrier();
            return;
        }
        let receivers: Vec<_> = (0..threads)
            .map(|_| {
                let server = server.clone();
                thread::spawn(move || {
                    let mut got = Vec::new();
                    let deadline = Instant::now() + long();
                    while got.len() < per_thread {
                        assert!(Instant::now() < deadline, "no message to probe");
                        let Some(msg) = server.probe_remove(0x500, !0xf) else {
                            // Spinning threads would starve the guest's rxe kernel threads, and
                            // the sender under valgrind (one thread runs at a time): 4 spinning
                            // receivers took 535 s of its 600 s bound there.
                            thread::sleep(Duration::from_millis(1));
                            continue;
                        };
                        let (tag, len) = (msg.tag(), msg.len() as usize);
                        let done = finish(msg.recv(vec![0; len])).expect("the probed message");
                        assert_eq!((done.tag, done.length), (tag, len));
                        let i = number_of(&done.buf);
                        assert_eq!(tag, 0x500 + (i % 7) as u64);
                        assert!(done.buf == message(i), "message {i} arrived intact");
                        got.push(i);
                    }
                    got
                })
            })
            .collect();
        let got = received_by("the probing threads", receivers);
        assert_eq!(
            got,
            (0..total).collect::<Vec<_>>(),
            "each message exactly once"
        );

        // Dropped unreceived: discarded, and the next probe finds the next message (the client
        // sent two after the others).
        let deadline = Instant::now() + long();
        let first = loop {
            if let Some(m) = server.probe_remove(0x600, TAG_MASK_ALL) {
                break m;
            }
            assert!(Instant::now() < deadline, "no message to probe");
        };
        assert_eq!(first.len(), 5);
        drop(first);
        let second = loop {
            if let Some(m) = server.probe_remove(0x600, TAG_MASK_ALL) {
                break m;
            }
            assert!(Instant::now() < deadline, "the second message never came");
        };
        assert_eq!(finish(second.recv(vec![0; 6])).unwrap().buf, b"second");
        assert!(server.probe(0x600, TAG_MASK_ALL).is_none());
        assert_eq!(server.stats().pending_requests, 0);
        p.barrier();
    });
}
