//! Random sequences of sends, receives, cancels and deliveries on a 3-peer fabric:
//! every message is delivered exactly once, byte-exact, in per-connection order, and no
//! request is left pending at quiesce.

mod common;

use common::*;
use proptest::prelude::*;
use rdmx_proto::*;

const SIZES: [usize; 12] = [0, 1, 50, 199, 200, 201, 215, 216, 217, 500, 999, 1500];
const CAP: usize = 1600;

#[derive(Debug, Clone)]
enum Op {
    Send {
        from: usize,
        to_off: usize,
        user: u64,
        size: usize,
    },
    Recv {
        at: usize,
        mode: u8,
        user: u64,
        src: usize,
    },
    Cancel {
        at: usize,
        nth: usize,
    },
    Step {
        n: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 1..3usize, 0..3u64, prop_oneof![
            proptest::sample::select(SIZES.to_vec()),
            0..1500usize
        ])
            .prop_map(|(from, to_off, user, size)| Op::Send { from, to_off, user, size }),
        3 => (0..3usize, 0..4u8, 0..3u64, 0..3usize)
            .prop_map(|(at, mode, user, src)| Op::Recv { at, mode, user, src }),
        1 => (0..3usize, 0..8usize).prop_map(|(at, nth)| Op::Cancel { at, nth }),
        2 => (0..30usize).prop_map(|n| Op::Step { n }),
    ]
}

const USER_MASK: u64 = 0xFFFF_FFFF_0000_0000;
const SRC_MASK: u64 = 0x0000_0000_FF00_0000;

fn msg_tag(user: u64, from: usize, idx: u64) -> u64 {
    (user << 32) | ((from as u64) << 24) | idx
}

struct PostedRecv {
    at: usize,
    req: RequestId,
    buf: UserBufId,
    tag: u64,
    mask: u64,
}

fn run_case(seed: u64, ops: Vec<Op>) {
    let mut s = Sim::uniform(3, small_cfg(), seed);
    // (from, to, idx) -> (tag, data, request)
    let mut sent: Vec<(usize, usize, u64, u64, Vec<u8>, RequestId)> = Vec::new();
    let mut next_idx = [0u64; 3];
    let mut recvs: Vec<PostedRecv> = Vec::new();
    for op in ops {
        match op {
            Op::Send {
                from,
                to_off,
                user,
                size,
            } => {
                let to = (from + to_off) % 3;
                let idx = next_idx[from];
                next_idx[from] += 1;
                let tag = msg_tag(user, from, idx);
                let data = pattern(size, tag);
                let r = s.send(from, to, tag, data.clone());
                sent.push((from, to, idx, tag, data, r));
            }
            Op::Recv {
                at,
                mode,
                user,
                src,
            } => {
                let (tag, mask) = match mode {
                    0 => (0, 0),
                    1 => (user << 32, USER_MASK),
                    2 => ((src as u64) << 24, SRC_MASK),
                    _ => ((user << 32) | ((src as u64) << 24), USER_MASK | SRC_MASK),
                };
                let (req, buf) = s.recv(at, tag, mask, CAP);
                recvs.push(PostedRecv {
                    at,
                    req,
                    buf,
                    tag,
                    mask,
                });
            }
            Op::Cancel { at, nth } => {
                let open: Vec<RequestId> = recvs
                    .iter()
                    .filter(|r| r.at == at && s.completion(at, r.req).is_none())
                    .map(|r| r.req)
                    .collect();
                if let Some(&r) = open.get(nth % open.len().max(1)) {
                    if s.cancel(at, r) {
                        assert_eq!(s.completion(at, r).unwrap().status, Status::Cancelled);
                    }
                }
            }
            Op::Step { n } => {
                for _ in 0..n {
                    s.step();
                }
            }
        }
    }
    s.run();
    // Quiesce: drain every unexpected message with wildcard receives, then cancel leftovers.
    for at in 0..3 {
        while s.peers[at].engine.unexpected_len() > 0 {
            let (req, buf) = s.recv(at, 0, 0, CAP);
            recvs.push(PostedRecv {
                at,
                req,
                buf,
                tag: 0,
                mask: 0,
            });
            s.run();
        }
    }
    s.run();
    for r in &recvs {
        if s.completion(r.at, r.req).is_none() {
            assert!(
                s.cancel(r.at, r.req),
                "unmatched receive must be cancellable"
            );
        }
    }
    // No request pending, SRQs whole, never an RNR.
    for (i, p) in s.peers.iter().enumerate() {
        assert_eq!(
            p.engine.pending_requests(),
            0,
            "peer {i} has pending requests"
        );
        assert_eq!(p.engine.unexpected_len(), 0);
    }
    s.assert_srq_full();
    assert_eq!(s.rnr_stalls, 0);
    // Every send succeeded.
    for (_, _, _, _, _, r) in &sent {
        let from = sent.iter().find(|x| x.5 == *r).unwrap().0;
        assert_eq!(s.completion(from, *r).unwrap().status, Status::Ok);
    }
    // Exactly-once, byte-exact delivery.
    let mut delivered = std::collections::HashMap::new();
    for (k, r) in recvs.iter().enumerate() {
        let c = s.completion(r.at, r.req).unwrap();
        match c.status {
            Status::Cancelled => continue,
            Status::Ok => {}
            other => panic!("receive failed: {other:?}"),
        }
        assert_eq!(
            c.tag & r.mask,
            r.tag & r.mask,
            "matched a non-matching message"
        );
        let m = sent
            .iter()
            .find(|m| m.3 == c.tag)
            .expect("delivered message was sent");
        assert_eq!(m.1, r.at, "delivered to the wrong peer");
        assert_eq!(c.conn, Some(conn(m.0)));
        assert_eq!(c.length, m.4.len() as u64);
        assert_eq!(s.data(r.at, r.buf, c.length), m.4, "payload corrupted");
        assert!(delivered.insert(c.tag, k).is_none(), "delivered twice");
    }
    assert_eq!(delivered.len(), sent.len(), "some message was lost");
    // Ordering: for receives ra before rb at one peer with messages ma, mb of one sender,
    // when both receives accept both messages, ma was sent before mb.
    let matched: Vec<(usize, u64, u64)> = recvs
        .iter()
        .enumerate()
        .filter_map(|(k, r)| {
            let c = s.completion(r.at, r.req).unwrap();
            (c.status == Status::Ok).then(|| (k, c.tag, c.conn.unwrap().0))
        })
        .collect();
    for (i, &(ka, ta, ca)) in matched.iter().enumerate() {
        for &(kb, tb, cb) in &matched[i + 1..] {
            let (ra, rb) = (&recvs[ka], &recvs[kb]);
            if ra.at != rb.at || ca != cb {
                continue;
            }
            let acc = |r: &PostedRecv, t: u64| t & r.mask == r.tag & r.mask;
            if acc(ra, tb) && acc(rb, ta) {
                assert!(
                    (ta & 0xFF_FFFF) < (tb & 0xFF_FFFF),
                    "receive {ka} got message {ta:#x} but later receive {kb} got earlier {tb:#x}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_traffic_is_delivered_exactly_once(
        seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        run_case(seed, ops);
    }
}

#[test]
fn long_deterministic_run() {
    let mut ops = Vec::new();
    let mut x = 12345u64;
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ops.push(match x % 10 {
            0..=3 => Op::Send {
                from: (x >> 8) as usize % 3,
                to_off: 1 + (x >> 12) as usize % 2,
                user: (x >> 16) % 3,
                size: SIZES[(x >> 20) as usize % SIZES.len()],
            },
            4..=6 => Op::Recv {
                at: (x >> 8) as usize % 3,
                mode: (x >> 12) as u8 % 4,
                user: (x >> 16) % 3,
                src: (x >> 20) as usize % 3,
            },
            7 => Op::Cancel {
                at: (x >> 8) as usize % 3,
                nth: (x >> 12) as usize % 8,
            },
            _ => Op::Step {
                n: (x >> 8) as usize % 40,
            },
        });
    }
    run_case(7, ops);
}
