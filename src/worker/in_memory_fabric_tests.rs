//! Random traffic among three workers fully connected in memory: sends of every size around
//! a small eager threshold (eager and rendezvous), receives with exact, masked and wildcard
//! tags, cancels, and progress steps of one worker at a time in a seeded order. Every
//! message is delivered exactly once, byte-exact, in per-connection order, and nothing is
//! left pending at quiesce — through the worker's real driver, executor and engine (what
//! `rdmx-proto`'s simulated fabric checks of the engine alone).

use proptest::prelude::*;

use super::*;
use crate::{Context, Ep, Request, Status};

const SIZES: [usize; 12] = [0, 1, 50, 199, 200, 201, 215, 216, 217, 500, 999, 1500];
const CAP: usize = 1600;
const USER_MASK: u64 = 0xFFFF_FFFF_0000_0000;
const SRC_MASK: u64 = 0x0000_0000_FF00_0000;

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

/// A message's tag: the user part, the sender, and the sender's sequence number.
fn msg_tag(user: u64, from: usize, idx: u64) -> u64 {
    (user << 32) | ((from as u64) << 24) | idx
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|k| (seed.wrapping_mul(31).wrapping_add(k as u64 * 7) % 251) as u8)
        .collect()
}

/// Three workers, each connected to the two others in memory, with small limits: frames of
/// at most 256 bytes, an eager threshold of 200, 8 credits per connection.
struct Fabric {
    workers: Vec<Worker>,
    /// `eps[i][j]`: worker `i`'s endpoint to worker `j`.
    eps: Vec<Vec<Option<Ep>>>,
    rng: u64,
}

impl Fabric {
    fn new(seed: u64) -> Fabric {
        let ctx = Context::builder()
            .env_lookup(|_| None)
            .transport(Transport::Tcp)
            .set("RDMX_RECV_BUF_SIZE", "256")
            .set("RDMX_EAGER_THRESHOLD", "200")
            .set("RDMX_SRQ_DEPTH", "16")
            .set("RDMX_CREDITS", "8")
            .build()
            .expect("context");
        let workers: Vec<Worker> = (0..3).map(|_| ctx.worker().expect("worker")).collect();
        let mut eps: Vec<Vec<Option<Ep>>> = (0..3).map(|_| vec![None, None, None]).collect();
        for i in 0..3 {
            for j in i + 1..3 {
                let (a, b, _cable) = workers[i].connect_in_memory(&workers[j]).expect("connect");
                eps[i][j] = Some(a);
                eps[j][i] = Some(b);
            }
        }
        Fabric {
            workers,
            eps,
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// One progress call of a worker chosen by the seeded generator.
    fn step(&mut self) {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.workers[(self.rng % 3) as usize].progress();
    }

    /// Steps every worker until `done` (a bounded number of steps, never a clock).
    fn run_until(&mut self, done: impl Fn() -> bool) {
        for _ in 0..200_000 {
            if done() {
                return;
            }
            for w in &self.workers {
                w.progress();
            }
        }
        panic!("the fabric made no progress");
    }
}

struct Sent {
    to: usize,
    tag: u64,
    data: Vec<u8>,
    req: Option<Request>,
}

struct Posted {
    at: usize,
    req: Option<Request>,
    tag: u64,
    mask: u64,
}

fn run_case(seed: u64, ops: Vec<Op>) {
    let mut f = Fabric::new(seed);
    let mut sent: Vec<Sent> = Vec::new();
    let mut next_idx = [0u64; 3];
    let mut recvs: Vec<Posted> = Vec::new();
    for op in ops {
        match op {
            Op::Send {
                from,
                to_off,
                user,
                size,
            } => {
                let to = (from + to_off) % 3;
                let tag = msg_tag(user, from, next_idx[from]);
                next_idx[from] += 1;
                let data = pattern(size, tag);
                let ep = f.eps[from][to].as_ref().expect("connected");
                let req = Some(ep.tag_send(tag, data.clone()));
                sent.push(Sent { to, tag, data, req });
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
                let req = Some(f.workers[at].tag_recv(tag, mask, vec![0; CAP]));
                recvs.push(Posted { at, req, tag, mask });
            }
            Op::Cancel { at, nth } => {
                let open: Vec<&Posted> = recvs
                    .iter()
                    .filter(|r| r.at == at && r.req.as_ref().is_some_and(|q| !q.is_done()))
                    .collect();
                if let Some(r) = open.get(nth % open.len().max(1)) {
                    r.req.as_ref().expect("open").cancel();
                }
            }
            Op::Step { n } => {
                for _ in 0..n {
                    f.step();
                }
            }
        }
    }
    // Quiesce: every send completes once its message is received; drain what nobody asked
    // for with wildcard receives, then cancel the receives nothing matched.
    loop {
        let all_sent = || {
            sent.iter()
                .all(|s| s.req.as_ref().is_some_and(Request::is_done))
        };
        for _ in 0..1000 {
            if all_sent() {
                break;
            }
            for w in &f.workers {
                w.progress();
            }
        }
        let mut posted = false;
        for at in 0..3 {
            while f.workers[at].probe(0, 0).is_some() {
                let req = f.workers[at].tag_recv(0, 0, vec![0; CAP]);
                f.run_until(|| req.is_done());
                recvs.push(Posted {
                    at,
                    req: Some(req),
                    tag: 0,
                    mask: 0,
                });
                posted = true;
            }
        }
        if !posted && all_sent() {
            break;
        }
    }
    for r in &recvs {
        let req = r.req.as_ref().expect("kept");
        if !req.is_done() {
            assert!(req.cancel(), "an unmatched receive must be cancellable");
        }
    }
    for w in &f.workers {
        w.progress();
        let stats = w.stats();
        assert_eq!(stats.pending_requests, 0, "requests left pending");
        assert_eq!(stats.unexpected_messages, 0);
    }
    // Every send succeeded.
    for s in &mut sent {
        let done = s.req.take().expect("kept").wait();
        assert!(done.is_ok(), "send {:#x} failed: {done:?}", s.tag);
    }
    // Exactly-once, byte-exact delivery, to the right worker, matching the receive's tag.
    let mut delivered = std::collections::HashMap::new();
    let mut matched = Vec::new();
    for (k, r) in recvs.iter_mut().enumerate() {
        let done = match r.req.take().expect("kept").wait() {
            Ok(done) => done,
            Err(e) if e.status() == Some(Status::Cancelled) => continue,
            Err(e) => panic!("receive failed: {e}"),
        };
        assert_eq!(
            done.tag & r.mask,
            r.tag & r.mask,
            "matched a non-matching message"
        );
        let m = sent
            .iter()
            .find(|m| m.tag == done.tag)
            .expect("a delivered message was sent");
        assert_eq!(m.to, r.at, "delivered to the wrong worker");
        assert_eq!(done.length, m.data.len());
        assert!(done.buf[..done.length] == m.data[..], "payload corrupted");
        assert!(delivered.insert(done.tag, k).is_none(), "delivered twice");
        matched.push((k, done.tag));
    }
    assert_eq!(delivered.len(), sent.len(), "a message was lost");
    // Ordering: of two receives at one worker that both accept two messages of one sender,
    // the earlier receive got the earlier message.
    for (i, &(ka, ta)) in matched.iter().enumerate() {
        for &(kb, tb) in &matched[i + 1..] {
            let (ra, rb) = (&recvs[ka], &recvs[kb]);
            if ra.at != rb.at || (ta & SRC_MASK) != (tb & SRC_MASK) {
                continue;
            }
            let accepts = |r: &Posted, t: u64| t & r.mask == r.tag & r.mask;
            if accepts(ra, tb) && accepts(rb, ta) {
                assert!(
                    (ta & 0xFF_FFFF) < (tb & 0xFF_FFFF),
                    "receive {ka} got {ta:#x} but the later receive {kb} got the earlier {tb:#x}"
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
