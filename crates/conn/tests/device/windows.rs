//! Memory windows: a window grants READ of its range to one QP only, and dies on invalidation.

use super::*;

/// A type-2 memory window grants RDMA READ of exactly its bytes, through exactly the QP it is
/// bound to, while it is bound: the region under it (registered with `Access::WINDOW_READ`)
/// grants nothing by its own rkey; another QP of the same protection domain holding the
/// window's rkey is refused; a READ one byte past the window is refused; and once the window
/// is dropped its rkey is dead. A refused access breaks the QP that made it, so each refusal
/// uses a connection of its own.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn memory_window_grants_read_of_its_range_to_one_qp_only() {
    let ip = addr_a();
    let server = Verbs::new(ip, Some(16), false);
    server.fill_srq(16, 64);
    let limits = server.pd.device().limits().unwrap();
    assert!(
        limits.memory_windows,
        "rxe supports type-2 memory windows: {limits:?}"
    );
    let client = Verbs::new(ip, None, false);
    let (listener, addr) = listen(ip);
    let mut listener = Some(listener);
    let mut connect_one = || {
        let accepted = accept_one(listener.take().unwrap(), server.config(), b"");
        let c = connect(&dst(addr), &client.config(), b"", LONG).unwrap();
        let (l, s, _) = accepted.join().unwrap();
        listener = Some(l);
        (s, c)
    };
    let windows_before = live_windows();

    const REGION: usize = 64 * 1024;
    const AT: usize = 4096;
    const LEN: usize = 8192;
    let source: Vec<u8> = (0..REGION).map(|i| (i * 13 + i / 512) as u8).collect();
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
        MemoryWindow::new(&client.pd.register(64, Access::REMOTE_READ).unwrap(), 64).is_err(),
        "windows need a WINDOW_READ region"
    );

    let (s1, c1) = connect_one();
    s1.post_bind(&window, 77).unwrap();
    let bound = collect(&server.cq, 1).pop().unwrap();
    assert_eq!((bound.kind, bound.cookie), (WorkKind::Bind, 77));
    assert!(bound.status.is_success(), "bind: {bound:?}");
    assert!(bound.buffer.is_none());
    assert!(window.is_posted());
    assert!(s1.post_bind(&window, 78).is_err(), "a window binds once");
    let remote = window.remote().expect("under 4 GiB");

    // The bound QP's peer reads the window's bytes exactly.
    let got = read_pieces(
        &c1,
        &client.cq,
        remote,
        vec![(0, client.pd.register(LEN, Access::LOCAL_WRITE).unwrap())],
    );
    assert!(
        got[0][..] == source[AT..AT + LEN],
        "READ through the window"
    );

    // Another QP of the same server PD, with the same rkey: refused.
    let (_s2, c2) = connect_one();
    let refused = read_status(&c2, &client, remote, LEN);
    println!("window: READ from another QP: {refused:?}");
    assert_eq!(refused, WcStatus::REMOTE_ACCESS, "the window is for one QP");

    // Past the window, inside its region, on the bound QP: the verbs contract refuses it,
    // but rxe checks READ ranges against the region (MR) under a window, not the window, so
    // there it succeeds (rdmx wipes its staging regions for this reason). Reported only.
    let past = RemoteBuf {
        len: LEN as u32 + 64,
        ..remote
    };
    let beyond = read_status(&c1, &client, past, LEN + 64);
    println!("window: READ 64 bytes past its end, inside its region: {beyond:?}");

    // A window over a whole region: one byte past it is refused.
    let exact = server
        .pd
        .register_from(&source[..LEN], Access::WINDOW_READ)
        .unwrap();
    let whole = MemoryWindow::new(&exact, LEN).unwrap();
    let (s4, c4) = connect_one();
    s4.post_bind(&whole, 80).unwrap();
    assert!(collect(&server.cq, 1).pop().unwrap().status.is_success());
    let past_end = RemoteBuf {
        len: LEN as u32 + 1,
        ..whole.remote().unwrap()
    };
    let refused = read_status(&c4, &client, past_end, LEN + 1);
    println!("window: READ one byte past the end of its region: {refused:?}");
    assert_eq!(refused, WcStatus::REMOTE_ACCESS);
    drop(whole);

    // A second window, bound on a fresh connection, is dead once dropped.
    let window2 = MemoryWindow::new(&piece, LEN).unwrap();
    assert_ne!(window2.rkey(), window.rkey());
    let (s3, c3) = connect_one();
    s3.post_bind(&window2, 79).unwrap();
    assert!(collect(&server.cq, 1).pop().unwrap().status.is_success());
    let remote2 = window2.remote().unwrap();
    assert_eq!(read_status(&c3, &client, remote2, 64), WcStatus::SUCCESS);
    assert_eq!(live_windows(), windows_before + 2);
    drop(window);
    drop(window2);
    assert_eq!(live_windows(), windows_before, "dropping invalidates");
    let late = read_status(&c3, &client, remote2, 64);
    println!("window: READ after the window was dropped: {late:?}");
    assert_eq!(
        late,
        WcStatus::REMOTE_ACCESS,
        "a dropped window's rkey is dead"
    );

    // The region was never written and can be reassembled and released.
    piece.unsplit(tail).unwrap();
    region.unsplit(piece).unwrap();
    assert!(region[..] == source[..]);
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
