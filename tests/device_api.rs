//! The endpoint API suite (`tests/api`) over RDMA (Soft-RoCE). `#[ignore]`d on the host,
//! which has no RDMA; `scripts/test` runs it with `--ignored` in the guest (rxe0 on
//! $SOFTROCE_ADDR_A, rxe1 on $SOFTROCE_ADDR_B).

#[macro_use]
mod api;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the device tests through scripts/test (it boots the Soft-RoCE guest)")
    })
}

fn net() -> api::Net {
    api::Net {
        transport: rdmx::Transport::Rdma,
        addr_a: env("SOFTROCE_ADDR_A"),
        addr_b: env("SOFTROCE_ADDR_B"),
        sides: api::Sides::Threads,
        keepalive_ms: None,
        settings: Vec::new(),
    }
}

all_api_tests!(#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]);

/// One worker, three transports: a worker of an `auto` context (shared memory, RDMA and TCP
/// in the guest) listens once, at one address and port, and takes an RDMA endpoint from an
/// `rdma,tcp` client, a TCP endpoint from a TCP-only client and a shared-memory endpoint from
/// an `auto` client (the same host); eager and rendezvous messages flow both ways on all three
/// at once, each endpoint with its transport's eager limit. The TCP-only client's worker also
/// connects out over TCP to the RDMA-capable listener.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn one_worker_holds_rdma_and_tcp_endpoints_at_once() {
    use rdmx::{Context, Transport, TAG_MASK_ALL};
    use std::time::Instant;
    let _ = env_logger::builder().is_test(true).try_init();
    let builder = || {
        Context::builder()
            .env_lookup(api::test_env)
            .srq_depth(1024)
            .credits(16)
    };
    let auto = builder().build().unwrap();
    assert_eq!(
        auto.transports(),
        [Transport::Shm, Transport::Rdma, Transport::Tcp]
    );
    let rdma_tcp = builder()
        .transports(&[Transport::Rdma, Transport::Tcp])
        .build()
        .unwrap();
    let tcp_only = builder().transport(Transport::Tcp).build().unwrap();
    let server = auto.worker().unwrap();
    let listener = server
        .listen(&format!("{}:0", env("SOFTROCE_ADDR_A")))
        .unwrap();
    assert_eq!(
        listener.transports(),
        [Transport::Shm, Transport::Rdma, Transport::Tcp]
    );
    let addr = listener.local_addr().unwrap().to_string();
    let connect = |ctx: &Context| {
        let w = ctx.worker().unwrap();
        let (w2, a) = (w.clone(), addr.clone());
        let t = std::thread::spawn(move || w2.connect(&a).unwrap());
        let sep = listener.accept().unwrap();
        (w, t.join().unwrap(), sep)
    };
    let (rw, rep, srep) = connect(&rdma_tcp);
    let (tw, tep, step) = connect(&tcp_only);
    let (mw, mep, smep) = connect(&auto);
    assert_eq!(
        (rep.transport(), srep.transport()),
        (Transport::Rdma, Transport::Rdma)
    );
    assert_eq!(
        (tep.transport(), step.transport()),
        (Transport::Tcp, Transport::Tcp)
    );
    assert_eq!(
        (mep.transport(), smep.transport()),
        (Transport::Shm, Transport::Shm)
    );
    assert_eq!(server.stats().eps, 3, "one worker, all three endpoints");
    assert_eq!(srep.eager_limit(), Some(8152), "RDMA: the SRQ's buffers");
    assert_eq!(step.eager_limit(), Some(65496), "TCP: 64 KiB frames");
    assert_eq!(
        smep.eager_limit(),
        Some(16384),
        "shm: 16 KiB frames through the ring"
    );
    // The auto worker prefers shm, whose frames are larger: its SRQ keeps RDMA's 8 KiB
    // buffers (1024 and the reserve of an eighth; TCP's read buffer and held frames on top,
    // well under what 16 KiB buffers would add).
    let srq = (1024 + 128) * 8192;
    let held = server.stats().recv_buffer_bytes;
    assert!(
        (srq..srq + (4 << 20)).contains(&held),
        "{held} B for receiving"
    );
    println!(
        "server worker: {:?} endpoint from {:?}, {:?} endpoint from {:?}, {:?} endpoint from {:?}",
        srep.transport(),
        srep.peer_addr(),
        step.transport(),
        step.peer_addr(),
        smep.transport(),
        smep.peer_addr()
    );

    let workers = [&server, &rw, &tw, &mw];
    let finish = |r: rdmx::Request| {
        let deadline = Instant::now() + api::long();
        while !r.is_done() {
            assert!(Instant::now() < deadline, "not done: {r:?}");
            for w in workers {
                w.progress();
            }
        }
        r.wait().unwrap()
    };
    for len in [100usize, 1 << 20] {
        let msg = |seed: u8| -> Vec<u8> { (0..len).map(|i| (i as u8) ^ seed).collect() };
        // Both endpoints at once, both directions.
        let recvs = [
            server.tag_recv(1, TAG_MASK_ALL, vec![0; len]),
            server.tag_recv(2, TAG_MASK_ALL, vec![0; len]),
            rw.tag_recv(3, TAG_MASK_ALL, vec![0; len]),
            tw.tag_recv(4, TAG_MASK_ALL, vec![0; len]),
            server.tag_recv(5, TAG_MASK_ALL, vec![0; len]),
            mw.tag_recv(6, TAG_MASK_ALL, vec![0; len]),
        ];
        let sends = [
            rep.tag_send(1, msg(1)),
            tep.tag_send(2, msg(2)),
            srep.tag_send(3, msg(3)),
            step.tag_send(4, msg(4)),
            mep.tag_send(5, msg(5)),
            smep.tag_send(6, msg(6)),
        ];
        for (i, r) in recvs.into_iter().enumerate() {
            assert!(finish(r).buf == msg(i as u8 + 1), "{len} B message {i}");
        }
        for s in sends {
            finish(s);
        }
    }

    // The TCP-only worker also connects out to the same listener: over TCP.
    let (tw2, a) = (tw.clone(), addr.clone());
    let t = std::thread::spawn(move || tw2.connect(&a).unwrap());
    let sep2 = listener.accept().unwrap();
    let tep2 = t.join().unwrap();
    assert_eq!(
        (tep2.transport(), sep2.transport()),
        (Transport::Tcp, Transport::Tcp)
    );
    assert_eq!(server.stats().eps, 4);
}
