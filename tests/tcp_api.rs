//! The endpoint API suite (`tests/api`) over TCP on loopback: the same test bodies as the
//! RDMA run in the guest.

#[macro_use]
mod api;

fn net() -> api::Net {
    api::Net {
        transport: rdmx::Transport::Tcp,
        addr_a: "127.0.0.1".into(),
        addr_b: "127.0.0.1".into(),
        sides: api::Sides::Threads,
        keepalive_ms: None,
        settings: Vec::new(),
    }
}

all_api_tests!();

#[test]
fn public_types_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<rdmx::Context>();
    both::<rdmx::Worker>();
    both::<rdmx::Ep>();
    both::<rdmx::Listener>();
    both::<rdmx::Request>();
    both::<rdmx::Error>();
}

#[test]
fn asking_for_rdma_without_a_device_is_a_clear_error() {
    // The host has no RDMA device (rdmacm lists none); the guest does, so only check there.
    #[cfg(feature = "rdma")]
    let devices = rdmx::conn::Device::list().unwrap_or_default();
    #[cfg(not(feature = "rdma"))]
    let devices: Vec<()> = Vec::new();
    let result = rdmx::Context::builder()
        .env_lookup(api::test_env)
        .transport(rdmx::Transport::Rdma)
        .build();
    if devices.is_empty() {
        let err = result.expect_err("no device");
        assert!(err.to_string().contains("RDMX_TRANSPORT=rdma"), "{err}");
        let auto = rdmx::Context::builder()
            .env_lookup(api::test_env)
            .build()
            .unwrap();
        assert_eq!(
            auto.transports(),
            [rdmx::Transport::Shm, rdmx::Transport::Tcp],
            "auto: shared memory for peers on this host, else TCP"
        );
    } else {
        assert_eq!(result.unwrap().transport(), rdmx::Transport::Rdma);
    }
}

/// A TCP context (environment ignored but for the tests' own variables), a worker of it
/// listening on loopback, the listener and its address.
fn tcp_server() -> (rdmx::Context, rdmx::Worker, rdmx::Listener, String) {
    let ctx = rdmx::Context::builder()
        .env_lookup(api::test_env)
        .transport(rdmx::Transport::Tcp)
        .build()
        .unwrap();
    let server = ctx.worker().unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (ctx, server, listener, addr)
}

/// Hostile frames over TCP: a peer with a valid handshake sends one malformed frame. Each
/// closes that peer's endpoint with a reason naming what was wrong, and another endpoint of
/// the same worker keeps working (eager and rendezvous).
#[test]
fn hostile_frames_close_only_their_endpoint() {
    use rdmx::proto::wire::{FrameBuf, Header, Opcode, RtsBody};
    use rdmx::TAG_MASK_ALL;
    use std::time::{Duration, Instant};
    let _ = env_logger::builder().is_test(true).try_init();
    let eager = |payload_len: u32, body: usize| {
        let mut h = Header::new(Opcode::Eager);
        h.payload_len = payload_len;
        let mut v = FrameBuf::encode(&h, None).as_bytes().to_vec();
        v.resize(v.len() + body, 7);
        v
    };
    let rts = |addr: u64, len: u64| {
        let mut h = Header::new(Opcode::Rts);
        h.payload_len = 24;
        FrameBuf::encode(&h, Some(&RtsBody { addr, rkey: 1, len }))
            .as_bytes()
            .to_vec()
    };
    let patched = |at: usize, bytes: &[u8]| {
        let mut v = eager(4, 4);
        v[at..at + bytes.len()].copy_from_slice(bytes);
        v
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "longer than a receive buffer",
            eager(70_000, 70_000),
            "exceeds the 65536-byte receive buffer",
        ),
        (
            "length disagreeing with the bytes",
            eager(100, 10),
            "payload length 100 disagrees",
        ),
        ("unknown opcode", patched(3, &[99]), "unknown opcode 99"),
        (
            "bad version",
            patched(2, &[9]),
            "unsupported protocol version 9",
        ),
        ("bad magic", patched(0, &[0xad, 0xde]), "bad magic"),
        (
            "shorter than a header",
            vec![1, 2, 3],
            "shorter than the 40-byte header",
        ),
        ("RTS of 0 bytes", rts(0x1000, 0), "out of range"),
        ("RTS past 2^47 bytes", rts(0x1000, 1 << 48), "out of range"),
        (
            "RTS past the address space",
            rts(u64::MAX - 10, 100),
            "out of range",
        ),
        (
            "not a frame at all",
            b"this is not an rdmx frame at all, not even close".to_vec(),
            "protocol error",
        ),
    ];
    let (ctx, server, listener, addr) = tcp_server();
    let client = ctx.worker().unwrap();
    let c = client.clone();
    let a = addr.clone();
    let good = std::thread::spawn(move || c.connect(&a).unwrap());
    let _good_server_side = listener.accept().unwrap();
    let good = good.join().unwrap();
    let handshake = rdmx::proto::Engine::new(Default::default())
        .local_handshake()
        .encode();
    for (i, (what, frame, expect)) in cases.into_iter().enumerate() {
        let a = addr.clone();
        let hs = handshake.clone();
        let evil = std::thread::spawn(move || {
            rdmx_tcp::connect(&a, &hs, Duration::from_secs(60)).unwrap()
        });
        let victim = listener.accept().unwrap();
        let evil = evil.join().unwrap();
        evil.queue_frame(&frame, &[]);
        let deadline = Instant::now() + api::long();
        while !evil.flush().unwrap() {
            assert!(Instant::now() < deadline);
        }
        while victim.is_connected() {
            assert!(Instant::now() < deadline, "{what}: not noticed");
            server.progress();
        }
        let reason = victim.close_reason().unwrap_or_default();
        println!("{what}: {reason}");
        assert!(
            reason.contains(expect),
            "{what}: {reason:?} should say {expect:?}"
        );
        // The hostile peer is disconnected.
        let mut events = Vec::new();
        while !events
            .iter()
            .any(|e| matches!(e, rdmx_tcp::Event::Closed { .. }))
        {
            assert!(
                Instant::now() < deadline,
                "{what}: the peer was not disconnected"
            );
            server.progress();
            let _ = evil.poll(&mut events);
        }
        // The good endpoint is untouched, eager and rendezvous.
        for len in [64, 1 << 20] {
            let r = server.tag_recv(1, TAG_MASK_ALL, vec![0; len]);
            let s = good.tag_send(1, vec![i as u8; len]);
            while !(r.is_done() && s.is_done()) {
                assert!(Instant::now() < deadline);
                server.progress();
                client.progress();
            }
            assert!(r.wait().unwrap().buf.iter().all(|&b| b == i as u8));
            s.wait().unwrap();
        }
    }
}

/// A raw TCP peer with a valid handshake, driven by the test (no rdmx worker of its own).
struct RawTcp {
    link: rdmx_tcp::Link,
    next_read: u64,
}

/// What a raw peer's READ request got.
#[derive(Debug, PartialEq)]
enum ReadOutcome {
    Data(Vec<u8>),
    Refused,
    Disconnected,
}

impl RawTcp {
    fn connect(listener: &rdmx::Listener, addr: &str) -> (RawTcp, rdmx::Ep) {
        let hs = rdmx::proto::Engine::new(Default::default())
            .local_handshake()
            .encode();
        let a = addr.to_string();
        let t = std::thread::spawn(move || {
            rdmx_tcp::connect(&a, &hs, std::time::Duration::from_secs(60)).unwrap()
        });
        let ep = listener.accept().unwrap();
        let link = t.join().unwrap();
        (RawTcp { link, next_read: 1 }, ep)
    }

    /// Progresses `worker` until this peer got an RTS; returns its body.
    fn expect_rts(&mut self, worker: &rdmx::Worker) -> rdmx::proto::wire::RtsBody {
        use rdmx::proto::wire::{decode, Body};
        let deadline = std::time::Instant::now() + api::long();
        loop {
            assert!(std::time::Instant::now() < deadline, "no RTS arrived");
            worker.progress();
            let mut events = Vec::new();
            self.link.poll(&mut events).unwrap();
            for e in events {
                if let rdmx_tcp::Event::Frame(bytes) = e {
                    if let Body::Rts(rts) = decode(&bytes).expect("rdmx sent a valid frame").body {
                        return rts;
                    }
                }
            }
        }
    }

    /// Asks for `len` bytes at `addr` with `rkey`, progressing `worker` until answered.
    fn read(&mut self, worker: &rdmx::Worker, addr: u64, rkey: u32, len: usize) -> ReadOutcome {
        let (id, key) = (self.next_read, 1 << 40 | self.next_read);
        self.next_read += 1;
        self.link.lend(key, vec![0; len]);
        self.link.expect_read(id, key, 0, len).unwrap();
        self.link.queue_read_request(id, addr, rkey, len as u64);
        let deadline = std::time::Instant::now() + api::long();
        loop {
            assert!(std::time::Instant::now() < deadline, "READ not answered");
            if self.link.flush().is_err() {
                return ReadOutcome::Disconnected;
            }
            worker.progress();
            let mut events = Vec::new();
            if self.link.poll(&mut events).is_err() {
                return ReadOutcome::Disconnected;
            }
            for e in events {
                match e {
                    rdmx_tcp::Event::ReadDone { read_id, ok } if read_id == id => {
                        let data = self.link.reclaim(key).expect("the lent buffer");
                        return if ok {
                            ReadOutcome::Data(data)
                        } else {
                            ReadOutcome::Refused
                        };
                    }
                    rdmx_tcp::Event::Closed { .. } => return ReadOutcome::Disconnected,
                    _ => {}
                }
            }
        }
    }
}

/// A hostile TCP peer that guesses rendezvous keys reads nothing that was not sent to it.
///
/// The worker sends a 1 MiB rendezvous message to the hostile peer, then a secret 1 MiB one
/// to an honest peer, whose READ key the hostile peer then tries to reach: by predicting it
/// from its own (the next exposure slot, the next value of a linear generator), by nearby
/// guesses, and finally with the honest peer's real address and key. None of it returns a
/// byte of the secret; a READ naming a buffer exposed to another endpoint closes the hostile
/// endpoint as a protocol error, and the honest peer still reads its message afterwards.
#[test]
fn a_hostile_tcp_peer_reads_only_what_was_sent_to_it() {
    let _ = env_logger::builder().is_test(true).try_init();
    const MIB: usize = 1 << 20;
    let (_ctx, server, listener, addr) = tcp_server();
    let (mut evil, evil_ep) = RawTcp::connect(&listener, &addr);
    let (mut honest, honest_ep) = RawTcp::connect(&listener, &addr);

    let own: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    let secret: Vec<u8> = (0..MIB).map(|i| (i % 241) as u8 ^ 0x5a).collect();
    let _to_evil = evil_ep.tag_send(1, own.clone());
    let mine = evil.expect_rts(&server);
    let _to_honest = honest_ep.tag_send(2, secret.clone());
    let theirs = honest.expect_rts(&server);
    assert_eq!(
        evil.read(&server, mine.addr, mine.rkey, MIB),
        ReadOutcome::Data(own),
        "the hostile peer may read what was sent to it"
    );

    // Guesses: what a linear key generator and sequential slots would give next, and
    // neighbours of the peer's own address and key.
    let lcg = |k: u32| k.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
    let mut guesses = vec![
        (mine.addr + (1 << 40), lcg(mine.rkey)),
        (mine.addr, lcg(mine.rkey)),
        (mine.addr + (1 << 40), mine.rkey),
    ];
    for d in 1..=16u32 {
        for (a, k) in [
            (mine.addr, mine.rkey.wrapping_add(d)),
            (mine.addr, mine.rkey.wrapping_sub(d)),
            (mine.addr.wrapping_add(u64::from(d) << 40), mine.rkey),
            (
                mine.addr.wrapping_add(u64::from(d) << 40),
                mine.rkey.wrapping_add(d),
            ),
        ] {
            guesses.push((a, k));
        }
    }
    guesses.push((theirs.addr, theirs.rkey));
    for (i, &(a, k)) in guesses.iter().enumerate() {
        match evil.read(&server, a, k, MIB) {
            ReadOutcome::Data(d) => {
                assert!(
                    d != secret,
                    "guess {i} ({a:#x}, {k:#x}) read the message sent to another peer"
                );
                panic!("guess {i} ({a:#x}, {k:#x}) read {} bytes", d.len());
            }
            ReadOutcome::Refused => {}
            ReadOutcome::Disconnected => {
                println!(
                    "hostile peer disconnected after guess {i} of {}",
                    guesses.len()
                );
                break;
            }
        }
    }
    // Naming another endpoint's buffer closes the asking endpoint.
    let deadline = std::time::Instant::now() + api::long();
    while evil_ep.is_connected() {
        assert!(std::time::Instant::now() < deadline);
        server.progress();
    }
    let reason = evil_ep.close_reason().unwrap_or_default();
    println!("hostile endpoint closed: {reason}");
    assert!(reason.contains("protocol error"), "{reason}");
    assert!(honest_ep.is_connected(), "only the hostile endpoint closed");
    assert_eq!(
        honest.read(&server, theirs.addr, theirs.rkey, MIB),
        ReadOutcome::Data(secret),
        "the honest peer reads its message"
    );
}
