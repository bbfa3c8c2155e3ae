//! Disconnect and teardown with work still posted, in any order, and a QP that cannot be destroyed.

use super::*;

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn teardown_with_work_still_posted_in_any_order() {
    let Pair {
        server,
        client,
        listener,
        server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_a(), 16, true, true);

    for buf in client
        .pd
        .register_chunks(128, 8, Access::LOCAL_WRITE)
        .unwrap()
    {
        conn.post_recv(buf, 0).map_err(|(e, _)| e).unwrap();
    }
    let exposed = client.pd.register(4096, Access::REMOTE_READ).unwrap();
    let client_cq = client.cq.clone();
    assert_eq!(client_cq.pending(), 8);

    // Drop the handles first, the connection last: ownership keeps QP before CQ/SRQ and MR
    // before PD, the event channel until its last id is destroyed, and the posted receives'
    // buffers are released with the QP.
    let Verbs {
        pd,
        cq,
        srq,
        events,
    } = client;
    drop(pd);
    drop(cq);
    drop(srq);
    drop(events);
    drop(exposed);
    assert_eq!(client_cq.pending(), 8);
    drop(conn);
    assert_eq!(
        client_cq.pending(),
        0,
        "destroying the QP released its posted receives"
    );
    drop(client_cq);

    // Server: SRQ handle dropped while 16 receives are posted and a connection uses it.
    let server_cq = server.cq.clone();
    drop(server);
    assert_eq!(server_cq.pending(), 16);
    let event = server_conn
        .next_event(Some(LONG))
        .unwrap()
        .expect("the client's disconnect");
    assert_eq!(event.kind, CmEventKind::DISCONNECTED);
    drop(server_conn);
    assert_eq!(
        server_cq.pending(),
        0,
        "the SRQ was destroyed with its last connection"
    );
    drop(listener);
    let mut out = Vec::new();
    assert_eq!(
        server_cq.poll(&mut out, 16).unwrap(),
        0,
        "no completion refers to freed work"
    );
}

/// When `ibv_destroy_qp` fails the QP may still be live and the NIC may still write the
/// buffers posted on it: dropping the connection must leak them (their region stays
/// registered and allocated), never free them. The failure is injected
/// (`fault::fail_next_qp_destroy`): the QP really stays alive, and a SEND from the peer still
/// lands in one of the leaked buffers afterwards.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn a_qp_that_cannot_be_destroyed_leaks_its_posted_buffers() {
    let Pair {
        server,
        client,
        server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_a(), 16, false, false);
    for buf in client
        .pd
        .register_chunks(128, 8, Access::LOCAL_WRITE)
        .unwrap()
    {
        conn.post_recv(buf, 0).map_err(|(e, _)| e).unwrap();
    }
    let client_cq = client.cq.clone();
    drop(client);
    assert_eq!(client_cq.pending(), 8);
    let before = live_registrations();

    fault::fail_next_qp_destroy();
    drop(conn);
    assert_eq!(
        client_cq.pending(),
        0,
        "the records are gone from the table"
    );
    assert_eq!(
        live_registrations(),
        before,
        "the posted receive buffers were leaked, not deregistered and freed"
    );
    // The QP was not destroyed: the peer's SEND is still received into a leaked buffer.
    server_conn.post_send_inline(b"still there", 3).unwrap();
    let sent = collect(&server.cq, 1).pop().unwrap();
    println!("SEND to the undestroyable QP: {:?}", sent.status);
    assert!(sent.status.is_success(), "{sent:?}");
    let mut out = Vec::new();
    client_cq.poll(&mut out, 8).unwrap();
    assert!(
        out.is_empty(),
        "a completion into a leaked buffer is not handed out: {out:?}"
    );
}
