//! Memory windows: a window grants READ of its range to one QP only, and dies on
//! invalidation; the server binds, the client reads.

use super::*;

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
            let (listener, _s4) = bind_and_tell(p, listener, &server, &whole, 80);
            p.barrier();
            drop(whole);

            let window2 = MemoryWindow::new(&piece, LEN).unwrap();
            let (_listener, _s3) = bind_and_tell(p, listener, &server, &window2, 79);
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

/// The server accepts the client's next connection, binds `window` to it (`cookie`), and
/// once the client has its receive posted, SENDs it the window's remote buffer.
fn bind_and_tell(
    p: &Peer,
    listener: Listener,
    server: &Verbs,
    window: &MemoryWindow,
    cookie: u64,
) -> (Listener, Connection) {
    let (listener, conn) = accept_on(listener, server);
    conn.post_bind(window, cookie).unwrap();
    assert!(collect(&server.cq, 1).pop().unwrap().status.is_success());
    p.barrier();
    tell(&conn, server, window.remote().unwrap());
    (listener, conn)
}
