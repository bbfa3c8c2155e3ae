//! The endpoint API suite (`tests/api`) over TCP on loopback: the same test bodies as the
//! RDMA run in the guest.

#[macro_use]
mod api;

fn net() -> api::Net {
    api::Net {
        transport: rdmx::Transport::Tcp,
        addr_a: "127.0.0.1".into(),
        addr_b: "127.0.0.1".into(),
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
    let devices = rdmx::conn::Device::list().unwrap_or_default();
    let result = rdmx::Context::builder()
        .env_lookup(|_| None)
        .transport(rdmx::Transport::Rdma)
        .build();
    if devices.is_empty() {
        let err = result.expect_err("no device");
        assert!(err.to_string().contains("RDMX_TRANSPORT=rdma"), "{err}");
        let auto = rdmx::Context::builder()
            .env_lookup(|_| None)
            .build()
            .unwrap();
        assert_eq!(auto.transport(), rdmx::Transport::Tcp);
    } else {
        assert_eq!(result.unwrap().transport(), rdmx::Transport::Rdma);
    }
}

/// Garbage from a peer over TCP closes that endpoint only, with a clear error; the
/// worker's other endpoint keeps working.
#[test]
fn garbage_from_a_tcp_peer_closes_only_its_endpoint() {
    use rdmx::TAG_MASK_ALL;
    use std::time::{Duration, Instant};
    let ctx = rdmx::Context::builder()
        .env_lookup(|_| None)
        .transport(rdmx::Transport::Tcp)
        .build()
        .unwrap();
    let server = ctx.worker().unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let client = ctx.worker().unwrap();
    let c = client.clone();
    let a = addr.clone();
    let good = std::thread::spawn(move || c.connect(&a).unwrap());
    let _good_server_side = listener.accept().unwrap();
    let good = good.join().unwrap();
    // A hostile peer: a valid rdmx handshake, then a frame that is not one.
    let handshake = rdmx::proto::Engine::new(Default::default())
        .local_handshake()
        .encode();
    let a = addr.clone();
    let evil = std::thread::spawn(move || {
        rdmx_tcp::connect(&a, &handshake, Duration::from_secs(5)).unwrap()
    });
    let victim = listener.accept().unwrap();
    let evil = evil.join().unwrap();
    evil.queue_frame(b"this is not an rdmx frame at all, not even close", &[]);
    while !evil.flush().unwrap() {}
    let deadline = Instant::now() + Duration::from_secs(30);
    while victim.is_connected() {
        assert!(Instant::now() < deadline, "the garbage was not noticed");
        server.progress();
    }
    // The hostile peer sees its connection closed.
    let mut events = Vec::new();
    while !events
        .iter()
        .any(|e| matches!(e, rdmx_tcp::Event::Closed { .. }))
    {
        assert!(
            Instant::now() < deadline,
            "the hostile peer was not disconnected"
        );
        server.progress();
        evil.poll(&mut events).unwrap();
    }
    // The good endpoint is untouched.
    let r = server.tag_recv(1, TAG_MASK_ALL, vec![0; 1 << 20]);
    let s = good.tag_send(1, vec![9; 1 << 20]);
    while !(r.is_done() && s.is_done()) {
        assert!(Instant::now() < deadline);
        server.progress();
        client.progress();
    }
    assert!(r.wait().unwrap().buf.iter().all(|&b| b == 9));
    s.wait().unwrap();
}
