//! Engine cost per message on a simulated pair (not a timed test): `cargo bench -p rdmx-proto`
//! (criterion; `cargo bench -p rdmx-proto -- eager/expected` runs the cases whose name
//! matches). Each case's time per iteration is one message, both sides.
//!
//! Two engines exchange frames through in-memory queues. The driver work is minimal: frames
//! (header and eager payload) are copied into a reused buffer, while a receive's copy out of
//! a frame is not made and RDMA READs are completed at once without moving data,
//! so the figures are the protocol engine's own cost (matching, flow control, framing).

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};

use rdmx_proto::{Action, Config, ConnId, ConnLimits, Engine, RemoteBuf, Status, UserBufId};

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
                // As the worker does: an eager message for a posted receive is handed back.
                if let Some(d) = self.e[i].handle_frame_delivering(ConnId(1 - i as u64), &b) {
                    black_box(&b[d.payload()]);
                    assert_eq!(d.completion().status, Status::Ok);
                    self.done += 1;
                }
                self.pump(i);
                // The frame's buffer is free once its actions are executed.
                self.pool.push(b);
            }
        }
    }
}

/// Sends `msgs` messages of `len` bytes (the receive posted before the send arrives when
/// `expected`) on a fresh pair and returns the time they took, setup excluded.
fn run(len: u64, msgs: u64, expected: bool) -> Duration {
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
    let took = start.elapsed();
    assert_eq!(p.done, 2 * msgs, "every send and receive completed");
    took
}

fn engine(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(1))
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    let sizes = [
        ("eager", 0),
        ("eager", 64),
        ("eager", 1024),
        ("eager", 8152),
    ];
    let rndv = [
        ("rendezvous", 8153),
        ("rendezvous", 1 << 20),
        ("rendezvous", 16 << 20),
    ];
    for (kind, len) in sizes.into_iter().chain(rndv) {
        for expected in [true, false] {
            let m = if expected { "expected" } else { "unexpected" };
            g.bench_with_input(
                BenchmarkId::new(format!("{kind}/{m}"), len),
                &len,
                |b, &len| b.iter_custom(|msgs| run(len, msgs, expected)),
            );
        }
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    engine(&mut c);
    c.final_summary();
}
