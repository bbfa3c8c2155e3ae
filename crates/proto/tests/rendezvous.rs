//! Scenario tests of the engine's rendezvous protocol on the simulated fabric: the RTS, the
//! receiver's chunked READs, the ATS, and what exposure, truncation and credits do to them.

mod common;

use common::*;
use rdmx_proto::wire::{self, FrameBuf, Header, Opcode};
use rdmx_proto::*;

#[test]
fn rendezvous_multi_chunk_pipelined() {
    let mut s = sim3(3);
    let (r, buf) = s.recv(2, 1, !0, 5000);
    let data = pattern(1234, 3);
    let sr = s.send(0, 2, 1, data.clone());
    assert!(
        s.completion(0, sr).is_none(),
        "rendezvous send waits for ATS"
    );
    s.run();
    assert_eq!(s.completion(0, sr).unwrap().status, Status::Ok);
    let c = s.completion(2, r).unwrap();
    assert_eq!((c.status, c.length, c.tag), (Status::Ok, 1234, 1));
    assert_eq!(s.data(2, buf, 1234), data);
    s.assert_srq_full();
}

#[test]
fn rendezvous_reads_are_chunked_and_bounded() {
    // Drive one engine by hand to observe the READ pipeline.
    let cfg = small_cfg();
    let mut e = Engine::new(cfg.clone());
    let peer = Engine::new(cfg).local_handshake();
    e.handle_connection_up(ConnId(5), &peer).unwrap();
    let r = e.tag_recv(3, !0, UserBufId(1), 1000);
    let mut h = Header::new(Opcode::Rts);
    h.tag = 3;
    h.sreq = 77;
    h.payload_len = wire::RTS_BODY_LEN as u32;
    let body = wire::RtsBody {
        addr: 1 << 40,
        rkey: 9,
        len: 950,
    };
    let f = FrameBuf::encode(&h, Some(&body));
    e.handle_frame(ConnId(5), RecvBufId(0), f.as_bytes());
    let mut reads = Vec::new();
    while let Some(a) = e.poll_action() {
        if let Action::RdmaRead {
            remote,
            len,
            dst_offset,
            ..
        } = a
        {
            assert_eq!(remote.addr, (1 << 40) + dst_offset);
            assert_eq!(remote.rkey, 9);
            reads.push((dst_offset, len));
        }
    }
    assert_eq!(
        reads,
        vec![(0, 100), (100, 100), (200, 100)],
        "3 in flight, 100-byte chunks"
    );
    // Complete out of order; each completion issues the next chunk.
    let mut all = reads.clone();
    let mut done = 0;
    let mut ats = None;
    let mut queue = reads;
    while let Some((off, _)) = queue.pop() {
        e.handle_read_complete(r, off, true);
        done += 1;
        while let Some(a) = e.poll_action() {
            match a {
                Action::RdmaRead {
                    len, dst_offset, ..
                } => {
                    queue.insert(0, (dst_offset, len));
                    all.push((dst_offset, len));
                }
                Action::SendFrame { frame, .. } if frame.header().opcode == Opcode::Ats => {
                    ats = Some(frame.header());
                }
                Action::Complete(c) => assert_eq!((c.status, c.length), (Status::Ok, 950)),
                _ => {}
            }
        }
        assert!(queue.len() <= 3);
    }
    assert_eq!(done, 10);
    all.sort();
    assert_eq!(all.last(), Some(&(900, 50)));
    assert_eq!(all.iter().map(|x| x.1).sum::<u64>(), 950);
    let ats = ats.expect("ATS sent");
    assert_eq!((ats.sreq, ats.status), (77, wire::WireStatus::Ok));
    assert_eq!(e.pending_requests(), 0);
}

#[test]
fn send_order_kept_while_exposure_pending() {
    let mut s = sim3(7);
    s.expose_immediately = false;
    let big = s.send(0, 1, 1, pattern(900, 1));
    let small = s.send(0, 1, 2, pattern(10, 2));
    s.run();
    // Nothing may overtake the RTS while its buffer is not yet exposed.
    assert_eq!(s.peers[1].engine.unexpected_len(), 0);
    assert!(s.completion(0, small).is_none());
    s.finish_exposures();
    s.run();
    let (r1, _) = s.recv(1, 0, 0, 1000);
    let (r2, _) = s.recv(1, 0, 0, 1000);
    s.run();
    assert_eq!(s.completion(1, r1).unwrap().tag, 1);
    assert_eq!(s.completion(1, r2).unwrap().tag, 2);
    assert_eq!(s.completion(0, big).unwrap().status, Status::Ok);
}

#[test]
fn rendezvous_truncation_fails_both_sides() {
    let mut s = sim3(10);
    let (r, buf) = s.recv(1, 0, 0, 500);
    let sr = s.send(0, 1, 3, pattern(1000, 10));
    s.run();
    let c = s.completion(1, r).unwrap();
    assert_eq!((c.status, c.length), (Status::Truncated, 1000));
    assert_eq!(s.data(1, buf, 500), vec![0xEE; 500]);
    assert_eq!(s.completion(0, sr).unwrap().status, Status::RemoteTruncated);
    assert_eq!(s.peers[0].engine.pending_requests(), 0);
}

#[test]
fn expose_failure_fails_send() {
    let mut s = sim3(21);
    s.expose_immediately = false;
    let sr = s.send(0, 1, 1, pattern(900, 1));
    let after = s.send(0, 1, 2, pattern(9, 1));
    s.peers[0].engine.handle_send_buffer_expose_failed(sr);
    s.pump(0);
    assert_eq!(s.completion(0, sr).unwrap().status, Status::ExposeFailed);
    assert_eq!(s.completion(0, after).unwrap().status, Status::Ok);
    s.pending_expose.clear();
    s.run();
    assert_eq!(s.peers[1].engine.unexpected_len(), 1);
}

/// A rendezvous receive completes only once its ATS has left: when the ATS must wait for
/// credits, so does the completion. A receiver that stopped progressing once its receive
/// completed would otherwise leave the ATS, and so the sender's request, waiting for ever
/// (seen over shared memory: the receiver's thread went on to a barrier, the sender's CREDIT
/// frame came after).
#[test]
fn a_rendezvous_receive_completes_once_its_ats_has_left() {
    let mut e = Engine::new(Config::default());
    let mut peer = e.local_handshake();
    peer.credits = 4;
    e.handle_connection_up(ConnId(1), &peer).unwrap();
    // Three messages spend 3 of the peer's 4 credits (a message leaves one, for control
    // frames) and a one-sided operation the last: the ATS will have to wait.
    for k in 0..3 {
        e.tag_send(ConnId(1), 9, UserBufId(100 + k), 8).unwrap();
    }
    let key = rdmx_proto::rma::PackedKey {
        key: rdmx_proto::rma::KeyRef {
            region: 0,
            generation: 0,
            secret: 1,
        },
        len: 64,
        access: rdmx_proto::rma::RemoteAccess::ALL,
        rdma: None,
    };
    let add = rdmx_proto::rma::AtomicOp::FetchAdd(1);
    e.rma_atomic(ConnId(1), &key, 0, add, UserBufId(99))
        .unwrap();
    while e.poll_action().is_some() {}
    assert_eq!(e.conn_stats(ConnId(1)).unwrap().tx_credits, 0);
    let len = 100_000u64;
    let r = e.tag_recv(3, !0, UserBufId(4), len);
    let mut h = Header::new(Opcode::Rts);
    h.tag = 3;
    h.sreq = 77;
    h.payload_len = wire::RTS_BODY_LEN as u32;
    let body = wire::RtsBody {
        addr: 0x1000,
        rkey: 5,
        len,
    };
    let rts = FrameBuf::encode(&h, Some(&body)).as_bytes().to_vec();
    e.handle_frame(ConnId(1), RecvBufId(0), &rts);
    let mut reads = Vec::new();
    while let Some(a) = e.poll_action() {
        if let Action::RdmaRead { dst_offset, .. } = a {
            reads.push(dst_offset);
        }
    }
    assert!(!reads.is_empty(), "the receive reads the data");
    for off in reads {
        e.handle_read_complete(r, off, true);
    }
    let actions: Vec<Action> = std::iter::from_fn(|| e.poll_action()).collect();
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Complete(_))),
        "completed while its ATS waits for credits: {actions:?}"
    );
    assert!(
        !e.cancel(r),
        "matched and read: not cancellable while its ATS waits"
    );
    // It stays pending until its completion is reported, and a new receive never takes
    // its id (drivers track requests by id).
    let pending = e.pending_requests();
    let next = e.tag_recv(4, !0, UserBufId(5), 8);
    assert_ne!(next, r, "the waiting receive's id was handed out again");
    assert_eq!(e.pending_requests(), pending + 1);
    assert!(e.cancel(next));
    while e.poll_action().is_some() {}
    // The peer grants credits: the ATS leaves, then the receive completes.
    let mut credit = Header::new(Opcode::Credit);
    credit.seq = 1;
    credit.credits = 4;
    e.handle_frame(
        ConnId(1),
        RecvBufId(1),
        FrameBuf::encode(&credit, None).as_bytes(),
    );
    let actions: Vec<Action> = std::iter::from_fn(|| e.poll_action()).collect();
    let ats = actions.iter().position(|a| {
        matches!(a, Action::SendFrame { frame, .. }
            if wire::decode_header(frame.as_bytes()).is_ok_and(|h| h.opcode == Opcode::Ats))
    });
    let done = actions.iter().position(|a| {
        matches!(a, Action::Complete(c) if c.request == r && c.status == Status::Ok && c.length == len)
    });
    assert!(
        matches!((ats, done), (Some(a), Some(d)) if a < d),
        "the ATS, then the completion: {actions:?}"
    );
}

/// A connection's own rendezvous chunk ([`ConnLimits::rndv_chunk`]: shared memory's larger
/// one) sizes the READs of the messages received on it; a connection given 0 reads in the
/// configuration's chunks.
#[test]
fn a_connection_reads_rendezvous_in_its_own_chunks() {
    let cfg = Config::builder()
        .rndv_chunk_size(4096)
        .eager_threshold(100)
        .build()
        .unwrap();
    let mut e = [Engine::new(cfg.clone()), Engine::new(cfg)];
    let limits = [
        ConnLimits {
            rndv_chunk: 0,
            verbs_rma: false,
            ..e[0].default_limits()
        },
        ConnLimits {
            rndv_chunk: 10_000,
            verbs_rma: false,
            ..e[1].default_limits()
        },
    ];
    let hs = [0, 1].map(|i| e[i].local_handshake_for(&limits[i]));
    e[0].handle_connection_up_with(ConnId(1), &hs[1], limits[0])
        .unwrap();
    e[1].handle_connection_up_with(ConnId(0), &hs[0], limits[1])
        .unwrap();
    let len = 50_000u64;
    for (from, to, chunk) in [(0usize, 1usize, 10_000u64), (1, 0, 4096)] {
        let r = e[to].tag_recv(7, !0, UserBufId(100), len);
        e[from]
            .tag_send(ConnId(to as u64), 7, UserBufId(200), len)
            .unwrap();
        let mut reads = Vec::new();
        // Frames go across until the receive is done; each READ is answered at once.
        let mut done = false;
        for _ in 0..100 {
            for side in [from, to] {
                let mut frames = Vec::new();
                while let Some(a) = e[side].poll_action() {
                    match a {
                        Action::ExposeSendBuffer { request, .. } => {
                            e[side].handle_send_buffer_exposed(
                                request,
                                RemoteBuf {
                                    addr: 0x10_000,
                                    rkey: 1,
                                },
                            );
                        }
                        Action::SendFrame { frame, payload, .. } => {
                            let mut b = frame.as_bytes().to_vec();
                            b.resize(b.len() + payload.map_or(0, |p| p.len as usize), 0);
                            frames.push(b);
                        }
                        Action::RdmaRead {
                            request,
                            len,
                            dst_offset,
                            ..
                        } => {
                            reads.push(len);
                            e[side].handle_read_complete(request, dst_offset, true);
                        }
                        Action::Complete(c) if c.request == r => {
                            assert_eq!((c.status, c.length), (Status::Ok, len));
                            done = true;
                        }
                        _ => {}
                    }
                }
                let peer = if side == from { to } else { from };
                for f in frames {
                    let _ = e[peer].handle_frame_delivering(ConnId(side as u64), &f);
                }
            }
        }
        assert!(done, "{from} -> {to}: the receive completed");
        let mut want = vec![chunk; (len / chunk) as usize];
        if len % chunk != 0 {
            want.push(len % chunk);
        }
        assert_eq!(
            reads, want,
            "{from} -> {to}: READs of the connection's chunk"
        );
    }
}

/// RTS frames of `n` messages of `len` bytes each (tags 0.., sender requests 1000..), for
/// an engine whose connection expects sequence numbers from `seq`.
fn rts_frames(seq: u32, n: u64, len: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|k| {
            let mut h = Header::new(Opcode::Rts);
            h.seq = seq + k as u32;
            h.tag = k;
            h.sreq = 1000 + k;
            h.payload_len = wire::RTS_BODY_LEN as u32;
            let body = wire::RtsBody {
                addr: k << 32,
                rkey: 9,
                len,
            };
            FrameBuf::encode(&h, Some(&body)).as_bytes().to_vec()
        })
        .collect()
}

/// The READs `e`'s actions issue, as (request, offset); other actions are dropped, and
/// completions collected.
fn drain_reads(e: &mut Engine, done: &mut Vec<Completion>) -> Vec<(RequestId, u64)> {
    let mut reads = Vec::new();
    while let Some(a) = e.poll_action() {
        match a {
            Action::RdmaRead {
                request,
                dst_offset,
                ..
            } => reads.push((request, dst_offset)),
            Action::Complete(c) => done.push(c),
            _ => {}
        }
    }
    reads
}

/// However many rendezvous receives one connection has matched, at most
/// `MAX_READS_PER_CONN` READs are in flight on it: the receives that find them all in
/// flight wait, in order, and every message is read and completes. (A sender answering
/// READs itself, over TCP, relies on the bound to tell a legitimate peer from one that
/// asks for more.)
#[test]
fn a_connection_keeps_a_bounded_number_of_reads_in_flight() {
    let mut e = Engine::new(Config::default());
    let mut peer = e.local_handshake();
    peer.credits = 64;
    e.handle_connection_up(ConnId(1), &peer).unwrap();
    let (n, len) = (40u64, 1u64 << 20);
    let recvs: Vec<RequestId> = (0..n)
        .map(|k| e.tag_recv(k, !0, UserBufId(100 + k), len))
        .collect();
    let mut done = Vec::new();
    let mut in_flight = Vec::new();
    for f in rts_frames(0, n, len) {
        e.handle_frame(ConnId(1), RecvBufId(0), &f);
        in_flight.extend(drain_reads(&mut e, &mut done));
    }
    // 4 READs of 256 KiB per message: the first 16 messages take the connection's 64.
    assert_eq!(in_flight.len(), MAX_READS_PER_CONN as usize);
    assert_eq!(
        e.conn_stats(ConnId(1)).unwrap().reads_in_flight,
        MAX_READS_PER_CONN
    );
    let started: std::collections::BTreeSet<RequestId> = in_flight.iter().map(|r| r.0).collect();
    assert_eq!(started, recvs[..16].iter().copied().collect());
    // Complete them oldest first: each completion issues one more, in order, never more
    // than the bound in flight.
    let mut issued = in_flight.len();
    while let Some((r, off)) = (!in_flight.is_empty()).then(|| in_flight.remove(0)) {
        e.handle_read_complete(r, off, true);
        let more = drain_reads(&mut e, &mut done);
        issued += more.len();
        in_flight.extend(more);
        assert!(in_flight.len() <= MAX_READS_PER_CONN as usize);
    }
    assert_eq!(issued as u64, n * 4);
    let mut completed: Vec<RequestId> = done
        .iter()
        .filter(|c| c.kind == RequestKind::Recv)
        .inspect(|c| assert_eq!((c.status, c.length), (Status::Ok, len)))
        .map(|c| c.request)
        .collect();
    completed.sort();
    let mut want = recvs.clone();
    want.sort();
    assert_eq!(completed, want, "every message read and completed");
    assert_eq!(e.conn_stats(ConnId(1)).unwrap().reads_in_flight, 0);
}

/// Receives waiting for their connection's READs fail with it when it goes down, as those
/// reading do once their READs are reported.
#[test]
fn receives_waiting_for_reads_fail_with_their_connection() {
    let mut e = Engine::new(Config::default());
    let mut peer = e.local_handshake();
    peer.credits = 64;
    e.handle_connection_up(ConnId(1), &peer).unwrap();
    let (n, len) = (20u64, 1u64 << 20);
    let recvs: Vec<RequestId> = (0..n)
        .map(|k| e.tag_recv(k, !0, UserBufId(100 + k), len))
        .collect();
    let mut done = Vec::new();
    let mut in_flight = Vec::new();
    for f in rts_frames(0, n, len) {
        e.handle_frame(ConnId(1), RecvBufId(0), &f);
        in_flight.extend(drain_reads(&mut e, &mut done));
    }
    assert_eq!(in_flight.len(), MAX_READS_PER_CONN as usize);
    e.handle_connection_down(ConnId(1));
    let _ = drain_reads(&mut e, &mut done);
    // The 4 waiting fail at once; the 16 reading once their READs are reported.
    assert_eq!(done.len(), 4);
    assert!(done.iter().all(|c| c.status == Status::ConnectionClosed));
    for (r, off) in in_flight {
        e.handle_read_complete(r, off, false);
    }
    assert!(
        drain_reads(&mut e, &mut done).is_empty(),
        "no READ after the end"
    );
    assert_eq!(done.len(), recvs.len());
    assert!(done.iter().all(|c| c.status == Status::ConnectionClosed));
    assert_eq!(e.pending_requests(), 0);
}
