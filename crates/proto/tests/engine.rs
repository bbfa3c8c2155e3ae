//! Scenario tests of the engine on the simulated fabric.

mod common;

use common::*;
use rdmx_proto::wire::{self, FrameBuf, Header, Opcode};
use rdmx_proto::*;

#[test]
fn eager_to_posted_receive() {
    let mut s = sim3(1);
    let (r, buf) = s.recv(1, 7, !0, 100);
    let data = pattern(50, 1);
    let sr = s.send(0, 1, 7, data.clone());
    // Eager sends complete once the driver copied the payload.
    assert_eq!(s.completion(0, sr).unwrap().status, Status::Ok);
    s.run();
    let c = s.completion(1, r).unwrap();
    assert_eq!(
        (c.status, c.length, c.tag, c.conn),
        (Status::Ok, 50, 7, Some(conn(0)))
    );
    assert_eq!(s.data(1, buf, 50), data);
    s.assert_srq_full();
}

#[test]
fn delivering_a_frame_directly_does_what_its_actions_would() {
    // Two engines in the same state get the same frames: one through `handle_frame` (the
    // copy and the completion as actions), the other through `handle_frame_delivering`
    // (them handed back). Turned into the actions they stand for, the deliveries and the
    // second engine's actions are the first engine's actions, frame after frame: matched
    // receives (empty and not), a truncated one, an unexpected message, credit updates
    // the frames make due, and a malformed frame, which closes the connection in both.
    let up = |cfg: Config| {
        let mut e = Engine::new(cfg.clone());
        let peer = Engine::new(cfg).local_handshake();
        e.handle_connection_up(ConnId(1), &peer).unwrap();
        while e.poll_action().is_some() {}
        e
    };
    let (mut a, mut b) = (up(small_cfg()), up(small_cfg()));
    let mut frames = Vec::new();
    // (Within the window of 8 frames the connection grants: the test returns no credits.)
    for i in 0..5u32 {
        let payload = pattern(usize::try_from(i % 4).unwrap() * 2, u64::from(i));
        frames.push((Some(8u64), eager_frame(i, 3, &payload)));
    }
    // Truncated: 9 bytes into a receive of 8.
    frames.push((Some(8), eager_frame(5, 3, &[7; 9])));
    // Unexpected: no receive posted for it.
    frames.push((None, eager_frame(6, 4, &[1, 2])));
    // Malformed: a sequence number out of order.
    frames.push((Some(8), eager_frame(99, 3, &[1])));
    let src = RecvBufId(6);
    let (mut deliveries, mut credit_updates) = (0, 0);
    for (i, (cap, frame)) in frames.iter().enumerate() {
        let dst = UserBufId(100 + i as u64);
        let recvs = cap.map(|cap| (a.tag_recv(3, !0, dst, cap), b.tag_recv(3, !0, dst, cap)));
        if let Some((ra, rb)) = recvs {
            assert_eq!(ra, rb, "frame {i}: the engines went apart");
        }
        a.handle_frame(ConnId(1), src, frame);
        let expected: Vec<Action> = std::iter::from_fn(|| a.poll_action()).collect();
        let mut got = Vec::new();
        if let Some(d) = b.handle_frame_delivering(ConnId(1), frame) {
            deliveries += 1;
            assert_eq!(d.dst, dst);
            assert_eq!(&frame[d.payload()], &frame[HEADER_LEN..]);
            if d.len > 0 {
                got.push(Action::CopyFromRecvBuf {
                    src,
                    src_offset: d.offset as usize,
                    len: d.len as usize,
                    dst: d.dst,
                    dst_offset: 0,
                });
            }
            got.push(Action::Complete(d.completion()));
        }
        got.extend(std::iter::from_fn(|| b.poll_action()));
        assert_eq!(got, expected, "frame {i}");
        credit_updates += expected
            .iter()
            .filter(|a| matches!(a, Action::SendFrame { payload: None, frame, .. } if frame.header().opcode == Opcode::Credit))
            .count();
    }
    assert!(credit_updates > 0, "no frame made a credit update due");
    assert_eq!(
        deliveries, 5,
        "the matched receives that fit were delivered directly"
    );
    assert_eq!(a.pending_requests(), b.pending_requests());
    assert_eq!(a.unexpected_len(), b.unexpected_len());
    assert!(a.conn_stats(ConnId(1)).is_none() && b.conn_stats(ConnId(1)).is_none());
}

#[test]
fn eager_truncation() {
    let mut s = sim3(9);
    let (r, buf) = s.recv(1, 0, 0, 10);
    let sr = s.send(0, 1, 3, pattern(50, 9));
    s.run();
    let c = s.completion(1, r).unwrap();
    assert_eq!((c.status, c.length), (Status::Truncated, 50));
    assert_eq!(s.data(1, buf, 10), vec![0xEE; 10], "no partial delivery");
    assert_eq!(s.completion(0, sr).unwrap().status, Status::Ok);
    // Unexpected path too.
    s.send(0, 1, 3, pattern(50, 9));
    s.run();
    let (r, _) = s.recv(1, 0, 0, 49);
    assert_eq!(s.completion(1, r).unwrap().status, Status::Truncated);
}

#[test]
fn zero_byte_messages() {
    let mut s = sim3(13);
    let (r, _) = s.recv(1, 1, !0, 0);
    let sr = s.send(0, 1, 1, vec![]);
    s.run();
    assert_eq!(s.completion(0, sr).unwrap().status, Status::Ok);
    let c = s.completion(1, r).unwrap();
    assert_eq!((c.status, c.length), (Status::Ok, 0));
    s.send(0, 1, 2, vec![]);
    s.run();
    let (r, _) = s.recv(1, 2, !0, 0);
    assert_eq!(s.completion(1, r).unwrap().length, 0);
}

fn first_action_is_expose(e: &mut Engine, len: u64) -> bool {
    e.tag_send(ConnId(1), 0, UserBufId(len), len).unwrap();
    let mut expose = false;
    while let Some(a) = e.poll_action() {
        if matches!(a, Action::ExposeSendBuffer { .. }) {
            expose = true;
        }
    }
    expose
}

#[test]
fn threshold_exact_and_plus_minus_one() {
    for t in [0u64, 1, 100, 200] {
        let cfg = Config::builder()
            .recv_buf_size(256)
            .eager_threshold(t)
            .build()
            .unwrap();
        let mut e = Engine::new(cfg.clone());
        e.handle_connection_up(ConnId(1), &Engine::new(cfg).local_handshake())
            .unwrap();
        assert_eq!(e.conn_stats(ConnId(1)).unwrap().eager_limit, t);
        if t > 0 {
            assert!(!first_action_is_expose(&mut e, t - 1), "t-1 is eager");
        }
        assert!(!first_action_is_expose(&mut e, t), "exactly t is eager");
        assert!(first_action_is_expose(&mut e, t + 1), "t+1 is rendezvous");
    }
    // Messages at the threshold really travel, both sides of it.
    let mut s = sim3(14);
    for len in [199usize, 200, 201] {
        let (r, buf) = s.recv(1, len as u64, !0, 300);
        let data = pattern(len, len as u64);
        s.send(0, 1, len as u64, data.clone());
        s.run();
        assert_eq!(s.completion(1, r).unwrap().length, len as u64);
        assert_eq!(s.data(1, buf, len as u64), data);
    }
}

#[test]
fn peer_buffer_size_caps_eager() {
    let small = Config::builder()
        .recv_buf_size(128)
        .eager_threshold(100_000)
        .srq_depth(16)
        .credits(8)
        .rndv_chunk_size(64)
        .build()
        .unwrap();
    let big = Config::builder()
        .recv_buf_size(1024)
        .eager_threshold(50)
        .srq_depth(16)
        .credits(8)
        .build()
        .unwrap();
    let mut s = Sim::new(vec![small, big, small_cfg()], 15);
    assert_eq!(
        s.peers[0].engine.conn_stats(conn(1)).unwrap().eager_limit,
        984
    );
    assert_eq!(
        s.peers[1].engine.conn_stats(conn(0)).unwrap().eager_limit,
        50
    );
    assert_eq!(
        s.peers[0].engine.conn_stats(conn(2)).unwrap().eager_limit,
        216
    );
    assert_eq!(
        s.peers[2].engine.conn_stats(conn(0)).unwrap().eager_limit,
        88
    );
    for (a, b) in [(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)] {
        for len in [0usize, 49, 50, 51, 88, 89, 300, 984, 985, 3000] {
            let (r, buf) = s.recv(b, len as u64, !0, 4000);
            let data = pattern(len, (a * 10 + b) as u64);
            let sr = s.send(a, b, len as u64, data.clone());
            s.run();
            assert_eq!(s.completion(a, sr).unwrap().status, Status::Ok);
            assert_eq!(s.completion(b, r).unwrap().length, len as u64);
            assert_eq!(s.data(b, buf, len as u64), data, "{a}->{b} len {len}");
        }
    }
    assert_eq!(s.rnr_stalls, 0);
}

#[test]
fn flow_control_never_overruns_the_srq() {
    let mut s = sim3(16);
    // Two senders blast a slow receiver that has posted nothing.
    for k in 0..200u64 {
        s.send(0, 2, k, pattern(150, k));
        s.send(1, 2, 1000 + k, pattern(150, k));
        assert!(s.in_flight(0, 2) <= 8 && s.in_flight(1, 2) <= 8);
        // Deliver only some events so queues build up.
        for _ in 0..(k % 3) {
            s.step();
        }
    }
    s.run();
    assert_eq!(s.rnr_stalls, 0, "a frame found the receiver's SRQ empty");
    assert_eq!(s.peers[2].engine.unexpected_len(), 400);
    for _ in 0..400 {
        s.recv(2, 0, 0, 200);
    }
    assert_eq!(s.peers[2].engine.pending_requests(), 0);
    assert_eq!(s.peers[0].engine.pending_requests(), 0);
    s.assert_srq_full();
}

#[test]
fn malformed_frame_closes_only_that_connection() {
    let mut s = sim3(17);
    // Peer 2 has a pending rendezvous send to peer 0 and a posted wildcard receive.
    let pending = s.send(2, 0, 1, pattern(900, 1));
    let other = s.send(2, 1, 1, pattern(900, 2));
    let (wild, _) = s.recv(2, 0, 0, 100);
    s.run();
    s.inject(0, 2, b"definitely not a frame".to_vec());
    s.run();
    assert!(matches!(
        s.peers[2].closed.as_slice(),
        [(c, CloseReason::ProtocolError(_))] if *c == conn(0)
    ));
    assert_eq!(
        s.completion(2, pending).unwrap().status,
        Status::ConnectionClosed
    );
    assert!(s.completion(2, other).is_none());
    assert!(
        s.completion(2, wild).is_none(),
        "worker-wide receive stays posted"
    );
    // The other connection still works.
    let (r, buf) = s.recv(1, 1, !0, 1000);
    s.run();
    assert_eq!(s.completion(2, other).unwrap().status, Status::Ok);
    assert_eq!(s.data(1, buf, 900), pattern(900, 2));
    assert_eq!(s.completion(1, r).unwrap().status, Status::Ok);
    let sr = s.send(1, 2, 5, pattern(20, 5));
    s.run();
    assert_eq!(s.completion(2, wild).unwrap().conn, Some(conn(1)));
    assert_eq!(s.completion(1, sr).unwrap().status, Status::Ok);
    // Peer 0 learnt that the connection is gone.
    assert!(s.peers[0].engine.conn_stats(conn(2)).is_none());
    assert!(s.peers[2]
        .engine
        .tag_send(conn(0), 0, UserBufId(1), 1)
        .is_err());
}

#[test]
fn every_malformation_is_a_protocol_error() {
    let good = eager_frame(0, 0, b"abcd");
    assert!(wire::decode(&good).is_ok());
    let mut cases: Vec<Vec<u8>> = vec![vec![], good[..39].to_vec(), good[..43].to_vec()];
    for (off, val) in [(0, 0u8), (2, 2), (3, 0), (3, 99), (4, 2), (5, 1), (12, 9)] {
        let mut v = good.clone();
        v[off] = val;
        cases.push(v);
    }
    for bytes in cases {
        assert!(wire::decode(&bytes).is_err(), "{bytes:?}");
        let mut s = Sim::uniform(3, small_cfg(), 18);
        s.inject(1, 0, bytes);
        s.run();
        assert_eq!(s.peers[0].closed.len(), 1);
        assert!(s.peers[0].engine.conn_stats(conn(2)).is_some());
        s.assert_srq_full();
    }
}

#[test]
fn connection_down_fails_only_its_requests() {
    let mut s = sim3(19);
    let to1 = s.send(0, 1, 1, pattern(900, 1));
    let to2 = s.send(0, 2, 1, pattern(900, 2));
    let eager_to1 = s.send(0, 1, 2, pattern(9, 1));
    s.run();
    assert_eq!(s.completion(0, eager_to1).unwrap().status, Status::Ok);
    // Peer 1 is reading a message from peer 0 when the connection dies.
    let (reading, _) = s.recv(1, 1, !0, 1000);
    assert!(s.completion(1, reading).is_none());
    s.kill(0, 1);
    s.run();
    assert_eq!(
        s.completion(0, to1).unwrap().status,
        Status::ConnectionClosed
    );
    assert_eq!(
        s.completion(1, reading).unwrap().status,
        Status::ConnectionClosed
    );
    assert!(s.completion(0, to2).is_none());
    assert_eq!(s.peers[0].engine.pending_requests(), 1);
    // The eager message that had already arrived is still deliverable.
    let (r, _) = s.recv(1, 2, !0, 100);
    assert_eq!(s.completion(1, r).unwrap().status, Status::Ok);
    let (r, buf) = s.recv(2, 1, !0, 1000);
    s.run();
    assert_eq!(s.completion(0, to2).unwrap().status, Status::Ok);
    assert_eq!(s.data(2, buf, 900), pattern(900, 2));
    assert_eq!(s.completion(2, r).unwrap().status, Status::Ok);
    for p in &s.peers {
        assert_eq!(p.engine.pending_requests(), 0);
    }
}

#[test]
fn drain_timeout_completes_unreported_reads() {
    let cfg = small_cfg();
    let mut e = Engine::new(cfg.clone());
    e.handle_connection_up(ConnId(1), &Engine::new(cfg).local_handshake())
        .unwrap();
    e.handle_timeout(1_000);
    let r = e.tag_recv(0, 0, UserBufId(1), 1000);
    let mut h = Header::new(Opcode::Rts);
    h.payload_len = wire::RTS_BODY_LEN as u32;
    let f = FrameBuf::encode(
        &h,
        Some(&wire::RtsBody {
            addr: 0,
            rkey: 0,
            len: 500,
        }),
    );
    e.handle_frame(ConnId(1), RecvBufId(3), f.as_bytes());
    while e.poll_action().is_some() {}
    e.handle_connection_down(ConnId(1));
    assert!(
        e.poll_action().is_none(),
        "waits for the READs to be flushed"
    );
    let deadline = e.poll_timeout().unwrap();
    assert_eq!(deadline, 1_000 + 1_000_000_000);
    e.handle_timeout(deadline - 1);
    assert!(e.poll_action().is_none());
    e.handle_timeout(deadline);
    match e.poll_action() {
        Some(Action::Complete(c)) => {
            assert_eq!((c.request, c.status), (r, Status::ConnectionClosed))
        }
        other => panic!("{other:?}"),
    }
    // Late read completions are ignored.
    e.handle_read_complete(r, 0, true);
    assert!(e.poll_action().is_none());
    assert_eq!(e.pending_requests(), 0);
}

#[test]
fn peer_error_frame_and_send_failure_close() {
    let mut s = sim3(20);
    let mut h = Header::new(Opcode::Error);
    h.status = wire::WireStatus::Protocol;
    s.inject(1, 0, FrameBuf::encode(&h, None).as_bytes().to_vec());
    s.run();
    assert!(matches!(
        s.peers[0].closed.as_slice(),
        [(_, CloseReason::PeerError(wire::WireStatus::Protocol))]
    ));
    let sr = s.send(2, 0, 1, pattern(900, 1));
    s.peers[2].engine.handle_send_complete(conn(0), false);
    s.pump(2);
    assert_eq!(
        s.completion(2, sr).unwrap().status,
        Status::ConnectionClosed
    );
    assert!(matches!(
        s.peers[2].closed.as_slice(),
        [(_, CloseReason::SendFailed)]
    ));
}

#[test]
fn handshake_is_compact_and_validated() {
    let hs = Engine::new(Config::default()).local_handshake();
    let bytes = hs.encode();
    assert_eq!(bytes.len(), 14);
    assert!(bytes.len() <= wire::MAX_HANDSHAKE_LEN);
    assert_eq!(Handshake::decode(&bytes).unwrap(), hs);
    // rdmacm pads private data with zeros.
    let mut padded = bytes.clone();
    padded.resize(56, 0);
    assert_eq!(Handshake::decode(&padded).unwrap(), hs);
    assert!(Handshake::decode(&bytes[..13]).is_err());
    assert!(Handshake::decode(&[0u8; 57]).is_err());
    // An accept's private data is padded to 196 bytes; non-zero bytes there are refused.
    padded.resize(196, 0);
    assert_eq!(Handshake::decode(&padded).unwrap(), hs);
    padded[100] = 1;
    assert!(Handshake::decode(&padded).is_err());
    assert!(Handshake::decode(&[0u8; 300]).is_err());
    let mut bad = bytes.clone();
    bad[0] ^= 1;
    assert!(Handshake::decode(&bad).is_err());
    assert_eq!(hs.recv_buf_size, 8192);
    assert_eq!((hs.credits, hs.max_credits), (4, 64));
}

#[test]
fn a_send_now_goes_out_at_once_or_does_nothing() {
    let mut e = engine_with_conn1();
    let eager = e.conn_stats(ConnId(1)).unwrap().eager_limit;
    // Unknown connection, or a rendezvous-sized message: nothing happens.
    assert_eq!(e.tag_send_now(ConnId(2), 1, 8), None);
    assert_eq!(e.tag_send_now(ConnId(1), 1, eager + 1), None);
    assert!(e.poll_action().is_none());
    // Eager with credit to spare: the frame comes back, done as made, and no action follows.
    let (id, frame) = e.tag_send_now(ConnId(1), 7, 8).unwrap();
    assert!(id.is_immediate());
    assert!(e.poll_action().is_none());
    assert_eq!(e.pending_requests(), 0);
    let h = wire::decode_header(frame.as_bytes()).unwrap();
    assert_eq!((h.opcode, h.tag, h.payload_len), (Opcode::Eager, 7, 8));
    // The next is numbered after it, made by tag_send (its frame an action) ...
    let second = e.tag_send(ConnId(1), 7, UserBufId(42), 8).unwrap();
    assert!(second.is_immediate());
    // ... and while that action waits for the driver, a frame made now would overtake it:
    // not at once.
    assert_eq!(e.tag_send_now(ConnId(1), 7, 8), None);
    match e.poll_action() {
        Some(Action::SendFrame {
            conn,
            frame,
            payload: Some(p),
        }) => {
            assert_eq!((conn, p.buf, p.len), (ConnId(1), UserBufId(42), 8));
            assert_eq!(
                wire::decode_header(frame.as_bytes()).unwrap().seq,
                h.seq.wrapping_add(1)
            );
        }
        other => panic!("expected the send's frame, got {other:?}"),
    }
    assert!(e.poll_action().is_none());
    // Out of credit: no longer at once (tag_send queues it instead).
    while e.tag_send_now(ConnId(1), 7, 8).is_some() {}
    assert!(e.poll_action().is_none());
    let queued = e.tag_send(ConnId(1), 7, UserBufId(44), 8).unwrap();
    assert!(!queued.is_immediate());
}

/// Once a connection is gone (the one whose frame came last) and another has come up,
/// frames still arriving under the old id are dropped as from an unknown connection, never
/// charged to the new one, and the new one's own frames are its own (its sequence numbers
/// start again at 0). (Written for a connection table that remembered its last lookup and
/// reused slots, which a mistake there would break; kept for any table that does.)
#[test]
fn a_gone_connections_frames_never_reach_the_one_in_its_place() {
    let cfg = small_cfg();
    let peer = Engine::new(cfg.clone()).local_handshake();
    let mut e = Engine::new(cfg);
    e.handle_connection_up(ConnId(1), &peer).unwrap();
    e.handle_connection_up(ConnId(2), &peer).unwrap();
    while e.poll_action().is_some() {}
    let r1 = e.tag_recv(3, !0, UserBufId(1), 8);
    let d = e.handle_frame_delivering(ConnId(1), &eager_frame(0, 3, &[1]));
    assert_eq!(d.map(|d| (d.request, d.conn)), Some((r1, ConnId(1))));
    // Connection 1, the one a frame came on last, goes; connection 3 comes up.
    e.handle_connection_down(ConnId(1));
    while e.poll_action().is_some() {}
    e.handle_connection_up(ConnId(3), &peer).unwrap();
    while e.poll_action().is_some() {}
    let before = e.conn_stats(ConnId(3)).unwrap();
    let r = e.tag_recv(3, !0, UserBufId(2), 8);
    assert!(
        e.handle_frame_delivering(ConnId(1), &eager_frame(1, 3, &[2]))
            .is_none(),
        "a frame on the gone connection was delivered"
    );
    assert!(e.conn_stats(ConnId(1)).is_none());
    assert_eq!(
        e.conn_stats(ConnId(3)).unwrap(),
        before,
        "connection 3 was charged"
    );
    // Both remaining connections still find their own state, looked up in turn.
    for (seq, c) in [(0, 3), (0, 2), (1, 3), (1, 2)] {
        let d = e.handle_frame_delivering(ConnId(c), &eager_frame(seq, 3, &[c as u8]));
        assert_eq!(d.map(|d| d.conn), Some(ConnId(c)), "frame {seq} on {c}");
        if seq == 0 && c == 3 {
            assert_eq!(d.map(|d| d.request), Some(r));
        }
        let _ = e.tag_recv(3, !0, UserBufId(10 + seq as u64 * 4 + c), 8);
    }
}
