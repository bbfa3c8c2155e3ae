//! One-sided operations over messages on the simulated fabric: puts, gets and atomic
//! operations executed by the target's engine through its driver's memory, flush and fence,
//! refusals, and failures.

// (Clients are numbered peers: their indexes are their names.)
#![allow(clippy::needless_range_loop)]

mod common;

use common::rma::*;
use common::*;
use rdmx_proto::rma::{AtomicOp, KeyRef, PackedKey, Refusal, RefusalKind, RemoteAccess, RmaOp};
use rdmx_proto::*;

#[test]
fn puts_and_gets_are_byte_exact_at_every_size_and_edge() {
    // 256-byte receive buffers: a put carries 192 bytes a frame, a get 216.
    let mut sim = sim3(1);
    let mem = with_memory(&mut sim);
    let key = mem[1].map(5000, RemoteAccess::ALL);
    for (n, (off, len)) in [
        (0, 0),
        (0, 1),
        (7, 1),
        (0, 192),
        (100, 193),
        (0, 4096),
        (4999, 1),
        (5000, 0),
        (0, 5000),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(len, n as u64);
        let p = put(&mut sim, 0, 1, &key, off, data.clone());
        sim.run();
        assert_eq!(status(&sim, 0, p), Status::Ok, "put of {len} at {off}");
        let c = sim.completion(0, p).unwrap();
        assert_eq!((c.kind, c.length), (RequestKind::Put, len as u64));
        assert_eq!(
            &mem[1].bytes(&key)[off as usize..off as usize + len],
            &data[..]
        );
        // Read back by peer 2, through its own connection.
        let (g, buf) = get(&mut sim, 2, 1, &key, off, len);
        sim.run();
        assert_eq!(status(&sim, 2, g), Status::Ok, "get of {len} at {off}");
        assert_eq!(sim.data(2, buf, len as u64), data);
    }
    // The bytes around each access were left alone: the last put covered everything.
    sim.assert_srq_full();
    assert_eq!(sim.peers[0].engine.pending_requests(), 0);
}

#[test]
fn fetch_and_add_from_four_clients_gives_the_exact_total() {
    let mut sim = Sim::star(small_cfg(), small_cfg(), 4, 2);
    let mem = with_memory(&mut sim);
    let key = mem[0].map(64, RemoteAccess::ATOMIC);
    const N: u64 = 10_000;
    let mut olds = Vec::new();
    // Each client keeps a window of operations outstanding, interleaved across clients.
    let mut reqs: Vec<Vec<RequestId>> = vec![Vec::new(); 5];
    for round in 0..N {
        for c in 1..=4 {
            reqs[c].push(atomic(&mut sim, c, 0, &key, 8, AtomicOp::FetchAdd(1)));
        }
        if round % 16 == 15 {
            sim.run();
        }
    }
    sim.run();
    for (c, rs) in reqs.iter().enumerate().skip(1) {
        for &r in rs {
            let done = sim.completion(c, r).expect("completed");
            assert_eq!(
                (done.status, done.kind, done.length),
                (Status::Ok, RequestKind::Atomic, 8)
            );
            olds.push(done.tag);
        }
    }
    assert_eq!(mem[0].word(&key, 8), 4 * N);
    // Every old value seen once: each add was applied exactly once, atomically.
    olds.sort_unstable();
    assert!(olds.iter().copied().eq(0..4 * N));
}

#[test]
fn compare_and_swap_as_a_lock_keeps_a_counter_exact() {
    // Word 0: the lock (0 free, else its holder); word 8: a counter updated by get and put
    // under the lock.
    let mut sim = Sim::star(small_cfg(), small_cfg(), 4, 3);
    let mem = with_memory(&mut sim);
    let key = mem[0].map(16, RemoteAccess::ALL);
    const ROUNDS: u32 = 200;
    #[derive(Clone, Copy)]
    enum St {
        Locking(RequestId),
        Reading(RequestId, UserBufId),
        Writing(RequestId),
        Unlocking(RequestId),
    }
    let mut done = [0u32; 5];
    let mut st: Vec<Option<St>> = vec![None; 5];
    for c in 1..=4 {
        st[c] = Some(St::Locking(atomic(
            &mut sim,
            c,
            0,
            &key,
            0,
            AtomicOp::CompareSwap {
                expected: 0,
                new: c as u64,
            },
        )));
    }
    let mut steps = 0u64;
    while done[1..].iter().any(|&d| d < ROUNDS) {
        steps += 1;
        assert!(steps < 10_000_000, "the lock never finishes");
        sim.step();
        for c in 1..=4 {
            let Some(s) = st[c] else { continue };
            let finished = |r: RequestId| sim.completion(c, r);
            st[c] = match s {
                St::Locking(r) => match finished(r) {
                    Some(d) if d.tag == 0 => {
                        let (g, b) = get(&mut sim, c, 0, &key, 8, 8);
                        Some(St::Reading(g, b))
                    }
                    Some(_) => Some(St::Locking(atomic(
                        &mut sim,
                        c,
                        0,
                        &key,
                        0,
                        AtomicOp::CompareSwap {
                            expected: 0,
                            new: c as u64,
                        },
                    ))),
                    None => Some(s),
                },
                St::Reading(r, b) => match finished(r) {
                    Some(_) => {
                        let v = u64::from_le_bytes(sim.data(c, b, 8).try_into().unwrap());
                        Some(St::Writing(put(
                            &mut sim,
                            c,
                            0,
                            &key,
                            8,
                            (v + 1).to_le_bytes().to_vec(),
                        )))
                    }
                    None => Some(s),
                },
                St::Writing(r) => match finished(r) {
                    Some(_) => {
                        // (In order behind the counter's put on the connection: no fence needed.)
                        Some(St::Unlocking(atomic(
                            &mut sim,
                            c,
                            0,
                            &key,
                            0,
                            AtomicOp::CompareSwap {
                                expected: c as u64,
                                new: 0,
                            },
                        )))
                    }
                    None => Some(s),
                },
                St::Unlocking(r) => match finished(r) {
                    Some(d) => {
                        assert_eq!(d.tag, c as u64, "client {c} held the lock");
                        done[c] += 1;
                        if done[c] < ROUNDS {
                            Some(St::Locking(atomic(
                                &mut sim,
                                c,
                                0,
                                &key,
                                0,
                                AtomicOp::CompareSwap {
                                    expected: 0,
                                    new: c as u64,
                                },
                            )))
                        } else {
                            None
                        }
                    }
                    None => Some(s),
                },
            };
        }
    }
    sim.run();
    assert_eq!(mem[0].word(&key, 8), 4 * u64::from(ROUNDS));
    assert_eq!(mem[0].word(&key, 0), 0);
}

#[test]
fn the_initiator_refuses_what_the_key_does_not_allow() {
    let mut sim = sim3(4);
    let mem = with_memory(&mut sim);
    let key = mem[1].map(100, RemoteAccess::READ);
    let buf = sim.alloc(0, vec![1; 8]);
    let e = &mut sim.peers[0].engine;
    assert_eq!(
        e.rma_put(conn(1), &key, 0, buf, 8),
        Err(Error::Refused(Refusal::NotPermitted {
            op: RmaOp::Put,
            granted: RemoteAccess::READ
        }))
    );
    assert!(matches!(
        e.rma_get(conn(1), &key, 96, buf, 8),
        Err(Error::Refused(Refusal::OutOfBounds { .. }))
    ));
    assert!(matches!(
        e.rma_atomic(conn(1), &key, 0, AtomicOp::FetchAdd(1), buf),
        Err(Error::Refused(Refusal::NotPermitted { .. }))
    ));
    assert_eq!(
        e.rma_get(ConnId(77), &key, 0, buf, 8),
        Err(Error::UnknownConnection(ConnId(77)))
    );
    // Nothing was sent.
    assert!(!e.has_actions());
    assert_eq!(sim.in_flight(0, 1), 0);
}

#[test]
fn the_target_refuses_bad_accesses_and_the_connection_stays_up() {
    let mut sim = sim3(5);
    let mem = with_memory(&mut sim);
    let key = mem[1].map(100, RemoteAccess::READ);
    let stale = mem[1].map(100, RemoteAccess::ALL);
    mem[1].unmap(&stale);
    // Keys that claim more than the region was mapped with: only the target can tell.
    let longer = PackedKey { len: 1000, ..key };
    let writable = PackedKey {
        access: RemoteAccess::ALL,
        len: 1000,
        ..key
    };
    let forged = PackedKey {
        key: KeyRef {
            secret: key.key.secret ^ 1,
            ..key.key
        },
        ..key
    };
    let cases = [
        (
            0,
            get(&mut sim, 0, 1, &longer, 96, 8).0,
            RefusalKind::OutOfBounds,
        ),
        // (Of several frames: each refused.)
        (
            0,
            put(&mut sim, 0, 1, &writable, 0, vec![9; 300]),
            RefusalKind::NotPermitted,
        ),
        (
            0,
            atomic(&mut sim, 0, 1, &writable, 0, AtomicOp::FetchAdd(1)),
            RefusalKind::NotPermitted,
        ),
        // (A stale key is refused as a forged one is: see one_sided_bounds.rs.)
        (0, get(&mut sim, 0, 1, &stale, 0, 8).0, RefusalKind::BadKey),
        (0, get(&mut sim, 0, 1, &forged, 0, 8).0, RefusalKind::BadKey),
        // Peer 1's key sent to peer 0, whose regions do not include it.
        (1, get(&mut sim, 1, 0, &key, 0, 8).0, RefusalKind::BadKey),
    ];
    sim.run();
    for (i, r, kind) in cases {
        assert_eq!(status(&sim, i, r), Status::Refused(kind), "{kind:?}");
    }
    // Nothing was written, and both connections still carry messages.
    assert_eq!(mem[1].bytes(&key), vec![0; 100]);
    let (rr, _) = sim.recv(1, 5, u64::MAX, 16);
    sim.send(0, 1, 5, vec![1, 2, 3]);
    sim.run();
    assert_eq!(status(&sim, 1, rr), Status::Ok);
    assert!(sim.peers.iter().all(|p| p.closed.is_empty()));
}

#[test]
fn an_engine_without_memory_refuses_every_access() {
    let mut sim = sim3(6);
    let key = unmapped_key();
    let p = put(&mut sim, 0, 1, &key, 0, vec![1; 8]);
    let a = atomic(&mut sim, 0, 1, &key, 0, AtomicOp::FetchAdd(1));
    sim.run();
    assert_eq!(status(&sim, 0, p), Status::Refused(RefusalKind::BadKey));
    assert_eq!(status(&sim, 0, a), Status::Refused(RefusalKind::BadKey));
}

#[test]
fn flush_completes_after_every_earlier_operation() {
    let mut sim = sim3(7);
    let mem = with_memory(&mut sim);
    let key = mem[1].map(4096, RemoteAccess::ALL);
    let p = put(&mut sim, 0, 1, &key, 0, pattern(4096, 9));
    let a = atomic(&mut sim, 0, 1, &key, 8, AtomicOp::FetchAdd(5));
    let f = flush(&mut sim, 0, 1);
    // Nothing came back yet: the flush waits.
    assert!(sim.completion(0, f).is_none());
    sim.run();
    let order = &sim.peers[0].completion_order;
    let pos = |r| order.iter().position(|&x| x == r).unwrap();
    assert!(pos(p) < pos(f) && pos(a) < pos(f), "{order:?}");
    assert_eq!(sim.completion(0, f).unwrap().kind, RequestKind::Flush);
    // What the flush covers is at the target.
    let mut want = pattern(4096, 9);
    let w = u64::from_le_bytes(want[8..16].try_into().unwrap()) + 5;
    want[8..16].copy_from_slice(&w.to_le_bytes());
    assert_eq!(mem[1].bytes(&key), want);
    // A flush with nothing before it completes at once.
    let f = flush(&mut sim, 0, 1);
    assert_eq!(status(&sim, 0, f), Status::Ok);
}

#[test]
fn a_worker_flush_waits_for_every_connection_s_operations() {
    let mut sim = sim3(17);
    let mem = with_memory(&mut sim);
    let k1 = mem[1].map(4096, RemoteAccess::ALL);
    let k2 = mem[2].map(4096, RemoteAccess::ALL);
    let p1 = put(&mut sim, 0, 1, &k1, 0, pattern(4096, 1));
    let p2 = put(&mut sim, 0, 2, &k2, 100, pattern(1000, 2));
    let a2 = atomic(&mut sim, 0, 2, &k2, 0, AtomicOp::FetchAdd(3));
    let f = flush_all(&mut sim, 0);
    // An operation made after the flush is not waited for.
    let later = atomic(&mut sim, 0, 1, &k1, 8, AtomicOp::FetchAdd(1));
    assert!(sim.completion(0, f).is_none());
    assert!(!sim.cancel(0, f), "a worker flush cannot be withdrawn");
    sim.run();
    let order = &sim.peers[0].completion_order;
    let pos = |r| order.iter().position(|&x| x == r).unwrap();
    assert!(
        pos(p1) < pos(f) && pos(p2) < pos(f) && pos(a2) < pos(f),
        "{order:?}"
    );
    let done = sim.completion(0, f).unwrap();
    assert_eq!(
        (done.kind, done.status, done.conn),
        (RequestKind::Flush, Status::Ok, None)
    );
    assert_eq!(status(&sim, 0, later), Status::Ok);
    assert_eq!(mem[1].bytes(&k1)[..8], pattern(4096, 1)[..8]);
    assert_eq!(mem[2].bytes(&k2)[100..1100], pattern(1000, 2)[..]);
    // With nothing outstanding it completes at once.
    let f = flush_all(&mut sim, 0);
    assert_eq!(status(&sim, 0, f), Status::Ok);
    // An operation whose connection fails counts as completed: the flush is not stuck.
    let p = put(&mut sim, 0, 1, &k1, 0, pattern(64, 3));
    let f = flush_all(&mut sim, 0);
    sim.kill(0, 1);
    assert_eq!(status(&sim, 0, p), Status::ConnectionClosed);
    assert_eq!(status(&sim, 0, f), Status::Ok);
    assert_eq!(sim.peers[0].engine.pending_requests(), 0);
}

#[test]
fn a_fenced_operation_waits_for_the_earlier_ones() {
    let mut sim = sim3(8);
    let mem = with_memory(&mut sim);
    let key = mem[1].map(64, RemoteAccess::ALL);
    mem[1].set(&key, &[0; 64]);
    let a = atomic(&mut sim, 0, 1, &key, 0, AtomicOp::FetchAdd(1));
    sim.peers[0].engine.rma_fence(conn(1)).unwrap();
    let b = atomic(&mut sim, 0, 1, &key, 0, AtomicOp::FetchAdd(1));
    // Only the first is on the wire.
    assert_eq!(sim.in_flight(0, 1), 1);
    sim.run();
    assert_eq!(sim.completion(0, a).unwrap().tag, 0);
    assert_eq!(sim.completion(0, b).unwrap().tag, 1);
    // Without a fence both go at once.
    let _ = atomic(&mut sim, 0, 1, &key, 0, AtomicOp::FetchAdd(1));
    let _ = atomic(&mut sim, 0, 1, &key, 0, AtomicOp::FetchAdd(1));
    assert_eq!(sim.in_flight(0, 1), 2);
    sim.run();
    assert_eq!(mem[1].word(&key, 0), 4);
}

#[test]
fn operations_fail_with_their_connection_and_queued_ones_cancel() {
    let mut sim = sim3(9);
    let mem = with_memory(&mut sim);
    let key = mem[1].map(100_000, RemoteAccess::ALL);
    // A put of many frames, more than the credits let out at once, then a get behind it.
    let p = put(&mut sim, 0, 1, &key, 0, pattern(100_000, 1));
    let (g, _) = get(&mut sim, 0, 1, &key, 0, 10);
    let (g2, _) = get(&mut sim, 0, 1, &key, 0, 10);
    // The put's first frame went out: too late to cancel it; the gets wait behind it.
    assert!(!sim.cancel(0, p));
    assert!(sim.cancel(0, g2));
    assert_eq!(status(&sim, 0, g2), Status::Cancelled);
    sim.step();
    sim.kill(0, 1);
    assert_eq!(status(&sim, 0, p), Status::ConnectionClosed);
    assert_eq!(status(&sim, 0, g), Status::ConnectionClosed);
    assert_eq!(sim.completion(0, g).unwrap().kind, RequestKind::Get);
    assert_eq!(sim.peers[0].engine.pending_requests(), 0);
}

#[test]
fn replies_nobody_asked_for_close_the_connection() {
    for case in 0..3 {
        let mut sim = sim3(10 + case);
        let _mem = with_memory(&mut sim);
        let mut h = wire::Header::new(wire::Opcode::RmaReply);
        let mut body = Vec::new();
        match case {
            // A reply to a request that does not exist.
            0 => h.sreq = 12345,
            // A refusal with bytes.
            1 => {
                h.status = wire::WireStatus::BadKey;
                body = vec![1, 2, 3];
            }
            // A refusal status on an ATS.
            _ => {
                h = wire::Header::new(wire::Opcode::Ats);
                h.status = wire::WireStatus::StaleKey;
            }
        }
        h.payload_len = body.len() as u32;
        let mut frame = wire::FrameBuf::encode(&h, None).as_bytes().to_vec();
        frame.extend_from_slice(&body);
        sim.inject(1, 0, frame);
        sim.run();
        assert!(
            matches!(sim.peers[0].closed.as_slice(), [(c, CloseReason::ProtocolError(_))] if *c == conn(1)),
            "case {case}: {:?}",
            sim.peers[0].closed
        );
        // The other connection is untouched.
        let (r, _) = sim.recv(0, 1, u64::MAX, 8);
        sim.send(2, 0, 1, vec![7]);
        sim.run();
        assert_eq!(status(&sim, 0, r), Status::Ok);
    }
}

#[test]
fn a_get_larger_than_a_reply_is_a_protocol_error_at_the_target() {
    let mut sim = sim3(20);
    let mem = with_memory(&mut sim);
    let key = mem[1].map(4096, RemoteAccess::READ);
    let mut h = wire::Header::new(wire::Opcode::Get);
    h.payload_len = wire::RmaBody::LEN as u32;
    let frame = wire::FrameBuf::encode_rma(
        &h,
        &wire::RmaBody {
            key: key.key,
            word: 4000,
        },
    );
    sim.inject(0, 1, frame.as_bytes().to_vec());
    sim.run();
    assert!(matches!(
        sim.peers[1].closed.as_slice(),
        [(c, CloseReason::ProtocolError(e))] if *c == conn(0) && e.contains("more than")
    ));
}

#[test]
fn a_peer_whose_buffers_hold_no_put_bytes_gets_no_put() {
    let mut e = Engine::new(Config::default());
    let mut hs = e.local_handshake();
    // The smallest buffers a peer may announce: a header and a 24-byte body, no more.
    hs.recv_buf_size = wire::MAX_CTRL_FRAME as u32;
    e.handle_connection_up(ConnId(1), &hs).unwrap();
    let key = unmapped_key();
    let err = e
        .rma_put(ConnId(1), &key, 0, UserBufId(1), 1)
        .expect_err("no room");
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("64-byte receive buffers"), "{err}");
    // An empty put, a get (its replies come into this side's buffers) and atomics still go.
    assert!(e.rma_put(ConnId(1), &key, 0, UserBufId(1), 0).is_ok());
    assert!(e.rma_get(ConnId(1), &key, 0, UserBufId(2), 8).is_ok());
    assert!(e
        .rma_atomic(ConnId(1), &key, 0, AtomicOp::FetchAdd(1), UserBufId(3))
        .is_ok());
}
