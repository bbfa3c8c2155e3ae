//! The endpoint API suite (`tests/api`) over shared memory with rendezvous by copy: as where
//! the kernel refuses CMA (`yama/ptrace_scope`, another user), forced here with
//! `RDMX_SHM_CMA=0`. The same test bodies as over TCP, RDMA and shared memory with CMA.

#[macro_use]
mod api;

fn net() -> api::Net {
    api::Net {
        transport: rdmx::Transport::Shm,
        addr_a: "127.0.0.1".into(),
        addr_b: "127.0.0.1".into(),
        sides: api::Sides::Threads,
        keepalive_ms: None,
        // (Copying is slower than CMA in a debug build: the threads test's large messages
        // are 4 MiB here, which races the same way.)
        settings: vec![(rdmx::SHM_CMA_VAR, "0"), ("RDMX_RECV_THREADS_MIB", "4")],
    }
}

all_api_tests!();

/// Both endpoints say their rendezvous goes by copy, and a large message arrives intact
/// through it (the copy is pipelined: 16 MiB is many times the ring).
#[test]
fn endpoints_say_their_rendezvous_goes_by_copy() {
    let ctx = api::builder().build().unwrap();
    let server = ctx.worker().unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let client = ctx.worker().unwrap();
    let accept = std::thread::spawn(move || listener.accept().unwrap());
    let ep = client.connect(&addr).unwrap();
    let sep = accept.join().unwrap();
    for e in [&ep, &sep] {
        assert_eq!(e.transport(), rdmx::Transport::Shm);
        assert_eq!(
            e.data_path(),
            "shm, rendezvous by copy (RDMX_SHM_CMA=0)",
            "{e:?}"
        );
    }
    let len = 16 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    let recv = server.tag_recv(1, rdmx::TAG_MASK_ALL, vec![0; len]);
    let send = ep.tag_send(1, data.clone());
    let deadline = std::time::Instant::now() + api::long();
    while !(recv.is_done() && send.is_done()) {
        assert!(
            std::time::Instant::now() < deadline,
            "not done (a hang guard)"
        );
        server.progress();
        client.progress();
    }
    assert_eq!(recv.wait().unwrap().buf, data);
    send.wait().unwrap();
}
