//! Engine cost per message on a simulated pair (not a timed test): `cargo bench -p rdmx-proto`.
//!
//! Two engines exchange frames through in-memory queues. The driver work is minimal: frames
//! (header and eager payload) are copied into a reused buffer, while a receive's copy out of
//! a frame is not made and RDMA READs are completed at once without moving data,
//! so the figures are the protocol engine's own cost (matching, flow control, framing).

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Instant;

use rdmx_proto::{
    Action, Config, ConnId, ConnLimits, Engine, RecvBufId, RemoteBuf, Status, UserBufId,
};

struct Pair {
    e: [Engine; 2],
    wires: [VecDeque<Vec<u8>>; 2],
    pool: Vec<Vec<u8>>,
    payload: Vec<u8>,
    done: u64,
}

impl Pair {
    fn new() -> Pair {
        let cfg = Config::default();
        let mut e = [Engine::new(cfg.clone()), Engine::new(cfg)];
        // Each side grants what its credit pool offers a new connection, as rdmx's worker
        // does (32 credits for a worker's first connection with the defaults).
        let limits = e.each_ref().map(|e| ConnLimits {
            credits: e.credit_offer(),
            ..e.default_limits()
        });
        let hs = [0, 1].map(|i| e[i].local_handshake_for(&limits[i]));
        e[0].handle_connection_up_with(ConnId(1), &hs[1], limits[0])
            .unwrap();
        e[1].handle_connection_up_with(ConnId(0), &hs[0], limits[1])
            .unwrap();
        Pair {
            e,
            wires: [VecDeque::new(), VecDeque::new()],
            pool: Vec::new(),
            payload: vec![0xA5; 8192],
            done: 0,
        }
    }

    fn pump(&mut self, i: usize) {
        while let Some(a) = self.e[i].poll_action() {
            match a {
                Action::SendFrame { frame, payload, .. } => {
                    let mut b = self.pool.pop().unwrap_or_default();
                    b.clear();
                    b.extend_from_slice(frame.as_bytes());
                    if let Some(p) = payload {
                        b.extend_from_slice(&self.payload[..p.len as usize]);
                    }
                    self.wires[1 - i].push_back(b);
                }
                Action::ExposeSendBuffer { request, .. } => self.e[i].handle_send_buffer_exposed(
                    request,
                    RemoteBuf {
                        addr: 0x1000,
                        rkey: 1,
                    },
                ),
                Action::RdmaRead {
                    request,
                    dst_offset,
                    ..
                } => self.e[i].handle_read_complete(request, dst_offset, true),
                Action::Complete(c) => {
                    assert_eq!(c.status, Status::Ok);
                    self.done += 1;
                }
                // Eager data is not moved (like READ data); buffers need no bookkeeping here.
                Action::CopyFromRecvBuf { len, .. } => {
                    black_box(len);
                }
                Action::CopyToUser { data, .. } => {
                    black_box(&data);
                    self.e[i].recycle_payload(data);
                }
                Action::ReleaseSendBuffer { .. } => {}
                other => panic!("unexpected action in a clean exchange: {other:?}"),
            }
        }
    }

    fn deliver(&mut self) {
        for i in 0..2 {
            while let Some(b) = self.wires[i].pop_front() {
                self.e[i].handle_frame(ConnId(1 - i as u64), RecvBufId(0), &b);
                self.pump(i);
                // The frame's buffer is free once its actions are executed.
                self.pool.push(b);
            }
        }
    }
}

fn run(len: u64, msgs: u64, expected: bool) -> f64 {
    let mut p = Pair::new();
    let start = Instant::now();
    for k in 0..msgs {
        if expected {
            p.e[1].tag_recv(k, !0, UserBufId(2), len);
            p.pump(1);
        }
        let sent = p.e[0].tag_send(ConnId(1), k, UserBufId(1), len).unwrap();
        p.pump(0);
        if sent.is_immediate() {
            // Completed as it was made: the driver's to complete.
            p.done += 1;
        }
        if !expected {
            p.deliver();
            p.e[1].tag_recv(k, !0, UserBufId(2), len);
            p.pump(1);
        }
        p.deliver();
        p.deliver();
    }
    let ns = start.elapsed().as_nanos() as f64 / msgs as f64;
    assert_eq!(p.done, 2 * msgs, "every send and receive completed");
    ns
}

fn main() {
    // `cargo bench -p rdmx-proto -- WORD...` runs only the cases whose name ("kind matching
    // size", e.g. `eager expected 0`) contains one of the words; cargo's own flags are ignored.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    println!("rdmx-proto engine cost (simulated pair, both sides, no data movement for READs)");
    println!(
        "{:<12} {:<11} {:>10} {:>10} {:>14}",
        "kind", "matching", "size", "messages", "ns/message"
    );
    let cases: [(&str, u64, u64); 7] = [
        ("eager", 0, 200_000),
        ("eager", 64, 200_000),
        ("eager", 1024, 200_000),
        ("eager", 8152, 100_000),
        ("rendezvous", 8153, 100_000),
        ("rendezvous", 1 << 20, 50_000),
        ("rendezvous", 16 << 20, 10_000),
    ];
    for (kind, len, msgs) in cases {
        for expected in [true, false] {
            let m = if expected { "expected" } else { "unexpected" };
            let name = format!("{kind} {m} {len}");
            if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
                continue;
            }
            let ns = run(len, msgs, expected);
            println!("{kind:<12} {m:<11} {len:>10} {msgs:>10} {ns:>14.1}");
        }
    }
}
