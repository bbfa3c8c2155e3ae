//! One-sided operations the NIC performs (`ConnLimits::verbs_rma`): on a key with an RDMA
//! part, puts, gets and atomic operations become `Action::RmaVerbs` work for the driver,
//! complete on its reports, keep fences and flushes, and a refusal by the target's NIC
//! fails the request as refused and the connection with it.

use rdmx_proto::rma::{AtomicOp, KeyRef, PackedKey, RdmaPart, RefusalKind, RemoteAccess};
use rdmx_proto::*;

const CONN: ConnId = ConnId(1);

/// An engine whose connection 1 performs one-sided operations by verbs.
fn engine() -> Engine {
    let mut e = Engine::new(Config::default());
    let hs = e.local_handshake();
    let limits = ConnLimits {
        verbs_rma: true,
        ..e.default_limits()
    };
    e.handle_connection_up_with(CONN, &hs, limits).unwrap();
    e
}

fn key(rdma: bool) -> PackedKey {
    PackedKey {
        key: KeyRef {
            region: 3,
            generation: 1,
            secret: 9,
        },
        len: 1 << 20,
        access: RemoteAccess::ALL,
        rdma: rdma.then_some(RdmaPart {
            addr: 0x7000_0000,
            rkey: 0x1234,
        }),
    }
}

fn actions(e: &mut Engine) -> Vec<Action> {
    std::iter::from_fn(|| e.poll_action()).collect()
}

fn completion(actions: &[Action], r: RequestId) -> Option<Completion> {
    actions.iter().find_map(|a| match a {
        Action::Complete(c) if c.request == r => Some(*c),
        _ => None,
    })
}

#[test]
fn operations_on_an_rdma_key_are_work_for_the_nic() {
    let mut e = engine();
    let k = key(true);
    let put = e.rma_put(CONN, &k, 4096, UserBufId(1), 1000).unwrap();
    let get = e.rma_get(CONN, &k, 8, UserBufId(2), 64).unwrap();
    let add = e
        .rma_atomic(CONN, &k, 16, AtomicOp::FetchAdd(5), UserBufId(3))
        .unwrap();
    let got = actions(&mut e);
    let work: Vec<_> = got
        .iter()
        .filter_map(|a| match a {
            Action::RmaVerbs {
                request,
                op,
                buf,
                offset,
                len,
                remote,
                ..
            } => Some((*request, *op, *buf, *offset, *len, remote.addr, remote.rkey)),
            _ => None,
        })
        .collect();
    assert_eq!(
        work,
        vec![
            (
                put,
                VerbsOp::Write,
                UserBufId(1),
                0,
                1000,
                0x7000_0000 + 4096,
                0x1234
            ),
            (
                get,
                VerbsOp::Read,
                UserBufId(2),
                0,
                64,
                0x7000_0000 + 8,
                0x1234
            ),
            (
                add,
                VerbsOp::Atomic(AtomicOp::FetchAdd(5)),
                UserBufId(3),
                0,
                8,
                0x7000_0000 + 16,
                0x1234
            ),
        ]
    );
    // No frame: the target's engine takes no part.
    assert!(!got.iter().any(|a| matches!(a, Action::SendFrame { .. })));
    // A flush waits for all three.
    let flush = e.rma_flush(CONN, UserBufId(4)).unwrap();
    assert!(completion(&actions(&mut e), flush).is_none());
    e.handle_rma_verbs_done(add, Ok(41));
    e.handle_rma_verbs_done(put, Ok(0));
    let got = actions(&mut e);
    let c = completion(&got, add).expect("the atomic completed");
    assert_eq!(
        (c.kind, c.status, c.tag),
        (RequestKind::Atomic, Status::Ok, 41)
    );
    assert_eq!(completion(&got, put).unwrap().length, 1000);
    assert!(completion(&got, flush).is_none());
    e.handle_rma_verbs_done(get, Ok(0));
    let got = actions(&mut e);
    assert_eq!(completion(&got, get).unwrap().status, Status::Ok);
    assert_eq!(completion(&got, flush).unwrap().status, Status::Ok);
    // A report for a request that is gone is ignored.
    e.handle_rma_verbs_done(get, Ok(0));
    assert!(actions(&mut e).is_empty());
    assert_eq!(e.pending_requests(), 0);
}

#[test]
fn a_fence_holds_the_next_work_and_keys_without_rdma_go_as_messages() {
    let mut e = engine();
    let a = e
        .rma_atomic(CONN, &key(true), 0, AtomicOp::FetchAdd(1), UserBufId(1))
        .unwrap();
    e.rma_fence(CONN).unwrap();
    let b = e.rma_put(CONN, &key(true), 0, UserBufId(2), 8).unwrap();
    let got = actions(&mut e);
    assert_eq!(
        got.iter()
            .filter(|x| matches!(x, Action::RmaVerbs { .. }))
            .count(),
        1
    );
    e.handle_rma_verbs_done(a, Ok(0));
    let got = actions(&mut e);
    assert!(got
        .iter()
        .any(|x| matches!(x, Action::RmaVerbs { request, .. } if *request == b)));
    // A key without an RDMA part, and a zero-byte put, go as frames.
    e.rma_put(CONN, &key(false), 0, UserBufId(3), 8).unwrap();
    e.rma_put(CONN, &key(true), 0, UserBufId(4), 0).unwrap();
    let got = actions(&mut e);
    assert_eq!(
        got.iter()
            .filter(|x| matches!(x, Action::SendFrame { .. }))
            .count(),
        2
    );
    assert!(!got.iter().any(|x| matches!(x, Action::RmaVerbs { .. })));
}

#[test]
fn a_refusal_by_the_nic_fails_the_request_and_the_connection() {
    let mut e = engine();
    let k = key(true);
    let bad = e.rma_put(CONN, &k, 0, UserBufId(1), 8).unwrap();
    let other = e.rma_get(CONN, &k, 0, UserBufId(2), 8).unwrap();
    let tag_send = e.tag_send(CONN, 5, UserBufId(3), 1 << 20).unwrap();
    actions(&mut e);
    e.handle_rma_verbs_done(bad, Err(VerbsFailure::RemoteAccess));
    let got = actions(&mut e);
    assert_eq!(
        completion(&got, bad).unwrap().status,
        Status::Refused(RefusalKind::RemoteAccess)
    );
    assert_eq!(
        completion(&got, other).unwrap().status,
        Status::ConnectionClosed
    );
    assert_eq!(
        completion(&got, tag_send).unwrap().status,
        Status::ConnectionClosed
    );
    assert!(got
        .iter()
        .any(|a| matches!(a, Action::CloseConnection { conn: CONN, .. })));
    // The flushed work's reports come after: ignored.
    e.handle_rma_verbs_done(other, Err(VerbsFailure::Broken));
    assert!(actions(&mut e).is_empty());
    assert_eq!(e.pending_requests(), 0);
    // Any other failure fails the connection, the request with it.
    let mut e = engine();
    let r = e.rma_get(CONN, &k, 0, UserBufId(1), 8).unwrap();
    actions(&mut e);
    e.handle_rma_verbs_done(r, Err(VerbsFailure::Broken));
    let got = actions(&mut e);
    assert_eq!(
        completion(&got, r).unwrap().status,
        Status::ConnectionClosed
    );
}

/// A reply frame for an operation the NIC performs is a protocol error: only the NIC's
/// report completes it (a reply would complete a get while the NIC may still write its
/// buffer). So is an atomic operation's reply carrying bytes. (Found while extending the
/// fuzz harness to one-sided operations, issue 48: both were accepted.)
#[test]
fn a_reply_frame_for_work_the_nic_performs_is_a_protocol_error() {
    for case in 0..2 {
        let mut e = engine();
        // (Case 1: a key without an RDMA part, so the operation goes by messages.)
        let r = e
            .rma_atomic(
                CONN,
                &key(case == 0),
                8,
                AtomicOp::FetchAdd(1),
                UserBufId(1),
            )
            .unwrap();
        actions(&mut e);
        let mut h = wire::Header::new(wire::Opcode::RmaReply);
        h.sreq = r.0;
        h.rreq = 77;
        h.payload_len = 8 * case;
        let mut frame = wire::FrameBuf::encode(&h, None).as_bytes().to_vec();
        frame.extend_from_slice(&vec![1; 8 * case as usize]);
        e.handle_frame(CONN, RecvBufId(0), &frame);
        let got = actions(&mut e);
        assert!(
            got.iter().any(|a| matches!(a,
                Action::CloseConnection { reason: CloseReason::ProtocolError(why), .. }
                    if why.contains("awaits none") || why.contains("with bytes"))),
            "case {case}: {got:?}"
        );
        let c = completion(&got, r).expect("the operation fails with its connection");
        assert_eq!(c.status, Status::ConnectionClosed, "case {case}");
    }
}
