//! A simulated RDMA fabric driving several engines: per-peer bounded SRQ, an in-memory
//! model of registered memory (RDMA READs really copy bytes), RC ordering per connection
//! and arbitrary interleaving across connections.
#![allow(dead_code)]

pub mod rma;

use std::collections::{BTreeMap, HashMap, VecDeque};

use rdmx_proto::*;

/// One peer: an engine plus its memory.
pub struct Peer {
    pub engine: Engine,
    pub mem: HashMap<UserBufId, Vec<u8>>,
    pub srq_free: Vec<RecvBufId>,
    pub srq_depth: usize,
    recv_bufs: HashMap<RecvBufId, Vec<u8>>,
    pub completions: BTreeMap<RequestId, Completion>,
    pub completion_order: Vec<RequestId>,
    /// The buffer each request was made with, which its completion must name.
    made_with: HashMap<RequestId, UserBufId>,
    pub closed: Vec<(ConnId, CloseReason)>,
    next_buf: u64,
    /// request -> exposed region base
    exposed: HashMap<RequestId, u64>,
}

struct ReadOp {
    conn: ConnId,
    request: RequestId,
    remote: RemoteBuf,
    len: u64,
    dst: UserBufId,
    dst_offset: u64,
}

struct Region {
    peer: usize,
    buf: UserBufId,
    len: u64,
    rkey: u32,
}

/// The fabric.
pub struct Sim {
    pub peers: Vec<Peer>,
    links: BTreeMap<(usize, usize), VecDeque<Vec<u8>>>,
    alive: BTreeMap<(usize, usize), bool>,
    /// Links whose frames are held for the test ([`Sim::capture`]), never delivered.
    captured: std::collections::BTreeSet<(usize, usize)>,
    reads: BTreeMap<(usize, usize), VecDeque<ReadOp>>,
    regions: BTreeMap<u64, Region>,
    rng: u64,
    next_addr: u64,
    /// Number of times a frame was ready but the receiver had no SRQ buffer posted.
    pub rnr_stalls: u64,
    /// Frames delivered.
    pub frames_delivered: u64,
    /// Deliveries pending: manual mode when false (tests step explicitly).
    pub expose_immediately: bool,
    pub pending_expose: Vec<(usize, RequestId)>,
}

pub fn conn(j: usize) -> ConnId {
    ConnId(j as u64)
}

impl Sim {
    /// `n` peers with the given configs, fully connected.
    pub fn new(cfgs: Vec<Config>, seed: u64) -> Sim {
        let n = cfgs.len();
        let pairs = (0..n).flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)));
        Sim::with_links(cfgs, pairs.collect(), seed)
    }

    /// A hub (peer 0, with `hub`) connected to `leaves` peers (with `leaf`), which are not
    /// connected to each other: one worker with many endpoints.
    pub fn star(hub: Config, leaf: Config, leaves: usize, seed: u64) -> Sim {
        let mut cfgs = vec![hub];
        cfgs.extend(std::iter::repeat(leaf).take(leaves));
        let pairs = (1..=leaves).flat_map(|j| [(0, j), (j, 0)]);
        Sim::with_links(cfgs, pairs.collect(), seed)
    }

    /// Peers with the given configs, connected along `pairs` (each pair in both orders).
    fn with_links(cfgs: Vec<Config>, pairs: Vec<(usize, usize)>, seed: u64) -> Sim {
        let peers: Vec<Peer> = cfgs
            .into_iter()
            .map(|cfg| {
                let depth = cfg.srq_depth as usize;
                Peer {
                    engine: Engine::new(cfg),
                    mem: HashMap::new(),
                    srq_free: (0..depth as u64).map(RecvBufId).collect(),
                    srq_depth: depth,
                    recv_bufs: HashMap::new(),
                    completions: BTreeMap::new(),
                    completion_order: Vec::new(),
                    made_with: HashMap::new(),
                    closed: Vec::new(),
                    next_buf: 1,
                    exposed: HashMap::new(),
                }
            })
            .collect();
        let mut sim = Sim {
            peers,
            links: BTreeMap::new(),
            alive: BTreeMap::new(),
            captured: Default::default(),
            reads: BTreeMap::new(),
            regions: BTreeMap::new(),
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            next_addr: 1 << 32,
            rnr_stalls: 0,
            frames_delivered: 0,
            expose_immediately: true,
            pending_expose: Vec::new(),
        };
        for (i, j) in pairs {
            // Handshakes travel through encode/decode, as in rdmacm private data.
            let bytes = sim.peers[j].engine.local_handshake().encode();
            assert!(bytes.len() <= 56);
            let hs = Handshake::decode(&bytes).unwrap();
            sim.peers[i]
                .engine
                .handle_connection_up(conn(j), &hs)
                .unwrap();
            sim.links.insert((i, j), VecDeque::new());
            sim.alive.insert((i, j), true);
            sim.reads.insert((i, j), VecDeque::new());
        }
        sim
    }

    /// `n` peers with the same config.
    pub fn uniform(n: usize, cfg: Config, seed: u64) -> Sim {
        Sim::new(vec![cfg; n], seed)
    }

    fn rand(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    pub fn alloc(&mut self, i: usize, data: Vec<u8>) -> UserBufId {
        let p = &mut self.peers[i];
        let id = UserBufId(p.next_buf);
        p.next_buf += 1;
        p.mem.insert(id, data);
        id
    }

    /// Tag-sends `data` from peer `i` to peer `j`.
    pub fn send(&mut self, i: usize, j: usize, tag: Tag, data: Vec<u8>) -> RequestId {
        let len = data.len() as u64;
        let buf = self.alloc(i, data);
        let r = self.peers[i]
            .engine
            .tag_send(conn(j), tag, buf, len)
            .unwrap();
        self.peers[i].made_with.insert(r, buf);
        self.pump(i);
        if r.is_immediate() {
            // Sent as it was made: the driver completes it once the frame is out.
            let p = &mut self.peers[i];
            let c = Completion {
                request: r,
                kind: RequestKind::Send,
                status: Status::Ok,
                length: len,
                tag,
                conn: Some(conn(j)),
                buf: Some(buf),
            };
            assert!(
                p.completions.insert(r, c).is_none(),
                "request completed twice"
            );
            p.completion_order.push(r);
        }
        r
    }

    /// Posts a receive at peer `i`; returns the request and its buffer.
    pub fn recv(&mut self, i: usize, tag: Tag, mask: Tag, cap: usize) -> (RequestId, UserBufId) {
        let buf = self.alloc(i, vec![0xEE; cap]);
        let r = self.peers[i].engine.tag_recv(tag, mask, buf, cap as u64);
        self.peers[i].made_with.insert(r, buf);
        self.pump(i);
        (r, buf)
    }

    pub fn cancel(&mut self, i: usize, r: RequestId) -> bool {
        let ok = self.peers[i].engine.cancel(r);
        self.pump(i);
        ok
    }

    pub fn completion(&self, i: usize, r: RequestId) -> Option<Completion> {
        self.peers[i].completions.get(&r).copied()
    }

    pub fn data(&self, i: usize, buf: UserBufId, len: u64) -> Vec<u8> {
        self.peers[i].mem[&buf][..len as usize].to_vec()
    }

    /// Injects raw bytes on the link from `a` to `b`.
    pub fn inject(&mut self, a: usize, b: usize, bytes: Vec<u8>) {
        self.links.get_mut(&(a, b)).unwrap().push_back(bytes);
    }

    /// From now on the frames `a` sends `b` are held for the test ([`Sim::take`]) instead
    /// of delivered: `b` is played by the test (a hostile peer's view of `a`'s answers).
    pub fn capture(&mut self, a: usize, b: usize) {
        self.captured.insert((a, b));
    }

    /// The frames held on a captured link from `a` to `b`, oldest first.
    pub fn take(&mut self, a: usize, b: usize) -> Vec<Vec<u8>> {
        self.links.get_mut(&(a, b)).unwrap().drain(..).collect()
    }

    /// Frames in flight from `a` to `b`.
    pub fn in_flight(&self, a: usize, b: usize) -> usize {
        self.links[&(a, b)].len()
    }

    /// Kills the connection between `a` and `b` (both sides learn it).
    pub fn kill(&mut self, a: usize, b: usize) {
        self.alive.insert((a, b), false);
        self.alive.insert((b, a), false);
        self.links.get_mut(&(a, b)).unwrap().clear();
        self.links.get_mut(&(b, a)).unwrap().clear();
        self.peers[a].engine.handle_connection_down(conn(b));
        self.pump(a);
        self.peers[b].engine.handle_connection_down(conn(a));
        self.pump(b);
    }

    /// Executes every action of peer `i`.
    pub fn pump(&mut self, i: usize) {
        while let Some(a) = self.peers[i].engine.poll_action() {
            match a {
                Action::SendFrame {
                    conn: c,
                    frame,
                    payload,
                } => {
                    let j = c.0 as usize;
                    let mut bytes = frame.as_bytes().to_vec();
                    if let Some(p) = payload {
                        let (at, n) = (p.offset as usize, p.len as usize);
                        bytes.extend_from_slice(&self.peers[i].mem[&p.buf][at..at + n]);
                    }
                    assert!(
                        bytes.len() <= self.peers[j].engine.config().recv_buf_size as usize,
                        "frame of {} bytes exceeds peer {j}'s receive buffer",
                        bytes.len()
                    );
                    if self.alive[&(i, j)] {
                        self.links.get_mut(&(i, j)).unwrap().push_back(bytes);
                    }
                }
                Action::SendFrameData {
                    conn: c,
                    frame,
                    data,
                } => {
                    let j = c.0 as usize;
                    let mut bytes = frame.as_bytes().to_vec();
                    bytes.extend_from_slice(&data);
                    self.peers[i].engine.recycle_payload(data);
                    assert!(
                        bytes.len() <= self.peers[j].engine.config().recv_buf_size as usize,
                        "frame of {} bytes exceeds peer {j}'s receive buffer",
                        bytes.len()
                    );
                    if self.alive[&(i, j)] {
                        self.links.get_mut(&(i, j)).unwrap().push_back(bytes);
                    }
                }
                Action::ExposeSendBuffer { request, buf, len } => {
                    let addr = self.next_addr;
                    self.next_addr += 1 << 32;
                    let rkey = self.rand() as u32;
                    self.regions.insert(
                        addr,
                        Region {
                            peer: i,
                            buf,
                            len,
                            rkey,
                        },
                    );
                    self.peers[i].exposed.insert(request, addr);
                    if self.expose_immediately {
                        self.peers[i]
                            .engine
                            .handle_send_buffer_exposed(request, RemoteBuf { addr, rkey });
                    } else {
                        self.pending_expose.push((i, request));
                    }
                }
                Action::ReleaseSendBuffer { request, .. } => {
                    if let Some(addr) = self.peers[i].exposed.remove(&request) {
                        self.regions.remove(&addr);
                    }
                }
                Action::RdmaRead {
                    conn: c,
                    request,
                    remote,
                    len,
                    dst,
                    dst_offset,
                } => {
                    self.reads
                        .get_mut(&(i, c.0 as usize))
                        .unwrap()
                        .push_back(ReadOp {
                            conn: c,
                            request,
                            remote,
                            len,
                            dst,
                            dst_offset,
                        });
                }
                Action::RmaVerbs { .. } => {
                    panic!("the simulated fabric's connections perform no verbs")
                }
                Action::CopyFromRecvBuf {
                    src,
                    src_offset,
                    len,
                    dst,
                    dst_offset,
                } => {
                    let p = &mut self.peers[i];
                    let data = p.recv_bufs[&src][src_offset..src_offset + len].to_vec();
                    let d = p.mem.get_mut(&dst).unwrap();
                    d[dst_offset as usize..dst_offset as usize + len].copy_from_slice(&data);
                }
                Action::CopyToUser {
                    dst,
                    dst_offset,
                    data,
                } => {
                    let d = self.peers[i].mem.get_mut(&dst).unwrap();
                    d[dst_offset as usize..dst_offset as usize + data.len()].copy_from_slice(&data);
                }
                Action::Complete(c) => {
                    let p = &mut self.peers[i];
                    // (Requests a test made without `send` or `recv` are not recorded.)
                    let made_with = p.made_with.get(&c.request).copied().or(c.buf);
                    assert!(
                        c.buf.is_some() && c.buf == made_with,
                        "a completion names its request's buffer: {c:?}"
                    );
                    assert!(
                        p.completions.insert(c.request, c).is_none(),
                        "request completed twice"
                    );
                    p.completion_order.push(c.request);
                }
                Action::CloseConnection { conn: c, reason } => {
                    let j = c.0 as usize;
                    self.peers[i].closed.push((c, reason));
                    if self.alive[&(i, j)] {
                        self.alive.insert((i, j), false);
                        self.alive.insert((j, i), false);
                        self.links.get_mut(&(j, i)).unwrap().clear();
                        // Frames already sent by i (e.g. an ERROR) may still arrive.
                        self.peers[j].engine.handle_connection_down(conn(i));
                        self.pump(j);
                    }
                }
            }
        }
    }

    /// Completes a deferred exposure.
    pub fn finish_exposures(&mut self) {
        for (i, r) in std::mem::take(&mut self.pending_expose) {
            if let Some(addr) = self.peers[i].exposed.get(&r).copied() {
                let rkey = self.regions[&addr].rkey;
                self.peers[i]
                    .engine
                    .handle_send_buffer_exposed(r, RemoteBuf { addr, rkey });
            }
            self.pump(i);
        }
    }

    /// Performs one random event; returns false when nothing is left to do.
    pub fn step(&mut self) -> bool {
        let mut ready: Vec<(bool, usize, usize)> = Vec::new();
        for (&(a, b), q) in &self.links {
            if !q.is_empty() && !self.captured.contains(&(a, b)) {
                if self.peers[b].srq_free.is_empty() {
                    self.rnr_stalls += 1;
                } else {
                    ready.push((true, a, b));
                }
            }
        }
        for (&(a, b), q) in &self.reads {
            if !q.is_empty() {
                ready.push((false, a, b));
            }
        }
        if ready.is_empty() {
            return false;
        }
        let k = (self.rand() % ready.len() as u64) as usize;
        let (is_frame, a, b) = ready[k];
        if is_frame {
            let bytes = self.links.get_mut(&(a, b)).unwrap().pop_front().unwrap();
            let p = &mut self.peers[b];
            let buf = p.srq_free.pop().expect("SRQ has a posted buffer");
            p.recv_bufs.insert(buf, bytes.clone());
            self.frames_delivered += 1;
            p.engine.handle_frame(conn(a), buf, &bytes);
            self.pump(b);
            // The engine keeps nothing of the buffer once its actions are executed.
            let p = &mut self.peers[b];
            assert!(
                p.recv_bufs.remove(&buf).is_some(),
                "repost of a free buffer"
            );
            p.srq_free.push(buf);
        } else {
            let op = self.reads.get_mut(&(a, b)).unwrap().pop_front().unwrap();
            let ok = self.do_read(a, b, &op);
            self.peers[a]
                .engine
                .handle_read_complete(op.request, op.dst_offset, ok);
            let _ = op.conn;
            self.pump(a);
        }
        true
    }

    fn do_read(&mut self, a: usize, b: usize, op: &ReadOp) -> bool {
        if !self.alive[&(a, b)] {
            return false;
        }
        let Some((&base, reg)) = self.regions.range(..=op.remote.addr).next_back() else {
            return false;
        };
        if reg.peer != b || reg.rkey != op.remote.rkey || op.remote.addr + op.len > base + reg.len {
            return false;
        }
        let off = (op.remote.addr - base) as usize;
        let data = self.peers[b].mem[&reg.buf][off..off + op.len as usize].to_vec();
        let Some(d) = self.peers[a].mem.get_mut(&op.dst) else {
            return false;
        };
        let o = op.dst_offset as usize;
        d[o..o + data.len()].copy_from_slice(&data);
        true
    }

    /// Runs until no event is left; returns the number of events.
    pub fn run(&mut self) -> u64 {
        let mut n = 0;
        while self.step() {
            n += 1;
            assert!(n < 10_000_000, "simulation does not terminate");
        }
        n
    }

    /// Checks that every SRQ buffer is posted again.
    pub fn assert_srq_full(&self) {
        for (i, p) in self.peers.iter().enumerate() {
            assert_eq!(p.srq_free.len(), p.srq_depth, "peer {i} leaked SRQ buffers");
        }
    }
}

/// A small config for tests.
pub fn small_cfg() -> Config {
    Config::builder()
        .recv_buf_size(256)
        .eager_threshold(200)
        .srq_depth(16)
        .credits(8)
        .rndv_chunk_size(100)
        .max_reads_in_flight(3)
        .build()
        .unwrap()
}

/// Deterministic test payload.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|k| (seed.wrapping_mul(31).wrapping_add(k as u64 * 7) % 251) as u8)
        .collect()
}

/// An eager frame carrying `payload` with sequence `seq` and tag `tag`.
pub fn eager_frame(seq: u32, tag: Tag, payload: &[u8]) -> Vec<u8> {
    let mut h = wire::Header::new(wire::Opcode::Eager);
    h.seq = seq;
    h.tag = tag;
    h.payload_len = payload.len() as u32;
    let mut frame = wire::FrameBuf::encode(&h, None).as_bytes().to_vec();
    frame.extend_from_slice(payload);
    frame
}

/// Three peers on the simulated fabric, each with [`small_cfg`].
pub fn sim3(seed: u64) -> Sim {
    Sim::uniform(3, small_cfg(), seed)
}

/// An engine (default configuration) with connection 1 up, to a peer that offered the
/// same handshake as its own.
pub fn engine_with_conn1() -> Engine {
    let mut e = Engine::new(Config::default());
    let hs = e.local_handshake();
    e.handle_connection_up(ConnId(1), &hs).unwrap();
    e
}
