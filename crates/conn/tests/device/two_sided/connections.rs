//! Connecting, accepting and rejecting, several connections sharing one SRQ and CQ, and
//! disconnecting, with the server and the client on two sides.

use super::*;

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

/// Three clients' connections to the server share its one SRQ and one CQ: each client SENDs
/// from a registered buffer and inline; all six land in the SRQ, complete on the one CQ
/// tagged with the sender's QP, and the receive buffers go back on the SRQ and are used again.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn connections_share_one_srq_and_one_cq() {
    const CLIENTS: usize = 3;
    two_sided("conn_connections_share_one_srq_and_one_cq", |p| {
        if !p.is_server() {
            let addr = server_addr(p);
            let clients: Vec<(Verbs, Connection)> = (0..CLIENTS)
                .map(|i| {
                    let side = Verbs::new(local_ip(), None, false);
                    let conn =
                        connect_to(p, addr, &side.config(), format!("client {i}").as_bytes());
                    (side, conn)
                })
                .collect();
            p.barrier();
            // Each client sends two messages: one from a registered buffer, one inline.
            for (i, (side, conn)) in clients.iter().enumerate() {
                let text = format!("buffer message from client {i}");
                let buf = side
                    .pd
                    .register_from(text.as_bytes(), Access::SEND)
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
            p.barrier(); // the server received them and reposted its buffers
            clients[0].1.post_send_inline(b"again", 7).unwrap();
            collect(&clients[0].0.cq, 1);
            p.barrier();
            return;
        }
        let server = Verbs::new(local_ip(), Some(32), false);
        server.fill_srq(32, 256);
        let listener = listener_of(p);
        let server_conns: Vec<Connection> = (0..CLIENTS)
            .map(|i| {
                let request = listener
                    .get_request(Some(LONG))
                    .unwrap()
                    .expect("a request");
                assert!(request
                    .private_data()
                    .starts_with(format!("client {i}").as_bytes()));
                request.accept(&server.config(), b"", LONG).unwrap()
            })
            .collect();
        assert_eq!(server.cq.pending(), 32, "32 receives posted on the SRQ");
        p.barrier();
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
        p.barrier();
        let again = collect(&server.cq, 1);
        assert_eq!(&again[0].buffer.as_ref().unwrap()[..5], b"again");
        p.barrier();
        drop(server_conns);
    });
}
