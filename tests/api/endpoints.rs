//! Many endpoints on one worker: a shared SRQ, floods through a small one, connect/close
//! churn, peer close and connect failures.

use super::*;

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
    wait_for_message(&server, 1, TAG_MASK_ALL);
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

/// The close modes UCP offers, and a drop that never blocks: each with a rendezvous send the
/// peer has not received.
pub fn close_modes_and_drop_never_block() {
    init_log();
    let ctx = builder().build().unwrap();
    let big = 1 << 20; // rendezvous on both transports
                       // Force: the pending send fails without waiting for the peer (which does not progress
                       // here): at once over TCP; over RDMA once the NIC gave the exposed buffer back, which
                       // only this side's progress has to see.
    let (server, sep, client, cep) = pair(&ctx);
    let s = cep.tag_send(1, pattern(big, 1));
    wait_for_message(&server, 1, TAG_MASK_ALL); // its RTS
    cep.close_force();
    assert!(!cep.is_connected());
    if !is_rdma() {
        assert!(s.is_done(), "a force close fails the pending send at once");
    }
    let deadline = Instant::now() + long();
    while !s.is_done() {
        assert!(
            Instant::now() < deadline,
            "the force-closed send never failed"
        );
        client.progress();
    }
    let err = s.wait().expect_err("force-closed");
    assert_eq!(err.status(), Some(Status::ConnectionClosed), "{err}");
    wait_closed(&server, &sep);

    // Flush-then-close with a deadline the unreceived send cannot meet: a timeout error,
    // the send fails, and the endpoint is closed anyway.
    let (server, sep, _client, cep) = pair(&ctx);
    let s = cep.tag_send(2, pattern(big, 2));
    wait_for_message(&server, 2, TAG_MASK_ALL); // its RTS
    let err = cep
        .close_timeout(Duration::from_millis(20))
        .expect_err("nobody receives the send");
    assert!(matches!(err, rdmx::Error::Timeout(..)), "{err}");
    assert!(!cep.is_connected());
    let err = finish(s).expect_err("closed at the deadline");
    assert_eq!(err.status(), Some(Status::ConnectionClosed), "{err}");
    wait_closed(&server, &sep);

    // Drop with the send in flight (its request dropped too: fire and forget): the drop
    // returns at once — the peer has not progressed, so a drop that waited for the send
    // would wait for its whole timeout and then fail it — and the endpoint lingers until
    // the peer receives the message, then closes by itself.
    let (server, sep, _client, cep) = pair(&ctx);
    drop(cep.tag_send(3, pattern(big, 3)));
    wait_for_message(&server, 3, TAG_MASK_ALL); // its RTS
    drop(cep);
    assert!(
        sep.is_connected(),
        "the dropped endpoint lingers while its send is pending"
    );
    let r = server.tag_recv(3, TAG_MASK_ALL, vec![0; big]);
    let got = finish(r).expect("the message of a dropped endpoint arrives");
    assert!(got.buf == pattern(big, 3));
    wait_closed(&server, &sep);
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
