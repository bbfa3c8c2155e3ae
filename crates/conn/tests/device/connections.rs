//! Devices and ports, connecting, accepting and rejecting, connect failures, and several connections sharing one SRQ and CQ.

use super::*;

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn devices_and_ports_are_listed() {
    let names: Vec<String> = Device::list().unwrap().iter().map(|d| d.name()).collect();
    for var in ["SOFTROCE_DEV_A", "SOFTROCE_DEV_B"] {
        let want = std::env::var(var).unwrap();
        assert!(names.contains(&want), "{want} not in {names:?}");
        let device = Device::by_name(&want).unwrap();
        let ports = device.ports().unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].state, "ACTIVE");
        assert_eq!(ports[0].link_layer, "Ethernet");
        assert!(device.limits().unwrap().max_srq_wr > 0);
    }
    assert_eq!(
        Device::for_local_addr(addr_a()).unwrap().name(),
        std::env::var("SOFTROCE_DEV_A").unwrap()
    );
    assert_eq!(
        Device::for_local_addr(addr_b()).unwrap().name(),
        std::env::var("SOFTROCE_DEV_B").unwrap()
    );
    let route = AddrInfo::from_socket_addr(SocketAddr::new(addr_b(), 7471), Side::Active).unwrap();
    assert_eq!(
        Device::for_route(&route).unwrap().name(),
        std::env::var("SOFTROCE_DEV_B").unwrap()
    );
    assert!(Device::by_name("no-such-device")
        .unwrap_err()
        .message()
        .contains("no-such-device"));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn connections_share_one_srq_and_one_cq() {
    const CLIENTS: usize = 3;
    let ip = addr_a();
    let server = Verbs::new(ip, Some(32), false);
    server.fill_srq(32, 256);
    let (listener, addr) = listen(ip);
    let config = server.config();
    let acceptor = thread::spawn(move || {
        (0..CLIENTS)
            .map(|_| {
                listener
                    .get_request(Some(LONG))
                    .unwrap()
                    .unwrap()
                    .accept(&config, b"", LONG)
                    .unwrap()
            })
            .collect::<Vec<_>>()
    });
    let clients: Vec<(Verbs, Connection)> = (0..CLIENTS)
        .map(|i| {
            let side = Verbs::new(ip, None, false);
            let conn = connect(
                &dst(addr),
                &side.config(),
                format!("client {i}").as_bytes(),
                LONG,
            )
            .unwrap();
            (side, conn)
        })
        .collect();
    let server_conns = acceptor.join().unwrap();
    assert_eq!(server.cq.pending(), 32, "32 receives posted on the SRQ");

    // Each client sends two messages: one from a registered buffer, one inline.
    for (i, (side, conn)) in clients.iter().enumerate() {
        let buf = side
            .pd
            .register_from(
                format!("buffer message from client {i}").as_bytes(),
                Access::SEND,
            )
            .unwrap();
        let len = buf.len();
        conn.post_send(buf, len, 100 + i as u64)
            .map_err(|(e, _)| e)
            .unwrap();
        conn.post_send_inline(
            format!("inline message from client {i}").as_bytes(),
            200 + i as u64,
        )
        .unwrap();
        let sent = collect(&side.cq, 2);
        assert!(
            sent.iter()
                .all(|c| c.status.is_success() && c.kind == WorkKind::Send),
            "{sent:?}"
        );
        let returned = sent.iter().find(|c| c.cookie == 100 + i as u64).unwrap();
        assert_eq!(
            returned.buffer.as_ref().map(|b| b.len()),
            Some(len),
            "the send buffer came back"
        );
    }

    // All six land in the one SRQ and complete on the one CQ, tagged with the sender's QP.
    let received = collect(&server.cq, 2 * CLIENTS);
    let server_qps: Vec<u32> = server_conns.iter().map(|c| c.qp_num()).collect();
    for c in &received {
        assert!(c.status.is_success(), "{c:?}");
        assert_eq!(c.kind, WorkKind::Recv);
        let buf = c.buffer.as_ref().expect("an SRQ buffer");
        let text = std::str::from_utf8(&buf[..c.byte_len as usize]).unwrap();
        let client: usize = text.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(
            c.qp_num, server_qps[client],
            "{text} arrived on the QP of client {client}"
        );
    }
    let mut per_qp: Vec<u32> = received.iter().map(|c| c.qp_num).collect();
    per_qp.sort();
    per_qp.dedup();
    assert_eq!(
        per_qp.len(),
        CLIENTS,
        "messages came through {CLIENTS} different QPs"
    );
    assert_eq!(server.cq.pending(), 32 - 2 * CLIENTS);

    // Receive buffers go back on the SRQ and are used again.
    for c in received {
        server
            .srq
            .as_ref()
            .unwrap()
            .post_recv(c.buffer.unwrap(), c.cookie)
            .map_err(|(e, _)| e)
            .unwrap();
    }
    assert_eq!(server.cq.pending(), 32);
    clients[0].1.post_send_inline(b"again", 7).unwrap();
    collect(&clients[0].0.cq, 1);
    let again = collect(&server.cq, 1);
    assert_eq!(&again[0].buffer.as_ref().unwrap()[..5], b"again");
    drop(server_conns);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn connect_failures_are_errors_within_bounded_time() {
    let ip = addr_a();
    let client = Verbs::new(ip, None, false);

    // A port nobody listens on: the peer's CM rejects at once.
    let (listener, addr) = listen(ip);
    drop(listener);
    let err = connect(&dst(addr), &client.config(), b"", LONG).unwrap_err();
    assert!(err.is_refused(), "{err}");
    assert!(err.message().contains("nobody listens"), "{err}");

    // A listener that never answers: our deadline ends the wait (the CM would retry for a minute).
    let (listener, addr) = listen(ip);
    let err = connect(&dst(addr), &client.config(), b"", Duration::from_secs(3)).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(
        listener
            .get_request(Some(Duration::from_secs(5)))
            .unwrap()
            .is_some(),
        "the request did arrive"
    );

    // A network with no route: address resolution fails (no packet leaves the guest).
    let unroutable: SocketAddr = "198.51.100.1:7471".parse().unwrap();
    let err = connect(&dst(unroutable), &client.config(), b"", LONG).unwrap_err();
    assert_eq!(err.call(), "rdma_create_ep", "{err}");
    assert!(err.message().contains("198.51.100.1:7471"), "{err}");

    // A name that does not resolve.
    let err = AddrInfo::resolve("no-such-host.invalid:7471", Side::Active).unwrap_err();
    assert_eq!(err.call(), "rdma_getaddrinfo");

    // No request waiting: get_request times out with None instead of blocking.
    assert!(listener
        .get_request(Some(Duration::from_millis(200)))
        .unwrap()
        .is_none());
}
