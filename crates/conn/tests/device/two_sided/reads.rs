//! RDMA READs of registered regions and of vectors registered in place, the server
//! exposing and the client reading.

use super::*;

/// The 1 MiB the server of [`rdma_read_of_a_registered_region`] exposes.
fn exposed_bytes() -> Vec<u8> {
    (0..1 << 20).map(|i| (i * 7 + i / 4096) as u8).collect()
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

/// The bytes the server of [`rdma_read_between_vecs_registered_in_place`] exposes.
fn vec_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + i / 1000) as u8).collect()
}

/// The server exposes a `Vec` registered in place (the region is the Vec's own heap buffer)
/// and the client READs it into its own Vec, registered in place too, in two uneven pieces;
/// both get their very Vecs back, the client's holding the server's bytes.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn rdma_read_between_vecs_registered_in_place() {
    const LEN: usize = (1 << 20) + 3;
    two_sided("conn_rdma_read_between_vecs_registered_in_place", |p| {
        if !p.is_server() {
            let client = Verbs::new(local_ip(), None, false);
            let conn = listening_conn(p, server_addr(p), &client);
            p.barrier();
            let remote = heard(&client);
            assert_eq!(remote.len as usize, LEN);
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
            let read = head
                .into_vec()
                .expect("the whole region, and the last buffer of it");
            assert_eq!(
                read.as_ptr() as u64,
                target_ptr,
                "the very same Vec is given back"
            );
            assert!(
                read == vec_bytes(LEN),
                "the READ copied the exposed bytes exactly"
            );
            p.barrier();
            return;
        }
        let server = Verbs::new(local_ip(), Some(8), false);
        server.fill_srq(8, 64);
        // An empty Vec cannot be a region; it comes back with the error.
        let (err, empty) = server
            .pd
            .register_vec(Vec::with_capacity(16), Access::REMOTE_READ)
            .unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL, "{err}");
        assert!(err.message().contains("empty"), "{err}");
        assert_eq!(empty.capacity(), 16, "the same Vec is given back");
        let exposed_vec = vec_bytes(LEN);
        let exposed_ptr = exposed_vec.as_ptr() as u64;
        let exposed = server
            .pd
            .register_vec(exposed_vec, Access::REMOTE_READ)
            .unwrap();
        assert_eq!(
            (exposed.addr(), exposed.len()),
            (exposed_ptr, LEN),
            "registered in place"
        );
        let remote = exposed.remote().expect("registered for remote read");
        assert_eq!((remote.addr, remote.len as usize), (exposed_ptr, LEN));
        let listener = listener_of(p);
        let (_listener, conn) = accept_on(listener, &server);
        p.barrier();
        tell(&conn, &server, remote);
        p.barrier(); // the client read it
        let exposed = exposed.into_vec().expect("the whole exposed region");
        assert_eq!(exposed.as_ptr() as u64, exposed_ptr);
        assert!(exposed == vec_bytes(LEN), "the exposed bytes are unchanged");
    });
}
