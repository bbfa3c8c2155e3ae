//! The one-sided part of [`super::engine_frames`]: the regions the engine serves the
//! peer's puts, gets and atomic operations from ([`Memory`], a driver's memory with a log of
//! what each access returned), and a model of this side's own one-sided operations on the
//! peer's regions ([`Ops`]) that predicts which RMA replies the engine must take and checks
//! the frames and NIC work it makes for them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use rdmx_proto::rma::{
    AtomicOp, KeyRef, PackedKey, RdmaPart, Refusal, Regions, RemoteAccess, RmaMemory, RmaOp,
};
use rdmx_proto::wire::{Header, Opcode, RmaBody, WireStatus};
use rdmx_proto::{ConnId, Engine, RequestId, RequestKind, UserBufId, HEADER_LEN};

/// Bits of the RMA byte of an [`super::engine_frames`] input (present when its flag byte
/// has `flag::RMA`).
pub mod rma_flag {
    /// The engine gets no memory: it refuses every access of the peer's.
    pub const NO_MEMORY: u8 = 1;
    /// The connection performs one-sided operations by verbs (`ConnLimits::verbs_rma`), and
    /// the key of this side's operations has an RDMA part: they become NIC work.
    pub const VERBS: u8 = 1 << 1;
    /// Start a put of [`super::OP_LEN`] bytes (several frames).
    pub const PUT: u8 = 1 << 2;
    /// Start a get of [`super::OP_LEN`] bytes (several frames, several replies).
    pub const GET: u8 = 1 << 3;
    /// Start a fetch-and-add, a fence and a compare-and-swap.
    pub const ATOMICS: u8 = 1 << 4;
    /// Start a flush of the connection and a flush of the engine, after the others.
    pub const FLUSH: u8 = 1 << 5;
    /// NIC work is reported done only at the end (so that replies can name it meanwhile);
    /// otherwise after each frame.
    pub const VERBS_LATE: u8 = 1 << 6;
    /// The NIC refuses the first work request (`RemoteAccess`) and breaks on the second.
    pub const VERBS_FAIL: u8 = 1 << 7;
}

/// Bytes of the peer-reachable region 0: more than the largest get (a reply into 8 KiB).
pub const REGION_LEN: u64 = 16 * 1024;

/// Bytes of this side's put and get.
pub const OP_LEN: u64 = 20_000;

/// The secrets of the peer-reachable regions: region 0 ([`REGION_LEN`] bytes, every access,
/// generation 0), region 1's first (64 bytes, unmapped: a stale key) and region 1 again
/// (64 bytes, read only, generation 1). Seeds name them; the fuzzer finds them by the
/// comparisons of the key check.
pub const SECRETS: [u64; 3] = [
    0x5ec2_e700_0000_0001,
    0x5ec2_e700_0000_0002,
    0x5ec2_e700_0000_0003,
];

/// Keys of those regions: valid, stale, valid read-only.
pub fn peer_keys() -> [KeyRef; 3] {
    [
        KeyRef {
            region: 0,
            generation: 0,
            secret: SECRETS[0],
        },
        KeyRef {
            region: 1,
            generation: 0,
            secret: SECRETS[1],
        },
        KeyRef {
            region: 1,
            generation: 1,
            secret: SECRETS[2],
        },
    ]
}

/// What the engine must answer a peer's operation with: status, an atomic operation's old
/// value, a get's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: WireStatus,
    pub value: u64,
    pub data: Vec<u8>,
}

impl Answer {
    fn refused(r: Refusal) -> Answer {
        let status = match r {
            Refusal::BadKey => WireStatus::BadKey,
            Refusal::OutOfBounds { .. } => WireStatus::OutOfBounds,
            Refusal::Unaligned(_) => WireStatus::Unaligned,
            Refusal::NotPermitted { .. } => WireStatus::NotPermitted,
        };
        Answer {
            status,
            value: 0,
            data: Vec::new(),
        }
    }

    /// What an engine without memory answers.
    pub fn no_memory() -> Answer {
        Answer::refused(Refusal::BadKey)
    }
}

#[derive(Default)]
struct State {
    regions: Regions,
    bytes: BTreeMap<u32, Vec<u8>>,
    /// What each access returned, in the order they were made.
    log: VecDeque<Answer>,
}

/// A driver's regions for the peer's operations (see [`SECRETS`]), logging what each access
/// returned, so that the engine's replies can be checked against it.
#[derive(Default)]
pub struct Memory(Mutex<State>);

impl Memory {
    pub fn new() -> Memory {
        let mut s = State::default();
        let a = s
            .regions
            .map(REGION_LEN, RemoteAccess::ALL, SECRETS[0])
            .expect("a slot");
        let old = s
            .regions
            .map(64, RemoteAccess::ALL, SECRETS[1])
            .expect("a slot");
        s.regions.unmap(&old).expect("mapped");
        let b = s
            .regions
            .map(64, RemoteAccess::READ, SECRETS[2])
            .expect("a slot");
        debug_assert_eq!([a, old, b], peer_keys());
        s.bytes.insert(
            0,
            (0..REGION_LEN as u32)
                .map(|i| (i * 7 % 251) as u8)
                .collect(),
        );
        s.bytes.insert(1, (0..64u8).collect());
        Memory(Mutex::new(s))
    }

    /// The answer of the oldest access not yet taken.
    pub fn take_answer(&self) -> Option<Answer> {
        self.0.lock().unwrap().log.pop_front()
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut State) -> Result<(T, Answer), Refusal>,
    ) -> Result<T, Refusal> {
        let mut s = self.0.lock().unwrap();
        match f(&mut s) {
            Ok((v, answer)) => {
                s.log.push_back(answer);
                Ok(v)
            }
            Err(r) => {
                s.log.push_back(Answer::refused(r));
                Err(r)
            }
        }
    }
}

fn ok(value: u64, data: Vec<u8>) -> Answer {
    Answer {
        status: WireStatus::Ok,
        value,
        data,
    }
}

impl RmaMemory for Memory {
    fn put(&self, key: &KeyRef, offset: u64, data: &[u8]) -> Result<(), Refusal> {
        self.with(|s| {
            let id = s
                .regions
                .check(key, RmaOp::Put, offset, data.len() as u64)?;
            let at = offset as usize;
            let region = s.bytes.get_mut(&id.0).expect("a mapped region's bytes");
            region[at..at + data.len()].copy_from_slice(data);
            Ok(((), ok(0, Vec::new())))
        })
    }

    fn get(&self, key: &KeyRef, offset: u64, len: usize, out: &mut Vec<u8>) -> Result<(), Refusal> {
        let answer = |out: &Vec<u8>| ok(0, out.clone());
        self.with(|s| {
            let id = s.regions.check(key, RmaOp::Get, offset, len as u64)?;
            let at = offset as usize;
            out.clear();
            out.extend_from_slice(&s.bytes[&id.0][at..at + len]);
            Ok(((), answer(out)))
        })
    }

    fn atomic(&self, key: &KeyRef, offset: u64, op: AtomicOp) -> Result<u64, Refusal> {
        self.with(|s| {
            let id = s.regions.check(key, RmaOp::Atomic, offset, 8)?;
            let at = offset as usize;
            let w = &mut s.bytes.get_mut(&id.0).expect("a mapped region's bytes")[at..at + 8];
            let old = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            let new = match op {
                AtomicOp::FetchAdd(v) => old.wrapping_add(v),
                AtomicOp::CompareSwap { expected, new } if old == expected => new,
                AtomicOp::CompareSwap { .. } => old,
            };
            w.copy_from_slice(&new.to_le_bytes());
            Ok((old, ok(old, Vec::new())))
        })
    }
}

/// One of this side's one-sided operations, as the model sees it.
#[derive(Debug)]
pub struct Op {
    pub kind: RequestKind,
    /// Its bytes (8 for an atomic operation).
    pub len: u64,
    /// Its offset in the peer's region.
    pub remote: u64,
    /// Frames or NIC work out whose replies or reports did not come back.
    pub out: u64,
    /// Whether it goes by verbs.
    pub verbs: bool,
}

/// This side's one-sided operations.
#[derive(Debug, Default)]
pub struct Ops {
    /// Every operation and flush started, in order: an RMA reply whose request field is a
    /// small index `i` is sent naming the `i`-th ([`Ops::aim`]).
    pub started: Vec<RequestId>,
    /// Puts, gets and atomic operations not completed.
    pub live: BTreeMap<RequestId, Op>,
    /// NIC work not reported yet: request, and whether a failure is due for it.
    pub nic: Vec<RequestId>,
    /// Work requests reported so far (to pick the failing ones).
    pub reported: u64,
    /// The most bytes a get asks for, and a get's reply carries: what a reply carries into
    /// the smaller of both sides' receive buffers.
    pub chunk: u64,
}

/// The buffers of this side's operations: (id, capacity).
pub const PUT_BUF: (UserBufId, u64) = (UserBufId(2_000_000), OP_LEN);
pub const GET_BUF: (UserBufId, u64) = (UserBufId(2_000_001), OP_LEN);
pub const ADD_BUF: (UserBufId, u64) = (UserBufId(2_000_002), 8);
pub const CAS_BUF: (UserBufId, u64) = (UserBufId(2_000_003), 8);
pub const FLUSH_BUF: (UserBufId, u64) = (UserBufId(2_000_004), 0);
pub const FLUSH_ALL_BUF: (UserBufId, u64) = (UserBufId(2_000_005), 0);

/// The key of the peer's region this side's operations reach (1 MiB, every access; with
/// an RDMA part when `rdma`).
pub fn remote_key(rdma: bool) -> PackedKey {
    PackedKey {
        key: KeyRef {
            region: 3,
            generation: 1,
            secret: 0x0dd_ba11,
        },
        len: 1 << 20,
        access: RemoteAccess::ALL,
        rdma: rdma.then_some(RdmaPart {
            addr: 0x7000_0000,
            rkey: 0x77,
        }),
    }
}

impl Ops {
    /// Starts the operations `rma` asks for on `conn` of `e` (up when `open`, to a peer
    /// with `peer_buf`-byte receive buffers); the buffers they use go into `caps`.
    pub fn start(
        &mut self,
        e: &mut Engine,
        conn: ConnId,
        (open, peer_buf): (bool, u32),
        rma: u8,
        caps: &mut BTreeMap<UserBufId, u64>,
    ) {
        use rma_flag::*;
        let verbs = rma & VERBS != 0;
        let key = remote_key(verbs);
        // (A put to a peer whose buffers hold no byte past a put frame's header and body is
        // refused as it is made, by verbs too.)
        let no_put_room = peer_buf as usize <= HEADER_LEN + RmaBody::LEN;
        let made = |ops: &mut Ops, r: Result<RequestId, rdmx_proto::Error>, kind, len, remote| {
            match &r {
                Err(rdmx_proto::Error::Unsupported(_)) if open => {
                    assert!(kind == RequestKind::Put && no_put_room, "{r:?}")
                }
                _ => assert_eq!(
                    r.is_ok(),
                    open,
                    "an operation is made exactly while connected: {r:?}"
                ),
            }
            if let Ok(id) = r {
                ops.started.push(id);
                if kind != RequestKind::Flush {
                    let op = Op {
                        kind,
                        len,
                        remote,
                        out: 0,
                        verbs,
                    };
                    ops.live.insert(id, op);
                }
            }
        };
        for (buf, cap) in [PUT_BUF, GET_BUF, ADD_BUF, CAS_BUF, FLUSH_BUF, FLUSH_ALL_BUF] {
            caps.insert(buf, cap);
        }
        if rma & PUT != 0 {
            let r = e.rma_put(conn, &key, 100, PUT_BUF.0, OP_LEN);
            made(self, r, RequestKind::Put, OP_LEN, 100);
        }
        if rma & GET != 0 {
            let r = e.rma_get(conn, &key, 5000, GET_BUF.0, OP_LEN);
            made(self, r, RequestKind::Get, OP_LEN, 5000);
        }
        if rma & ATOMICS != 0 {
            let r = e.rma_atomic(conn, &key, 8, AtomicOp::FetchAdd(5), ADD_BUF.0);
            made(self, r, RequestKind::Atomic, 8, 8);
            let fenced = e.rma_fence(conn);
            assert_eq!(fenced.is_ok(), open);
            let cas = AtomicOp::CompareSwap {
                expected: 0,
                new: 9,
            };
            let r = e.rma_atomic(conn, &key, 16, cas, CAS_BUF.0);
            made(self, r, RequestKind::Atomic, 8, 16);
        }
        if rma & FLUSH != 0 {
            let r = e.rma_flush(conn, FLUSH_BUF.0);
            made(self, r, RequestKind::Flush, 0, 0);
            let r = e.rma_flush_all(FLUSH_ALL_BUF.0);
            self.started.push(r);
        }
    }

    /// An RMA reply whose request field is a small index names that operation (so that the
    /// fuzzer reaches the reply checks without guessing request ids).
    pub fn aim(&self, frame: &mut [u8]) {
        if frame.len() >= 32 && frame[3] == Opcode::RmaReply as u8 {
            let sreq = u64::from_le_bytes(frame[24..32].try_into().expect("8 bytes"));
            if let Some(id) = usize::try_from(sreq).ok().and_then(|i| self.started.get(i)) {
                frame[24..32].copy_from_slice(&id.0.to_le_bytes());
            }
        }
    }

    /// Whether the engine must take an RMA reply with header `h` and bytes `data` (else it
    /// is a protocol error): what `Engine`'s reply checks say, from the model.
    pub fn reply_ok(&self, h: &Header, data: &[u8]) -> bool {
        let Some(op) = self.live.get(&RequestId(h.sreq)) else {
            return false;
        };
        if op.out == 0 || op.verbs {
            return false;
        }
        if h.status != WireStatus::Ok {
            return data.is_empty();
        }
        match op.kind {
            RequestKind::Get => {
                let off = h.tag.wrapping_sub(op.remote);
                let want = op.len.saturating_sub(off).min(self.chunk);
                off < op.len.max(1) && off % self.chunk.max(1) == 0 && data.len() as u64 == want
            }
            _ => data.is_empty(),
        }
    }

    /// A reply the engine took: one fewer out.
    pub fn replied(&mut self, sreq: u64) {
        let op = self
            .live
            .get_mut(&RequestId(sreq))
            .expect("a live operation");
        op.out -= 1;
    }

    /// A frame of this side's operation `sreq` went out: checks it and counts it.
    pub fn frame_out(&mut self, h: &Header, body: &[u8], payload_len: u64) {
        let op = self
            .live
            .get_mut(&RequestId(h.sreq))
            .unwrap_or_else(|| panic!("a {:?} frame for no live operation", h.opcode));
        assert!(!op.verbs, "a frame for an operation the NIC performs");
        let (rma, _) = RmaBody::split(body).expect("a one-sided frame holds a body");
        match (h.opcode, op.kind) {
            (Opcode::Put, RequestKind::Put) => {
                assert!(payload_len > 0 && h.tag >= op.remote);
                assert!(
                    h.tag - op.remote + payload_len <= op.len,
                    "a put frame past its end"
                );
            }
            (Opcode::Get, RequestKind::Get) => {
                assert!(
                    rma.word > 0 && rma.word <= self.chunk,
                    "a get of {} bytes",
                    rma.word
                );
                assert!(
                    h.tag - op.remote + rma.word <= op.len,
                    "a get frame past its end"
                );
            }
            (Opcode::FetchAdd | Opcode::CompareSwap, RequestKind::Atomic) => {
                assert_eq!(h.tag, op.remote)
            }
            (o, k) => panic!("a {o:?} frame for a {k:?}"),
        }
        op.out += 1;
    }

    /// NIC work for `request` was asked for: checks and counts it.
    pub fn nic_work(&mut self, request: RequestId) {
        let op = self
            .live
            .get_mut(&request)
            .expect("NIC work for a live operation");
        assert!(op.verbs, "NIC work for an operation that goes by messages");
        op.out += 1;
        self.nic.push(request);
    }

    /// The operation `request` completed with `length` (None if it is not one of this
    /// side's one-sided operations).
    pub fn completed(&mut self, request: RequestId, kind: RequestKind, length: u64) {
        if let Some(op) = self.live.remove(&request) {
            assert_eq!(
                (kind, length),
                (op.kind, op.len),
                "completion of {request:?}"
            );
        } else {
            assert_eq!(
                kind,
                RequestKind::Flush,
                "completion of an unknown {kind:?}"
            );
            assert!(
                self.started.contains(&request),
                "an unknown flush completed"
            );
        }
    }
}
