//! The checks the fuzz targets run, one function per target, each taking arbitrary bytes.
//!
//! The corpus replay test (`crates/proto/tests/corpus.rs`) includes this file as a module
//! (`#[path]`), so every committed corpus entry goes through exactly the code the fuzzer ran.
//! This file must therefore build with stable Rust at the workspace MSRV (1.80) and use
//! nothing but `rdmx-proto` and `std`.
//!
//! A check panics only when `rdmx-proto` misbehaves: a panic inside the crate itself, or a
//! broken invariant asserted here. (`scripts/fuzz` runs the targets with a limit on any one
//! allocation, so an allocation a peer sizes beyond the engine's bounds is a crash too.)

use std::sync::Arc;

use rdmx_proto::wire::{self, Body, FrameBuf, Opcode};
use rdmx_proto::{
    CloseReason, Completion, Config, ConnId, Engine, Handshake, RecvBufId, UserBufId, HEADER_LEN,
    MAX_RECV_BUF_SIZE,
};

#[path = "harness.rs"]
mod harness;
#[path = "one_sided.rs"]
pub mod one_sided;

use harness::Harness;
use one_sided::Memory;

/// Target `frame_decode`: `data` is one frame.
///
/// A frame that decodes re-encodes to exactly `data` (no field is silently ignored). Fed to
/// an engine as the first frame of a fresh connection, its receive buffer is reposted exactly
/// once, and a frame that does not decode (or does not fit a receive buffer) closes the
/// connection with a protocol error. The engine has memory for one-sided operations
/// ([`one_sided::Memory`]), so a put, get or atomic frame reaches it.
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
    e.set_rma_memory(Arc::new(Memory::new()));
    let conn = ConnId(1);
    let hs = e.local_handshake();
    e.handle_connection_up(conn, &hs)
        .expect("a fresh engine accepts its own handshake");
    e.tag_recv(0, 0, UserBufId(1), 1 << 20);
    e.handle_frame(conn, RecvBufId(0), data);
    let mut close = None;
    while let Some(a) = e.poll_action() {
        match a {
            rdmx_proto::Action::CopyFromRecvBuf { src, .. } => {
                assert_eq!(src, RecvBufId(0), "copy out of another receive buffer");
            }
            rdmx_proto::Action::SendFrameData { data, .. } => {
                let room = cfg.recv_buf_size as usize - HEADER_LEN;
                assert!(data.len() <= room, "a {}-byte reply", data.len());
            }
            rdmx_proto::Action::CloseConnection { conn: c, reason } => {
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
/// an engine either accepts it (and then honours the peer's buffer size and credits, which
/// it took only within its bounds) or rejects it without any side effect.
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
            assert!(hs.recv_buf_size <= MAX_RECV_BUF_SIZE, "{hs:?} taken");
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
    /// An RMA byte follows this one (before the handshake): the engine's memory and this
    /// side's one-sided operations (`one_sided::rma_flag`). Without it the engine has
    /// memory and makes no one-sided operation.
    pub const RMA: u8 = 1 << 7;
}

/// Target `engine_frames`: `data` is a peer's side of a connection.
///
/// Input layout: a flag byte (see `flag`), an optional RMA byte (see
/// `one_sided::rma_flag`), an optional handshake (decoded, or the default one when it does
/// not decode), then frames, each a little-endian `u16` length followed by that many bytes
/// (the last one cut short by the end of the input). The harness plays the driver: it gives
/// the engine memory for the peer's one-sided operations (regions the peer's frames name by
/// the keys of `one_sided::peer_keys`), exposes send buffers, completes RDMA READs at once
/// and NIC work when told, and finally receives every unexpected message, closes the
/// connection and cancels what is left. An RMA reply whose request field is a small index
/// `i` is aimed at this side's `i`-th one-sided operation.
///
/// Besides "never panics" it checks the engine against a model of the peer: exactly one
/// repost per frame; a frame closes the connection exactly when it is malformed, oversized,
/// out of sequence, over the credit limits (protocol error) or an ERROR (peer error); after
/// the close nothing else happens on the connection; the engine never sends more frames
/// than the peer granted credits, nor returns more credits than frames it received, nor
/// holds more replies to the peer's operations than its window (each holds its
/// operation's credit); every frame it sends is valid and fits the peer's buffers; each
/// reply answers the peer's operations in order with what the memory returned, and a get's
/// carries at most what fits the smaller of both sides' buffers; it takes an RMA reply
/// exactly when one of its operations awaits it by messages, with the bytes asked; copies,
/// READs and NIC work stay inside the buffers they target; and no request is left pending
/// at the end.
///
/// Returns what happened, for the replay test's assertions about the named seeds.
pub fn engine_frames(data: &[u8]) -> EngineOutcome {
    let flags = data.first().copied().unwrap_or(0);
    let mut rest = data.get(1..).unwrap_or(&[]);
    let rma = if flags & flag::RMA != 0 {
        take(&mut rest, 1).first().copied()
    } else {
        None
    };
    // A fixed window of the default's largest size (what the seeds were written for);
    // windows that grow and shrink are tested on the simulated fabric (tests/credits.rs).
    let cfg = Config::builder()
        .initial_credits(Config::default().credits)
        .build()
        .expect("valid configuration");
    let mut h = Harness::new(cfg, flags & flag::READ_FAIL != 0, rma.unwrap_or(0));
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
    if let Some(rma) = rma {
        h.start_rma(rma);
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
        if rma.is_some() {
            h.ops.aim(&mut frame);
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
    /// The status of each reply the engine sent to the peer's one-sided operations.
    pub replies: Vec<wire::WireStatus>,
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
