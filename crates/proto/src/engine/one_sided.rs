//! One-sided operations over messages: put, get and atomic operations on a peer's regions
//! (named by their keys, see [`crate::rma`]), carried as frames that the target's engine
//! executes as they arrive — through its driver's [`RmaMemory`] — and answers with an RMA
//! reply; and flush and fence, which wait for earlier operations' replies. This is how TCP
//! and shared memory carry them, as UCX does over its tcp transport (over RDMA the NIC can
//! perform them instead, without the target's engine).
//!
//! Semantics, as UCP's with its strongest guarantees:
//! - an operation completes when its reply came back: a put's bytes are then in the target's
//!   region (remote completion), a get's in the initiator's buffer, an atomic operation's old
//!   value in its completion's `tag`;
//! - operations on one connection reach the target in the order they were made (its frames
//!   go out in order, behind the connection's earlier frames, tag sends included) and the
//!   target performs them in arrival order, so a later operation sees an earlier one's
//!   effect; a fence ([`Engine::rma_fence`]) makes the next operation wait until every
//!   earlier one completed besides;
//! - a flush ([`Engine::rma_flush`]) completes once every operation made on its connection
//!   before it completed;
//! - an access the target refuses (bad or stale key, outside the region, unaligned word,
//!   access not granted) completes the request with [`Status::Refused`] and leaves the
//!   connection up: nothing of that operation was performed (a put of several frames may
//!   have been performed in part: each frame is checked by itself, and any refused fails
//!   the put). A connection that fails completes its operations with
//!   [`Status::ConnectionClosed`], whatever the target performed of them.
//!
//! A put or get larger than a frame goes as several, each at most what the receiving side's
//! buffers hold (the peer's for a put; for a get's reply the smaller of both sides', so
//! that the target never allocates more for a reply than its own buffers hold).
//!
//! What a peer can make the target spend is bounded by the target, whatever the peer
//! declares: a get asking for more than a reply carries (the smaller of the two sides'
//! receive buffers, less the header) is a protocol error; a get's key and bounds are checked
//! before a byte is allocated for its reply ([`RmaMemory::get`]); and the credit of each
//! operation's frame is held back until its reply leaves, so a peer that withholds credits
//! makes the target hold at most its window of replies ([`ConnStats::replies_waiting`]). At
//! the initiator, one operation has at most [`FRAMES_IN_FLIGHT`] frames out, whatever the
//! peer's buffers and credits make of its size.

mod verbs;

use std::sync::Arc;

use super::*;
use crate::rma::{AtomicOp, KeyRef, PackedKey, RdmaPart, Refusal, RefusalKind, RmaMemory, RmaOp};
use crate::wire::RmaBody;

pub use verbs::VerbsFailure;

/// The driver's regions, if it gave the engine any ([`Engine::set_rma_memory`]).
#[derive(Default)]
pub(super) struct Memory(Option<Arc<dyn RmaMemory>>);

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Memory(set)"
        } else {
            "Memory(none)"
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Put,
    Get,
    Atomic(AtomicOp),
    Flush,
    /// A worker-wide flush ([`Engine::rma_flush_all`]): on no connection's queue, done once
    /// the operations it waits for ([`WorkerFlush`]) completed.
    WorkerFlush,
}

/// The connection a worker-wide flush names: none (the driver never names one so).
const NO_CONN: ConnId = ConnId(u64::MAX);

/// The key a flush names: none (it reaches no region).
const NO_KEY: KeyRef = KeyRef {
    region: 0,
    generation: 0,
    secret: 0,
};

/// A worker-wide flush, waiting for the one-sided operations that were outstanding when it
/// was made.
#[derive(Debug)]
pub(super) struct WorkerFlush {
    id: RequestId,
    waiting: Vec<RequestId>,
}

/// A one-sided operation or flush, while it runs (the request's `len` is its bytes, 8 for
/// an atomic operation, 0 for a flush).
#[derive(Debug)]
pub(super) struct RmaState {
    op: Op,
    key: KeyRef,
    /// Where the target's NIC finds the region, if it registered it for RDMA: the
    /// operation goes by verbs on a connection that performs them ([`Conn::verbs_rma`]).
    rdma: Option<RdmaPart>,
    /// Offset of the access in the remote region.
    remote: u64,
    /// Bytes whose frames went out.
    sent: u64,
    /// Whether its first frame went out.
    started: bool,
    /// Whether it waits for every earlier operation before it starts (a fence was made).
    fenced: bool,
    /// Frames out whose replies did not come back yet.
    replies: u32,
    /// The first refusal a reply brought.
    failed: Option<RefusalKind>,
    /// An atomic operation's old value.
    value: u64,
}

/// What the head of a connection's queue, a one-sided operation, did when given credit.
pub(super) enum Step {
    /// It sent a frame and has more to send.
    More,
    /// It sent its last frame (its replies will complete it).
    AllSent,
    /// It waits (for earlier operations).
    Wait,
    /// It completed (a flush).
    Done(Completion),
}

/// The answer to a peer's operation, waiting for credit.
#[derive(Debug)]
pub(super) struct Reply {
    sreq: u64,
    tag: u64,
    status: WireStatus,
    value: u64,
    data: Vec<u8>,
}

impl RmaState {
    /// `op` on `key`'s region (`rdma`: where its NIC finds it) at `remote`, not started.
    fn new(op: Op, key: KeyRef, rdma: Option<RdmaPart>, remote: u64, fenced: bool) -> Self {
        RmaState {
            op,
            key,
            rdma,
            remote,
            sent: 0,
            started: false,
            fenced,
            replies: 0,
            failed: None,
            value: 0,
        }
    }

    /// What it completes with once every byte of its `len` went out and every reply or
    /// report came back: its kind, its status and an atomic operation's old value.
    fn outcome(&self, len: u64) -> Option<(RequestKind, Status, u64)> {
        (self.started && self.replies == 0 && self.sent == len).then(|| {
            let status = self.failed.map_or(Status::Ok, Status::Refused);
            (self.kind(), status, self.value)
        })
    }

    pub(super) fn kind(&self) -> RequestKind {
        match self.op {
            Op::Put => RequestKind::Put,
            Op::Get => RequestKind::Get,
            Op::Atomic(_) => RequestKind::Atomic,
            Op::Flush | Op::WorkerFlush => RequestKind::Flush,
        }
    }

    /// Whether its first frame went out (from then on it cannot be cancelled).
    pub(super) fn started(&self) -> bool {
        self.started
    }

    /// Sends its next frame, on `c` (`conn`, with credit for it), for the request `id` with
    /// buffer `buf` and length `len`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn step(
        &mut self,
        c: &mut Conn,
        conn: ConnId,
        id: RequestId,
        buf: UserBufId,
        len: u64,
        actions: &mut VecDeque<Action>,
        pool: &mut CreditPool,
    ) -> Step {
        if let Op::WorkerFlush = self.op {
            // (Never on a connection's queue.)
            return Step::Wait;
        }
        if let Op::Flush = self.op {
            if c.rma_pending > 0 {
                return Step::Wait;
            }
            return Step::Done(Completion {
                request: id,
                kind: RequestKind::Flush,
                status: Status::Ok,
                length: 0,
                tag: 0,
                conn: Some(conn),
                buf: Some(buf),
            });
        }
        if !self.started {
            if self.fenced && c.rma_pending > 0 {
                return Step::Wait;
            }
            self.started = true;
            c.rma_pending += 1;
        }
        if let (true, Some(rdma)) = (c.verbs_rma, self.rdma) {
            return self.step_verbs(rdma, conn, id, buf, len, actions);
        }
        if self.replies >= FRAMES_IN_FLIGHT {
            // (The next frame goes once a reply came back: the reply's flush resumes it.)
            return Step::Wait;
        }
        let (opcode, n, word, rreq) = match self.op {
            Op::Put => (Opcode::Put, put_chunk(c).min(len - self.sent), 0, 0),
            Op::Get => {
                let n = get_chunk(c).min(len - self.sent);
                (Opcode::Get, n, n, 0)
            }
            Op::Atomic(AtomicOp::FetchAdd(v)) => (Opcode::FetchAdd, 8, 0, v),
            Op::Atomic(AtomicOp::CompareSwap { expected, new }) => {
                (Opcode::CompareSwap, 8, expected, new)
            }
            Op::Flush | Op::WorkerFlush => unreachable!("handled above"),
        };
        let mut h = Header::new(opcode);
        h.tag = self.remote + self.sent;
        h.sreq = id.0;
        h.rreq = rreq;
        let carried = if matches!(self.op, Op::Put) { n } else { 0 };
        h.payload_len = (RmaBody::LEN as u64 + carried) as u32;
        let h = c.number(h, pool);
        let frame = FrameBuf::encode_rma(
            &h,
            &RmaBody {
                key: self.key,
                word,
            },
        );
        actions.push_back(Action::SendFrame {
            conn,
            frame,
            payload: (carried > 0).then_some(PayloadRef {
                buf,
                offset: self.sent,
                len: carried,
            }),
        });
        self.sent += n;
        self.replies += 1;
        if self.sent == len {
            Step::AllSent
        } else {
            Step::More
        }
    }
}

/// The most frames of one one-sided operation out whose replies did not come back (the
/// default largest window, `Config::credits`): a put or get of many frames waits for
/// replies past it, whatever credits the peer grants. Without it a peer declaring the
/// smallest receive buffers (65 bytes: a put frame carries one byte) and 65 535 credits
/// made one 20 000-byte put queue 20 000 frames at once (found by the fuzzer, issue 48).
const FRAMES_IN_FLIGHT: u32 = 64;

/// The most bytes one put frame carries on `c`: what the peer's receive buffers hold.
fn put_chunk(c: &Conn) -> u64 {
    u64::from(c.peer.recv_buf_size).saturating_sub((HEADER_LEN + RmaBody::LEN) as u64)
}

/// The most bytes one get asks for on `c`, and a peer's get may ask of this side: what a
/// reply carries into the smaller of the two sides' receive buffers — the initiator's,
/// which receive it, and the target's, the most it allocates for one reply. (Both sides
/// compute the same, from the handshakes; a peer's declared buffers alone never size what
/// this side allocates.)
fn get_chunk(c: &Conn) -> u64 {
    u64::from(c.recv_buf_size.min(c.peer.recv_buf_size)).saturating_sub(HEADER_LEN as u64)
}

impl Conn {
    /// Emits an RMA reply on this connection (`id`), returning the credit of the peer's
    /// frame it answers (held back while it waited: [`Conn::replies_waiting`]).
    pub(super) fn emit_reply(
        &mut self,
        id: ConnId,
        reply: Reply,
        actions: &mut VecDeque<Action>,
        pool: &mut CreditPool,
    ) {
        self.replies_waiting -= 1;
        self.rx_unreturned += 1;
        let mut h = Header::new(Opcode::RmaReply);
        h.sreq = reply.sreq;
        h.tag = reply.tag;
        h.rreq = reply.value;
        h.status = reply.status;
        h.payload_len = reply.data.len() as u32;
        let frame = FrameBuf::encode(&self.number(h, pool), None);
        if reply.data.is_empty() {
            actions.push_back(Action::SendFrame {
                conn: id,
                frame,
                payload: None,
            });
        } else {
            actions.push_back(Action::SendFrameData {
                conn: id,
                frame,
                data: reply.data,
            });
        }
    }
}

impl Engine {
    /// Gives the engine the regions peers' operations reach: until then every put, get
    /// and atomic operation that arrives is refused ([`RefusalKind::BadKey`]).
    pub fn set_rma_memory(&mut self, memory: Arc<dyn RmaMemory>) {
        self.rma_memory = Memory(Some(memory));
    }

    /// Starts a put of the first `len` bytes of `buf` to `offset` of the peer's region
    /// `key` names. Fails at once, sending nothing, when the key does not allow it
    /// ([`Error::Refused`]).
    pub fn rma_put(
        &mut self,
        conn: ConnId,
        key: &PackedKey,
        offset: u64,
        buf: UserBufId,
        len: u64,
    ) -> Result<RequestId, Error> {
        self.start_rma(conn, key, Op::Put, offset, buf, len)
    }

    /// Starts a get of `len` bytes at `offset` of the peer's region `key` names into the
    /// start of `buf`. Fails at once when the key does not allow it ([`Error::Refused`]).
    pub fn rma_get(
        &mut self,
        conn: ConnId,
        key: &PackedKey,
        offset: u64,
        buf: UserBufId,
        len: u64,
    ) -> Result<RequestId, Error> {
        self.start_rma(conn, key, Op::Get, offset, buf, len)
    }

    /// Starts the atomic operation `op` on the 8-byte word at `offset` of the peer's region
    /// `key` names; `buf` names the request for the driver (no bytes of it are used). Its
    /// completion's `tag` is the word's old value. Fails at once when the key does not
    /// allow it ([`Error::Refused`]).
    pub fn rma_atomic(
        &mut self,
        conn: ConnId,
        key: &PackedKey,
        offset: u64,
        op: AtomicOp,
        buf: UserBufId,
    ) -> Result<RequestId, Error> {
        self.start_rma(conn, key, Op::Atomic(op), offset, buf, 8)
    }

    /// Starts a flush of `conn`: it completes once every one-sided operation made on it
    /// before completed. `buf` names the request for the driver.
    pub fn rma_flush(&mut self, conn: ConnId, buf: UserBufId) -> Result<RequestId, Error> {
        self.queue_rma(conn, NO_KEY, None, Op::Flush, 0, buf, 0)
    }

    /// Starts a flush of every connection: it completes once every one-sided operation made
    /// on the engine before it completed (each with its own status: one whose connection
    /// failed counts as completed). `buf` names the request for the driver.
    pub fn rma_flush_all(&mut self, buf: UserBufId) -> RequestId {
        let waiting: Vec<RequestId> = self
            .reqs
            .ids_made(|s| {
                matches!(&s.phase, SendPhase::Rma(r)
                    if matches!(r.op, Op::Put | Op::Get | Op::Atomic(_)))
            })
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        let id = self.new_send(SendReq {
            conn: NO_CONN,
            tag: 0,
            buf,
            len: 0,
            phase: SendPhase::Rma(Box::new(RmaState {
                // (Nothing to withdraw: it cannot be cancelled.)
                started: true,
                ..RmaState::new(Op::WorkerFlush, NO_KEY, None, 0, false)
            })),
        });
        if waiting.is_empty() {
            self.complete(id, RequestKind::Flush, Status::Ok, 0, 0, None);
        } else {
            self.worker_flushes.push(WorkerFlush { id, waiting });
        }
        id
    }

    /// The one-sided operation `done` completed: the worker-wide flushes waiting for it
    /// wait no more, and those it was the last of complete.
    pub(super) fn rma_completed(&mut self, done: RequestId) {
        let mut finished = Vec::new();
        self.worker_flushes.retain_mut(|f| {
            f.waiting.retain(|&w| w != done);
            let empty = f.waiting.is_empty();
            if empty {
                finished.push(f.id);
            }
            !empty
        });
        for id in finished {
            self.complete(id, RequestKind::Flush, Status::Ok, 0, 0, None);
        }
    }

    /// A fence on `conn`: the next one-sided operation made on it starts only once every
    /// earlier one completed.
    pub fn rma_fence(&mut self, conn: ConnId) -> Result<(), Error> {
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(Error::UnknownConnection(conn))?;
        c.fence_next = true;
        Ok(())
    }

    fn start_rma(
        &mut self,
        conn: ConnId,
        key: &PackedKey,
        op: Op,
        offset: u64,
        buf: UserBufId,
        len: u64,
    ) -> Result<RequestId, Error> {
        let c = self
            .conns
            .get(&conn)
            .ok_or(Error::UnknownConnection(conn))?;
        // (Bytes each frame carries: a put's in its own frames, a get's in its replies.)
        let room = match op {
            Op::Put => put_chunk(c),
            Op::Get => get_chunk(c),
            _ => 1,
        };
        if len > 0 && room == 0 {
            return Err(Error::Unsupported(format!(
                "{}-byte receive buffers leave no room for a {op:?}'s bytes",
                if matches!(op, Op::Put) {
                    c.peer.recv_buf_size
                } else {
                    c.recv_buf_size
                }
            )));
        }
        let check = match op {
            Op::Put => RmaOp::Put,
            Op::Get => RmaOp::Get,
            _ => RmaOp::Atomic,
        };
        key.allows(check, offset, len).map_err(Error::Refused)?;
        // (Zero bytes move nothing: as a message, which orders it like any other.)
        let rdma = if len > 0 { key.rdma } else { None };
        self.queue_rma(conn, key.key, rdma, op, offset, buf, len)
    }

    #[allow(clippy::too_many_arguments)]
    fn queue_rma(
        &mut self,
        conn: ConnId,
        key: KeyRef,
        rdma: Option<RdmaPart>,
        op: Op,
        remote: u64,
        buf: UserBufId,
        len: u64,
    ) -> Result<RequestId, Error> {
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or(Error::UnknownConnection(conn))?;
        let fenced = !matches!(op, Op::Flush) && std::mem::take(&mut c.fence_next);
        let id = self.new_send(SendReq {
            conn,
            tag: 0,
            buf,
            len,
            phase: SendPhase::Rma(Box::new(RmaState::new(op, key, rdma, remote, fenced))),
        });
        if let Some(c) = self.conns.get_mut(&conn) {
            c.data_q.push_back(id);
        }
        self.flush(conn);
        Ok(id)
    }

    /// A put, get or atomic operation of the peer's, or the reply to one of this side's,
    /// arrived on `conn`: its `frame`, decoded already (out of line: the path of every
    /// frame only calls it).
    #[cold]
    #[inline(never)]
    pub(super) fn one_sided_frame(
        &mut self,
        conn: ConnId,
        frame: &[u8],
    ) -> Result<(), CloseReason> {
        let (Ok(h), Some(payload)) = (wire::decode_header(frame), frame.get(HEADER_LEN..)) else {
            return Err(perr("a one-sided frame that no longer decodes".into()));
        };
        let h = &h;
        match (h.opcode, RmaBody::split(payload)) {
            (Opcode::Put, _) => self.serve_put(conn, h, payload),
            (Opcode::Get | Opcode::FetchAdd | Opcode::CompareSwap, Some((rma, _))) => {
                self.serve_rma(conn, h, rma)?
            }
            (Opcode::RmaReply, _) => self.handle_rma_reply(conn, h, payload)?,
            // (Decoding gives this body to these opcodes only, with these lengths.)
            _ => return Err(perr(format!("{:?} frame with a one-sided body", h.opcode))),
        }
        Ok(())
    }

    /// A peer's put arrived: performed (or refused) at once, its reply queued.
    fn serve_put(&mut self, conn: ConnId, h: &Header, payload: &[u8]) {
        let done = match (&self.rma_memory.0, RmaBody::split(payload)) {
            (Some(m), Some((rma, data))) => m.put(&rma.key, h.tag, data),
            _ => Err(Refusal::BadKey),
        };
        self.queue_reply(conn, h, done.err(), 0, Vec::new());
    }

    /// A peer's get or atomic operation arrived: performed (or refused) at once, its reply
    /// queued. A get asking for more than its reply can carry (see [`get_chunk`]) is a
    /// protocol error, and nothing is allocated for one whose access is refused.
    fn serve_rma(&mut self, conn: ConnId, h: &Header, rma: RmaBody) -> Result<(), CloseReason> {
        let memory = self.rma_memory.0.clone();
        match h.opcode {
            Opcode::Get => {
                let room = self.conns.get(&conn).map_or(0, get_chunk);
                if rma.word > room {
                    return Err(perr(format!(
                        "get of {} bytes, more than the {room} a reply carries",
                        rma.word
                    )));
                }
                let mut data = Vec::new();
                let done = match &memory {
                    Some(m) => {
                        // (A recycled allocation, if any: the memory sizes it once the
                        // access passed its checks, and leaves it alone otherwise.)
                        data = self.spare_payloads.pop().unwrap_or_default();
                        m.get(&rma.key, h.tag, rma.word as usize, &mut data)
                    }
                    None => Err(Refusal::BadKey),
                };
                if done.is_err() {
                    self.recycle_payload(std::mem::take(&mut data));
                }
                self.queue_reply(conn, h, done.err(), 0, data);
            }
            _ => {
                let op = if h.opcode == Opcode::FetchAdd {
                    AtomicOp::FetchAdd(h.rreq)
                } else {
                    AtomicOp::CompareSwap {
                        expected: rma.word,
                        new: h.rreq,
                    }
                };
                let done = match &memory {
                    Some(m) => m.atomic(&rma.key, h.tag, op),
                    None => Err(Refusal::BadKey),
                };
                let value = *done.as_ref().unwrap_or(&0);
                self.queue_reply(conn, h, done.err(), value, Vec::new());
            }
        }
        Ok(())
    }

    fn queue_reply(
        &mut self,
        conn: ConnId,
        h: &Header,
        refusal: Option<Refusal>,
        value: u64,
        data: Vec<u8>,
    ) {
        if let Some(r) = refusal {
            debug!("{conn:?}: {:?} refused: {r}", h.opcode);
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            // The credit of the operation's frame (counted as it arrived, and returned by
            // nothing since) goes back with the reply.
            c.rx_unreturned -= 1;
            c.replies_waiting += 1;
            c.ctrl_q.push_back(Ctrl::RmaReply(Box::new(Reply {
                sreq: h.sreq,
                tag: h.tag,
                status: refusal.map_or(WireStatus::Ok, |r| r.kind().wire()),
                value,
                data,
            })));
        }
    }

    /// The reply to one of this side's operations arrived. A reply to nothing this side
    /// asked on the connection by messages (an operation the NIC performs gets none), or
    /// with bytes it did not ask for, is a protocol error.
    fn handle_rma_reply(
        &mut self,
        conn: ConnId,
        h: &Header,
        data: &[u8],
    ) -> Result<(), CloseReason> {
        let id = RequestId(h.sreq);
        let (chunk, verbs) = self
            .conns
            .get(&conn)
            .map_or((0, false), |c| (get_chunk(c), c.verbs_rma));
        let Some(s) = self.reqs.get_mut(id) else {
            return Err(perr(format!("RMA reply for unknown request {:#x}", h.sreq)));
        };
        let (len, buf) = (s.len, s.buf);
        let SendPhase::Rma(r) = &mut s.phase else {
            return Err(perr("RMA reply for a tag send".into()));
        };
        // (An operation that went by verbs awaits the NIC's reports, not replies: one would
        // complete it while the NIC may still write its buffer.)
        if s.conn != conn || r.replies == 0 || (verbs && r.rdma.is_some()) {
            return Err(perr(format!("RMA reply for {id:?}, which awaits none")));
        }
        r.replies -= 1;
        let refused = RefusalKind::from_wire(h.status);
        let mut copy = None;
        match (r.op, refused) {
            (_, Some(kind)) => {
                if !data.is_empty() {
                    return Err(perr("RMA refusal with bytes".into()));
                }
                r.failed.get_or_insert(kind);
            }
            (Op::Get, None) => {
                let off = h.tag.wrapping_sub(r.remote);
                let want = len.saturating_sub(off).min(chunk);
                if off >= len.max(1) || off % chunk.max(1) != 0 || data.len() as u64 != want {
                    return Err(perr(format!(
                        "get reply of {} bytes at {off} of a {len}-byte get",
                        data.len()
                    )));
                }
                if !data.is_empty() {
                    copy = Some(off);
                }
            }
            (op, None) => {
                if !data.is_empty() {
                    return Err(perr(format!("{op:?} reply with bytes")));
                }
                if let Op::Atomic(_) = op {
                    r.value = h.rreq;
                }
            }
        }
        let done = r.outcome(len);
        if let Some(off) = copy {
            let data = self.payload_copy(data);
            self.actions.push_back(Action::CopyToUser {
                dst: buf,
                dst_offset: off,
                data,
            });
        }
        if let Some(done) = done {
            self.finish_rma(conn, id, len, done);
        }
        Ok(())
    }

    /// The one-sided operation `request` of `len` bytes on `conn` is over, with `done`
    /// ([`RmaState::outcome`]): no longer pending on its connection, it completes.
    fn finish_rma(
        &mut self,
        conn: ConnId,
        request: RequestId,
        len: u64,
        (kind, status, value): (RequestKind, Status, u64),
    ) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.rma_pending -= 1;
        }
        self.complete(request, kind, status, len, value, Some(conn));
    }
}
