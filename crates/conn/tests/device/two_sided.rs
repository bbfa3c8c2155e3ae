//! Device tests with two sides (`rdmx-two-sided`): the server's verbs objects on one side,
//! the client's on the other, meeting only through rdmacm, the wire and barriers. In the one
//! guest they run a thread each (rxe's loopback path); `scripts/test` also runs them across
//! the wire of `scripts/softroce-twonode`, a node each (nextest profiles `twonode-A` and
//! `twonode-B` take the tests of this module).

use rdmx_two_sided::{Peer, Sides};

use super::*;

/// Runs `body` once per side: a node each when `scripts/softroce-twonode` runs this binary,
/// a thread each otherwise.
fn two_sided(test: &'static str, body: impl Fn(&Peer) + Sync) {
    let sides = if std::env::var_os("RDMX_NODE").is_some() {
        Sides::from_twonode_env()
    } else {
        Sides::Threads
    };
    rdmx_two_sided::two_sided(test, sides, LONG, body);
}

/// This side's address: its node's across the wire, rxe0's in one guest.
fn local_ip() -> IpAddr {
    std::env::var("RDMX_NODE_ADDR").map_or_else(|_| addr_a(), |a| a.parse().expect("an IP"))
}

/// The other side's address.
fn peer_ip() -> IpAddr {
    std::env::var("RDMX_PEER_ADDR").map_or_else(|_| addr_a(), |a| a.parse().expect("an IP"))
}

/// The server's next listener (server side).
fn listener_of(p: &Peer) -> Listener {
    let addr: SocketAddr = p.listen_addr(&local_ip().to_string()).parse().unwrap();
    let listener = Listener::bind(
        &AddrInfo::from_socket_addr(addr, Side::Passive).unwrap(),
        16,
    )
    .expect("listen");
    p.listening(listener.local_addr().expect("bound"));
    listener
}

/// The server's next listener, as the client sees it.
fn server_addr(p: &Peer) -> SocketAddr {
    p.server_addr().parse().expect("a socket address")
}

/// Connects to `addr` with `data`, retrying while nobody listens there yet.
fn connect_to(p: &Peer, addr: SocketAddr, config: &QpConfig, data: &[u8]) -> Connection {
    p.retry(&format!("connect to {addr}"), || {
        connect(&dst(addr), config, data, LONG)
    })
}

/// The 1 MiB the server of [`rdma_read_of_a_registered_region`] exposes.
fn exposed_bytes() -> Vec<u8> {
    (0..1 << 20).map(|i| (i * 7 + i / 4096) as u8).collect()
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn connect_accept_and_reject_carry_private_data() {
    two_sided("conn_connect_accept_and_reject_carry_private_data", |p| {
        let verbs = Verbs::new(local_ip(), Some(16), false);
        if p.is_server() {
            let listener = listener_of(p);
            let request = listener
                .get_request(Some(LONG))
                .unwrap()
                .expect("a request");
            assert!(
                request.private_data().starts_with(b"hello-from-client"),
                "{:?}",
                request.private_data()
            );
            let conn = request
                .accept(&verbs.config(), b"accepted-by-server", LONG)
                .unwrap();
            assert_eq!(conn.peer_addr().map(|a| a.ip()), Some(peer_ip()));
            p.barrier();
            // A rejected request: the client gets ECONNREFUSED and this side's reason.
            let request = listener
                .get_request(Some(LONG))
                .unwrap()
                .expect("a request");
            assert!(request.private_data().starts_with(b"may I?"));
            request.reject(b"not today").unwrap();
            p.barrier();
            return;
        }
        let addr = server_addr(p);
        let conn = connect_to(p, addr, &verbs.config(), b"hello-from-client");
        assert!(conn.peer_private_data().starts_with(b"accepted-by-server"));
        assert_eq!(conn.peer_addr(), Some(addr));
        p.barrier();
        let err = connect(&dst(addr), &verbs.config(), b"may I?", LONG).unwrap_err();
        assert!(err.is_refused(), "{err}");
        assert!(err.message().contains("rejected"), "{err}");
        assert!(
            err.reject_data().starts_with(b"not today"),
            "{:?}",
            err.reject_data()
        );
        // Private data past the connect limit is refused before anything is sent.
        let err = connect(
            &dst(addr),
            &verbs.config(),
            &[0u8; MAX_CONNECT_PRIVATE_DATA + 1],
            LONG,
        )
        .unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL);
        p.barrier();
    });
}

/// The server exposes 1 MiB for reading and SENDs its (addr, len, rkey) to the client, which
/// READs it in four chunks at once straight into one buffer; a READ past the range and a
/// WRITE into it (rdmx never grants REMOTE_WRITE) are refused by the server's NIC.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn rdma_read_of_a_registered_region() {
    const LEN: usize = 1 << 20;
    two_sided("conn_rdma_read_of_a_registered_region", |p| {
        if p.is_server() {
            let server = Verbs::new(local_ip(), Some(8), false);
            server.fill_srq(8, 64);
            let listener = listener_of(p);
            let (listener, conn, _) = accept_one(listener, server.config(), b"").join().unwrap();
            let source = exposed_bytes();
            let exposed = server
                .pd
                .register_from(&source, Access::REMOTE_READ)
                .unwrap();
            let remote = exposed.remote().expect("registered for remote read");
            assert!(
                server
                    .pd
                    .register(16, Access::SEND)
                    .unwrap()
                    .remote()
                    .is_none(),
                "no rkey without REMOTE_READ"
            );
            let mut ad = [0u8; 16];
            ad[..8].copy_from_slice(&remote.addr.to_le_bytes());
            ad[8..12].copy_from_slice(&remote.len.to_le_bytes());
            ad[12..].copy_from_slice(&remote.rkey.to_le_bytes());
            p.barrier(); // the client's receive is posted
            conn.post_send_inline(&ad, 2).unwrap();
            collect(&server.cq, 1);
            p.barrier(); // the client read it all, and was refused past it
            let (_listener, _conn2, _) = accept_one(listener, server.config(), b"").join().unwrap();
            p.barrier(); // the client's WRITE was refused
            assert!(exposed[..] == source[..], "the exposed bytes are untouched");
            drop(conn);
            return;
        }
        let client = Verbs::new(local_ip(), None, false);
        let addr = server_addr(p);
        let conn = connect_to(p, addr, &client.config(), b"");
        let mut rbuf = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
        rbuf.fill(0);
        conn.post_recv(rbuf, 1).map_err(|(e, _)| e).unwrap();
        p.barrier();
        let got = collect(&client.cq, 1).pop().unwrap();
        assert_eq!(got.byte_len, 16);
        let ad = &got.buffer.as_ref().unwrap()[..16];
        let remote = RemoteBuf {
            addr: u64::from_le_bytes(ad[..8].try_into().unwrap()),
            len: u32::from_le_bytes(ad[8..12].try_into().unwrap()),
            rkey: u32::from_le_bytes(ad[12..].try_into().unwrap()),
        };
        assert_eq!(remote.len as usize, LEN);

        // Four chunks, all in flight at once, straight into one buffer.
        let mut target = client.pd.register(LEN, Access::LOCAL_WRITE).unwrap();
        let chunk = LEN / 4;
        let mut pieces = Vec::new();
        for i in 0..3 {
            let rest = target.split_off(chunk);
            pieces.push((i * chunk, target));
            target = rest;
        }
        pieces.push((3 * chunk, target));
        let mut read = read_pieces(&conn, &client.cq, remote, pieces).into_iter();
        let mut whole = read.next().unwrap();
        for piece in read {
            whole.unsplit(piece).expect("adjacent pieces of one region");
        }
        assert!(
            whole[..] == exposed_bytes()[..],
            "the READ copied the exposed bytes exactly"
        );

        // Past the exposed range: refused by the server's NIC, not silently served.
        let target = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
        let past = RemoteBuf {
            addr: remote.addr + LEN as u64,
            len: 64,
            rkey: remote.rkey,
        };
        conn.post_read(target, 64, past, 9)
            .map_err(|(e, _)| e)
            .unwrap();
        let failed = collect(&client.cq, 1).pop().unwrap();
        assert_eq!(
            failed.status,
            WcStatus::REMOTE_ACCESS,
            "a READ outside the region must fail: {failed:?}"
        );
        assert!(
            failed.buffer.is_some(),
            "the target comes back when the READ fails"
        );
        p.barrier();

        // A WRITE is refused too (the failed READ broke the first QP: a second connection).
        let conn2 = connect(&dst(addr), &client.config(), b"", LONG).unwrap();
        let source = client.pd.register_from(&[0xee; 64], Access::SEND).unwrap();
        let into = RemoteBuf {
            addr: remote.addr,
            len: 64,
            rkey: remote.rkey,
        };
        conn2
            .post_write(source, 64, into, 10)
            .map_err(|(e, _)| e)
            .unwrap();
        let refused = collect(&client.cq, 1).pop().unwrap();
        assert_eq!(refused.kind, WorkKind::Write);
        assert_eq!(
            refused.status,
            WcStatus::REMOTE_ACCESS,
            "a WRITE into a read-only region must fail: {refused:?}"
        );
        assert_eq!(
            refused.buffer.map(|b| b.len()),
            Some(64),
            "the source comes back"
        );
        p.barrier();
    });
}

/// The server disconnects while the client has receives posted: the client gets rdmacm's
/// DISCONNECTED, and its own disconnect flushes every posted receive, each buffer back.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn disconnect_flushes_posted_work_and_is_reported_to_the_peer() {
    two_sided(
        "conn_disconnect_flushes_posted_work_and_is_reported_to_the_peer",
        |p| {
            if p.is_server() {
                let server = Verbs::new(local_ip(), Some(8), false);
                server.fill_srq(8, 64);
                let listener = listener_of(p);
                let (_listener, conn, _) =
                    accept_one(listener, server.config(), b"").join().unwrap();
                p.barrier(); // the client's receives are posted
                conn.disconnect().unwrap();
                p.barrier();
                return;
            }
            let client = Verbs::new(local_ip(), None, false);
            let conn = connect_to(p, server_addr(p), &client.config(), b"");
            for (i, buf) in client
                .pd
                .register_chunks(64, 4, Access::LOCAL_WRITE)
                .unwrap()
                .into_iter()
                .enumerate()
            {
                conn.post_recv(buf, i as u64).map_err(|(e, _)| e).unwrap();
            }
            assert_eq!(client.cq.pending(), 4);
            p.barrier();
            let event = conn.next_event(Some(LONG)).unwrap().expect("an event");
            assert_eq!(
                event.kind,
                CmEventKind::DISCONNECTED,
                "{}",
                event.kind.name()
            );
            conn.disconnect().unwrap();
            for c in &collect(&client.cq, 4) {
                assert_eq!(c.status, WcStatus::FLUSHED, "{c:?}");
                assert_eq!(c.kind, WorkKind::Recv);
                assert_eq!(
                    c.buffer.as_ref().map(|b| b.len()),
                    Some(64),
                    "the buffer comes back"
                );
            }
            assert_eq!(client.cq.pending(), 0);
            // Posting on a disconnected QP fails (or flushes); either way the buffer is not lost.
            let buf = client.pd.register(8, Access::SEND).unwrap();
            match conn.post_send(buf, 8, 77) {
                Err((err, buf)) => assert_eq!(buf.len(), 8, "{err}"),
                Ok(()) => assert_eq!(collect(&client.cq, 1)[0].status, WcStatus::FLUSHED),
            }
            p.barrier();
        },
    );
}

/// The server's side of a connection it tells the client a remote buffer on.
fn accept_on(listener: Listener, server: &Verbs) -> (Listener, Connection) {
    let (listener, conn, _) = accept_one(listener, server.config(), b"").join().unwrap();
    (listener, conn)
}

/// SENDs `remote` (addr, len, rkey) to the peer of `conn`, which has a receive posted.
fn tell(conn: &Connection, server: &Verbs, remote: RemoteBuf) {
    let mut ad = [0u8; 16];
    ad[..8].copy_from_slice(&remote.addr.to_le_bytes());
    ad[8..12].copy_from_slice(&remote.len.to_le_bytes());
    ad[12..].copy_from_slice(&remote.rkey.to_le_bytes());
    conn.post_send_inline(&ad, 3).unwrap();
    let sent = collect(&server.cq, 1).pop().unwrap();
    assert!(sent.status.is_success(), "{sent:?}");
}

/// Connects a client connection with one receive posted, for [`tell`].
fn listening_conn(p: &Peer, addr: SocketAddr, client: &Verbs) -> Connection {
    let conn = connect_to(p, addr, &client.config(), b"");
    let buf = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    conn.post_recv(buf, 1).map_err(|(e, _)| e).unwrap();
    conn
}

/// The remote buffer the server told (the receive [`listening_conn`] posted).
fn heard(client: &Verbs) -> RemoteBuf {
    let got = collect(&client.cq, 1).pop().unwrap();
    assert!(got.status.is_success() && got.byte_len == 16, "{got:?}");
    let ad = &got.buffer.as_ref().unwrap()[..16];
    RemoteBuf {
        addr: u64::from_le_bytes(ad[..8].try_into().unwrap()),
        len: u32::from_le_bytes(ad[8..12].try_into().unwrap()),
        rkey: u32::from_le_bytes(ad[12..].try_into().unwrap()),
    }
}

/// READs `len` bytes of `remote` on `conn` and returns the completion status.
fn read_status(conn: &Connection, side: &Verbs, remote: RemoteBuf, len: usize) -> WcStatus {
    let target = side.pd.register(len, Access::LOCAL_WRITE).unwrap();
    conn.post_read(target, len, remote, 1)
        .map_err(|(e, _)| e)
        .unwrap();
    let c = collect(&side.cq, 1).pop().unwrap();
    assert_eq!(c.kind, WorkKind::Read);
    c.status
}

/// The region the server of [`memory_window_grants_read_of_its_range_to_one_qp_only`]
/// exposes windows of.
fn window_region_bytes() -> Vec<u8> {
    (0..64 * 1024).map(|i| (i * 13 + i / 512) as u8).collect()
}

/// A type-2 memory window grants RDMA READ of exactly its bytes, through exactly the QP it is
/// bound to, while it is bound: the region under it (registered with `Access::WINDOW_READ`)
/// grants nothing by its own rkey; another QP of the same protection domain holding the
/// window's rkey is refused; a READ one byte past the window is refused; and once the window
/// is dropped its rkey is dead. A refused access breaks the QP that made it, so each refusal
/// uses a connection of its own. The server binds the windows and SENDs their keys; the
/// client READs.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn memory_window_grants_read_of_its_range_to_one_qp_only() {
    const AT: usize = 4096;
    const LEN: usize = 8192;
    two_sided(
        "conn_memory_window_grants_read_of_its_range_to_one_qp_only",
        |p| {
            let source = window_region_bytes();
            if !p.is_server() {
                let client = Verbs::new(local_ip(), None, false);
                let addr = server_addr(p);
                // The bound QP's peer reads the window's bytes exactly.
                let c1 = listening_conn(p, addr, &client);
                p.barrier();
                let remote = heard(&client);
                assert_eq!(remote.len as usize, LEN);
                let target = client.pd.register(LEN, Access::LOCAL_WRITE).unwrap();
                let got = read_pieces(&c1, &client.cq, remote, vec![(0, target)]);
                assert!(
                    got[0][..] == source[AT..AT + LEN],
                    "READ through the window"
                );
                // Another QP of the same server PD, with the same rkey: refused.
                let c2 = connect(&dst(addr), &client.config(), b"", LONG).unwrap();
                let refused = read_status(&c2, &client, remote, LEN);
                println!("window: READ from another QP: {refused:?}");
                assert_eq!(refused, WcStatus::REMOTE_ACCESS, "the window is for one QP");
                // Past the window, inside its region, on the bound QP: the verbs contract
                // refuses it, but rxe checks READ ranges against the region (MR) under a
                // window, not the window, so there it succeeds (rdmx wipes its staging regions
                // for this reason). Reported only.
                let past = RemoteBuf {
                    len: LEN as u32 + 64,
                    ..remote
                };
                let beyond = read_status(&c1, &client, past, LEN + 64);
                println!("window: READ 64 bytes past its end, inside its region: {beyond:?}");
                p.barrier();
                // A window over a whole region: one byte past it is refused.
                let c4 = listening_conn(p, addr, &client);
                p.barrier();
                let whole = heard(&client);
                let past_end = RemoteBuf {
                    len: LEN as u32 + 1,
                    ..whole
                };
                let refused = read_status(&c4, &client, past_end, LEN + 1);
                println!("window: READ one byte past the end of its region: {refused:?}");
                assert_eq!(refused, WcStatus::REMOTE_ACCESS);
                p.barrier();
                // A second window, bound on a fresh connection, is dead once dropped.
                let c3 = listening_conn(p, addr, &client);
                p.barrier();
                let remote2 = heard(&client);
                assert_ne!(remote2.rkey, remote.rkey);
                assert_eq!(read_status(&c3, &client, remote2, 64), WcStatus::SUCCESS);
                p.barrier();
                p.barrier(); // the server dropped both windows
                let late = read_status(&c3, &client, remote2, 64);
                println!("window: READ after the window was dropped: {late:?}");
                assert_eq!(
                    late,
                    WcStatus::REMOTE_ACCESS,
                    "a dropped window's rkey is dead"
                );
                p.barrier();
                drop((c1, c2, c4));
                return;
            }
            let server = Verbs::new(local_ip(), Some(16), false);
            server.fill_srq(16, 64);
            let limits = server.pd.device().limits().unwrap();
            assert!(
                limits.memory_windows,
                "rxe supports type-2 memory windows: {limits:?}"
            );
            let listener = listener_of(p);
            let windows_before = live_windows();
            let mut region = server
                .pd
                .register_from(&source, Access::WINDOW_READ)
                .unwrap();
            assert!(
                region.remote().is_none(),
                "no rkey grants the region itself"
            );
            let mut piece = region.split_off(AT);
            let tail = piece.split_off(LEN + 4096);
            let window = MemoryWindow::new(&piece, LEN).unwrap();
            assert_eq!((window.addr(), window.len()), (piece.addr(), LEN as u64));
            assert!(MemoryWindow::new(&piece, piece.len() + 1).is_err());
            assert!(
                MemoryWindow::new(&server.pd.register(64, Access::REMOTE_READ).unwrap(), 64)
                    .is_err(),
                "windows need a WINDOW_READ region"
            );

            let (listener, s1) = accept_on(listener, &server);
            s1.post_bind(&window, 77).unwrap();
            let bound = collect(&server.cq, 1).pop().unwrap();
            assert_eq!((bound.kind, bound.cookie), (WorkKind::Bind, 77));
            assert!(bound.status.is_success(), "bind: {bound:?}");
            assert!(bound.buffer.is_none());
            assert!(window.is_posted());
            assert!(s1.post_bind(&window, 78).is_err(), "a window binds once");
            p.barrier();
            tell(&s1, &server, window.remote().expect("under 4 GiB"));
            let (listener, _s2) = accept_on(listener, &server);
            p.barrier();

            let exact = server
                .pd
                .register_from(&source[..LEN], Access::WINDOW_READ)
                .unwrap();
            let whole = MemoryWindow::new(&exact, LEN).unwrap();
            let (listener, s4) = accept_on(listener, &server);
            s4.post_bind(&whole, 80).unwrap();
            assert!(collect(&server.cq, 1).pop().unwrap().status.is_success());
            p.barrier();
            tell(&s4, &server, whole.remote().unwrap());
            p.barrier();
            drop(whole);

            let window2 = MemoryWindow::new(&piece, LEN).unwrap();
            let (_listener, s3) = accept_on(listener, &server);
            s3.post_bind(&window2, 79).unwrap();
            assert!(collect(&server.cq, 1).pop().unwrap().status.is_success());
            p.barrier();
            tell(&s3, &server, window2.remote().unwrap());
            p.barrier(); // the client read through it
            assert_eq!(live_windows(), windows_before + 2);
            drop(window);
            drop(window2);
            assert_eq!(live_windows(), windows_before, "dropping invalidates");
            p.barrier();
            p.barrier(); // the client's READ was refused
                         // The region was never written and can be reassembled and released.
            piece.unsplit(tail).unwrap();
            region.unsplit(piece).unwrap();
            assert!(region[..] == source[..]);
        },
    );
}
