//! The protocol engine: inputs via `handle_*` and user operations, outputs via
//! [`Engine::poll_action`].
//!
//! One module per job: `actions` (what the driver is asked to do), `conn_table` (the
//! connections by id), `connections` (handshake, admission, failure), `credits` (the pool windows are granted from), `send` (eager and rendezvous sends, credit
//! flow), `matching` (posted and unexpected receives, probes, cancel), `budget` (the
//! unexpected-message budget and the credits withheld past it), `rendezvous` (the
//! receiver's READs), `rndv_timeout` (the sender's optional deadline for them) and `frames`
//! (decoding and dispatching arrivals).

mod actions;
mod budget;
mod conn_table;
mod connections;
mod credits;
mod frames;
mod matching;
mod one_sided;
mod rendezvous;
mod rndv_timeout;
mod send;

pub use actions::{
    Action, CloseReason, Completion, PayloadRef, RemoteBuf, RequestKind, Status, VerbsOp,
};
pub use credits::CreditStats;
pub use frames::Delivery;
pub use one_sided::VerbsFailure;
pub use rendezvous::MAX_READS_PER_CONN;

use conn_table::ConnTable;
use credits::CreditPool;

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

use log::{debug, warn};

use crate::config::{Config, UNEXPECTED_ENTRY_COST};
use crate::requests::{made_of, receive_id, Requests, IMMEDIATE, RECEIVE};
use crate::wire::{
    self, Body, FrameBuf, Handshake, Header, Opcode, RtsBody, WireStatus, HANDSHAKE_MAGIC,
    HEADER_LEN, MAX_CTRL_FRAME, VERSION,
};
use crate::{ConnId, Error, MessageId, RecvBufId, RequestId, Tag, UserBufId};

/// This side's limits on one connection: the receive buffer size its handshake advertises
/// (also the largest frame it accepts there) and its eager threshold (capped per connection
/// by the peer's receive buffers). By default the configuration's; a driver whose transports
/// differ gives each connection its transport's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Bytes of each receive buffer (the largest frame the peer may send).
    pub recv_buf_size: u32,
    /// Largest payload this side sends eagerly.
    pub eager_threshold: u64,
    /// Credits this side grants the peer at connect (its handshake's `credits`). From the
    /// pool (`pooled`), kept within `Config::initial_credits..=Config::credits`:
    /// [`Engine::credit_offer`]. Otherwise the whole window, as given.
    pub credits: u16,
    /// Whether the window is granted from the worker's pool of receive buffers (an SRQ's:
    /// it starts at `credits`, grows on demand and gives back under pressure, see the
    /// `credits` module). A link that holds the frames in flight itself — shared memory's
    /// ring — grants a fixed window of `credits` instead, never taken from the pool, grown
    /// or reclaimed; its handshake's `max_credits` is that window.
    pub pooled: bool,
    /// Bytes each READ of a rendezvous this side receives on the connection fetches (0: the
    /// engine's `Config::rndv_chunk_size`). A transport whose READ is one system call copying
    /// the bytes (shared memory's CMA) wants larger chunks than a NIC's pipeline does.
    pub rndv_chunk: u64,
    /// Whether the link performs one-sided operations itself, with the NIC's verbs (RDMA
    /// WRITE, READ and atomics: [`Action::RmaVerbs`]), on keys that carry an RDMA part;
    /// otherwise they go as messages the target's engine performs.
    pub verbs_rma: bool,
}

/// An unexpected message found by [`Engine::probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeInfo {
    /// Handle for [`Engine::msg_recv`].
    pub msg: MessageId,
    /// Connection it arrived on.
    pub conn: ConnId,
    /// Sender tag.
    pub tag: Tag,
    /// Message length.
    pub len: u64,
    /// Whether it is a rendezvous message (data not yet transferred).
    pub rendezvous: bool,
}

/// Flow-control and protocol state of one connection, for inspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnStats {
    /// Frames this side may still send.
    pub tx_credits: u32,
    /// Frames received whose buffers were not yet granted back to the peer (but for those
    /// of one-sided operations whose replies wait: [`ConnStats::replies_waiting`]).
    pub rx_unreturned: u32,
    /// Credits this side grants the peer in all (its window: what it holds, what is in
    /// flight and what is owed back to it).
    pub window: u32,
    /// Largest payload sent eagerly on this connection.
    pub eager_limit: u64,
    /// The most credits the peer may grant this side (its handshake's `max_credits`): the
    /// most frames this side can ever have in flight to it.
    pub peer_max_credits: u32,
    /// Frames waiting for credits (data and control).
    pub queued: usize,
    /// Rendezvous READs in flight on it (at most [`MAX_READS_PER_CONN`], or the
    /// configuration's `max_reads_in_flight` if more).
    pub reads_in_flight: u32,
    /// Of `queued`, replies to the peer's one-sided operations. Each holds back the credit
    /// of its operation's frame until it leaves (those credits are not in
    /// `rx_unreturned`): a peer that withholds credits makes this side hold at most its
    /// window of replies.
    pub replies_waiting: u32,
    /// Credits owed to the peer for frames that arrived unexpected past the worker's
    /// unexpected-message budget, withheld until receives bring it back within the budget
    /// (see [`Engine::unexpected_bytes`]).
    pub withheld: u32,
    /// Bytes held for the peer's unexpected messages (its part of
    /// [`Engine::unexpected_bytes`]).
    pub unexpected_bytes: u64,
}

#[derive(Debug)]
enum SendPhase {
    EagerQueued,
    RtsQueued {
        remote: Option<RemoteBuf>,
    },
    AwaitAts,
    /// A one-sided operation or a flush (boxed: no tag send pays for its size).
    Rma(Box<one_sided::RmaState>),
}

impl SendPhase {
    /// The kind of request it is.
    fn kind(&self) -> RequestKind {
        match self {
            SendPhase::Rma(r) => r.kind(),
            _ => RequestKind::Send,
        }
    }

    /// Whether its buffer was handed to the driver to expose (a rendezvous send's).
    fn exposes(&self) -> bool {
        matches!(self, SendPhase::RtsQueued { .. } | SendPhase::AwaitAts)
    }
}

#[derive(Debug)]
struct SendReq {
    conn: ConnId,
    tag: Tag,
    buf: UserBufId,
    len: u64,
    phase: SendPhase,
}

#[derive(Debug)]
struct Reading {
    conn: ConnId,
    remote: RemoteBuf,
    sreq: u64,
    total: u64,
    /// Bytes each READ fetches: its connection's ([`ConnLimits::rndv_chunk`]).
    chunk: u64,
    next_offset: u64,
    done: u64,
    outstanding: Vec<(u64, u64)>,
    failed: Option<Status>,
    conn_dead: bool,
    /// Whether it waits in its connection's `reads_waiting` for READs to issue.
    waiting: bool,
}

/// A receive a rendezvous matched, kept (in `Engine::recvs`) while its data is read and
/// until its completion is reported.
#[derive(Debug)]
struct RecvReq {
    buf: UserBufId,
    /// Sender tag.
    tag: Tag,
    /// `None` once nothing is read any more (the ATS waits to leave). (Not boxed: only
    /// receives a rendezvous matched are kept, so no small message pays for its size.)
    reading: Option<Reading>,
}

/// A posted receive no message matched yet: all the engine keeps of it (no request slot,
/// see `requests::RECEIVE`).
#[derive(Debug)]
struct Posted {
    req: RequestId,
    tag: Tag,
    mask: Tag,
    buf: UserBufId,
    cap: u64,
}

#[derive(Debug)]
enum UnexpKind {
    Eager(Vec<u8>),
    Rts { sreq: u64, body: RtsBody },
}

#[derive(Debug)]
struct Unexpected {
    id: MessageId,
    conn: ConnId,
    tag: Tag,
    kind: UnexpKind,
}

impl Unexpected {
    fn len(&self) -> u64 {
        match &self.kind {
            UnexpKind::Eager(d) => d.len() as u64,
            UnexpKind::Rts { body, .. } => body.len,
        }
    }

    fn info(&self) -> ProbeInfo {
        ProbeInfo {
            msg: self.id,
            conn: self.conn,
            tag: self.tag,
            len: self.len(),
            rendezvous: matches!(self.kind, UnexpKind::Rts { .. }),
        }
    }
}

#[derive(Debug)]
enum Ctrl {
    /// The ATS that ends a rendezvous; `then` is the receive's completion, reported once the
    /// ATS has left (so a receiver waiting for its receive keeps progressing until the
    /// sender can complete too, even when the ATS waits for credits).
    Ats {
        sreq: u64,
        rreq: u64,
        status: WireStatus,
        then: Option<Completion>,
    },
    /// The answer to a peer's put, get or atomic operation (see `one_sided`).
    RmaReply(Box<one_sided::Reply>),
}

#[derive(Debug)]
struct Conn {
    peer: Handshake,
    /// This side's receive buffer size on this connection: the largest frame accepted.
    recv_buf_size: u32,
    eager_limit: u64,
    tx_credits: u32,
    /// Whether this side ran out of credits with frames waiting since its last frame (the
    /// next one asks for a larger window).
    starved: bool,
    /// Credits granted to the peer in all (see [`ConnStats::window`]) but those withheld: what
    /// the peer may have in flight, hold or be owed (withheld ones are counted apart, so that
    /// every check of a frame's credits, on the path of every message, is as it was).
    window: u32,
    /// Whether `window` was granted from the pool (see [`ConnLimits::pooled`]).
    pooled: bool,
    /// Bytes each rendezvous READ on it fetches ([`ConnLimits::rndv_chunk`], 0 resolved).
    rndv_chunk: u64,
    /// Frames received (and credits added to the window) not yet granted back to the peer.
    /// (CREDIT frames cost no credit: see `send::CTRL_CREDITS`.)
    rx_unreturned: u32,
    /// Credits owed to the peer but withheld: its frames arrived unexpected past the
    /// unexpected-message budget (see `budget`). Granted to it, but in neither `window` nor
    /// `rx_unreturned` until they go back.
    withheld: u32,
    /// Bytes held for the peer's unexpected messages, against the budget (see `budget`).
    unexpected: u64,
    tx_seq: u32,
    rx_seq: u32,
    ctrl_q: VecDeque<Ctrl>,
    data_q: VecDeque<RequestId>,
    /// One-sided operations on it whose frames went out and whose replies have not all
    /// come back: what a flush, and an operation after a fence, wait for.
    rma_pending: u32,
    /// Replies to the peer's one-sided operations in `ctrl_q`. The credit of each
    /// operation's frame is held back (out of `rx_unreturned`, in the window still) until
    /// its reply leaves, carrying it: a peer can have at most its window of operations
    /// whose replies wait, however it withholds credits ([`ConnStats::replies_waiting`]).
    replies_waiting: u32,
    /// A fence was made: the next one-sided operation waits for every earlier one.
    fence_next: bool,
    /// Whether one-sided operations go by verbs where their keys allow ([`ConnLimits::verbs_rma`]).
    verbs_rma: bool,
    /// Rendezvous READs issued on it and not yet complete: at most
    /// [`Engine::reads_per_conn`] (see [`MAX_READS_PER_CONN`]).
    reads_out: u32,
    /// Receives with READs to issue that found the connection's READs all in flight, in
    /// the order they found it so.
    reads_waiting: VecDeque<RequestId>,
}

/// An id for a request that completes as it is made and is never stored, from the engine's
/// counter `next`.
fn immediate_id(next: &mut u64) -> RequestId {
    let id = RequestId(IMMEDIATE | *next);
    *next = (*next + 1) & !IMMEDIATE;
    id
}

fn perr(s: String) -> CloseReason {
    CloseReason::ProtocolError(s)
}

fn matches(msg_tag: Tag, tag: Tag, mask: Tag) -> bool {
    (msg_tag & mask) == (tag & mask)
}

/// The sans-IO protocol engine of one worker (one SRQ shared by all its connections).
#[derive(Debug)]
pub struct Engine {
    cfg: Config,
    now: u64,
    next_msg: u64,
    conns: ConnTable,
    credits: CreditPool,
    /// Sends, in a slab (see `requests`).
    reqs: Requests<SendReq>,
    /// Receives a rendezvous matched (a posted receive is only in `posted`).
    recvs: HashMap<RequestId, RecvReq>,
    /// The next id of a request that completed as it was made (see `requests::IMMEDIATE`).
    next_immediate: u64,
    posted: VecDeque<Posted>,
    unexpected: VecDeque<Unexpected>,
    /// Messages taken out of matching by [`Engine::probe_remove`], waiting for their
    /// [`Engine::msg_recv`].
    claimed: HashMap<MessageId, Unexpected>,
    draining: Vec<(u64, RequestId)>,
    actions: VecDeque<Action>,
    /// Emptied lists of outstanding READs, reused by the next rendezvous receives.
    spare_reads: Vec<Vec<(u64, u64)>>,
    /// Allocations of unexpected eager payloads the driver handed back
    /// ([`Engine::recycle_payload`]), reused by the next unexpected messages.
    spare_payloads: Vec<Vec<u8>>,
    /// The regions peers' one-sided operations reach ([`Engine::set_rma_memory`]).
    rma_memory: one_sided::Memory,
    /// Worker-wide flushes waiting for operations ([`Engine::rma_flush_all`]).
    worker_flushes: Vec<one_sided::WorkerFlush>,
    /// Bytes held for unexpected messages, queued or claimed (see `budget`).
    unexpected_bytes: u64,
    /// Connections that may have credits withheld (see `budget`).
    withholding: Vec<ConnId>,
    /// Of `unexpected_bytes`, those of connections gone (see `budget`).
    orphaned_bytes: u64,
    /// Rendezvous sends whose RTS went out since the clock last advanced, and those whose
    /// deadline is set, in deadline order (see `rndv_timeout`).
    rndv_timeouts: rndv_timeout::Deadlines,
}

/// How many handed-back payload allocations the engine keeps for reuse, and the largest it
/// keeps (a TCP frame): at most 2 MiB held for reuse, usually a few KiB.
const SPARE_PAYLOADS: usize = 32;
const SPARE_PAYLOAD_MAX: usize = 64 * 1024;

impl Engine {
    /// Creates an engine with a validated configuration.
    pub fn new(cfg: Config) -> Self {
        Engine {
            credits: CreditPool::new(cfg.srq_depth, cfg.initial_credits, cfg.credits),
            cfg,
            now: 0,
            next_msg: 1,
            conns: ConnTable::default(),
            reqs: Requests::default(),
            recvs: HashMap::default(),
            next_immediate: 0,
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            claimed: HashMap::default(),
            draining: Vec::new(),
            actions: VecDeque::new(),
            spare_reads: Vec::new(),
            spare_payloads: Vec::new(),
            rma_memory: one_sided::Memory::default(),
            worker_flushes: Vec::new(),
            unexpected_bytes: 0,
            withholding: Vec::new(),
            orphaned_bytes: 0,
            rndv_timeouts: rndv_timeout::Deadlines::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The handshake to send to a peer at connect (encode with [`Handshake::encode`]).
    pub fn local_handshake(&self) -> Handshake {
        self.local_handshake_for(&self.default_limits())
    }

    /// The handshake for a connection with `limits` (a driver whose transports differ in
    /// receive buffer size); the same `limits` must go to
    /// [`Engine::handle_connection_up_with`].
    pub fn local_handshake_for(&self, limits: &ConnLimits) -> Handshake {
        let (credits, max_credits) = if limits.pooled {
            (
                limits
                    .credits
                    .clamp(self.cfg.initial_credits, self.cfg.credits),
                self.cfg.credits,
            )
        } else {
            (limits.credits, limits.credits)
        };
        Handshake {
            magic: HANDSHAKE_MAGIC,
            version: VERSION.into(),
            recv_buf_size: limits.recv_buf_size,
            credits,
            max_credits,
        }
    }

    /// The configuration's own limits, granting `Config::initial_credits`: what
    /// [`Engine::local_handshake`] and [`Engine::handle_connection_up`] use (a driver that
    /// wants the pool's [`Engine::credit_offer`] puts it in the limits it passes to
    /// [`Engine::local_handshake_for`] and [`Engine::handle_connection_up_with`]).
    pub fn default_limits(&self) -> ConnLimits {
        ConnLimits {
            recv_buf_size: self.cfg.recv_buf_size,
            eager_threshold: self.cfg.eager_threshold,
            credits: self.cfg.initial_credits,
            pooled: true,
            rndv_chunk: self.cfg.rndv_chunk_size,
            verbs_rma: false,
        }
    }

    /// The credits a connection made now would be granted at connect: a 128th of the
    /// pool's free buffers, between `Config::initial_credits` and `Config::credits`.
    pub fn credit_offer(&self) -> u16 {
        self.credits.offer()
    }

    /// Next action for the driver, in order.
    #[inline]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether actions wait for the driver ([`Engine::poll_action`]).
    #[inline]
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Earliest time (ns) at which [`Engine::handle_timeout`] has work to do (0: at once,
    /// with the current time: a rendezvous send's deadline is to be set from it).
    #[inline]
    pub fn poll_timeout(&self) -> Option<u64> {
        // (After every locked section of a driver: most often there is nothing to wait for.)
        if self.draining.is_empty() && self.rndv_timeouts.is_empty() {
            return None;
        }
        self.earliest_timeout()
    }

    /// [`Engine::poll_timeout`] with timers to look at. (Out of line: inlined into every
    /// locked section of the worker, a larger body made the progress call it sits in cost
    /// more, whatever ran.)
    #[cold]
    #[inline(never)]
    fn earliest_timeout(&self) -> Option<u64> {
        let drain = self.draining.iter().map(|d| d.0).min();
        match self.rndv_timeouts.next() {
            Some(at) => Some(drain.map_or(at, |d| d.min(at))),
            None => drain,
        }
    }

    /// Number of user requests not yet completed.
    pub fn pending_requests(&self) -> usize {
        self.reqs.len() + self.recvs.len() + self.posted.len()
    }

    /// How many messages have ever been queued as unexpected: grows with each arrival that
    /// no posted receive matched (a driver wakes probing waiters when it changes).
    pub fn unexpected_arrivals(&self) -> u64 {
        self.next_msg
    }

    /// Number of messages in the unexpected queue.
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }

    /// Flow-control state of a connection.
    pub fn conn_stats(&self, conn: ConnId) -> Option<ConnStats> {
        self.conns.get(&conn).map(|c| ConnStats {
            tx_credits: c.tx_credits,
            rx_unreturned: c.rx_unreturned,
            window: c.window + c.withheld,
            eager_limit: c.eager_limit,
            peer_max_credits: u32::from(c.peer.max_credits),
            queued: c.ctrl_q.len() + c.data_q.len(),
            reads_in_flight: c.reads_out,
            replies_waiting: c.replies_waiting,
            withheld: c.withheld,
            unexpected_bytes: c.unexpected,
        })
    }

    /// The driver's receive buffers run low (e.g. the SRQ limit event): windows above the
    /// initial grant shrink as their credits come back, as when the pool refuses a request.
    pub fn handle_receive_pressure(&mut self) {
        self.credits.pressure();
    }

    /// What the credit pool did so far (how many credits are granted, grown, refused).
    pub fn credit_stats(&self) -> CreditStats {
        self.credits.stats()
    }

    /// Hands back the bytes of an executed [`Action::CopyToUser`]: the next unexpected eager
    /// message is copied into their allocation instead of a new one, so that a steady stream
    /// of unexpected messages allocates nothing. Optional; a driver may drop them instead.
    pub fn recycle_payload(&mut self, data: Vec<u8>) {
        if self.spare_payloads.len() < SPARE_PAYLOADS
            && data.capacity() > 0
            && data.capacity() <= SPARE_PAYLOAD_MAX
        {
            self.spare_payloads.push(data);
        }
    }

    /// An engine-held copy of an unexpected eager payload, in a recycled allocation when
    /// one is at hand.
    fn payload_copy(&mut self, payload: &[u8]) -> Vec<u8> {
        if payload.is_empty() {
            return Vec::new();
        }
        match self.spare_payloads.pop() {
            Some(mut v) => {
                v.clear();
                v.extend_from_slice(payload);
                v
            }
            None => payload.to_vec(),
        }
    }

    // (Once per message: inlined, as the request tables' operations are; see
    // `worker::requests`.)
    #[inline(always)]
    fn new_send(&mut self, s: SendReq) -> RequestId {
        self.reqs.insert(s)
    }

    /// The id of a new receive (in no slot: see `requests::RECEIVE`).
    #[inline(always)]
    fn new_recv_id(&mut self) -> RequestId {
        receive_id(self.reqs.stamp())
    }

    fn complete(
        &mut self,
        request: RequestId,
        kind: RequestKind,
        status: Status,
        length: u64,
        tag: Tag,
        conn: Option<ConnId>,
    ) {
        let done = Completion {
            request,
            kind,
            status,
            length,
            tag,
            conn,
            // (Filled in by `report`.)
            buf: None,
        };
        report(&mut self.reqs, &mut self.recvs, &mut self.actions, done);
        if !self.worker_flushes.is_empty()
            && matches!(
                kind,
                RequestKind::Put | RequestKind::Get | RequestKind::Atomic
            )
        {
            self.rma_completed(request);
        }
    }

    /// The requests on `conn` that a failure ends (sends, and receives reading from it), in
    /// the order they were made.
    fn requests_on(&self, conn: ConnId) -> Vec<RequestId> {
        let mut ids = self.reqs.ids_made(|s| s.conn == conn);
        ids.extend(
            self.recvs
                .iter()
                .filter(|(_, r)| r.reading.as_ref().is_some_and(|x| x.conn == conn))
                .map(|(&id, _)| (made_of(id), id)),
        );
        ids.sort_unstable_by_key(|&(made, _)| made);
        ids.into_iter().map(|(_, id)| id).collect()
    }
}

/// Forgets the request `done` completes and queues its completion, with the request's
/// buffer (unless the completion names it already): the one way a request ends (a
/// function of the fields, for callers that hold other parts of the engine borrowed).
fn report(
    reqs: &mut Requests<SendReq>,
    recvs: &mut HashMap<RequestId, RecvReq>,
    actions: &mut VecDeque<Action>,
    mut done: Completion,
) {
    let buf = match done.kind {
        RequestKind::Recv => recvs.remove(&done.request).map(|r| r.buf),
        _ => {
            let buf = reqs.get(done.request).map(|s| s.buf);
            reqs.discard(done.request);
            buf
        }
    };
    done.buf = done.buf.or(buf);
    actions.push_back(Action::Complete(done));
}
