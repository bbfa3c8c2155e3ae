//! Scenario tests of tag matching on the simulated fabric: posted receives and unexpected
//! messages, their order, wildcards and masks, probes (plain and matched), receives done as
//! they are made; cancelling receives and sends.

mod common;

use common::*;
use rdmx_proto::*;

#[test]
fn unexpected_eager_reposts_at_once() {
    let mut s = sim3(2);
    let data = pattern(120, 2);
    s.send(0, 1, 9, data.clone());
    s.run();
    assert_eq!(s.peers[1].engine.unexpected_len(), 1);
    s.assert_srq_full();
    let (r, buf) = s.recv(1, 9, !0, 200);
    let c = s.completion(1, r).unwrap();
    assert_eq!((c.status, c.length), (Status::Ok, 120));
    assert_eq!(s.data(1, buf, 120), data);
    assert_eq!(s.peers[1].engine.pending_requests(), 0);
}

#[test]
fn a_receive_whose_eager_message_arrived_completes_as_it_is_made() {
    let mut e = engine_with_conn1();
    let frame = eager_frame(0, 5, &[1, 2, 3]);
    e.handle_frame(ConnId(1), RecvBufId(0), &frame);
    while e.poll_action().is_some() {}
    let r = e.tag_recv(5, !0, UserBufId(9), 8);
    // Never stored: an immediate id, nothing pending, nothing to cancel; the copy, then
    // the completion, are the actions the call queued.
    assert!(r.is_immediate());
    assert_eq!(e.pending_requests(), 0);
    assert_eq!(
        e.poll_action(),
        Some(Action::CopyToUser {
            dst: UserBufId(9),
            dst_offset: 0,
            data: vec![1, 2, 3]
        })
    );
    assert_eq!(
        e.poll_action(),
        Some(Action::Complete(Completion {
            request: r,
            kind: RequestKind::Recv,
            status: Status::Ok,
            length: 3,
            tag: 5,
            conn: Some(ConnId(1)),
            buf: Some(UserBufId(9)),
        }))
    );
    assert_eq!(e.poll_action(), None);
    assert!(!e.cancel(r));
    // A receive with nothing to match is stored, as before.
    let later = e.tag_recv(5, !0, UserBufId(10), 8);
    assert!(!later.is_immediate());
    assert_eq!(e.pending_requests(), 1);
}

#[test]
fn tag_recv_now_takes_the_first_match_only_when_it_is_eager() {
    let mut e = engine_with_conn1();
    let mut buf = [0u8; 4];
    // Nothing arrived: nothing happens.
    assert_eq!(e.tag_recv_now(5, !0, &mut buf), None);
    for (seq, (tag, payload)) in [(5, &[1u8, 2, 3][..]), (6, &[4][..]), (5, &[9; 6][..])]
        .into_iter()
        .enumerate()
    {
        e.handle_frame(
            ConnId(1),
            RecvBufId(0),
            &eager_frame(seq as u32, tag, payload),
        );
    }
    while e.poll_action().is_some() {}
    // The first message with tag 5, copied in at once: no action, nothing stored.
    let c = e.tag_recv_now(5, !0, &mut buf).unwrap();
    assert!(c.request.is_immediate());
    assert_eq!(
        (c.kind, c.status, c.length, c.tag, c.conn),
        (RequestKind::Recv, Status::Ok, 3, 5, Some(ConnId(1)))
    );
    assert_eq!(buf, [1, 2, 3, 0]);
    assert_eq!((e.poll_action(), e.pending_requests()), (None, 0));
    // The next one with tag 5 does not fit: truncated, dropped, the buffer untouched.
    let c = e.tag_recv_now(5, !0, &mut buf).unwrap();
    assert_eq!((c.status, c.length), (Status::Truncated, 6));
    assert_eq!(buf, [1, 2, 3, 0]);
    // The wildcard finds the one left; then nothing is.
    assert_eq!(e.tag_recv_now(0, 0, &mut buf).unwrap().tag, 6);
    assert_eq!(buf[0], 4);
    assert_eq!(e.tag_recv_now(0, 0, &mut buf), None);
    assert_eq!(e.unexpected_len(), 0);
}

#[test]
fn tag_recv_now_leaves_a_rendezvous_first_match_to_tag_recv() {
    let mut s = sim3(41);
    let large = pattern(700, 1);
    s.send(0, 1, 44, large.clone());
    s.send(0, 1, 44, pattern(10, 2));
    s.run();
    assert_eq!(s.peers[1].engine.unexpected_len(), 2);
    // The first message with tag 44 is a rendezvous: not taken, nor is the eager one
    // behind it (that would receive out of order).
    let mut buf = vec![0u8; 1000];
    assert_eq!(s.peers[1].engine.tag_recv_now(44, !0, &mut buf), None);
    assert_eq!(s.peers[1].engine.unexpected_len(), 2);
    let (r, rbuf) = s.recv(1, 44, !0, 1000);
    s.run();
    assert_eq!(s.completion(1, r).unwrap().length, 700);
    assert_eq!(s.data(1, rbuf, 700), large);
    // Now the eager one is first.
    let c = s.peers[1].engine.tag_recv_now(44, !0, &mut buf).unwrap();
    assert_eq!((c.status, c.length), (Status::Ok, 10));
    assert_eq!(&buf[..10], &pattern(10, 2)[..]);
}

#[test]
fn unexpected_rts_waits_for_receive() {
    let mut s = sim3(4);
    let data = pattern(700, 4);
    let sr = s.send(1, 0, 44, data.clone());
    s.run();
    assert!(s.completion(1, sr).is_none());
    let p = s.peers[0].engine.probe(44, !0).unwrap();
    assert!(p.rendezvous);
    assert_eq!((p.len, p.conn), (700, conn(1)));
    let (r, buf) = s.recv(0, 0, 0, 1000);
    s.run();
    assert_eq!(s.completion(1, sr).unwrap().status, Status::Ok);
    assert_eq!(s.completion(0, r).unwrap().length, 700);
    assert_eq!(s.data(0, buf, 700), data);
}

#[test]
fn wildcard_and_mask_matching() {
    let mut s = sim3(5);
    // Receives posted in order; the first matching one wins.
    let (r_hi, _) = s.recv(2, 0xAB00, 0xFF00, 64); // matches 0xAB??
    let (r_any, _) = s.recv(2, 0, 0, 64); // wildcard
    let (r_exact, _) = s.recv(2, 0x1234, !0, 64);
    s.send(0, 2, 0x1234, pattern(4, 1)); // r_hi does not match, r_any does (posted first)
    s.run();
    assert_eq!(s.completion(2, r_any).unwrap().tag, 0x1234);
    s.send(1, 2, 0xAB42, pattern(4, 2));
    s.run();
    assert_eq!(s.completion(2, r_hi).unwrap().tag, 0xAB42);
    assert!(s.completion(2, r_exact).is_none());
    s.send(1, 2, 0x1234, pattern(4, 3));
    s.run();
    assert_eq!(s.completion(2, r_exact).unwrap().conn, Some(conn(1)));
}

#[test]
fn per_connection_order_with_unexpected_messages() {
    let mut s = sim3(6);
    for k in 0..6u64 {
        let len = if k % 2 == 0 { 30 } else { 600 };
        s.send(0, 1, 100 + k, pattern(len, k));
    }
    s.run();
    let mut got = Vec::new();
    for _ in 0..6 {
        let (r, _) = s.recv(1, 0, 0, 1000);
        got.push(r);
    }
    s.run();
    let tags: Vec<u64> = got
        .iter()
        .map(|r| s.completion(1, *r).unwrap().tag)
        .collect();
    assert_eq!(tags, (100..106).collect::<Vec<_>>());
}

#[test]
fn probe_then_msg_recv() {
    let mut s = sim3(8);
    assert!(s.peers[1].engine.probe(0, 0).is_none());
    let data = pattern(33, 8);
    s.send(2, 1, 0x55, data.clone());
    s.run();
    let p = s.peers[1].engine.probe(0x50, 0xF0).unwrap();
    assert_eq!((p.tag, p.len, p.rendezvous), (0x55, 33, false));
    // Probing does not remove.
    assert!(s.peers[1].engine.probe(0x55, !0).is_some());
    let buf = s.alloc(1, vec![0; 40]);
    let r = s.peers[1].engine.msg_recv(p.msg, buf, 40).unwrap();
    s.pump(1);
    assert_eq!(s.completion(1, r).unwrap().status, Status::Ok);
    assert_eq!(s.data(1, buf, 33), data);
    assert!(s.peers[1].engine.probe(0, 0).is_none());
    assert!(s.peers[1].engine.msg_recv(p.msg, buf, 40).is_none());
}

#[test]
fn matched_probe_hides_the_message_until_msg_recv() {
    let mut s = sim3(9);
    let first = pattern(20, 1);
    s.send(2, 1, 0x77, first.clone());
    s.send(2, 1, 0x77, pattern(21, 2));
    s.run();
    let p = s.peers[1].engine.probe_remove(0x77, !0).unwrap();
    assert_eq!(p.len, 20, "the first matching message, in arrival order");
    // Neither a probe nor a posted receive sees it any more: they get the second one.
    assert_eq!(s.peers[1].engine.probe(0x77, !0).unwrap().len, 21);
    let (r2, b2) = s.recv(1, 0x77, !0, 64);
    s.run();
    assert_eq!(s.completion(1, r2).unwrap().length, 21);
    assert_eq!(s.data(1, b2, 21), pattern(21, 2));
    // Only its handle receives it.
    let buf = s.alloc(1, vec![0; 20]);
    let r = s.peers[1].engine.msg_recv(p.msg, buf, 20).unwrap();
    s.pump(1);
    assert_eq!(s.completion(1, r).unwrap().status, Status::Ok);
    assert_eq!(s.data(1, buf, 20), first);
    assert!(s.peers[1].engine.msg_recv(p.msg, buf, 20).is_none());
}

#[test]
fn matched_probe_of_a_rendezvous_whose_connection_died_fails_its_receive() {
    let mut s = sim3(10);
    let big = s.peers[2].engine.config().eager_threshold as usize + 100;
    s.send(2, 1, 0x78, pattern(big, 3));
    s.run();
    let p = s.peers[1].engine.probe_remove(0x78, !0).unwrap();
    assert!(p.rendezvous);
    s.kill(1, 2);
    let buf = s.alloc(1, vec![0; big]);
    let r = s.peers[1]
        .engine
        .msg_recv(p.msg, buf, big as u64)
        .expect("a removed message is always received");
    s.pump(1);
    assert_eq!(s.completion(1, r).unwrap().status, Status::ConnectionClosed);
}

/// A connection dies with a rendezvous message and then an eager one from it unexpected at
/// the receiver: they stay queued in order, the receive that matches the rendezvous one fails
/// (its data is gone) and the next receive gets the eager one — never the later message in
/// place of the lost one.
#[test]
fn connection_down_keeps_its_unexpected_messages_in_order() {
    let mut s = sim3(20);
    let rndv = s.send(0, 1, 1, pattern(900, 1));
    let eager = s.send(0, 1, 2, pattern(9, 1));
    s.run();
    assert_eq!(s.completion(0, eager).unwrap().status, Status::Ok);
    assert!(s.completion(0, rndv).is_none());
    s.kill(0, 1);
    s.run();
    let c = s.completion(0, rndv).unwrap();
    assert_eq!(c.status, Status::ConnectionClosed);
    let probed = s.peers[1]
        .engine
        .probe(0, 0)
        .expect("the rendezvous message is queued");
    assert_eq!((probed.tag, probed.len, probed.rendezvous), (1, 900, true));
    let (first, _) = s.recv(1, 0, 0, 1000);
    let c = s.completion(1, first).unwrap();
    assert_eq!(
        (c.status, c.tag, c.length),
        (Status::ConnectionClosed, 1, 900)
    );
    let (second, buf) = s.recv(1, 0, 0, 1000);
    let c = s.completion(1, second).unwrap();
    assert_eq!((c.status, c.tag, c.length), (Status::Ok, 2, 9));
    assert_eq!(s.data(1, buf, 9), pattern(9, 1));
    assert!(s.peers[1].engine.probe(0, 0).is_none());
    for p in &s.peers {
        assert_eq!(p.engine.pending_requests(), 0);
    }
}

#[test]
fn cancel_receive_and_sends() {
    let mut s = sim3(11);
    let (r, _) = s.recv(1, 5, !0, 10);
    assert!(s.cancel(1, r));
    assert_eq!(s.completion(1, r).unwrap().status, Status::Cancelled);
    assert!(!s.cancel(1, r), "already completed");
    // The cancelled receive does not match.
    s.send(0, 1, 5, pattern(3, 1));
    s.run();
    assert_eq!(s.peers[1].engine.unexpected_len(), 1);

    // A rendezvous send whose RTS reached the peer cannot be withdrawn: cancel says no, and
    // the late receiver gets the message whole (no receive is consumed by a phantom).
    let sr = s.send(0, 2, 6, pattern(900, 2));
    s.run();
    assert!(s.peers[2].engine.probe(6, !0).is_some(), "the RTS arrived");
    assert!(!s.cancel(0, sr));
    assert!(s.completion(0, sr).is_none(), "the send goes on");
    let (rr, buf) = s.recv(2, 6, !0, 1000);
    s.run();
    assert_eq!(s.completion(2, rr).unwrap().status, Status::Ok);
    assert_eq!(s.data(2, buf, 900), pattern(900, 2));
    assert_eq!(s.completion(0, sr).unwrap().status, Status::Ok);
    assert_eq!(s.peers[0].engine.pending_requests(), 0);
    assert_eq!(s.peers[2].engine.pending_requests(), 0);

    // A matched rendezvous receive cannot be cancelled.
    let (rr, _) = s.recv(2, 8, !0, 1000);
    s.send(0, 2, 8, pattern(900, 3));
    for _ in 0..3 {
        s.step();
    }
    if s.completion(2, rr).is_none() && s.peers[2].engine.probe(8, !0).is_none() {
        assert!(!s.cancel(2, rr));
    }
    s.run();
    assert_eq!(s.completion(2, rr).unwrap().status, Status::Ok);
}

#[test]
fn cancel_queued_sends() {
    let mut s = sim3(12);
    // Exhaust credits towards peer 1 so later sends queue.
    let mut reqs = Vec::new();
    for k in 0..12 {
        reqs.push(s.send(0, 1, k, pattern(5, k)));
    }
    let queued = *reqs.last().unwrap();
    assert!(s.completion(0, queued).is_none(), "waiting for credits");
    // A rendezvous send queued behind them: its RTS has not left either.
    let rndv = s.send(0, 1, 99, pattern(900, 4));
    assert!(s.cancel(0, queued));
    assert_eq!(s.completion(0, queued).unwrap().status, Status::Cancelled);
    assert!(
        s.cancel(0, rndv),
        "a queued rendezvous send can be withdrawn"
    );
    assert_eq!(s.completion(0, rndv).unwrap().status, Status::Cancelled);
    s.run();
    // Neither cancelled send is ever seen by the peer.
    assert_eq!(s.peers[1].engine.unexpected_len(), 11);
    assert!(s.peers[1].engine.probe(11, !0).is_none());
    assert!(s.peers[1].engine.probe(99, !0).is_none());
    assert_eq!(s.peers[0].engine.pending_requests(), 0);
}
