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
        let limits = device.limits().unwrap();
        assert!(limits.max_srq_wr > 0);
        assert!(limits.is_soft_roce(), "{want} is rxe: {limits:?}");
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

/// An inline SEND is not recorded (it holds nothing once posted): its completion, mixed in
/// one poll with recorded work's, still carries its cookie and kind; it is never counted as
/// pending; a cookie with the top bit set (which marks unrecorded work) is refused. Inline
/// sends gathered from pieces arrive as their pieces joined.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn inline_sends_complete_with_their_cookie_without_a_record() {
    let Pair {
        server,
        client,
        server_conn: _server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_a(), 8, false, false);
    assert!(conn.post_send_inline(b"x", 1 << 63).is_err());
    let big = (1u64 << 63) - 1;
    conn.post_send_inline(b"first", big).unwrap();
    let buf = client.pd.register(8, Access::SEND).unwrap();
    conn.post_send(buf, 8, 42).map_err(|(e, _)| e).unwrap();
    conn.post_send_inline(b"third", 7).unwrap();
    assert_eq!(client.cq.pending(), 1, "only the registered buffer's send");
    let done = collect(&client.cq, 3);
    let seen: Vec<(u64, WorkKind, bool, bool)> = done
        .iter()
        .map(|c| (c.cookie, c.kind, c.status.is_success(), c.buffer.is_some()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (big, WorkKind::Send, true, false),
            (42, WorkKind::Send, true, true),
            (7, WorkKind::Send, true, false),
        ]
    );
    assert_eq!(client.cq.pending(), 0);
    let got = collect(&server.cq, 3);
    let lens: Vec<u32> = got.iter().map(|c| c.byte_len).collect();
    assert_eq!(lens, vec![5, 8, 5], "{got:?}");

    // Gathered from pieces (a header and its payload), an empty piece among them.
    let too_many: [&[u8]; 3] = [b"a", b"b", b"c"];
    assert!(conn.post_send_inline_gather(&too_many, 1).is_err());
    let too_long = vec![0u8; conn.max_inline() as usize];
    assert!(conn.post_send_inline_gather(&[&too_long, b"x"], 1).is_err());
    conn.post_send_inline_gather(&[b"head", b"tail"], 8)
        .unwrap();
    conn.post_send_inline_gather(&[b"", b"only"], 9).unwrap();
    conn.post_send_inline_gather(&[b"alone"], 10).unwrap();
    let cookies: Vec<u64> = collect(&client.cq, 3).iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, vec![8, 9, 10]);
    let got: Vec<Vec<u8>> = collect(&server.cq, 3)
        .iter()
        .map(|c| c.buffer.as_ref().unwrap()[..c.byte_len as usize].to_vec())
        .collect();
    assert_eq!(
        got,
        vec![b"headtail".to_vec(), b"only".to_vec(), b"alone".to_vec()]
    );
}

/// A shared vector registers in place for the NIC to read only: local write is refused (the
/// bytes are reachable through other clones), an empty one too; the region holds a clone
/// (so no one can take the vector back to write it) until `into_shared`, which waits for a
/// memory window over it to go; the registration is counted and uncounted.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn shared_vectors_register_in_place_for_reading_only() {
    use std::sync::Arc;
    let v = Verbs::new(addr_a(), None, false);
    let data = Arc::new((0..4096u32).map(|i| i as u8).collect::<Vec<u8>>());
    let (err, back) =
        v.pd.register_shared(data.clone(), Access::LOCAL_WRITE)
            .unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
    assert!(Arc::ptr_eq(&back, &data), "the same Arc comes back");
    drop(back);
    let (err, _) =
        v.pd.register_shared(Arc::new(Vec::new()), Access::REMOTE_READ)
            .unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");

    let before = live_registrations();
    let read =
        v.pd.register_shared(data.clone(), Access::REMOTE_READ)
            .unwrap();
    assert_eq!(live_registrations().regions, before.regions + 1);
    assert_eq!(read.addr(), data.as_ptr() as u64, "registered in place");
    assert!(*read == **data);
    let remote = read.remote().expect("registered for remote read");
    assert_eq!((remote.addr, remote.len), (data.as_ptr() as u64, 4096));
    assert_eq!(Arc::strong_count(&data), 2, "the region holds a clone");
    let again = read.into_shared().expect("nothing else holds the region");
    assert!(Arc::ptr_eq(&again, &data));
    drop(again);
    assert_eq!(live_registrations().regions, before.regions);
    assert_eq!(Arc::strong_count(&data), 1);

    // Through a memory window: the window keeps the region registered.
    let windowed =
        v.pd.register_shared(data.clone(), Access::WINDOW_READ)
            .unwrap();
    assert!(
        windowed.remote().is_none(),
        "no access by the region's rkey"
    );
    let window = MemoryWindow::new_shared(&windowed, 100).expect("a window over it");
    assert_eq!((window.addr(), window.len()), (data.as_ptr() as u64, 100));
    assert!(MemoryWindow::new_shared(&windowed, 4097).is_err());
    let windowed = windowed
        .into_shared()
        .expect_err("the window still holds the region");
    drop(window);
    drop(windowed.into_shared().expect("the window is gone"));
    assert_eq!(Arc::strong_count(&data), 1);
    assert_eq!(live_registrations().regions, before.regions);
}

/// Accepting without waiting ([`ConnectionRequest::accept_start`]): a connector that never
/// completes the exchange (`fault::connect_unanswered`: it never reads the answer, so the
/// RTU never goes) leaves its accept under way — never established, never named by the
/// listener's channel — while a second request is accepted the same way, named by its
/// token when its connection is established, and finished onto the server's event channel,
/// where its events come from then on. Dropping the stalled accept is all it costs.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn an_accept_under_way_waits_on_no_other() {
    let ip = addr_a();
    let server = Verbs::new(ip, Some(16), false);
    server.fill_srq(16, 64);
    let client = Verbs::new(ip, None, false);
    let (listener, addr) = listen(ip);

    // The stalled connector, on a channel nothing reads.
    let silent = Verbs::new(ip, None, false);
    let stalled = fault::connect_unanswered(&dst(addr), &silent.config(), b"stall").unwrap();
    let request = listener
        .get_request(Some(LONG))
        .unwrap()
        .expect("a request");
    assert!(request.private_data().starts_with(b"stall"));
    let mut stuck = request.accept_start(&server.config(), b"").unwrap();
    stuck.set_event_token(1);
    let deadline = Instant::now() + LONG;
    while !stalled.answered() {
        assert!(
            Instant::now() < deadline,
            "the stalled connector got no answer"
        );
        thread::sleep(Duration::from_millis(5));
    }

    // A good connector meanwhile.
    let config = client.config();
    let good = thread::spawn(move || connect(&dst(addr), &config, b"good", LONG));
    let request = listener
        .get_request(Some(LONG))
        .unwrap()
        .expect("a request");
    assert!(request.private_data().starts_with(b"good"));
    let mut accepting = request.accept_start(&server.config(), b"hello").unwrap();
    accepting.set_event_token(2);
    let deadline = Instant::now() + LONG;
    loop {
        let mut tokens = Vec::new();
        listener.take_ready(&mut tokens).unwrap();
        assert!(
            !tokens.contains(&1),
            "the stalled accept has no news: {tokens:?}"
        );
        if tokens.contains(&2) && accepting.poll().unwrap() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the good accept was never established"
        );
        thread::sleep(Duration::from_millis(5));
    }
    assert!(
        !stuck.poll().unwrap(),
        "the stalled accept is not established"
    );
    let server_conn = accepting.finish().unwrap();
    let client_conn = good.join().unwrap().expect("the good connector connects");
    assert!(client_conn.peer_private_data().starts_with(b"hello"));

    // Its events now come on the server's channel.
    server_conn.set_event_token(7);
    client_conn.disconnect().unwrap();
    let deadline = Instant::now() + LONG;
    loop {
        let mut tokens = Vec::new();
        server.events.take_ready(&mut tokens).unwrap();
        if tokens.contains(&7) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no DISCONNECTED on the server's channel"
        );
        thread::sleep(Duration::from_millis(5));
    }
    let ev = server_conn
        .next_event(Some(LONG))
        .unwrap()
        .expect("an event");
    assert_eq!(ev.kind, CmEventKind::DISCONNECTED);
    assert!(!stuck.poll().unwrap(), "still not established");
    drop((stuck, stalled));
}
