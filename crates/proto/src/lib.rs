//! # rdmx-proto — the sans-IO protocol engine of rdmx
//!
//! Modelled on `quinn-proto`: the [`Engine`] performs no IO, reads no clock, owns no IO
//! memory and contains no `unsafe`. The driver (an RDMA worker, or later a TCP one) feeds
//! it inputs — frames received into SRQ buffers ([`Engine::handle_frame`]), send and RDMA
//! READ completions, user operations ([`Engine::tag_send`], [`Engine::tag_recv`],
//! [`Engine::probe`], [`Engine::msg_recv`], [`Engine::cancel`]), connection up/down and
//! the current time — and executes the [`Action`]s returned by [`Engine::poll_action`]
//! **in order**. Buffers are named by handles ([`RecvBufId`], [`UserBufId`]); remote
//! addresses and keys are opaque `u64`/`u32` values ([`RemoteBuf`]).
//!
//! ## Protocols
//!
//! * **Eager** — a message of at most the connection's eager limit
//!   (`min(Config::eager_threshold, peer recv_buf_size − 40)`) travels in one EAGER frame;
//!   the driver appends the payload to the header ([`Action::SendFrame`]) and the send
//!   request completes right after that action (the data has been copied, as in UCP). A
//!   send that goes out as it is made completes without an [`Action::Complete`]: its id says
//!   so ([`RequestId::is_immediate`]) and the driver completes it once it executed the
//!   frame. At the receiver, a matching posted receive gets an
//!   [`Action::CopyFromRecvBuf`]; otherwise the payload is copied into the engine's
//!   unexpected queue. Either way the engine never keeps the SRQ buffer: it is the driver's
//!   to repost once the actions that [`Engine::handle_frame`] queued are executed, so a slow
//!   application never starves the SRQ. A later matching receive gets an
//!   [`Action::CopyToUser`] and completes as it is made: its id too is immediate, it is
//!   never stored, and its [`Action::Complete`] follows the copy among the actions that
//!   [`Engine::tag_recv`] queued.
//! * **Rendezvous** — larger messages: the engine asks the driver to expose the send
//!   buffer ([`Action::ExposeSendBuffer`] → [`Engine::handle_send_buffer_exposed`]), then
//!   sends RTS(addr, len, rkey, request id). When a receive matches, the receiver issues
//!   [`Action::RdmaRead`]s of at most `rndv_chunk_size` straight into the user buffer,
//!   at most `max_reads_in_flight` at a time — and at most [`MAX_READS_PER_CONN`] on one
//!   connection over all its receives, the others waiting in order — then sends ATS; the
//!   sender releases its buffer ([`Action::ReleaseSendBuffer`]) and completes. A sender
//!   that answers READs itself (TCP) can rely on that bound. An unexpected RTS waits for a
//!   matching receive. A too-small receive buffer completes the receive with
//!   [`Status::Truncated`] and the send with [`Status::RemoteTruncated`] — nothing is
//!   delivered. (An eager send has already completed when the receiver sees the
//!   truncation; only the receiver gets `Truncated`.)
//! * **Tag matching** (UCP semantics) — `(msg_tag & mask) == (tag & mask)`; mask 0 is a
//!   wildcard. Messages of one connection are matched in send order (RC delivers frames in
//!   order and the engine keeps a FIFO per connection, including a rendezvous send whose
//!   buffer exposure is pending); posted receives are matched in posting order; the
//!   unexpected queue is searched in arrival order. [`Engine::probe`] peeks without
//!   receiving.
//! * **Cancel** — an unmatched receive completes with [`Status::Cancelled`]; a matched one
//!   cannot be cancelled. A send that has not completed (a queued eager, or a rendezvous
//!   before ATS) completes with `Cancelled` and its exposure is released; a receiver that
//!   later reads it gets [`Status::ReadFailed`].
//! * **Connection down** — every pending send on the connection and every receive
//!   reading from it completes with [`Status::ConnectionClosed`] (receives with READs in
//!   flight once those are reported, at the latest `drain_timeout_ns` later, see
//!   [`Engine::handle_timeout`]). Its unexpected messages stay queued in arrival order: an
//!   eager one is received as usual, and a receive that matches a rendezvous one (its data
//!   can no longer be read) completes with `ConnectionClosed`, so a receiver never sees a
//!   connection's later message in place of an earlier one it lost. Other connections are
//!   untouched. Posted receives are worker-wide and stay posted.
//!
//! * **One-sided operations** — put, get, fetch-and-add and compare-and-swap on a peer's
//!   region, and flush and fence ([`Engine::rma_put`] and the rest): frames the target's
//!   engine executes as they arrive, through the driver's [`rma::RmaMemory`], and
//!   answers; completed by the answer. The target's bookkeeping of regions mapped for
//!   remote access, their packed keys and the check of every remote access: [`rma`]. What
//!   a peer's operations make the target spend is the target's to bound, whatever the peer
//!   declares: a peer's handshake may declare receive buffers of at most
//!   [`MAX_RECV_BUF_SIZE`]; a get asks at most what a reply carries into the smaller of both
//!   sides' buffers (more is a protocol error), and one refused allocates nothing; the
//!   credit of each operation is held until its reply leaves, so a peer has at most its
//!   window of replies waiting ([`ConnStats::replies_waiting`]).
//!
//! ## Wire format (version 1)
//!
//! Every frame starts with a 40-byte little-endian header:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 2 | magic `b"RX"` |
//! | 2  | 1 | version (1) |
//! | 3  | 1 | opcode: 1 EAGER, 2 RTS, 3 ATS, 4 ERROR/NACK, 5 CREDIT, 6 HANDSHAKE, 7 PUT, 8 GET, 9 FETCH_ADD, 10 COMPARE_SWAP, 11 RMA_REPLY |
//! | 4  | 1 | flags: 1 = credit wanted (the sender ran out of credits); other bits must be 0 |
//! | 5  | 1 | status (ATS/ERROR: 0 ok, 1 truncated, 2 read failed, 3 protocol; RMA_REPLY: 0 ok, 4 bad key (also a stale key), 5 stale key (no longer sent; read as 4), 6 out of bounds, 7 unaligned, 8 not permitted; else 0) |
//! | 6  | 2 | credits granted back to the frame's receiver |
//! | 8  | 4 | sequence number (per connection and direction, every frame, wrapping) |
//! | 12 | 4 | payload length (bytes after the header; must match exactly) |
//! | 16 | 8 | tag (one-sided frames: the offset in the remote region) |
//! | 24 | 8 | sender request id (RTS, ATS; one-sided: the initiator's request) |
//! | 32 | 8 | receiver request id (ATS, informational; FETCH_ADD: the addend, COMPARE_SWAP: the new value, RMA_REPLY: an atomic's old value) |
//!
//! EAGER carries the payload; RTS carries a 24-byte body `addr: u64, rkey: u32,
//! reserved: u32 (0), len: u64`; ATS, ERROR and CREDIT have no body. PUT, GET,
//! FETCH_ADD and COMPARE_SWAP carry a 24-byte [`wire::RmaBody`] `region: u32, generation:
//! u32, secret: u64, word: u64` (GET: the length; COMPARE_SWAP: the expected value;
//! FETCH_ADD: 0), a PUT then its bytes; RMA_REPLY carries a GET's bytes. [`wire::decode`]
//! never panics; any malformed frame, a sequence gap, a credit overrun or an ERROR from
//! the peer closes that connection only ([`Action::CloseConnection`]).
//!
//! The connection [`Handshake`] (magic, version, receive-buffer size, initial credits,
//! largest window) is bincode-1.3 encoded in 14 bytes for rdmacm private data (≤ 56 bytes); it is
//! the only place serde is used. A sender's eager limit honours the peer's buffer size, so
//! peers with different thresholds and buffer sizes interoperate.
//!
//! ## Flow control
//!
//! Receive buffers come from one pool per engine (the worker's SRQ, `Config::srq_depth`),
//! and nothing of it is reserved per connection beyond a small initial grant: each side
//! grants its peer `Config::initial_credits` frames at connect (the handshake's
//! `credits`); every frame costs the sender one credit but a CREDIT frame, which costs none
//! and must grant at least one (a CREDIT frame granting nothing costs a credit like any
//! other frame), and the receiver returns a credit for each frame whose buffer it reposted,
//! piggybacked on the `credits` header field of any frame it sends, or in a standalone
//! CREDIT frame once `max(2, window / 4)` are owed, or all it is owed would leave the peer
//! fewer than the two credits a message needs. A sender that ran out of credits with frames
//! waiting sets the credit-wanted flag on its next frame, and the receiver doubles that
//! peer's window from the pool, up to `Config::credits` (the handshake's `max_credits`);
//! when the pool cannot serve such a request, windows above the initial grant are halved as
//! their credits come back ([`Engine::credit_stats`] counts all this). A message (EAGER,
//! RTS) is only sent while at least two credits remain; a control frame (ATS, RMA reply)
//! or a one-sided request with one. As CREDIT frames are free, a side can always give
//! credits back, which rules out credit deadlock, and no credit is ever owed for a CREDIT
//! frame, so none calls for another (as UCX's pure grants). No connection is refused: up to
//! `srq_depth / initial_credits` connections (1024 by default) the pool can never be
//! overrun by well-behaved peers' windows; past that, initial grants overcommit it and RC's
//! RNR retry (over TCP, the socket's own flow control) is the backstop, as it is for CREDIT
//! frames in flight. A peer exceeding its credits is a protocol error.
//!
//! **The unexpected-message budget.** Messages no receive matched are copied into the engine
//! (the receive buffer goes back at once). Past `Config::max_unexpected` bytes held, the
//! credit of each frame that arrives unexpected is withheld from a peer holding more than
//! its share of the budget (an equal part per connection), so that peer waits on credit
//! instead of the queue growing; its control frames still go (it keeps the one credit they
//! need), and its credits come back as receives drain the queue (see
//! [`Engine::unexpected_bytes`], [`ConnStats::withheld`]). A peer that sends a message
//! without the credits for it while its credits are withheld is a protocol error.
//!
//! **The rendezvous timeout.** With `Config::rndv_timeout_ns` set (0, none, by default), a
//! rendezvous send not ended by an ATS within it after its RTS went out completes with
//! [`Status::TimedOut`] and its exposure is released; a later READ of it fails, a late ATS
//! is ignored, and the connection stays up. The engine's clock is [`Engine::handle_timeout`].
//!
//! ## Configuration
//!
//! [`Config`] defaults: 8 KiB receive buffers, eager threshold 8152 bytes (a full buffer
//! minus the header), windows of 4 credits growing to 64 per connection, SRQ depth 4096, 256 KiB READ chunks,
//! 4 READs in flight, an unexpected-message budget of 64 MiB, no rendezvous timeout. [`ConfigBuilder::from_env`] reads `RDMX_EAGER_THRESHOLD` (bytes,
//! suffixes `k`/`K`/`KiB`/`m`/`M`/`MiB`, range 0..=1 MiB); an invalid value is an
//! [`Error::InvalidConfig`] naming the variable, the value and the allowed range.
//! Programmatic setters on [`ConfigBuilder`] override the environment.
#![forbid(unsafe_code)]

pub mod config;
pub mod engine;
mod error;
mod requests;
pub mod rma;
pub mod wire;

pub use config::{Config, ConfigBuilder, EAGER_THRESHOLD_VAR};
pub use engine::{
    Action, CloseReason, Completion, ConnLimits, ConnStats, CreditStats, Delivery, Engine,
    PayloadRef, ProbeInfo, RemoteBuf, RequestKind, Status, VerbsFailure, VerbsOp,
    MAX_READS_PER_CONN,
};
pub use error::{Error, Unit};
pub use wire::{Handshake, HEADER_LEN, MAX_HANDSHAKE_LEN, MAX_RECV_BUF_SIZE};

/// A message tag.
pub type Tag = u64;

/// A connection, named by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// A user request (send or receive), named by the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl RequestId {
    /// The index of the engine's slot that holds the send: small and dense among the sends
    /// alive at once (a slot is reused, under another id, once its send ends), so a driver
    /// can keep per-send state in an array indexed by it, checking the whole id. `None` for
    /// an id no slot holds: a send that completed as it was made, and every receive (the
    /// engine keeps a posted receive in its queue of posted receives only, and a receive's
    /// id is never reused). A driver finds a receive by its buffer's [`UserBufId`].
    pub fn index(self) -> Option<usize> {
        requests::index_of(self)
    }

    /// Whether this names a request that completed as it was made and was never stored:
    /// - a send: [`Engine::tag_send`] put its frame in the action queue and the engine
    ///   reports no [`Action::Complete`] for it — the driver completes it (status
    ///   [`Status::Ok`], the send's length and tag) once it has executed the actions that
    ///   call queued;
    /// - a receive: [`Engine::tag_recv`] found its message already arrived eagerly, and its
    ///   [`Action::Complete`] is the last of the actions that call queued.
    ///
    /// Never true of any other request; such an id cannot be cancelled.
    pub fn is_immediate(self) -> bool {
        self.0 & requests::IMMEDIATE != 0
    }
}

/// An SRQ receive buffer, named by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecvBufId(pub u64);

/// A user buffer, named by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserBufId(pub u64);

/// An unexpected message found by [`Engine::probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub u64);
