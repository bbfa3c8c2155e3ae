//! RDMA READs of registered regions and of vectors registered in place.

use super::*;

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn rdma_read_of_a_registered_region() {
    let Pair {
        server,
        client,
        listener,
        addr,
        server_conn,
        client_conn: conn,
    } = connected_pair(addr_b(), 8, false, false);

    // The server exposes 1 MiB for reading and sends its (addr, len, rkey) to the client.
    const LEN: usize = 1 << 20;
    let source: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
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
    let mut rbuf = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    rbuf.fill(0);
    conn.post_recv(rbuf, 1).map_err(|(e, _)| e).unwrap();
    server_conn.post_send_inline(&ad, 2).unwrap();
    collect(&server.cq, 1);
    let got = collect(&client.cq, 1).pop().unwrap();
    assert_eq!(got.byte_len, 16);
    let ad = &got.buffer.as_ref().unwrap()[..16];
    let remote = RemoteBuf {
        addr: u64::from_le_bytes(ad[..8].try_into().unwrap()),
        len: u32::from_le_bytes(ad[8..12].try_into().unwrap()),
        rkey: u32::from_le_bytes(ad[12..].try_into().unwrap()),
    };

    // The client reads it in four chunks, all in flight at once, straight into one buffer.
    let mut target = client.pd.register(LEN, Access::LOCAL_WRITE).unwrap();
    let chunk = LEN / 4;
    let mut pieces = Vec::new();
    for _ in 0..3 {
        let rest = target.split_off(chunk);
        pieces.push(target);
        target = rest;
    }
    pieces.push(target);
    let pieces = pieces
        .into_iter()
        .enumerate()
        .map(|(i, p)| (i * chunk, p))
        .collect();
    let mut read = read_pieces(&conn, &client.cq, remote, pieces).into_iter();
    let mut whole = read.next().unwrap();
    for piece in read {
        whole.unsplit(piece).expect("adjacent pieces of one region");
    }
    assert_eq!(whole.len(), LEN);
    assert!(
        whole[..] == source[..],
        "the READ copied the exposed bytes exactly"
    );

    // Reading past the exposed range is refused by the peer's NIC, not silently served.
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
        "the target comes back even when the READ fails"
    );

    // RDMA WRITE into the exposed region is refused too: rdmx never grants REMOTE_WRITE.
    // (The failed READ put the first QP in the error state, so this uses a second connection.)
    let accepted = accept_one(listener, server.config(), b"");
    let conn2 = connect(&dst(addr), &client.config(), b"", LONG).unwrap();
    let (_listener, _server_conn2, _) = accepted.join().unwrap();
    let write_source = client.pd.register_from(&[0xee; 64], Access::SEND).unwrap();
    let into = RemoteBuf {
        addr: remote.addr,
        len: 64,
        rkey: remote.rkey,
    };
    conn2
        .post_write(write_source, 64, into, 10)
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
        refused.buffer.as_ref().map(|b| b.len()),
        Some(64),
        "the source comes back"
    );
    assert!(
        exposed[..64] == source[..64],
        "the exposed bytes are untouched"
    );
    drop(server_conn);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn rdma_read_between_vecs_registered_in_place() {
    let Pair {
        server,
        client,
        server_conn: _server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_b(), 8, false, false);

    // An empty Vec cannot be a region; it comes back with the error.
    let (err, empty) = server
        .pd
        .register_vec(Vec::with_capacity(16), Access::REMOTE_READ)
        .unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
    assert!(err.message().contains("empty"), "{err}");
    assert_eq!(empty.capacity(), 16, "the same Vec is given back");

    // The server exposes a Vec in place: the region is the Vec's own heap buffer.
    const LEN: usize = (1 << 20) + 3;
    let source: Vec<u8> = (0..LEN).map(|i| (i * 31 + i / 1000) as u8).collect();
    let exposed_vec = source.clone();
    let exposed_ptr = exposed_vec.as_ptr() as u64;
    let exposed = server
        .pd
        .register_vec(exposed_vec, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(exposed.len(), LEN);
    assert_eq!(
        exposed.addr(),
        exposed_ptr,
        "registered in place, not copied"
    );
    let remote = exposed.remote().expect("registered for remote read");
    assert_eq!(remote.len as usize, LEN);
    assert_eq!(remote.addr, exposed_ptr);

    // The client reads it into its own Vec, registered in place too, in two uneven pieces.
    let target_vec = vec![0u8; LEN];
    let target_ptr = target_vec.as_ptr() as u64;
    let mut head = client
        .pd
        .register_vec(target_vec, Access::LOCAL_WRITE)
        .unwrap();
    assert_eq!(head.addr(), target_ptr, "registered in place, not copied");
    let split = LEN / 2 + 1;
    let tail = head.split_off(split);
    // A split buffer is not the whole region: into_vec gives it back.
    let mut head = head.into_vec().expect_err("only part of the region");
    assert_eq!((head.addr(), head.len()), (target_ptr, split));
    let tail = tail.into_vec().expect_err("only part of the region");
    assert_eq!(tail.len(), LEN - split);
    // Neither is a buffer of a region that was not made from a Vec.
    let allocated = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        allocated.into_vec().expect_err("not a Vec region").len(),
        64
    );

    let mut read = read_pieces(&conn, &client.cq, remote, vec![(0, head), (split, tail)]);
    let tail = read.pop().unwrap();
    head = read.pop().unwrap();
    // While the tail is still out, the head alone cannot become the Vec.
    head = head
        .into_vec()
        .expect_err("the tail still holds the region");
    head.unsplit(tail).expect("adjacent pieces of one region");
    assert_eq!(head.len(), LEN);

    let read = head
        .into_vec()
        .expect("the whole region, and the last buffer of it");
    assert_eq!(read.len(), LEN);
    assert_eq!(
        read.as_ptr() as u64,
        target_ptr,
        "the very same Vec is given back"
    );
    assert!(read == source, "the READ copied the exposed bytes exactly");

    let exposed = exposed.into_vec().expect("the whole exposed region");
    assert_eq!(exposed.as_ptr() as u64, exposed_ptr);
    assert!(exposed == source, "the exposed bytes are unchanged");
}
