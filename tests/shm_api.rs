//! The endpoint API suite (`tests/api`) over shared memory between workers on this host:
//! the same test bodies as over TCP and RDMA. Connections are set up over loopback TCP and
//! then carried by the shared-memory transport.

#[macro_use]
mod api;

fn net() -> api::Net {
    api::Net {
        transport: rdmx::Transport::Shm,
        addr_a: "127.0.0.1".into(),
        addr_b: "127.0.0.1".into(),
        sides: api::Sides::Threads,
        keepalive_ms: None,
        settings: Vec::new(),
    }
}

all_api_tests!();

/// A context using only `transports` (environment ignored but for the tests' own variables).
fn context(transports: &str) -> rdmx::Context {
    let list: Vec<rdmx::Transport> = transports
        .split(',')
        .map(|t| match t {
            "shm" => rdmx::Transport::Shm,
            _ => rdmx::Transport::Tcp,
        })
        .collect();
    rdmx::Context::builder()
        .env_lookup(api::test_env)
        .transports(&list)
        .build()
        .unwrap()
}

/// Endpoints say which transport carries them: shared memory when both sides use it, TCP
/// when the acceptor does not (and the connector allows TCP).
#[test]
fn endpoints_say_they_run_over_shared_memory() {
    let server_ctx = context("shm");
    let server = server_ctx.worker().unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    assert_eq!(listener.transports(), [rdmx::Transport::Shm]);
    let addr = listener.local_addr().unwrap().to_string();
    let client_ctx = context("shm,tcp");
    // In the worker's order of preference.
    let both = client_ctx.worker().unwrap().listen("127.0.0.1:0").unwrap();
    assert_eq!(
        both.transports(),
        [rdmx::Transport::Shm, rdmx::Transport::Tcp]
    );
    drop(both);
    let client = client_ctx.worker().unwrap();
    let accept = std::thread::spawn(move || {
        let ep = listener.accept().unwrap();
        (ep, listener)
    });
    let ep = client.connect(&addr).unwrap();
    let (sep, _listener) = accept.join().unwrap();
    assert_eq!(ep.transport(), rdmx::Transport::Shm);
    assert_eq!(sep.transport(), rdmx::Transport::Shm);
    // Two threads of one process: the kernel allows CMA.
    assert_eq!(ep.data_path(), "shm, rendezvous by CMA");
    assert_eq!(sep.data_path(), "shm, rendezvous by CMA");

    // A TCP-only acceptor: the offer is declined and the connection stays TCP.
    let tcp_ctx = context("tcp");
    let tcp_server = tcp_ctx.worker().unwrap();
    let tcp_listener = tcp_server.listen("127.0.0.1:0").unwrap();
    let tcp_addr = tcp_listener.local_addr().unwrap().to_string();
    let accept = std::thread::spawn(move || {
        let ep = tcp_listener.accept().unwrap();
        (ep, tcp_listener)
    });
    let ep2 = client.connect(&tcp_addr).unwrap();
    let (sep2, tcp_listener) = accept.join().unwrap();
    assert_eq!(ep2.transport(), rdmx::Transport::Tcp);
    assert_eq!(sep2.transport(), rdmx::Transport::Tcp);

    // A connector that allows only shared memory, to that acceptor: refused, saying why.
    let accept = std::thread::spawn(move || {
        let ep = tcp_listener.accept();
        (ep, tcp_listener)
    });
    let shm_only_ctx = context("shm");
    let shm_only = shm_only_ctx.worker().unwrap();
    let e = shm_only.connect(&tcp_addr).expect_err("declined");
    assert!(e.to_string().contains("declined shared memory"), "{e}");
    let _ = accept.join().unwrap();
}

/// The segment of a shared-memory connection is a memfd with no name in any file system:
/// while the connection carries messages nothing appears in `/dev/shm`, so nothing can be
/// left there when either side dies (its mapping goes with it; neither side keeps a
/// descriptor of it once it is mapped).
#[test]
fn segments_leave_nothing_in_dev_shm() {
    let listing = || -> Vec<String> {
        std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    // (Other programs' entries come and go as they like.)
                    .filter(|n| n.contains("rdmx"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let memfd_descriptors = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy().starts_with("/memfd:rdmx-shm"))
            .count()
    };
    let memfd_mappings = || {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.contains("/memfd:rdmx-shm"))
            .count()
    };
    let before = listing();
    let ctx = context("shm");
    let server = ctx.worker().unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let client = ctx.worker().unwrap();
    let accept = std::thread::spawn(move || listener.accept().unwrap());
    let ep = client.connect(&addr).unwrap();
    let _sep = accept.join().unwrap();
    let recv = server.tag_recv(1, rdmx::TAG_MASK_ALL, vec![0; 8]);
    let send = ep.tag_send(1, b"segment!".to_vec());
    let deadline = std::time::Instant::now() + api::long();
    while !(recv.is_done() && send.is_done()) {
        assert!(
            std::time::Instant::now() < deadline,
            "not done (a hang guard)"
        );
        server.progress();
        client.progress();
    }
    assert_eq!(recv.wait().unwrap().buf, b"segment!");
    // Mapped on both sides; the descriptors closed once handed over and mapped (a
    // connection holds none for its segment).
    assert!(
        memfd_mappings() >= 2,
        "the connection's segment is a memfd, mapped by both sides"
    );
    assert_eq!(memfd_descriptors(), 0, "no descriptor kept for the segment");
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(listing(), before, "nothing of rdmx's in /dev/shm");
}
