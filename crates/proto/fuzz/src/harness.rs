//! The driver and peer model of [`super::engine_frames`]: an engine with one peer
//! connection, fed frames, its actions executed and checked against a model of the peer's
//! view of the connection.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use rdmx_proto::wire::{self, Body, Opcode};
use rdmx_proto::{
    Action, CloseReason, Completion, Config, ConnId, ConnLimits, Engine, Handshake, RecvBufId,
    RemoteBuf, RequestId, RequestKind, Status, UserBufId, VerbsFailure, HEADER_LEN,
};

use super::one_sided::{rma_flag, Answer, Memory, Ops};
use super::{is_free, EngineOutcome};

/// The only connection of [`super::engine_frames`].
pub(crate) const CONN: ConnId = ConnId(1);

/// What one drain of the engine's actions saw.
#[derive(Debug, Default)]
pub(crate) struct Drained {
    pub(crate) actions: usize,
    /// The receive buffers `CopyFromRecvBuf` actions read.
    copies: Vec<RecvBufId>,
    pub(crate) close: Option<CloseReason>,
}

/// An engine with one peer connection, driven by [`super::engine_frames`], and a model of
/// the peer's view of the connection.
pub(crate) struct Harness {
    pub(crate) e: Engine,
    cfg: Config,
    read_ok: bool,
    /// The RMA byte (`rma_flag`).
    rma: u8,
    /// The engine's memory for the peer's one-sided operations, unless `NO_MEMORY`.
    memory: Option<Arc<Memory>>,
    /// This side's one-sided operations.
    pub(crate) ops: Ops,
    /// The peer's one-sided operations the engine took and did not answer yet: request,
    /// offset (what the reply echoes).
    asked: VecDeque<(u64, u64)>,
    /// The connection is up (the engine accepted it and has not closed it).
    open: bool,
    /// The peer's handshake.
    peer: Handshake,
    /// Frames the engine sent on the connection, CREDIT frames aside (they cost no credit).
    sent: u64,
    /// Credits granted to the engine by frames it accepted.
    granted: u64,
    /// Credits the engine grants the peer in all: its initial grant, doubled (up to the
    /// configured largest window) by each accepted frame that asks for more.
    window: u64,
    /// Next sequence number expected from the engine.
    tx_seq: u32,
    /// Frames handed to the engine while the connection was up, CREDIT frames aside.
    received: u64,
    /// Credits the engine returned in the frames it sent.
    returned: u64,
    /// Next sequence number the engine expects from the peer.
    pub(crate) rx_seq: u32,
    /// Capacity of each receive request's buffer.
    recvs: BTreeMap<RequestId, u64>,
    /// Capacity of each user buffer.
    caps: BTreeMap<UserBufId, u64>,
    pub(crate) outcome: EngineOutcome,
}

impl Harness {
    pub(crate) fn new(cfg: Config, read_fail: bool, rma: u8) -> Self {
        let mut e = Engine::new(cfg.clone());
        let memory = (rma & rma_flag::NO_MEMORY == 0).then(|| Arc::new(Memory::new()));
        if let Some(m) = &memory {
            e.set_rma_memory(m.clone());
        }
        Harness {
            e,
            window: cfg.initial_credits.into(),
            cfg,
            read_ok: !read_fail,
            rma,
            memory,
            ops: Ops::default(),
            asked: VecDeque::new(),
            open: false,
            peer: Handshake {
                magic: 0,
                version: 0,
                recv_buf_size: 0,
                credits: 0,
                max_credits: 0,
            },
            sent: 0,
            granted: 0,
            tx_seq: 0,
            received: 0,
            returned: 0,
            rx_seq: 0,
            recvs: BTreeMap::new(),
            caps: BTreeMap::new(),
            outcome: EngineOutcome::default(),
        }
    }

    pub(crate) fn connect(&mut self, hs: Handshake) {
        self.peer = hs;
        let limits = ConnLimits {
            verbs_rma: self.rma & rma_flag::VERBS != 0,
            ..self.e.default_limits()
        };
        match self.e.handle_connection_up_with(CONN, &hs, limits) {
            Ok(()) => {
                self.open = true;
                self.outcome.up = true;
            }
            Err(_) => assert!(self.e.conn_stats(CONN).is_none()),
        }
        // (What a get asks for and a reply carries: both sides' buffers bound it.)
        self.ops.chunk = u64::from(self.cfg.recv_buf_size.min(hs.recv_buf_size))
            .saturating_sub(HEADER_LEN as u64);
        assert_eq!(
            self.drain(None).actions,
            0,
            "connection setup emits no action"
        );
        self.check_model();
    }

    pub(crate) fn recv(&mut self, tag: u64, mask: u64, cap: u64) {
        let buf = UserBufId(self.caps.len() as u64 + 1);
        self.caps.insert(buf, cap);
        let r = self.e.tag_recv(tag, mask, buf, cap);
        self.recvs.insert(r, cap);
        self.drain(None);
        self.check_model();
    }

    pub(crate) fn send(&mut self, tag: u64, buf: UserBufId, len: u64) {
        self.caps.insert(buf, len);
        let r = self.e.tag_send(CONN, tag, buf, len);
        assert_eq!(
            r.is_ok(),
            self.open,
            "tag_send succeeds exactly while the connection is up: {r:?}"
        );
        self.drain(None);
        if let Some(id) = r.as_ref().ok().copied().filter(|id| id.is_immediate()) {
            // Sent as it was made: the driver completes it, the engine reports nothing.
            self.outcome.completions.push(Completion {
                request: id,
                kind: RequestKind::Send,
                status: Status::Ok,
                length: len,
                tag,
                conn: Some(CONN),
                buf: Some(buf),
            });
        }
        self.check_model();
    }

    /// Starts this side's one-sided operations (`rma`'s bits).
    pub(crate) fn start_rma(&mut self, rma: u8) {
        let conn = (self.open, self.peer.recv_buf_size);
        self.ops.start(&mut self.e, CONN, conn, rma, &mut self.caps);
        self.drain(None);
        self.check_model();
        self.settle_nic(false);
    }

    /// Reports the NIC work asked for so far (unless it is reported only at the end, or
    /// `last`): each done, but with `VERBS_FAIL` the first refused and the second broken.
    /// A failure closes the connection (`SendFailed`), and nothing else does.
    fn settle_nic(&mut self, last: bool) {
        if self.rma & rma_flag::VERBS_LATE != 0 && !last {
            return;
        }
        // (Work a report lets start, behind a fence, is reported too.)
        while !self.ops.nic.is_empty() {
            self.report_nic();
        }
    }

    fn report_nic(&mut self) {
        for request in std::mem::take(&mut self.ops.nic) {
            let n = self.ops.reported;
            self.ops.reported += 1;
            let result = match (self.rma & rma_flag::VERBS_FAIL != 0, n) {
                (true, 0) => Err(VerbsFailure::RemoteAccess),
                (true, 1) => Err(VerbsFailure::Broken),
                _ => Ok(0x1234),
            };
            if let Some(op) = self.ops.live.get_mut(&request) {
                op.out -= 1;
            }
            let was_open = self.open;
            self.e.handle_rma_verbs_done(request, result);
            let d = self.drain(None);
            match (&d.close, result) {
                (None, _) => {}
                (Some(CloseReason::SendFailed), Err(_)) if was_open => {}
                (close, _) => panic!("NIC report {result:?} closed with {close:?}"),
            }
            self.check_model();
        }
    }

    /// Feeds one frame and checks the engine's reaction against the model.
    pub(crate) fn frame(&mut self, buf: RecvBufId, bytes: &[u8]) {
        let was_open = self.open;
        let expect = if was_open {
            // (A CREDIT frame granting credits costs none.)
            if !wire::decode(bytes).is_ok_and(|f| is_free(&f)) {
                self.received += 1;
            }
            Some(self.predict(bytes))
        } else {
            None
        };
        if let Some(Ok(_)) = expect {
            // (Decoded by `predict`.)
            let f = wire::decode(bytes).expect("a frame the engine takes decodes");
            match f.header.opcode {
                Opcode::Put | Opcode::Get | Opcode::FetchAdd | Opcode::CompareSwap => {
                    self.asked.push_back((f.header.sreq, f.header.tag));
                }
                Opcode::RmaReply => self.ops.replied(f.header.sreq),
                _ => {}
            }
        }
        self.e.handle_frame(CONN, buf, bytes);
        if let Some(Err((_, taken))) = expect {
            // Refused, but after the engine took the credits it grants.
            self.granted += u64::from(taken);
        }
        if let Some(Ok(credits)) = expect {
            // Accepted: the engine may spend these credits on its answer at once.
            self.rx_seq = self.rx_seq.wrapping_add(1);
            self.granted += u64::from(credits);
            self.outcome.accepted += 1;
            if bytes[4] & wire::FLAG_CREDIT_WANTED != 0 {
                // One connection never finds the default pool short.
                let max = u64::from(self.cfg.credits);
                self.window += self.window.min(max - self.window);
            }
        }
        let d = self.drain(Some(bytes.len()));
        assert!(
            d.copies.iter().all(|&b| b == buf),
            "a copy out of another receive buffer than the frame's"
        );
        match expect {
            None => assert_eq!(d.actions, 0, "a frame on a closed connection is dropped"),
            Some(Err((expected, _))) => match (&expected, &d.close) {
                (CloseReason::ProtocolError(_), Some(CloseReason::ProtocolError(_))) => {}
                (CloseReason::PeerError(a), Some(CloseReason::PeerError(b))) if a == b => {}
                _ => panic!("expected close {expected:?}, got {:?}", d.close),
            },
            Some(Ok(_)) => assert_eq!(d.close, None, "a valid frame closed the connection"),
        }
        self.check_model();
        self.settle_nic(false);
    }

    /// Whether the engine must accept `bytes` (then the credits it grants) or close the
    /// connection (why, and the credits the frame granted that the engine took before it
    /// found the frame wrong: it may spend one on its ERROR frame).
    fn predict(&self, bytes: &[u8]) -> Result<u16, (CloseReason, u16)> {
        let perr = |taken| Err((CloseReason::ProtocolError(String::new()), taken));
        if bytes.len() > self.cfg.recv_buf_size as usize {
            return perr(0);
        }
        let Ok(f) = wire::decode(bytes) else {
            return perr(0);
        };
        let overrun = self.received - self.returned > self.window - self.grown();
        if overrun && !is_free(&f) {
            return perr(0);
        }
        let tx_credits = u64::from(self.peer.credits) + self.granted - self.sent;
        if f.header.seq != self.rx_seq
            || tx_credits + u64::from(f.header.credits) > u64::from(self.peer.max_credits)
        {
            return perr(0);
        }
        // (From here on the engine has taken the frame's credits.)
        let credits = f.header.credits;
        match f.body {
            Body::Error => Err((CloseReason::PeerError(f.header.status), credits)),
            Body::Handshake(_) => perr(credits),
            Body::OneSided(p) => match f.header.opcode {
                Opcode::RmaReply if !self.ops.reply_ok(&f.header, p) => perr(credits),
                // A get asks for at most what a reply carries into the smaller buffers.
                Opcode::Get => match wire::RmaBody::split(p) {
                    Some((rma, _)) if rma.word <= self.ops.chunk => Ok(credits),
                    _ => perr(credits),
                },
                _ => Ok(credits),
            },
            _ => Ok(credits),
        }
    }

    /// Credits granted on demand beyond the initial grant.
    fn grown(&self) -> u64 {
        self.window - u64::from(self.cfg.initial_credits)
    }

    /// The engine's flow-control state matches the model.
    fn check_model(&self) {
        match self.e.conn_stats(CONN) {
            Some(s) => {
                assert!(self.open, "connection known after it was closed");
                let tx_credits = u64::from(self.peer.credits) + self.granted - self.sent;
                assert_eq!(u64::from(s.tx_credits), tx_credits, "tx credits");
                // (The credits of the peer's operations whose replies wait are held back.)
                assert_eq!(
                    s.replies_waiting as usize,
                    self.asked.len(),
                    "replies waiting"
                );
                assert_eq!(
                    u64::from(s.rx_unreturned + s.replies_waiting),
                    self.received + self.grown() - self.returned
                );
                assert_eq!(u64::from(s.window), self.window);
                assert!(s.replies_waiting <= s.window, "replies over the window");
            }
            None => assert!(!self.open, "open connection unknown to the engine"),
        }
    }

    /// A user buffer access of `len` bytes at `offset` stays inside the buffer.
    fn check_fits(&self, buf: UserBufId, offset: u64, len: u64) {
        let cap = *self
            .caps
            .get(&buf)
            .expect("access to a buffer never posted");
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= cap),
            "{len} bytes at {offset} overflow the {cap}-byte buffer {buf:?}"
        );
    }

    /// A frame the engine sends: counted against the peer's credits, numbered in order,
    /// returning no more credits than it owes, within the peer's buffers; a reply answers
    /// the peer's oldest operation not answered with what the memory returned. `total` is
    /// its length with the payload the driver appends, `data` a reply's bytes.
    fn sent_frame(&mut self, hdr: &wire::Header, total: u64, data: &[u8]) {
        self.outcome.sent += 1;
        if hdr.opcode == Opcode::Credit {
            // (It costs no credit, and grants some.)
            assert!(hdr.credits > 0, "a CREDIT frame granting nothing");
        } else {
            self.sent += 1;
        }
        assert!(
            self.sent <= u64::from(self.peer.credits) + self.granted,
            "the engine sent more frames than the peer granted credits"
        );
        assert_eq!(hdr.seq, self.tx_seq, "engine frames are numbered in order");
        self.tx_seq = self.tx_seq.wrapping_add(1);
        self.returned += u64::from(hdr.credits);
        assert!(
            self.returned <= self.received + self.grown(),
            "the engine returned more credits than frames it received and grants"
        );
        assert!(
            total <= u64::from(self.peer.recv_buf_size),
            "a {total}-byte frame overflows the peer's receive buffers"
        );
        if hdr.opcode == Opcode::RmaReply {
            let (sreq, tag) = self.asked.pop_front().expect("a reply to no operation");
            let want = match &self.memory {
                Some(m) => m.take_answer().expect("the memory's answer"),
                None => Answer::no_memory(),
            };
            let got = Answer {
                status: hdr.status,
                value: hdr.rreq,
                data: data.to_vec(),
            };
            assert_eq!((hdr.sreq, hdr.tag), (sreq, tag), "a reply out of order");
            assert_eq!(got, want, "the reply to {sreq:#x}");
            self.outcome.replies.push(hdr.status);
            assert!(
                data.len() as u64 <= self.ops.chunk,
                "a {}-byte reply",
                data.len()
            );
        }
    }

    /// Executes every pending action like a driver would, checking each.
    /// `frame_len` is the length of the frame being handled, if any.
    pub(crate) fn drain(&mut self, frame_len: Option<usize>) -> Drained {
        let mut d = Drained::default();
        while let Some(a) = self.e.poll_action() {
            d.actions += 1;
            if !self.open {
                let on_conn = match &a {
                    Action::SendFrame { conn, .. }
                    | Action::SendFrameData { conn, .. }
                    | Action::RdmaRead { conn, .. }
                    | Action::RmaVerbs { conn, .. }
                    | Action::CloseConnection { conn, .. } => *conn == CONN,
                    _ => false,
                };
                assert!(!on_conn, "action on a closed connection: {a:?}");
            }
            match a {
                Action::SendFrame {
                    conn,
                    frame,
                    payload,
                } => {
                    assert_eq!(conn, CONN);
                    let bytes = frame.as_bytes();
                    let hdr = wire::decode_header(bytes).expect("valid header");
                    let total = match payload {
                        None => {
                            wire::decode(bytes).expect("engine frames decode");
                            bytes.len() as u64
                        }
                        Some(p) => {
                            self.check_fits(p.buf, p.offset, p.len);
                            match hdr.opcode {
                                Opcode::Eager => {
                                    assert_eq!(bytes.len(), HEADER_LEN);
                                    assert_eq!(u64::from(hdr.payload_len), p.len);
                                }
                                Opcode::Put => {
                                    assert_eq!(bytes.len(), HEADER_LEN + wire::RmaBody::LEN);
                                    assert_eq!(
                                        u64::from(hdr.payload_len),
                                        wire::RmaBody::LEN as u64 + p.len
                                    );
                                }
                                o => panic!("a {o:?} frame with a payload"),
                            }
                            bytes.len() as u64 + p.len
                        }
                    };
                    if matches!(
                        hdr.opcode,
                        Opcode::Put | Opcode::Get | Opcode::FetchAdd | Opcode::CompareSwap
                    ) {
                        let len = payload.map_or(0, |p| p.len);
                        self.ops.frame_out(&hdr, &bytes[HEADER_LEN..], len);
                    }
                    self.sent_frame(&hdr, total, &[]);
                }
                Action::SendFrameData { conn, frame, data } => {
                    assert_eq!(conn, CONN);
                    let hdr = wire::decode_header(frame.as_bytes()).expect("valid header");
                    assert_eq!(hdr.opcode, Opcode::RmaReply, "{hdr:?} with data");
                    assert_eq!(frame.as_bytes().len(), HEADER_LEN);
                    assert_eq!(hdr.payload_len as usize, data.len());
                    self.sent_frame(&hdr, (HEADER_LEN + data.len()) as u64, &data);
                    self.e.recycle_payload(data);
                }
                Action::ExposeSendBuffer { request, .. } => {
                    let remote = RemoteBuf {
                        addr: 0x10_0000,
                        rkey: 7,
                    };
                    self.e.handle_send_buffer_exposed(request, remote);
                }
                Action::ReleaseSendBuffer { .. } => {}
                Action::RmaVerbs {
                    conn,
                    request,
                    buf,
                    offset,
                    len,
                    ..
                } => {
                    assert_eq!(conn, CONN);
                    if buf != super::one_sided::ADD_BUF.0 && buf != super::one_sided::CAS_BUF.0 {
                        self.check_fits(buf, offset, len);
                    }
                    self.ops.nic_work(request);
                }
                Action::RdmaRead {
                    conn,
                    request,
                    len,
                    dst,
                    dst_offset,
                    ..
                } => {
                    assert_eq!(conn, CONN);
                    assert!(len > 0, "empty READ");
                    self.check_fits(dst, dst_offset, len);
                    self.e
                        .handle_read_complete(request, dst_offset, self.read_ok);
                }
                Action::CopyFromRecvBuf {
                    src,
                    src_offset,
                    len,
                    dst,
                    dst_offset,
                } => {
                    let frame_len = frame_len.expect("copy out of a receive buffer not in use");
                    d.copies.push(src);
                    assert!(src_offset.checked_add(len).is_some_and(|e| e <= frame_len));
                    self.check_fits(dst, dst_offset, len as u64);
                }
                Action::CopyToUser {
                    dst,
                    dst_offset,
                    data,
                } => self.check_fits(dst, dst_offset, data.len() as u64),
                Action::Complete(c) => {
                    self.outcome.completions.push(c);
                    match c.kind {
                        RequestKind::Recv => {
                            let cap = *self.recvs.get(&c.request).expect("known receive");
                            match c.status {
                                Status::Ok => assert!(c.length <= cap),
                                Status::Truncated => assert!(c.length > cap),
                                _ => {}
                            }
                        }
                        RequestKind::Send => {}
                        kind => self.ops.completed(c.request, kind, c.length),
                    }
                }
                Action::CloseConnection { conn, reason } => {
                    assert_eq!(conn, CONN);
                    assert!(d.close.is_none(), "connection closed twice");
                    self.open = false;
                    self.asked.clear();
                    self.outcome.close = Some(reason.clone());
                    d.close = Some(reason);
                }
            }
        }
        d
    }

    /// Receives every unexpected message, reports the NIC work left, closes the connection
    /// and cancels what is left; then nothing may be pending.
    pub(crate) fn finish(&mut self) {
        while self.e.unexpected_len() > 0 {
            let before = self.e.unexpected_len();
            self.recv(0, 0, 4096);
            assert!(
                self.e.unexpected_len() < before,
                "a wildcard receive matched nothing"
            );
        }
        self.settle_nic(true);
        if self.open {
            self.e.close(CONN);
            let d = self.drain(None);
            assert_eq!(d.close, Some(CloseReason::Local));
        }
        let reqs: Vec<RequestId> = self.recvs.keys().copied().collect();
        for r in reqs {
            self.e.cancel(r);
        }
        self.drain(None);
        assert_eq!(self.e.pending_requests(), 0, "requests left pending");
        assert!(
            self.ops.live.is_empty(),
            "operations left: {:?}",
            self.ops.live
        );
        assert_eq!(self.e.poll_timeout(), None, "a drain timer left running");
        self.check_model();
    }
}
