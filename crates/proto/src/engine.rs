//! The protocol engine: inputs via `handle_*` and user operations, outputs via
//! [`Engine::poll_action`].

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

use log::{debug, warn};

use crate::config::Config;
use crate::requests::{Requests, IMMEDIATE};
use crate::wire::{
    self, Body, FrameBuf, Handshake, Header, Opcode, RtsBody, WireStatus, HANDSHAKE_MAGIC,
    HEADER_LEN, MAX_CTRL_FRAME, VERSION,
};
use crate::{ConnId, Error, MessageId, RecvBufId, RequestId, Tag, UserBufId};

/// Where a rendezvous send buffer was exposed by the sender's driver (opaque values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// Remote address (RDMA virtual address, or a transport token).
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// Final status of a user request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Completed successfully.
    Ok,
    /// Receive: the message was larger than the buffer; nothing was delivered.
    Truncated,
    /// Cancelled by [`Engine::cancel`].
    Cancelled,
    /// Send: the receiver's matching buffer was too small; the message was not delivered.
    RemoteTruncated,
    /// Send: the receiver could not read the exposed buffer.
    RemoteReadFailed,
    /// Receive: an RDMA READ of the sender's buffer failed.
    ReadFailed,
    /// Send: exposing the send buffer failed.
    ExposeFailed,
    /// The connection failed or was closed before the request finished.
    ConnectionClosed,
}

/// Kind of a user request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// A tag send.
    Send,
    /// A tag receive.
    Recv,
}

/// Completion of a user request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The request.
    pub request: RequestId,
    /// Send or receive.
    pub kind: RequestKind,
    /// Outcome.
    pub status: Status,
    /// Message length in bytes (for `Truncated`, the length of the incoming message).
    pub length: u64,
    /// The message's tag (the sender's tag, for receives).
    pub tag: Tag,
    /// The connection involved (`None` for a receive that never matched).
    pub conn: Option<ConnId>,
}

/// Why the engine closes a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The peer sent something invalid (malformed frame, credit overrun, bad sequence...).
    ProtocolError(String),
    /// The peer reported an error and is closing.
    PeerError(WireStatus),
    /// A send completion reported failure.
    SendFailed,
    /// Closed locally through [`Engine::close`].
    Local,
}

/// User payload to append after a frame header (eager sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef {
    /// The user's send buffer.
    pub buf: UserBufId,
    /// Bytes from the start of the buffer.
    pub len: u64,
}

/// Something the driver must do. Actions must be executed in the order they are polled.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Post a SEND of `frame` followed by `payload` (if any) from the user's buffer.
    /// The driver copies both into a registered send buffer; an eager send's
    /// [`Action::Complete`] follows this action, so the user buffer may be reused once
    /// the copy is done.
    SendFrame {
        /// Connection.
        conn: ConnId,
        /// Encoded header (plus RTS body).
        frame: FrameBuf,
        /// Eager payload to append.
        payload: Option<PayloadRef>,
    },
    /// Register/expose `buf` (its first `len` bytes) for remote reads, then call
    /// [`Engine::handle_send_buffer_exposed`] (or `..._expose_failed`).
    ExposeSendBuffer {
        /// The send request.
        request: RequestId,
        /// The user buffer.
        buf: UserBufId,
        /// Bytes to expose.
        len: u64,
    },
    /// The exposure requested by `ExposeSendBuffer` is no longer needed (ATS arrived,
    /// cancel, or connection down). If exposure is still in progress, release it when done.
    ReleaseSendBuffer {
        /// The send request.
        request: RequestId,
        /// The user buffer.
        buf: UserBufId,
    },
    /// Post an RDMA READ of `len` bytes from `remote` into `dst` at `dst_offset`, then call
    /// [`Engine::handle_read_complete`] with the same request and `dst_offset` (every read
    /// must be reported, including flush errors).
    RdmaRead {
        /// Connection to read over.
        conn: ConnId,
        /// The receive request.
        request: RequestId,
        /// Remote address (already offset) and key.
        remote: RemoteBuf,
        /// Bytes to read.
        len: u64,
        /// Destination user buffer.
        dst: UserBufId,
        /// Offset in the destination.
        dst_offset: u64,
    },
    /// Copy `len` bytes at `src_offset` of SRQ buffer `src` into `dst` at `dst_offset`.
    /// Always precedes the `RepostRecv` of `src`.
    CopyFromRecvBuf {
        /// SRQ buffer.
        src: RecvBufId,
        /// Offset in the SRQ buffer (the header length).
        src_offset: usize,
        /// Bytes to copy.
        len: usize,
        /// Destination user buffer.
        dst: UserBufId,
        /// Offset in the destination.
        dst_offset: u64,
    },
    /// Copy engine-held bytes (an unexpected eager message) into `dst` at `dst_offset`.
    CopyToUser {
        /// Destination user buffer.
        dst: UserBufId,
        /// Offset in the destination.
        dst_offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Repost SRQ buffer `buf`.
    RepostRecv {
        /// SRQ buffer.
        buf: RecvBufId,
    },
    /// Complete a user request.
    Complete(Completion),
    /// Close the connection (the engine already forgot it and failed its requests).
    /// After a protocol error it is preceded by a best-effort `SendFrame` of an ERROR
    /// frame, which the driver should post before disconnecting.
    CloseConnection {
        /// Connection.
        conn: ConnId,
        /// Why.
        reason: CloseReason,
    },
}

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
    /// Frames received whose buffers were not yet granted back to the peer.
    pub rx_unreturned: u32,
    /// Largest payload sent eagerly on this connection.
    pub eager_limit: u64,
    /// Frames waiting for credits (data and control).
    pub queued: usize,
}

#[derive(Debug)]
enum SendPhase {
    EagerQueued,
    RtsQueued { remote: Option<RemoteBuf> },
    AwaitAts,
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
    next_offset: u64,
    done: u64,
    outstanding: Vec<(u64, u64)>,
    failed: Option<Status>,
    conn_dead: bool,
}

#[derive(Debug)]
struct RecvReq {
    buf: UserBufId,
    cap: u64,
    /// Sender tag once matched.
    tag: Tag,
    reading: Option<Reading>,
}

#[derive(Debug)]
enum Req {
    Send(SendReq),
    Recv(RecvReq),
}

#[derive(Debug)]
struct Posted {
    req: RequestId,
    tag: Tag,
    mask: Tag,
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
    Ats {
        sreq: u64,
        rreq: u64,
        status: WireStatus,
    },
}

#[derive(Debug)]
struct Conn {
    peer: Handshake,
    /// This side's receive buffer size on this connection: the largest frame accepted.
    recv_buf_size: u32,
    eager_limit: u64,
    tx_credits: u32,
    rx_unreturned: u32,
    tx_seq: u32,
    rx_seq: u32,
    ctrl_q: VecDeque<Ctrl>,
    data_q: VecDeque<RequestId>,
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
    conns: HashMap<ConnId, Conn>,
    reqs: Requests<Req>,
    /// The next id of a send that completed as it was made (see `requests::IMMEDIATE`).
    next_immediate: u64,
    posted: VecDeque<Posted>,
    unexpected: VecDeque<Unexpected>,
    /// Messages taken out of matching by [`Engine::probe_remove`], waiting for their
    /// [`Engine::msg_recv`].
    claimed: HashMap<MessageId, Unexpected>,
    draining: Vec<(u64, RequestId)>,
    actions: VecDeque<Action>,
}

impl Engine {
    /// Queues a message no posted receive matched, in arrival order.
    fn push_unexpected(&mut self, conn: ConnId, tag: Tag, kind: UnexpKind) {
        let id = MessageId(self.next_msg);
        self.next_msg += 1;
        self.unexpected.push_back(Unexpected {
            id,
            conn,
            tag,
            kind,
        });
    }

    /// Removes and returns the first posted receive (in posting order) whose tag and mask
    /// match `tag`.
    fn take_posted_match(&mut self, tag: Tag) -> Option<Posted> {
        let pos = self
            .posted
            .iter()
            .position(|p| matches(tag, p.tag, p.mask))?;
        self.posted.remove(pos)
    }

    /// Creates an engine with a validated configuration.
    pub fn new(cfg: Config) -> Self {
        Engine {
            cfg,
            now: 0,
            next_msg: 1,
            conns: HashMap::default(),
            reqs: Requests::default(),
            next_immediate: 0,
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            claimed: HashMap::default(),
            draining: Vec::new(),
            actions: VecDeque::new(),
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
    /// receive buffer size).
    pub fn local_handshake_for(&self, limits: &ConnLimits) -> Handshake {
        Handshake {
            magic: HANDSHAKE_MAGIC,
            version: VERSION.into(),
            recv_buf_size: limits.recv_buf_size,
            credits: self.cfg.credits,
            flags: 0,
        }
    }

    /// The configuration's own limits: what [`Engine::local_handshake`] and
    /// [`Engine::handle_connection_up`] use.
    pub fn default_limits(&self) -> ConnLimits {
        ConnLimits {
            recv_buf_size: self.cfg.recv_buf_size,
            eager_threshold: self.cfg.eager_threshold,
        }
    }

    /// Next action for the driver, in order.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Earliest time (ns) at which [`Engine::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.draining.iter().map(|d| d.0).min()
    }

    /// Number of user requests not yet completed.
    pub fn pending_requests(&self) -> usize {
        self.reqs.len()
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
            eager_limit: c.eager_limit,
            queued: c.ctrl_q.len() + c.data_q.len(),
        })
    }

    fn new_req(&mut self, r: Req) -> RequestId {
        self.reqs.insert(r)
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
        self.reqs.discard(request);
        self.actions.push_back(Action::Complete(Completion {
            request,
            kind,
            status,
            length,
            tag,
            conn,
        }));
    }

    // ------------------------------------------------------------------ connections

    /// A connection is established; `peer` is the handshake the peer sent.
    pub fn handle_connection_up(&mut self, conn: ConnId, peer: &Handshake) -> Result<(), Error> {
        self.handle_connection_up_with(conn, peer, self.default_limits())
    }

    /// A connection is established with this side's `limits` on it (the receive buffer size
    /// its handshake advertised, which is also the largest frame it accepts there, and its
    /// eager threshold); `peer` is the handshake the peer sent.
    pub fn handle_connection_up_with(
        &mut self,
        conn: ConnId,
        peer: &Handshake,
        limits: ConnLimits,
    ) -> Result<(), Error> {
        if self.conns.contains_key(&conn) {
            return Err(Error::DuplicateConnection(conn));
        }
        if peer.magic != HANDSHAKE_MAGIC || peer.version != u16::from(VERSION) {
            return Err(Error::Handshake(format!(
                "peer speaks version {} (magic {:#x}), this engine version {VERSION}",
                peer.version, peer.magic
            )));
        }
        if (peer.recv_buf_size as usize) < MAX_CTRL_FRAME {
            return Err(Error::Handshake(format!(
                "peer receive buffers of {} bytes cannot hold a {MAX_CTRL_FRAME}-byte control frame",
                peer.recv_buf_size
            )));
        }
        if peer.credits < crate::config::MIN_CREDITS {
            return Err(Error::Handshake(format!(
                "peer grants {} credits, at least {} are needed",
                peer.credits,
                crate::config::MIN_CREDITS
            )));
        }
        let credits = u64::from(self.cfg.credits);
        let in_use = self.conns.len() as u64 * credits;
        if in_use + credits > u64::from(self.cfg.srq_depth) {
            return Err(Error::SrqExhausted {
                in_use,
                srq_depth: self.cfg.srq_depth.into(),
                credits,
            });
        }
        let eager_limit = limits
            .eager_threshold
            .min(u64::from(peer.recv_buf_size) - HEADER_LEN as u64);
        self.conns.insert(
            conn,
            Conn {
                peer: *peer,
                recv_buf_size: limits.recv_buf_size,
                eager_limit,
                tx_credits: peer.credits.into(),
                rx_unreturned: 0,
                tx_seq: 0,
                rx_seq: 0,
                ctrl_q: VecDeque::new(),
                data_q: VecDeque::new(),
            },
        );
        Ok(())
    }

    /// The transport reports the connection gone: every pending request on it fails with
    /// [`Status::ConnectionClosed`] (receives with READs in flight once those are
    /// reported, or at the drain timeout).
    pub fn handle_connection_down(&mut self, conn: ConnId) {
        self.fail_conn(conn, None);
    }

    /// Closes a connection locally: like [`Engine::handle_connection_down`], plus a
    /// [`Action::CloseConnection`] for the driver.
    pub fn close(&mut self, conn: ConnId) {
        self.fail_conn(conn, Some(CloseReason::Local));
    }

    /// Advances the engine's clock (ns, any monotonic origin) and fires expired timeouts.
    pub fn handle_timeout(&mut self, now: u64) {
        self.now = self.now.max(now);
        let now = self.now;
        let expired: Vec<RequestId> = self
            .draining
            .iter()
            .filter(|d| d.0 <= now)
            .map(|d| d.1)
            .collect();
        self.draining.retain(|d| d.0 > now);
        for r in expired {
            if let Some(Req::Recv(rr)) = self.reqs.get(r) {
                let (tag, conn) = (rr.tag, rr.reading.as_ref().map(|x| x.conn));
                warn!("request {r:?}: READs not reported within the drain timeout");
                self.complete(r, RequestKind::Recv, Status::ConnectionClosed, 0, tag, conn);
            }
        }
    }

    /// A send completion; a failed one (e.g. retry exceeded, flush) closes the connection.
    pub fn handle_send_complete(&mut self, conn: ConnId, ok: bool) {
        if !ok {
            self.fail_conn(conn, Some(CloseReason::SendFailed));
        }
    }

    fn fail_conn(&mut self, conn_id: ConnId, reason: Option<CloseReason>) {
        let Some(mut conn) = self.conns.remove(&conn_id) else {
            return;
        };
        debug!("connection {conn_id:?} failed: {reason:?}");
        if let Some(CloseReason::ProtocolError(_)) = reason {
            if conn.tx_credits >= 1 {
                let mut h = Header::new(Opcode::Error);
                h.status = WireStatus::Protocol;
                h.seq = conn.tx_seq;
                conn.tx_seq = conn.tx_seq.wrapping_add(1);
                self.actions.push_back(Action::SendFrame {
                    conn: conn_id,
                    frame: FrameBuf::encode(&h, None),
                    payload: None,
                });
            }
        }
        // In the order they were made, whatever the table's order.
        let ids = self.reqs.ids_in_order(|r| match r {
            Req::Send(s) => s.conn == conn_id,
            Req::Recv(rr) => rr.reading.as_ref().is_some_and(|x| x.conn == conn_id),
        });
        for id in ids {
            match self.reqs.get_mut(id) {
                Some(Req::Send(s)) => {
                    let (tag, len, buf) = (s.tag, s.len, s.buf);
                    if !matches!(s.phase, SendPhase::EagerQueued) {
                        self.actions
                            .push_back(Action::ReleaseSendBuffer { request: id, buf });
                    }
                    self.complete(
                        id,
                        RequestKind::Send,
                        Status::ConnectionClosed,
                        len,
                        tag,
                        Some(conn_id),
                    );
                }
                Some(Req::Recv(rr)) => {
                    let tag = rr.tag;
                    let rd = rr.reading.as_mut().expect("filtered on reading");
                    rd.conn_dead = true;
                    rd.failed = Some(Status::ConnectionClosed);
                    if rd.outstanding.is_empty() {
                        self.complete(
                            id,
                            RequestKind::Recv,
                            Status::ConnectionClosed,
                            0,
                            tag,
                            Some(conn_id),
                        );
                    } else {
                        self.draining
                            .push((self.now.saturating_add(self.cfg.drain_timeout_ns), id));
                    }
                }
                None => {}
            }
        }
        self.unexpected
            .retain(|u| !(u.conn == conn_id && matches!(u.kind, UnexpKind::Rts { .. })));
        if let Some(reason) = reason {
            self.actions.push_back(Action::CloseConnection {
                conn: conn_id,
                reason,
            });
        }
    }

    // ------------------------------------------------------------------ sends

    /// Starts a tag send of the first `len` bytes of `buf`. Messages of at most the
    /// connection's eager limit go eager (completed once the driver copied them); larger
    /// ones use rendezvous (an [`Action::ExposeSendBuffer`] is emitted first).
    pub fn tag_send(
        &mut self,
        conn: ConnId,
        tag: Tag,
        buf: UserBufId,
        len: u64,
    ) -> Result<RequestId, Error> {
        let Some(c) = self.conns.get(&conn) else {
            return Err(Error::UnknownConnection(conn));
        };
        let eager = len <= c.eager_limit;
        if eager && c.data_q.is_empty() && c.ctrl_q.is_empty() && c.tx_credits >= 2 {
            // Nothing queued ahead and credit to spare: the message goes out now and the send
            // completes with it, never stored (what `flush` would do, without the table).
            let id = RequestId(IMMEDIATE | self.next_immediate);
            self.next_immediate = (self.next_immediate + 1) & !IMMEDIATE;
            let mut h = Header::new(Opcode::Eager);
            h.tag = tag;
            h.sreq = id.0;
            h.payload_len = len as u32;
            self.emit_frame(conn, h, None, Some(PayloadRef { buf, len }));
            self.actions.push_back(Action::Complete(Completion {
                request: id,
                kind: RequestKind::Send,
                status: Status::Ok,
                length: len,
                tag,
                conn: Some(conn),
            }));
            return Ok(id);
        }
        let phase = if eager {
            SendPhase::EagerQueued
        } else {
            SendPhase::RtsQueued { remote: None }
        };
        let id = self.new_req(Req::Send(SendReq {
            conn,
            tag,
            buf,
            len,
            phase,
        }));
        if !eager {
            self.actions.push_back(Action::ExposeSendBuffer {
                request: id,
                buf,
                len,
            });
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.data_q.push_back(id);
        }
        self.flush(conn);
        Ok(id)
    }

    /// The driver exposed a rendezvous send buffer.
    pub fn handle_send_buffer_exposed(&mut self, request: RequestId, remote: RemoteBuf) {
        if let Some(Req::Send(s)) = self.reqs.get_mut(request) {
            if let SendPhase::RtsQueued { remote: r @ None } = &mut s.phase {
                *r = Some(remote);
                let conn = s.conn;
                self.flush(conn);
            }
        }
    }

    /// The driver could not expose a rendezvous send buffer: the send fails with
    /// [`Status::ExposeFailed`].
    pub fn handle_send_buffer_expose_failed(&mut self, request: RequestId) {
        if let Some(Req::Send(s)) = self.reqs.get(request) {
            if matches!(s.phase, SendPhase::RtsQueued { remote: None }) {
                let (tag, len, conn) = (s.tag, s.len, s.conn);
                self.complete(
                    request,
                    RequestKind::Send,
                    Status::ExposeFailed,
                    len,
                    tag,
                    Some(conn),
                );
                self.flush(conn);
            }
        }
    }

    fn credit_threshold(&self) -> u32 {
        (u32::from(self.cfg.credits) / 4).max(2)
    }

    fn emit_frame(
        &mut self,
        conn_id: ConnId,
        mut h: Header,
        rts: Option<&RtsBody>,
        payload: Option<PayloadRef>,
    ) {
        let c = self
            .conns
            .get_mut(&conn_id)
            .expect("emit on open connection");
        let grant = c.rx_unreturned.min(u32::from(u16::MAX));
        c.rx_unreturned -= grant;
        h.credits = grant as u16;
        h.seq = c.tx_seq;
        c.tx_seq = c.tx_seq.wrapping_add(1);
        c.tx_credits -= 1;
        self.actions.push_back(Action::SendFrame {
            conn: conn_id,
            frame: FrameBuf::encode(&h, rts),
            payload,
        });
    }

    /// Emits every frame of `conn` that credits allow.
    fn flush(&mut self, conn_id: ConnId) {
        loop {
            let Some(c) = self.conns.get_mut(&conn_id) else {
                return;
            };
            // Data and control frames leave one credit in reserve for credit updates.
            if c.tx_credits < 2 {
                break;
            }
            if let Some(Ctrl::Ats { sreq, rreq, status }) = c.ctrl_q.pop_front() {
                let mut h = Header::new(Opcode::Ats);
                h.sreq = sreq;
                h.rreq = rreq;
                h.status = status;
                self.emit_frame(conn_id, h, None, None);
                continue;
            }
            let Some(&id) = c.data_q.front() else { break };
            let Some(Req::Send(s)) = self.reqs.get_mut(id) else {
                // Cancelled or failed while queued.
                if let Some(c) = self.conns.get_mut(&conn_id) {
                    c.data_q.pop_front();
                }
                continue;
            };
            let (tag, len, buf) = (s.tag, s.len, s.buf);
            match s.phase {
                SendPhase::EagerQueued => {
                    let mut h = Header::new(Opcode::Eager);
                    h.tag = tag;
                    h.sreq = id.0;
                    h.payload_len = len as u32;
                    self.conns.get_mut(&conn_id).map(|c| c.data_q.pop_front());
                    self.emit_frame(conn_id, h, None, Some(PayloadRef { buf, len }));
                    self.complete(id, RequestKind::Send, Status::Ok, len, tag, Some(conn_id));
                }
                SendPhase::RtsQueued {
                    remote: Some(remote),
                } => {
                    s.phase = SendPhase::AwaitAts;
                    let mut h = Header::new(Opcode::Rts);
                    h.tag = tag;
                    h.sreq = id.0;
                    h.payload_len = wire::RTS_BODY_LEN as u32;
                    let body = RtsBody {
                        addr: remote.addr,
                        rkey: remote.rkey,
                        len,
                    };
                    self.conns.get_mut(&conn_id).map(|c| c.data_q.pop_front());
                    self.emit_frame(conn_id, h, Some(&body), None);
                }
                // Head of line waits for its buffer exposure (send order is preserved).
                SendPhase::RtsQueued { remote: None } => break,
                SendPhase::AwaitAts => {
                    self.conns.get_mut(&conn_id).map(|c| c.data_q.pop_front());
                }
            }
        }
        let threshold = self.credit_threshold();
        if let Some(c) = self.conns.get(&conn_id) {
            if c.rx_unreturned >= threshold && c.tx_credits >= 1 {
                self.emit_frame(conn_id, Header::new(Opcode::Credit), None, None);
            }
        }
    }

    // ------------------------------------------------------------------ receives

    /// Posts a tag receive into the first `capacity` bytes of `buf`, matching messages whose
    /// tag satisfies `(msg_tag & mask) == (tag & mask)` (mask 0 = wildcard).
    pub fn tag_recv(&mut self, tag: Tag, mask: Tag, buf: UserBufId, capacity: u64) -> RequestId {
        let id = self.new_req(Req::Recv(RecvReq {
            buf,
            cap: capacity,
            tag: 0,
            reading: None,
        }));
        if let Some(pos) = self
            .unexpected
            .iter()
            .position(|u| matches(u.tag, tag, mask))
        {
            let u = self.unexpected.remove(pos).expect("position is valid");
            self.deliver_unexpected(id, u);
        } else {
            self.posted.push_back(Posted { req: id, tag, mask });
        }
        id
    }

    /// Looks for an unexpected message matching `tag`/`mask` without receiving it.
    pub fn probe(&self, tag: Tag, mask: Tag) -> Option<ProbeInfo> {
        self.unexpected
            .iter()
            .find(|u| matches(u.tag, tag, mask))
            .map(Unexpected::info)
    }

    /// A matched probe (`MPI_Mprobe`, `ucp_tag_probe_nb` with remove): finds the first
    /// unexpected message matching `tag`/`mask` and takes it out of matching, so that no
    /// receive or probe sees it any more; only [`Engine::msg_recv`] with its handle receives
    /// it.
    pub fn probe_remove(&mut self, tag: Tag, mask: Tag) -> Option<ProbeInfo> {
        let pos = self
            .unexpected
            .iter()
            .position(|u| matches(u.tag, tag, mask))?;
        let u = self.unexpected.remove(pos)?;
        let info = u.info();
        self.claimed.insert(u.id, u);
        Some(info)
    }

    /// Receives the probed message `msg` into `buf`; `None` if it is no longer queued (another
    /// receive took it, or — for a rendezvous message not removed by
    /// [`Engine::probe_remove`] — its connection is gone). A message removed by
    /// `probe_remove` is always received: if its connection is gone meanwhile, a rendezvous
    /// message completes with [`Status::ConnectionClosed`].
    pub fn msg_recv(&mut self, msg: MessageId, buf: UserBufId, capacity: u64) -> Option<RequestId> {
        let u = match self.claimed.remove(&msg) {
            Some(u) => u,
            None => {
                let pos = self.unexpected.iter().position(|u| u.id == msg)?;
                self.unexpected.remove(pos)?
            }
        };
        let id = self.new_req(Req::Recv(RecvReq {
            buf,
            cap: capacity,
            tag: 0,
            reading: None,
        }));
        let gone = !self.conns.contains_key(&u.conn);
        if gone && matches!(u.kind, UnexpKind::Rts { .. }) {
            let len = u.len();
            self.complete(
                id,
                RequestKind::Recv,
                Status::ConnectionClosed,
                len,
                u.tag,
                Some(u.conn),
            );
        } else {
            self.deliver_unexpected(id, u);
        }
        Some(id)
    }

    /// Cancels a request. A posted, unmatched receive completes with
    /// [`Status::Cancelled`]; a receive already matched cannot be cancelled. A send not yet
    /// completed (queued eager, or rendezvous before ATS) completes with `Cancelled` and its
    /// buffer is released; a rendezvous receiver still reading it then sees a READ failure.
    /// Returns whether the request was cancelled.
    pub fn cancel(&mut self, request: RequestId) -> bool {
        match self.reqs.get(request) {
            Some(Req::Recv(r)) if r.reading.is_none() => {
                if let Some(pos) = self.posted.iter().position(|p| p.req == request) {
                    self.posted.remove(pos);
                    self.complete(request, RequestKind::Recv, Status::Cancelled, 0, 0, None);
                    return true;
                }
                false
            }
            Some(Req::Send(s)) => {
                let (tag, len, conn, buf) = (s.tag, s.len, s.conn, s.buf);
                if !matches!(s.phase, SendPhase::EagerQueued) {
                    self.actions
                        .push_back(Action::ReleaseSendBuffer { request, buf });
                }
                self.complete(
                    request,
                    RequestKind::Send,
                    Status::Cancelled,
                    len,
                    tag,
                    Some(conn),
                );
                self.flush(conn);
                true
            }
            _ => false,
        }
    }

    fn deliver_unexpected(&mut self, req: RequestId, u: Unexpected) {
        match u.kind {
            UnexpKind::Eager(data) => {
                let Some(Req::Recv(r)) = self.reqs.get(req) else {
                    return;
                };
                let (buf, cap) = (r.buf, r.cap);
                let len = data.len() as u64;
                if len > cap {
                    self.complete(
                        req,
                        RequestKind::Recv,
                        Status::Truncated,
                        len,
                        u.tag,
                        Some(u.conn),
                    );
                    return;
                }
                if !data.is_empty() {
                    self.actions.push_back(Action::CopyToUser {
                        dst: buf,
                        dst_offset: 0,
                        data,
                    });
                }
                self.complete(req, RequestKind::Recv, Status::Ok, len, u.tag, Some(u.conn));
            }
            UnexpKind::Rts { sreq, body } => {
                self.start_rndv(req, u.conn, u.tag, sreq, body);
                self.flush(u.conn);
            }
        }
    }

    fn start_rndv(&mut self, req: RequestId, conn: ConnId, tag: Tag, sreq: u64, body: RtsBody) {
        let Some(Req::Recv(r)) = self.reqs.get_mut(req) else {
            return;
        };
        r.tag = tag;
        if body.len > r.cap || body.len == 0 {
            let (status, wst) = if body.len > r.cap {
                (Status::Truncated, WireStatus::Truncated)
            } else {
                (Status::Ok, WireStatus::Ok)
            };
            if let Some(c) = self.conns.get_mut(&conn) {
                c.ctrl_q.push_back(Ctrl::Ats {
                    sreq,
                    rreq: req.0,
                    status: wst,
                });
            }
            self.complete(req, RequestKind::Recv, status, body.len, tag, Some(conn));
            return;
        }
        r.reading = Some(Reading {
            conn,
            remote: RemoteBuf {
                addr: body.addr,
                rkey: body.rkey,
            },
            sreq,
            total: body.len,
            next_offset: 0,
            done: 0,
            outstanding: Vec::new(),
            failed: None,
            conn_dead: false,
        });
        self.issue_reads(req);
    }

    fn issue_reads(&mut self, req: RequestId) {
        let (chunk, max) = (
            self.cfg.rndv_chunk_size,
            self.cfg.max_reads_in_flight as usize,
        );
        let Some(Req::Recv(r)) = self.reqs.get_mut(req) else {
            return;
        };
        let buf = r.buf;
        let Some(rd) = r.reading.as_mut() else { return };
        while rd.failed.is_none() && rd.outstanding.len() < max && rd.next_offset < rd.total {
            let off = rd.next_offset;
            let len = chunk.min(rd.total - off);
            rd.next_offset += len;
            rd.outstanding.push((off, len));
            self.actions.push_back(Action::RdmaRead {
                conn: rd.conn,
                request: req,
                remote: RemoteBuf {
                    addr: rd.remote.addr.wrapping_add(off),
                    rkey: rd.remote.rkey,
                },
                len,
                dst: buf,
                dst_offset: off,
            });
        }
    }

    /// An RDMA READ issued by [`Action::RdmaRead`] finished (`ok == false`: it failed,
    /// including flush errors).
    pub fn handle_read_complete(&mut self, request: RequestId, dst_offset: u64, ok: bool) {
        let Some(Req::Recv(r)) = self.reqs.get_mut(request) else {
            debug!("read completion for unknown request {request:?}");
            return;
        };
        let tag = r.tag;
        let Some(rd) = r.reading.as_mut() else { return };
        let Some(pos) = rd.outstanding.iter().position(|o| o.0 == dst_offset) else {
            debug!("read completion for unknown offset {dst_offset} of {request:?}");
            return;
        };
        let (_, len) = rd.outstanding.swap_remove(pos);
        if ok {
            rd.done += len;
        } else if rd.failed.is_none() {
            rd.failed = Some(Status::ReadFailed);
        }
        if !rd.outstanding.is_empty() || (rd.failed.is_none() && rd.done < rd.total) {
            self.issue_reads(request);
            return;
        }
        let (conn, sreq, total, failed, dead) =
            (rd.conn, rd.sreq, rd.total, rd.failed, rd.conn_dead);
        let status = failed.unwrap_or(Status::Ok);
        if !dead {
            let wst = if status == Status::Ok {
                WireStatus::Ok
            } else {
                WireStatus::ReadFailed
            };
            if let Some(c) = self.conns.get_mut(&conn) {
                c.ctrl_q.push_back(Ctrl::Ats {
                    sreq,
                    rreq: request.0,
                    status: wst,
                });
            }
        }
        self.draining.retain(|d| d.1 != request);
        let length = if status == Status::Ok { total } else { 0 };
        self.complete(request, RequestKind::Recv, status, length, tag, Some(conn));
        self.flush(conn);
    }

    // ------------------------------------------------------------------ frames

    /// A frame arrived in SRQ buffer `buf` on `conn`. The buffer is always handed back
    /// through [`Action::RepostRecv`] (after any copy out of it). A malformed frame or a
    /// protocol violation closes only this connection.
    pub fn handle_frame(&mut self, conn_id: ConnId, buf: RecvBufId, bytes: &[u8]) {
        let result = self.process_frame(conn_id, buf, bytes);
        self.actions.push_back(Action::RepostRecv { buf });
        match result {
            Ok(()) => self.flush(conn_id),
            Err(reason) => {
                warn!("connection {conn_id:?} closed: {reason:?}");
                self.fail_conn(conn_id, Some(reason));
            }
        }
    }

    fn process_frame(
        &mut self,
        conn_id: ConnId,
        buf: RecvBufId,
        bytes: &[u8],
    ) -> Result<(), CloseReason> {
        let max_credits = u32::from(self.cfg.credits);
        let Some(c) = self.conns.get_mut(&conn_id) else {
            debug!("frame on unknown connection {conn_id:?} dropped");
            return Ok(());
        };
        let recv_buf_size = c.recv_buf_size as usize;
        c.rx_unreturned += 1;
        if c.rx_unreturned > max_credits {
            return Err(perr(format!(
                "peer overran its credits ({} frames unreturned, {max_credits} granted)",
                c.rx_unreturned
            )));
        }
        if bytes.len() > recv_buf_size {
            return Err(perr(format!(
                "{}-byte frame exceeds the {recv_buf_size}-byte receive buffer",
                bytes.len()
            )));
        }
        let frame = wire::decode(bytes).map_err(|e| perr(e.to_string()))?;
        let h = frame.header;
        if h.seq != c.rx_seq {
            return Err(perr(format!(
                "sequence {} where {} was expected",
                h.seq, c.rx_seq
            )));
        }
        c.rx_seq = c.rx_seq.wrapping_add(1);
        let new_credits = c.tx_credits + u32::from(h.credits);
        if new_credits > u32::from(c.peer.credits) {
            return Err(perr(format!(
                "peer granted {} credits, more than the {} it advertised",
                new_credits, c.peer.credits
            )));
        }
        c.tx_credits = new_credits;
        match frame.body {
            Body::Eager(payload) => {
                if let Some(p) = self.take_posted_match(h.tag) {
                    let Some(Req::Recv(r)) = self.reqs.get(p.req) else {
                        return Ok(());
                    };
                    let len = payload.len() as u64;
                    if len > r.cap {
                        self.complete(
                            p.req,
                            RequestKind::Recv,
                            Status::Truncated,
                            len,
                            h.tag,
                            Some(conn_id),
                        );
                    } else {
                        if len > 0 {
                            self.actions.push_back(Action::CopyFromRecvBuf {
                                src: buf,
                                src_offset: HEADER_LEN,
                                len: payload.len(),
                                dst: r.buf,
                                dst_offset: 0,
                            });
                        }
                        self.complete(
                            p.req,
                            RequestKind::Recv,
                            Status::Ok,
                            len,
                            h.tag,
                            Some(conn_id),
                        );
                    }
                } else {
                    self.push_unexpected(conn_id, h.tag, UnexpKind::Eager(payload.to_vec()));
                }
            }
            Body::Rts(body) => {
                if let Some(p) = self.take_posted_match(h.tag) {
                    self.start_rndv(p.req, conn_id, h.tag, h.sreq, body);
                } else {
                    self.push_unexpected(conn_id, h.tag, UnexpKind::Rts { sreq: h.sreq, body });
                }
            }
            Body::Ats => {
                let req = RequestId(h.sreq);
                match self.reqs.get(req) {
                    Some(Req::Send(s))
                        if s.conn == conn_id && matches!(s.phase, SendPhase::AwaitAts) =>
                    {
                        let (tag, len, sbuf) = (s.tag, s.len, s.buf);
                        let status = match h.status {
                            WireStatus::Ok => Status::Ok,
                            WireStatus::Truncated => Status::RemoteTruncated,
                            WireStatus::ReadFailed | WireStatus::Protocol => {
                                Status::RemoteReadFailed
                            }
                        };
                        self.actions.push_back(Action::ReleaseSendBuffer {
                            request: req,
                            buf: sbuf,
                        });
                        self.complete(req, RequestKind::Send, status, len, tag, Some(conn_id));
                    }
                    _ => debug!("ATS for unknown or cancelled request {req:?}"),
                }
            }
            Body::Credit => {}
            Body::Error => return Err(CloseReason::PeerError(h.status)),
            Body::Handshake(_) => return Err(perr("unexpected in-band handshake".into())),
        }
        Ok(())
    }
}
