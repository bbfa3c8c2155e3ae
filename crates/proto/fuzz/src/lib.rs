//! The checks the fuzz targets run, one function per target, each taking arbitrary bytes.
//!
//! The corpus replay test (`crates/proto/tests/corpus.rs`) includes this file as a module
//! (`#[path]`), so every committed corpus entry goes through exactly the code the fuzzer ran.
//! This file must therefore build with stable Rust at the workspace MSRV (1.80) and use
//! nothing but `rdmx-proto` and `std`.
//!
//! A check panics only when `rdmx-proto` misbehaves: a panic inside the crate itself, or a
//! broken invariant asserted here.

use std::collections::BTreeMap;

use rdmx_proto::wire::{self, Body, FrameBuf, Opcode};
use rdmx_proto::{
    Action, CloseReason, Completion, Config, ConnId, Engine, Handshake, RecvBufId, RemoteBuf,
    RequestId, RequestKind, Status, UserBufId, HEADER_LEN,
};

/// Target `frame_decode`: `data` is one frame.
///
/// A frame that decodes re-encodes to exactly `data` (no field is silently ignored). Fed to
/// an engine as the first frame of a fresh connection, its receive buffer is reposted exactly
/// once, and a frame that does not decode (or does not fit a receive buffer) closes the
/// connection with a protocol error.
pub fn frame_decode(data: &[u8]) {
    let decoded = wire::decode(data);
    if let Ok(f) = &decoded {
        assert_eq!(f.header.payload_len as usize, data.len() - HEADER_LEN);
        let mut header = [0u8; HEADER_LEN];
        f.header.write(&mut header);
        assert_eq!(
            header[..],
            data[..HEADER_LEN],
            "header re-encodes differently"
        );
        match f.body {
            Body::Eager(p) | Body::Handshake(p) => assert_eq!(p, &data[HEADER_LEN..]),
            Body::Rts(rts) => {
                assert_eq!(
                    FrameBuf::encode(&f.header, Some(&rts)).as_bytes(),
                    data,
                    "RTS re-encodes differently"
                );
            }
            Body::Ats | Body::Error | Body::Credit => assert_eq!(data.len(), HEADER_LEN),
            Body::OneSided(p) if f.header.opcode == Opcode::RmaReply => {
                assert_eq!(p, &data[HEADER_LEN..])
            }
            Body::OneSided(p) => {
                let (rma, bytes) = wire::RmaBody::split(p).expect("an RMA frame holds a body");
                let mut again = FrameBuf::encode_rma(&f.header, &rma).as_bytes().to_vec();
                again.extend_from_slice(bytes);
                assert_eq!(again, data, "RMA frame re-encodes differently");
            }
        }
    }

    let cfg = Config::default();
    let mut e = Engine::new(cfg.clone());
    let conn = ConnId(1);
    let hs = e.local_handshake();
    e.handle_connection_up(conn, &hs)
        .expect("a fresh engine accepts its own handshake");
    e.tag_recv(0, 0, UserBufId(1), 1 << 20);
    e.handle_frame(conn, RecvBufId(0), data);
    let mut close = None;
    while let Some(a) = e.poll_action() {
        match a {
            Action::CopyFromRecvBuf { src, .. } => {
                assert_eq!(src, RecvBufId(0), "copy out of another receive buffer");
            }
            Action::CloseConnection { conn: c, reason } => {
                assert_eq!(c, conn);
                assert!(close.is_none(), "connection closed twice");
                close = Some(reason);
            }
            _ => {}
        }
    }
    if decoded.is_err() || data.len() > cfg.recv_buf_size as usize {
        assert!(
            matches!(close, Some(CloseReason::ProtocolError(_))),
            "a malformed frame must close with a protocol error, got {close:?}"
        );
    }
    if close.is_some() {
        assert!(
            e.conn_stats(conn).is_none(),
            "closed connection still known"
        );
    }
}

/// Target `handshake_decode`: `data` is a handshake as found in connect private data.
///
/// A decoded handshake re-encodes to the first bytes of `data` and decodes again to itself;
/// an engine either accepts it (and then honours the peer's buffer size and credits) or
/// rejects it without any side effect.
pub fn handshake_decode(data: &[u8]) {
    let Ok(hs) = Handshake::decode(data) else {
        return;
    };
    let enc = hs.encode();
    assert_eq!(Handshake::decode(&enc), Ok(hs));
    assert_eq!(
        data.get(..enc.len()),
        Some(&enc[..]),
        "handshake re-encodes differently"
    );

    let cfg = Config::default();
    let mut e = Engine::new(cfg.clone());
    match e.handle_connection_up(ConnId(1), &hs) {
        Ok(()) => {
            let s = e
                .conn_stats(ConnId(1))
                .expect("accepted connection is known");
            assert!(s.eager_limit + HEADER_LEN as u64 <= u64::from(hs.recv_buf_size));
            assert!(s.eager_limit <= cfg.eager_threshold);
            assert_eq!(s.tx_credits, u32::from(hs.credits));
        }
        Err(_) => assert!(e.conn_stats(ConnId(1)).is_none()),
    }
    assert_eq!(e.poll_action(), None, "connection setup emits no action");
}

/// Flag bits of the first input byte of [`engine_frames`].
mod flag {
    /// A handshake follows: one length byte, then that many bytes for `Handshake::decode`.
    pub const HANDSHAKE: u8 = 1;
    /// Post a wildcard receive of 1 MiB before the frames.
    pub const RECV_BIG: u8 = 1 << 1;
    /// Post a 16-byte receive for tag 0 exactly before the frames.
    pub const RECV_SMALL: u8 = 1 << 2;
    /// Start a 64 KiB rendezvous send (tag 5) before the frames.
    pub const SEND_RNDV: u8 = 1 << 3;
    /// Start a 100-byte eager send (tag 6) before the frames.
    pub const SEND_EAGER: u8 = 1 << 4;
    /// Write the expected sequence number into every frame (bytes 8..12) before feeding it.
    pub const AUTO_SEQ: u8 = 1 << 5;
    /// Report every RDMA READ as failed.
    pub const READ_FAIL: u8 = 1 << 6;
}

/// The only connection of [`engine_frames`].
const CONN: ConnId = ConnId(1);

/// Target `engine_frames`: `data` is a peer's side of a connection.
///
/// Input layout: a flag byte (see `flag`), an optional handshake (decoded, or the default
/// one when it does not decode), then frames, each a little-endian `u16` length followed by
/// that many bytes (the last one cut short by the end of the input). The harness plays the
/// driver: it exposes send buffers, completes RDMA READs at once, and finally receives every
/// unexpected message, closes the connection and cancels what is left.
///
/// Besides "never panics" it checks the engine against a model of the peer: exactly one
/// repost per frame; a frame closes the connection exactly when it is malformed, oversized,
/// out of sequence, over the credit limits (protocol error) or an ERROR (peer error); after
/// the close nothing else happens on the connection; the engine never sends more frames
/// than the peer granted credits, nor returns more credits than frames it received; every
/// frame it sends is valid and fits the peer's buffers; copies and READs stay inside the
/// buffers they target; and no request is left pending at the end.
///
/// Returns what happened, for the replay test's assertions about the named seeds.
pub fn engine_frames(data: &[u8]) -> EngineOutcome {
    let flags = data.first().copied().unwrap_or(0);
    let mut rest = data.get(1..).unwrap_or(&[]);
    // A fixed window of the default's largest size (what the seeds were written for);
    // windows that grow and shrink are tested on the simulated fabric (tests/credits.rs).
    let cfg = Config::builder()
        .initial_credits(Config::default().credits)
        .build()
        .expect("valid configuration");
    let mut h = Harness::new(cfg, flags & flag::READ_FAIL != 0);
    let default_hs = h.e.local_handshake();
    let hs = if flags & flag::HANDSHAKE != 0 {
        let n = rest.first().map_or(0, |&n| usize::from(n));
        let bytes = take(&mut rest, 1 + n).get(1..).unwrap_or(&[]);
        Handshake::decode(bytes).unwrap_or(default_hs)
    } else {
        default_hs
    };
    h.connect(hs);
    if flags & flag::RECV_BIG != 0 {
        h.recv(0, 0, 1 << 20);
    }
    if flags & flag::RECV_SMALL != 0 {
        h.recv(0, !0, 16);
    }
    if flags & flag::SEND_RNDV != 0 {
        h.send(5, UserBufId(1_000_000), 64 * 1024);
    }
    if flags & flag::SEND_EAGER != 0 {
        h.send(6, UserBufId(1_000_001), 100);
    }
    let mut n = 0u64;
    while !rest.is_empty() {
        let len = match *rest {
            [lo, hi, ..] => usize::from(u16::from_le_bytes([lo, hi])),
            [b] => usize::from(b),
            [] => 0,
        };
        let header_len = rest.len().min(2);
        take(&mut rest, header_len);
        let mut frame = take(&mut rest, len).to_vec();
        if flags & flag::AUTO_SEQ != 0 && frame.len() >= 12 {
            frame[8..12].copy_from_slice(&h.rx_seq.to_le_bytes());
        }
        h.frame(RecvBufId(n), &frame);
        n += 1;
    }
    h.finish();
    h.outcome
}

/// What [`engine_frames`] saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineOutcome {
    /// The engine accepted the connection.
    pub up: bool,
    /// Why the connection was closed (`Local` if it lasted until the harness closed it).
    pub close: Option<CloseReason>,
    /// Frames the engine accepted.
    pub accepted: u64,
    /// Frames the engine sent.
    pub sent: u64,
    /// Every request completion, in order.
    pub completions: Vec<Completion>,
}

/// Whether frame `f` costs no credit: a CREDIT frame that grants credits.
fn is_free(f: &wire::Frame<'_>) -> bool {
    matches!(f.body, Body::Credit) && f.header.credits > 0
}

/// Splits off and returns the first `n` bytes of `rest` (fewer if it is shorter).
fn take<'a>(rest: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = rest.split_at(n.min(rest.len()));
    *rest = tail;
    head
}

/// What one drain of the engine's actions saw.
#[derive(Debug, Default)]
struct Drained {
    actions: usize,
    /// The receive buffers `CopyFromRecvBuf` actions read.
    copies: Vec<RecvBufId>,
    close: Option<CloseReason>,
}

/// An engine with one peer connection, driven by [`engine_frames`], and a model of the peer's
/// view of the connection.
struct Harness {
    e: Engine,
    cfg: Config,
    read_ok: bool,
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
    rx_seq: u32,
    /// Capacity of each receive request's buffer.
    recvs: BTreeMap<RequestId, u64>,
    /// Capacity of each user receive buffer.
    caps: BTreeMap<UserBufId, u64>,
    outcome: EngineOutcome,
}

impl Harness {
    fn new(cfg: Config, read_fail: bool) -> Self {
        Harness {
            e: Engine::new(cfg.clone()),
            window: cfg.initial_credits.into(),
            cfg,
            read_ok: !read_fail,
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

    fn connect(&mut self, hs: Handshake) {
        self.peer = hs;
        match self.e.handle_connection_up(CONN, &hs) {
            Ok(()) => {
                self.open = true;
                self.outcome.up = true;
            }
            Err(_) => assert!(self.e.conn_stats(CONN).is_none()),
        }
        assert_eq!(
            self.drain(None).actions,
            0,
            "connection setup emits no action"
        );
        self.check_model();
    }

    fn recv(&mut self, tag: u64, mask: u64, cap: u64) {
        let buf = UserBufId(self.caps.len() as u64 + 1);
        self.caps.insert(buf, cap);
        let r = self.e.tag_recv(tag, mask, buf, cap);
        self.recvs.insert(r, cap);
        self.drain(None);
        self.check_model();
    }

    fn send(&mut self, tag: u64, buf: UserBufId, len: u64) {
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

    /// Feeds one frame and checks the engine's reaction against the model.
    fn frame(&mut self, buf: RecvBufId, bytes: &[u8]) {
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
        self.e.handle_frame(CONN, buf, bytes);
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
            Some(Err(expected)) => match (&expected, &d.close) {
                (CloseReason::ProtocolError(_), Some(CloseReason::ProtocolError(_))) => {}
                (CloseReason::PeerError(a), Some(CloseReason::PeerError(b))) if a == b => {}
                _ => panic!("expected close {expected:?}, got {:?}", d.close),
            },
            Some(Ok(_)) => assert_eq!(d.close, None, "a valid frame closed the connection"),
        }
        self.check_model();
    }

    /// Whether the engine must accept `bytes` (then the credits it grants) or close the
    /// connection (and why).
    fn predict(&self, bytes: &[u8]) -> Result<u16, CloseReason> {
        let perr = || Err(CloseReason::ProtocolError(String::new()));
        if bytes.len() > self.cfg.recv_buf_size as usize {
            return perr();
        }
        let Ok(f) = wire::decode(bytes) else {
            return perr();
        };
        let overrun = self.received - self.returned > self.window - self.grown();
        if overrun && !is_free(&f) {
            return perr();
        }
        let tx_credits = u64::from(self.peer.credits) + self.granted - self.sent;
        if f.header.seq != self.rx_seq
            || tx_credits + u64::from(f.header.credits) > u64::from(self.peer.max_credits)
        {
            return perr();
        }
        match f.body {
            Body::Error => Err(CloseReason::PeerError(f.header.status)),
            Body::Handshake(_) => perr(),
            _ => Ok(f.header.credits),
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
                assert_eq!(
                    u64::from(s.rx_unreturned),
                    self.received + self.grown() - self.returned
                );
                assert_eq!(u64::from(s.window), self.window);
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

    /// Executes every pending action like a driver would, checking each.
    /// `frame_len` is the length of the frame being handled, if any.
    fn drain(&mut self, frame_len: Option<usize>) -> Drained {
        let mut d = Drained::default();
        while let Some(a) = self.e.poll_action() {
            d.actions += 1;
            if !self.open {
                let on_conn = match &a {
                    Action::SendFrame { conn, .. }
                    | Action::RdmaRead { conn, .. }
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
                    let hdr = wire::decode_header(frame.as_bytes()).expect("valid header");
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
                    let total = match payload {
                        None => {
                            wire::decode(frame.as_bytes()).expect("engine frames decode");
                            frame.as_bytes().len() as u64
                        }
                        Some(p) => {
                            assert_eq!(hdr.opcode, Opcode::Eager);
                            assert_eq!(frame.as_bytes().len(), HEADER_LEN);
                            assert_eq!(u64::from(hdr.payload_len), p.len);
                            HEADER_LEN as u64 + p.len
                        }
                    };
                    assert!(
                        total <= u64::from(self.peer.recv_buf_size),
                        "a {total}-byte frame overflows the peer's receive buffers"
                    );
                }
                // (The engine was given no memory for one-sided operations: it refuses every
                // get, and a refusal carries no bytes.)
                Action::SendFrameData { .. } => panic!("an RMA reply with bytes: {a:?}"),
                Action::ExposeSendBuffer { request, .. } => {
                    let remote = RemoteBuf {
                        addr: 0x10_0000,
                        rkey: 7,
                    };
                    self.e.handle_send_buffer_exposed(request, remote);
                }
                Action::ReleaseSendBuffer { .. } => {}
                // (The fuzzed connection performs no verbs, and the fuzzer makes no
                // one-sided operations.)
                Action::RmaVerbs { .. } => panic!("one-sided work for the NIC: {a:?}"),
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
                    if c.kind == RequestKind::Recv {
                        let cap = *self.recvs.get(&c.request).expect("known receive");
                        match c.status {
                            Status::Ok => assert!(c.length <= cap),
                            Status::Truncated => assert!(c.length > cap),
                            _ => {}
                        }
                    }
                }
                Action::CloseConnection { conn, reason } => {
                    assert_eq!(conn, CONN);
                    assert!(d.close.is_none(), "connection closed twice");
                    self.open = false;
                    self.outcome.close = Some(reason.clone());
                    d.close = Some(reason);
                }
            }
        }
        d
    }

    /// Receives every unexpected message, closes the connection and cancels what is left;
    /// then nothing may be pending.
    fn finish(&mut self) {
        while self.e.unexpected_len() > 0 {
            let before = self.e.unexpected_len();
            self.recv(0, 0, 4096);
            assert!(
                self.e.unexpected_len() < before,
                "a wildcard receive matched nothing"
            );
        }
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
        assert_eq!(self.e.poll_timeout(), None, "a drain timer left running");
        self.check_model();
    }
}
