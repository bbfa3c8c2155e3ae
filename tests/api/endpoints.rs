//! Many endpoints on one worker: a thousand with the defaults, floods through a small one, connect/close
//! churn, peer close and connect failures.

use super::*;

/// The size of message `k` of endpoint `ep`'s burst: small eager ones, one of exactly the
/// threshold, and one rendezvous.
fn burst_len(ep: usize, k: usize, threshold: usize) -> usize {
    match k {
        0 => threshold + 1 + ep % 100,
        1 => threshold,
        _ => (ep * 31 + k * 17) % 200,
    }
}

/// A thousand endpoints (1024 over TCP; 256 over RDMA, in the guest) on one server worker
/// with the default settings — no admission cap — connected from four client workers;
/// each endpoint sends a burst of 8 messages at once. Every message arrives once, intact
/// and in order per endpoint; the server's receive memory does not grow with endpoints
/// (figures printed at 1, 64, 256 and all); the credit pool's figures and the device's
/// RNR events (past 4096 / 4 = 1024 endpoints' initial grants, RNR retry is the backstop)
/// are reported.
pub fn a_thousand_endpoints_on_one_worker() {
    two_sided("a_thousand_endpoints_on_one_worker", |p| {
        // RDMX_SCALE_EPS: fewer under valgrind (scripts/test).
        let n = env_count("RDMX_SCALE_EPS", if is_rdma() { 256 } else { 1024 });
        // The defaults (not the suite's smaller SRQ): no setting needs changing.
        let ctx = Context::builder()
            .env_lookup(test_env)
            .transport(crate::net().transport)
            .build()
            .unwrap();
        let mut stages: Vec<usize> = [1, 64, 256].into_iter().filter(|&s| s < n).collect();
        stages.push(n);
        if p.is_server() {
            thousand_server(p, &ctx, n, &stages);
        } else {
            thousand_clients(p, &ctx, &stages);
        }
    });
}

const BURST: usize = 8;
const CLIENTS: usize = 4;
/// The tag bit of the greeting each new endpoint sends.
const HELLO: u64 = 1 << 63;

/// The server of [`a_thousand_endpoints_on_one_worker`]: accepts the endpoints in stages,
/// each greeting it once, then takes every endpoint's burst by wildcard receives.
fn thousand_server(p: &Peer, ctx: &Context, n: usize, stages: &[usize]) {
    let threshold = ctx.config().eager_threshold() as usize;
    let server = new_worker(ctx);
    let listener = p.listen(&server);
    let started = Instant::now();
    let mut sep: Vec<Ep> = Vec::new();
    let mut memory = Vec::new();
    for &stage in stages {
        let have = sep.len();
        sep.extend(accept_n(&listener, stage - have, "a stage of endpoints"));
        // One message from each new endpoint, so that every connection was read from.
        for r in (have..stage)
            .map(|i| server.tag_recv(HELLO | i as u64, TAG_MASK_ALL, vec![0; 8]))
            .collect::<Vec<_>>()
        {
            let got = finish(r).unwrap();
            assert_eq!(got.buf, (got.tag & !HELLO).to_le_bytes());
        }
        p.barrier();
        let st = server.stats();
        assert_eq!(st.eps, stage);
        println!(
            "{stage:5} eps: server receive memory {} B, {:?} since the start; credits {:?}",
            st.recv_buffer_bytes,
            started.elapsed(),
            st.credits
        );
        memory.push(st.recv_buffer_bytes);
    }
    if is_rdma() {
        // The SRQ's buffers and its reserve (an eighth more), whatever the endpoints.
        let depth = u64::from(ctx.config().srq_depth());
        let srq = (depth + depth / 8) * u64::from(ctx.config().recv_buf_size());
        assert!(memory.iter().all(|&m| m == srq), "{memory:?}");
    } else {
        // One read buffer for all connections, and what each holds between polls (a few
        // recycled frame buffers of the handshake's size): no 64 KiB per connection.
        assert!(
            memory[memory.len() - 1] <= memory[0] + n as u64 * 1024,
            "TCP receive memory grows with endpoints: {memory:?}"
        );
    }
    // Every endpoint sends its burst at once; this side takes them all by wildcard receives.
    let rnr_before = rnr_events();
    let total = n * BURST;
    let mut next = vec![0usize; n];
    let mut posted = std::collections::VecDeque::new();
    let post = |posted: &mut std::collections::VecDeque<Request>| {
        posted.push_back(server.tag_recv(0, TAG_MASK_ANY, vec![0; threshold + 101]));
    };
    for _ in 0..256.min(total) {
        post(&mut posted);
    }
    for got in 0..total {
        let done = finish(posted.pop_front().unwrap()).expect("receive");
        if got + posted.len() < total {
            post(&mut posted);
        }
        let (ep_i, k) = ((done.tag >> 32) as usize, (done.tag & 0xffff_ffff) as usize);
        assert!(ep_i < n && k < BURST, "tag {:#x}", done.tag);
        assert_eq!(k, next[ep_i], "ep {ep_i}: out of order, lost or duplicated");
        next[ep_i] += 1;
        let len = burst_len(ep_i, k, threshold);
        assert_eq!(done.length, len, "ep {ep_i} message {k}");
        assert!(
            done.buf[..len] == pattern(len, (ep_i ^ k) as u8)[..],
            "ep {ep_i} message {k}: bytes differ"
        );
    }
    assert!(next.iter().all(|&k| k == BURST));
    let st = server.stats();
    assert_eq!(st.unexpected_messages, 0, "nothing extra arrived");
    let rnr_after = rnr_events();
    println!(
        "{n} eps x {BURST}: {total} messages in {:?}; credits {:?}; RNR events {rnr_before:?} -> {rnr_after:?}",
        started.elapsed(),
        st.credits
    );
    if crate::net().transport == Transport::Shm {
        assert_eq!(
            st.credits.granted, 0,
            "shared memory's windows are its rings', not the pool's: {:?}",
            st.credits
        );
    } else {
        assert!(
            st.credits.granted >= 4 * n as u64,
            "every endpoint holds at least the initial grant: {:?}",
            st.credits
        );
    }
    if rnr_after.is_none() && is_rdma() {
        println!("this device exposes no RNR counter");
    }
    p.barrier();
    drop(sep);
}

/// The clients of [`a_thousand_endpoints_on_one_worker`]: [`CLIENTS`] workers connect
/// endpoint `i` from worker `i % CLIENTS`, in the server's stages, and each endpoint
/// greets it; then every endpoint sends its burst at once.
fn thousand_clients(p: &Peer, ctx: &Context, stages: &[usize]) {
    let threshold = ctx.config().eager_threshold() as usize;
    let clients: Vec<Worker> = (0..CLIENTS).map(|_| new_worker(ctx)).collect();
    let addr = p.server_addr();
    let mut cep: Vec<Vec<Ep>> = vec![Vec::new(); CLIENTS];
    let mut have = 0;
    for &stage in stages {
        let connecting: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(c, w)| {
                let (w, a) = (w.clone(), addr.clone());
                let mine = (have..stage).filter(|i| i % CLIENTS == c).count();
                thread::spawn(move || {
                    (0..mine)
                        .map(|_| connect_retrying(&w, &a))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (c, t) in connecting.into_iter().enumerate() {
            cep[c].extend(t.join().expect("client thread"));
        }
        for i in have..stage {
            let ep = &cep[i % CLIENTS][i / CLIENTS];
            finish(ep.tag_send(HELLO | i as u64, (i as u64).to_le_bytes().to_vec())).unwrap();
        }
        p.barrier();
        have = stage;
    }
    let senders: Vec<_> = cep
        .into_iter()
        .enumerate()
        .map(|(c, eps)| {
            thread::spawn(move || {
                let mut sends = Vec::new();
                for (j, ep) in eps.iter().enumerate() {
                    let ep_i = j * CLIENTS + c;
                    for k in 0..BURST {
                        let tag = (ep_i as u64) << 32 | k as u64;
                        let len = burst_len(ep_i, k, threshold);
                        sends.push(ep.tag_send(tag, pattern(len, (ep_i ^ k) as u8)));
                    }
                }
                for s in sends {
                    s.wait().expect("send");
                }
                eps
            })
        })
        .collect();
    let eps: Vec<Vec<Ep>> = senders
        .into_iter()
        .map(|t| t.join().expect("sender"))
        .collect();
    p.barrier();
    drop(eps);
}

/// An overcommitted SRQ: 48 endpoints granted 4 credits each (192) towards a worker with 64
/// receive buffers, all sending while the worker does not progress. Over RDMA the SRQ runs
/// low, the device raises its limit event and the worker posts its reserve before the SRQ
/// runs dry; senders past that meet RNR and retry. Every message arrives once, in order.
pub fn overcommitted_srq_posts_its_reserve_and_loses_nothing() {
    two_sided(
        "overcommitted_srq_posts_its_reserve_and_loses_nothing",
        |p| {
            let eps_n = 48;
            let per_ep = 6;
            let ctx = builder().srq_depth(64).credits(4).build().unwrap();
            let (w, eps) = p.endpoints(&ctx, eps_n);
            if !p.is_server() {
                let mut sends = Vec::new();
                for seq in 0..per_ep {
                    for (ep_i, ep) in eps.iter().enumerate() {
                        let tag = ((ep_i as u64) << 32) | seq as u64;
                        sends.push(ep.tag_send(tag, pattern(100 + ep_i, seq as u8)));
                    }
                }
                for s in sends {
                    finish(s).expect("send");
                }
                p.barrier();
                return;
            }
            let rnr_before = rnr_events();
            // This side does not progress while the first frames pour in.
            thread::sleep(Duration::from_secs(2));
            let mut next = vec![0usize; eps_n];
            for _ in 0..eps_n * per_ep {
                let done = finish(w.tag_recv(0, TAG_MASK_ANY, vec![0; 200])).expect("receive");
                let (ep_i, seq) = ((done.tag >> 32) as usize, (done.tag & 0xffff_ffff) as usize);
                // The client's endpoint i is this side's i (one client connects them in order).
                assert_eq!(
                    seq, next[ep_i],
                    "ep {ep_i}: out of order, lost or duplicated"
                );
                next[ep_i] += 1;
                assert_eq!(done.buf[..done.length], pattern(100 + ep_i, seq as u8)[..]);
            }
            let st = w.stats();
            println!(
            "overcommitted SRQ: {} SRQ limit events; credits {:?}; RNR events {rnr_before:?} -> {:?}",
            st.srq_limit_events,
            st.credits,
            rnr_events()
        );
            if crate::net().transport == Transport::Shm {
                // Shared memory's windows are its rings': the pool grants nothing.
                assert_eq!(st.credits.granted, 0, "{:?}", st.credits);
            } else {
                assert!(
                    st.credits.granted > u64::from(st.srq_depth),
                    "{:?}",
                    st.credits
                );
            }
            if is_rdma() {
                assert!(
                    st.srq_limit_events > 0,
                    "the SRQ never reported running low"
                );
            } else {
                assert_eq!(st.srq_limit_events, 0, "TCP and shared memory have no SRQ");
            }
            p.barrier();
        },
    );
}

/// The server closes one of two endpoints while the client's rendezvous send on it waits to
/// be received: the send fails within 5 s (ConnectionClosed, its buffer back), new sends on
/// it fail at once, and the other endpoint keeps working.
pub fn peer_close_fails_pending_requests_only_on_that_ep() {
    two_sided("peer_close_fails_pending_requests_only_on_that_ep", |p| {
        let ctx = builder().build().unwrap();
        let (w, mut eps) = p.endpoints(&ctx, 2);
        if p.is_server() {
            wait_for_message(&w, 1, TAG_MASK_ALL);
            eps.remove(0).close().unwrap();
            p.barrier(); // closed
            let r = w.tag_recv(3, TAG_MASK_ALL, vec![0; 1 << 20]);
            assert_eq!(finish(r).unwrap().buf, pattern(1 << 20, 3));
            let r = w.tag_recv(4, TAG_MASK_ALL, vec![0; 8]);
            eps[0].send(4, b"back").unwrap();
            assert_eq!(&finish(r).unwrap().buf[..4], b"ok!!");
            p.barrier();
            return;
        }
        // A rendezvous send on ep 0 that the peer never receives, then the peer closes ep 0.
        let pending = eps[0].tag_send(1, pattern(1 << 20, 1));
        p.barrier();
        let closed_at = Instant::now();
        let mut err = finish(pending).expect_err("the peer closed");
        println!(
            "pending send failed {:?} after the peer closed",
            closed_at.elapsed()
        );
        assert_eq!(err.status(), Some(Status::ConnectionClosed));
        assert_eq!(err.take_buffer(), pattern(1 << 20, 1));
        assert!(closed_at.elapsed() < Duration::from_secs(5));
        assert!(!eps[0].is_connected());
        // New sends on the closed ep fail at once, with the buffer back.
        let err = finish(eps[0].tag_send(2, vec![1; 3])).expect_err("closed");
        assert_eq!(err.status(), Some(Status::ConnectionClosed));
        // The other ep keeps working, both ways.
        finish(eps[1].tag_send(3, pattern(1 << 20, 3))).unwrap();
        let (got, _) = w.recv_vec(4, TAG_MASK_ALL).unwrap();
        assert_eq!(got, b"back");
        eps[1].send(4, b"ok!!").unwrap();
        p.barrier();
    });
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
    two_sided("flood_through_a_small_srq", |p| {
        let eps_n = 64;
        let per_ep = env_count("RDMX_FLOOD_MSGS", 300);
        let ctx = builder().srq_depth(256).credits(4).build().unwrap();
        let threshold = ctx.config().eager_threshold() as usize;
        let (w, eps) = p.endpoints(&ctx, eps_n);
        let total = eps_n * per_ep;
        if !p.is_server() {
            let mut in_flight = std::collections::VecDeque::new();
            for seq in 0..per_ep {
                for (ep_i, ep) in eps.iter().enumerate() {
                    let len = flood_len(ep_i, seq, threshold);
                    let tag = ((ep_i as u64) << 32) | seq as u64;
                    in_flight.push_back(ep.tag_send(tag, pattern(len, (seq ^ ep_i) as u8)));
                    if in_flight.len() >= 512 {
                        finish(in_flight.pop_front().unwrap()).expect("send");
                    }
                }
            }
            for r in in_flight {
                finish(r).expect("send");
            }
            p.barrier();
            return;
        }
        let rnr_before = rnr_events();
        let started = Instant::now();
        // Receives posted ahead, any tag; they match in the order posted, so waiting for them
        // in that order sees each endpoint's messages in the order they were matched.
        let mut next = vec![0usize; eps_n];
        let mut posted = std::collections::VecDeque::new();
        let post = |posted: &mut std::collections::VecDeque<Request>| {
            posted.push_back(w.tag_recv(0, TAG_MASK_ANY, vec![0; threshold + 1001]));
        };
        for _ in 0..128.min(total) {
            post(&mut posted);
        }
        for n in 0..total {
            let done = finish(posted.pop_front().unwrap()).expect("receive");
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
        assert!(next.iter().all(|&n| n == per_ep));
        assert_eq!(w.stats().unexpected_messages, 0, "nothing extra arrived");
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
        p.barrier();
    });
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

/// The close modes UCP offers, and a drop that never blocks: each with a rendezvous send the
/// peer has not received.
/// The three ways to end an endpoint with a rendezvous send pending that the peer has not
/// received (it does not progress meanwhile): a force close fails the send; a flush-then-
/// close with a deadline it cannot meet is a timeout error, fails the send and closes anyway;
/// a drop returns at once and the endpoint lingers until the peer has the message.
pub fn close_modes_and_drop_never_block() {
    two_sided("close_modes_and_drop_never_block", |p| {
        let ctx = builder().build().unwrap();
        let big = 1 << 20; // rendezvous on both transports
        for tag in 1..=3u64 {
            let (w, eps) = p.endpoints(&ctx, 1);
            if p.is_server() {
                wait_for_message(&w, tag, TAG_MASK_ALL); // its RTS
                p.barrier();
                p.barrier(); // the client closed (or dropped) its endpoint
                if tag == 3 {
                    assert!(
                        eps[0].is_connected(),
                        "the dropped endpoint lingers while its send is pending"
                    );
                    let r = w.tag_recv(3, TAG_MASK_ALL, vec![0; big]);
                    let got = finish(r).expect("the message of a dropped endpoint arrives");
                    assert!(got.buf == pattern(big, 3));
                }
                wait_closed(&w, &eps[0]);
                p.barrier();
                continue;
            }
            let ep = eps.into_iter().next().expect("an endpoint");
            let s = ep.tag_send(tag, pattern(big, tag as u8));
            p.barrier(); // the server has its RTS
            match tag {
                1 => {
                    // Force: the pending send fails without waiting for the peer: at once
                    // over TCP; over RDMA once the NIC gave the exposed buffer back, which
                    // only this side's progress has to see.
                    ep.close_force();
                    assert!(!ep.is_connected());
                    if !is_rdma() {
                        assert!(s.is_done(), "a force close fails the pending send at once");
                    }
                    let err = finish(s).expect_err("force-closed");
                    assert_eq!(err.status(), Some(Status::ConnectionClosed), "{err}");
                    p.barrier();
                }
                2 => {
                    // Flush-then-close with a deadline the unreceived send cannot meet: a
                    // timeout error, the send fails, and the endpoint is closed anyway.
                    let err = ep
                        .close_timeout(Duration::from_millis(20))
                        .expect_err("nobody receives the send");
                    assert!(matches!(err, rdmx::Error::Timeout(..)), "{err}");
                    assert!(!ep.is_connected());
                    let err = finish(s).expect_err("closed at the deadline");
                    assert_eq!(err.status(), Some(Status::ConnectionClosed), "{err}");
                    p.barrier();
                }
                _ => {
                    // Drop with the send in flight (its request dropped too: fire and
                    // forget): the drop returns at once — the peer has not progressed, so a
                    // drop that waited for the send would wait for its whole timeout and then
                    // fail it — and the endpoint lingers until the peer receives the message,
                    // then closes by itself (this side progresses until it has).
                    drop(s);
                    drop(ep);
                    p.barrier();
                    let deadline = Instant::now() + long();
                    while w.stats().connections > 0 {
                        assert!(
                            Instant::now() < deadline,
                            "the dropped endpoint never closed"
                        );
                        w.progress();
                    }
                }
            }
            p.barrier();
        }
    });
}

/// Progresses this thread's workers until `ep` (the peer of a closed endpoint) sees the close.
fn wait_closed(worker: &Worker, ep: &Ep) {
    let deadline = Instant::now() + long();
    while ep.is_connected() {
        assert!(Instant::now() < deadline, "the peer never saw the close");
        worker.progress();
        WORKERS.with(|v| {
            for w in v.borrow().iter() {
                w.progress();
            }
        });
    }
}
