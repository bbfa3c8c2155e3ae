//! Wire format: a fixed-layout little-endian frame header, the rendezvous body, and the
//! compact connection handshake.
//!
//! See the crate-level documentation for the byte layout. Decoding never panics: every
//! malformed input yields a [`DecodeError`].

use serde::{Deserialize, Serialize};

/// Magic number at offset 0 of every frame (`b"RX"` little-endian).
pub const MAGIC: u16 = u16::from_le_bytes(*b"RX");
/// Wire protocol version carried in every frame and in the handshake.
pub const VERSION: u8 = 1;

/// Header flag: the sender of this frame ran out of credits since its last frame (it had
/// frames waiting): a request for a larger window, which the receiver grants from its
/// worker-wide pool when it can.
pub const FLAG_CREDIT_WANTED: u8 = 1;
/// Size in bytes of the fixed frame header.
pub const HEADER_LEN: usize = 40;
/// Size in bytes of the RTS body (address, rkey, reserved, length).
pub const RTS_BODY_LEN: usize = 24;
/// Largest control frame (header plus the largest fixed body) the engine ever emits.
pub const MAX_CTRL_FRAME: usize = HEADER_LEN + RTS_BODY_LEN;
/// The largest receive buffer a handshake may declare, and a [`crate::Config`] may have
/// (16 MiB): the largest frame any transport carries (TCP's `rdmx_tcp::MAX_FRAME_LEN`; the
/// others' are smaller: RDMA's receive buffers are 8 KiB by default, and rdmx's
/// `RDMX_RECV_BUF_SIZE` sets at most 2 MiB). A peer that declares more is refused at
/// connect: what it declares sizes the frames this side sends it.
pub const MAX_RECV_BUF_SIZE: u32 = 16 << 20;
/// Largest encoded handshake accepted (rdmacm private data limit on connect).
pub const MAX_HANDSHAKE_LEN: usize = 56;

/// Frame operation code (byte 3 of the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Eager tagged message; the payload follows the header.
    Eager = 1,
    /// Rendezvous request-to-send; a 24-byte [`RtsBody`] follows the header.
    Rts = 2,
    /// Rendezvous acknowledgement-to-send; `status` tells the outcome, `sreq` the request.
    Ats = 3,
    /// Error / negative acknowledgement: the peer is closing the connection.
    Error = 4,
    /// Standalone credit update (the `credits` field carries the grant).
    Credit = 5,
    /// In-band handshake (reserved for transports without connect private data).
    Handshake = 6,
    /// One-sided put: an [`RmaBody`] naming the region, then the bytes to write at the
    /// header's `tag` (the offset in the region).
    Put = 7,
    /// One-sided get: an [`RmaBody`] whose word is the length to read at `tag`.
    Get = 8,
    /// Atomic fetch-and-add of the header's `rreq` to the word at `tag` ([`RmaBody`], word 0).
    FetchAdd = 9,
    /// Atomic compare-and-swap of the word at `tag`: `rreq` replaces it if it holds the
    /// [`RmaBody`]'s word.
    CompareSwap = 10,
    /// The target's answer to a put, get or atomic (its `sreq`, `tag` echoed): the status, a
    /// get's bytes as payload, an atomic's old value in `rreq`.
    RmaReply = 11,
}

impl Opcode {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Eager,
            2 => Self::Rts,
            3 => Self::Ats,
            4 => Self::Error,
            5 => Self::Credit,
            6 => Self::Handshake,
            7 => Self::Put,
            8 => Self::Get,
            9 => Self::FetchAdd,
            10 => Self::CompareSwap,
            11 => Self::RmaReply,
            _ => return None,
        })
    }
}

/// Outcome code carried in the `status` byte of ATS and ERROR frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WireStatus {
    /// Success.
    Ok = 0,
    /// The receiver's buffer was smaller than the message.
    Truncated = 1,
    /// The receiver failed to read the sender's buffer.
    ReadFailed = 2,
    /// The receiver detected a protocol violation.
    Protocol = 3,
    /// RMA reply: the key names no mapped region ([`crate::rma::Refusal::BadKey`]: never
    /// mapped, unmapped since, or forged).
    BadKey = 4,
    /// RMA reply: the key's region was unmapped. No longer sent: a target answers a stale
    /// key as it answers a forged one, [`WireStatus::BadKey`] (see [`crate::rma`]'s Keys);
    /// still read, as `BadKey`.
    StaleKey = 5,
    /// RMA reply: the access reaches outside the region.
    OutOfBounds = 6,
    /// RMA reply: an atomic word not 8-byte aligned.
    Unaligned = 7,
    /// RMA reply: the region was not mapped with the access needed.
    NotPermitted = 8,
}

impl WireStatus {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Ok,
            1 => Self::Truncated,
            2 => Self::ReadFailed,
            3 => Self::Protocol,
            4 => Self::BadKey,
            5 => Self::StaleKey,
            6 => Self::OutOfBounds,
            7 => Self::Unaligned,
            8 => Self::NotPermitted,
            _ => return None,
        })
    }
}

/// The largest message a rendezvous may advertise: 2^47 bytes (128 TiB), beyond any buffer a
/// process can have today; a larger RTS is malformed.
pub const MAX_RNDV_LEN: u64 = 1 << 47;

/// Why a byte string is not a valid frame or handshake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the fixed header.
    #[error("frame of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    /// Wrong magic number.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// Unsupported protocol version.
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    /// Unknown opcode.
    #[error("unknown opcode {0}")]
    BadOpcode(u8),
    /// Reserved flag bits set.
    #[error("reserved flags {0:#04x} set")]
    BadFlags(u8),
    /// Unknown status code.
    #[error("unknown status code {0}")]
    BadStatus(u8),
    /// `payload_len` disagrees with the number of bytes received.
    #[error("payload length {declared} disagrees with {actual} bytes received after the header")]
    LengthMismatch {
        /// Length declared in the header.
        declared: u32,
        /// Bytes actually present after the header.
        actual: usize,
    },
    /// The body size is wrong for the opcode.
    #[error("{opcode:?} frame with a {len}-byte body")]
    BadBody {
        /// The opcode.
        opcode: Opcode,
        /// Its body length.
        len: usize,
    },
    /// A reserved field was not zero.
    #[error("reserved field not zero")]
    Reserved,
    /// An RTS advertising a buffer no sender can have: empty (empty messages go eagerly),
    /// longer than [`MAX_RNDV_LEN`], or running past the end of the address space.
    #[error("RTS advertises {len} bytes at {addr:#x}: out of range")]
    RtsOutOfRange {
        /// Advertised address.
        addr: u64,
        /// Advertised length.
        len: u64,
    },
    /// The handshake could not be decoded.
    #[error("bad handshake: {0}")]
    Handshake(String),
}

/// The fixed 40-byte frame header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Operation code.
    pub opcode: Opcode,
    /// Flag bits: [`FLAG_CREDIT_WANTED`] or none (any other bit is a decode error).
    pub flags: u8,
    /// Status (ATS / ERROR); zero otherwise.
    pub status: WireStatus,
    /// Credits granted back to the receiver of this frame (piggybacked flow control).
    pub credits: u16,
    /// Per-connection, per-direction frame sequence number (wrapping).
    pub seq: u32,
    /// Bytes following the header.
    pub payload_len: u32,
    /// Message tag (EAGER, RTS); zero otherwise.
    pub tag: u64,
    /// Sender-side request id (RTS, ATS).
    pub sreq: u64,
    /// Receiver-side request id (ATS; informational).
    pub rreq: u64,
}

impl Header {
    /// A header with the given opcode and every other field zero.
    pub fn new(opcode: Opcode) -> Self {
        Header {
            opcode,
            flags: 0,
            status: WireStatus::Ok,
            credits: 0,
            seq: 0,
            payload_len: 0,
            tag: 0,
            sreq: 0,
            rreq: 0,
        }
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`HEADER_LEN`] (a caller bug, never input-dependent).
    #[inline]
    pub fn write(&self, out: &mut [u8]) {
        // (One encoder: the words a `FrameBuf` holds, as bytes.)
        let mut words = [0u64; MAX_CTRL_FRAME / 8];
        self.write_words(&mut words);
        out[..HEADER_LEN].copy_from_slice(&zerocopy::IntoBytes::as_bytes(&words)[..HEADER_LEN]);
    }

    /// [`Header::write`] as 8-byte words, into the first [`HEADER_WORDS`] of `out`: each
    /// the little-endian reading of its bytes, stored in native order (see [`FrameBuf`]).
    #[inline]
    fn write_words(&self, out: &mut [u64; MAX_CTRL_FRAME / 8]) {
        out[0] = (u64::from(MAGIC)
            | u64::from(VERSION) << 16
            | (self.opcode as u64) << 24
            | u64::from(self.flags) << 32
            | (self.status as u64) << 40
            | u64::from(self.credits) << 48)
            .to_le();
        out[1] = (u64::from(self.seq) | u64::from(self.payload_len) << 32).to_le();
        out[2] = self.tag.to_le();
        out[3] = self.sreq.to_le();
        out[4] = self.rreq.to_le();
    }
}

/// Body of an RTS frame: where and how large the sender's exposed buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsBody {
    /// Remote address (opaque to the engine).
    pub addr: u64,
    /// Remote key (opaque to the engine).
    pub rkey: u32,
    /// Message length in bytes.
    pub len: u64,
}

impl RtsBody {
    /// The body's 8-byte words, read little-endian: address, key (and 4 reserved zero
    /// bytes), length.
    fn words(&self) -> [u64; RTS_BODY_LEN / 8] {
        [self.addr, u64::from(self.rkey), self.len]
    }
}

/// Body of a put, get or atomic frame: the region's key and one word (a get's length, a
/// compare-and-swap's expected value, 0 otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmaBody {
    /// The region's key.
    pub key: crate::rma::KeyRef,
    /// The operation's word.
    pub word: u64,
}

impl RmaBody {
    /// Bytes of an encoded body: region and generation, secret, word.
    pub const LEN: usize = 24;

    fn words(&self) -> [u64; 3] {
        [
            u64::from(self.key.region) | u64::from(self.key.generation) << 32,
            self.key.secret,
            self.word,
        ]
    }

    /// The payload of a put, get or atomic frame ([`Body::OneSided`]) as its body and what
    /// follows it (a put's bytes); `None` if it is shorter than a body (which decoding rules
    /// out).
    pub fn split(payload: &[u8]) -> Option<(Self, &[u8])> {
        let (body, data) = payload.split_at_checked(Self::LEN)?;
        Some((Self::decode(body), data))
    }

    fn decode(b: &[u8]) -> Self {
        let w0 = u64_at(b, 0);
        RmaBody {
            key: crate::rma::KeyRef {
                region: w0 as u32,
                generation: (w0 >> 32) as u32,
                secret: u64_at(b, 8),
            },
            word: u64_at(b, 16),
        }
    }
}

/// Body of a decoded frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body<'a> {
    /// Eager payload.
    Eager(&'a [u8]),
    /// Rendezvous descriptor.
    Rts(RtsBody),
    /// ATS (no body).
    Ats,
    /// ERROR (no body).
    Error,
    /// Credit update (no body).
    Credit,
    /// Encoded [`Handshake`] bytes (not yet validated).
    Handshake(&'a [u8]),
    /// A put, get, atomic operation or RMA reply (the opcode says which): its payload, of
    /// the length the opcode asks for — an [`RmaBody`] (a put's followed by its bytes, see
    /// [`RmaBody::split`]), or a reply's bytes. (One variant for all four, kept whole: the
    /// `Body` of every frame is matched on its path, and more or larger variants cost each
    /// one.)
    OneSided(&'a [u8]),
}

/// A decoded frame borrowing from the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The header.
    pub header: Header,
    /// The opcode-specific body.
    pub body: Body<'a>,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}
pub(crate) fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// Decodes only the fixed header (no payload-length check). Never panics.
// (Inline, as `decode` is, which calls it for every frame.)
#[inline]
pub fn decode_header(bytes: &[u8]) -> Result<Header, DecodeError> {
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::Short(bytes.len()));
    }
    let magic = u16_at(bytes, 0);
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    if bytes[2] != VERSION {
        return Err(DecodeError::BadVersion(bytes[2]));
    }
    let opcode = Opcode::from_u8(bytes[3]).ok_or(DecodeError::BadOpcode(bytes[3]))?;
    if bytes[4] & !FLAG_CREDIT_WANTED != 0 {
        return Err(DecodeError::BadFlags(bytes[4]));
    }
    let status = WireStatus::from_u8(bytes[5]).ok_or(DecodeError::BadStatus(bytes[5]))?;
    Ok(Header {
        opcode,
        flags: bytes[4],
        status,
        credits: u16_at(bytes, 6),
        seq: u32_at(bytes, 8),
        payload_len: u32_at(bytes, 12),
        tag: u64_at(bytes, 16),
        sreq: u64_at(bytes, 24),
        rreq: u64_at(bytes, 32),
    })
}

/// The bits of a header's first word (read little-endian) that an EAGER frame fixes, and
/// their value: magic, version, opcode, the flags but [`FLAG_CREDIT_WANTED`], and a zero
/// status. The rest are the credit-wanted flag and the credits, any value of which is valid.
const EAGER_WORD_MASK: u64 = 0x0000_ffff_ffff_ffff & !((FLAG_CREDIT_WANTED as u64) << 32);
const EAGER_WORD: u64 = MAGIC as u64 | (VERSION as u64) << 16 | (Opcode::Eager as u64) << 24;

/// Decodes one frame from untrusted bytes. Never panics.
///
/// An EAGER frame, the one of every small message, is recognised by its first word alone
/// and its length checked against its header, which is all [`decode_header`] and the
/// general checks ask of one (a test holds the two ways to the same answers).
// (Inline, with `decode_header`: the engine decodes every frame it is given, and as a call
// the `Frame` comes back through memory, once per message.)
#[inline]
pub fn decode(bytes: &[u8]) -> Result<Frame<'_>, DecodeError> {
    if let Some((head, payload)) = bytes.split_first_chunk::<HEADER_LEN>() {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&head[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let (w0, w1) = (word(0), word(1));
        if w0 & EAGER_WORD_MASK == EAGER_WORD && (w1 >> 32) as usize == payload.len() {
            return Ok(Frame {
                header: Header {
                    opcode: Opcode::Eager,
                    flags: (w0 >> 32) as u8,
                    status: WireStatus::Ok,
                    credits: (w0 >> 48) as u16,
                    seq: w1 as u32,
                    payload_len: (w1 >> 32) as u32,
                    tag: word(2),
                    sreq: word(3),
                    rreq: word(4),
                },
                body: Body::Eager(payload),
            });
        }
    }
    decode_any(bytes)
}

/// [`decode`] of any frame, field by field.
#[inline]
fn decode_any(bytes: &[u8]) -> Result<Frame<'_>, DecodeError> {
    let header = decode_header(bytes)?;
    let opcode = header.opcode;
    let status = header.status;
    let payload = &bytes[HEADER_LEN..];
    if header.payload_len as usize != payload.len() {
        return Err(DecodeError::LengthMismatch {
            declared: header.payload_len,
            actual: payload.len(),
        });
    }
    let bad_body = || DecodeError::BadBody {
        opcode,
        len: payload.len(),
    };
    let body = match opcode {
        Opcode::Eager => Body::Eager(payload),
        Opcode::Rts => {
            if payload.len() != RTS_BODY_LEN {
                return Err(bad_body());
            }
            if u32_at(payload, 12) != 0 {
                return Err(DecodeError::Reserved);
            }
            let (addr, len) = (u64_at(payload, 0), u64_at(payload, 16));
            if len == 0 || len > MAX_RNDV_LEN || addr.checked_add(len).is_none() {
                return Err(DecodeError::RtsOutOfRange { addr, len });
            }
            Body::Rts(RtsBody {
                addr,
                rkey: u32_at(payload, 8),
                len,
            })
        }
        Opcode::Ats | Opcode::Error | Opcode::Credit => {
            if !payload.is_empty() {
                return Err(bad_body());
            }
            match opcode {
                Opcode::Ats => Body::Ats,
                Opcode::Error => Body::Error,
                _ => Body::Credit,
            }
        }
        Opcode::Handshake => {
            if payload.len() > MAX_HANDSHAKE_LEN {
                return Err(bad_body());
            }
            Body::Handshake(payload)
        }
        Opcode::Put => {
            if payload.len() < RmaBody::LEN {
                return Err(bad_body());
            }
            Body::OneSided(payload)
        }
        Opcode::Get | Opcode::FetchAdd | Opcode::CompareSwap => {
            if payload.len() != RmaBody::LEN {
                return Err(bad_body());
            }
            let body = RmaBody::decode(payload);
            if opcode == Opcode::FetchAdd && body.word != 0 {
                return Err(DecodeError::Reserved);
            }
            Body::OneSided(payload)
        }
        Opcode::RmaReply => Body::OneSided(payload),
    };
    // (A status only where it means something: ATS and ERROR take the rendezvous ones, an
    // RMA reply success or a refusal.)
    let status_ok = match opcode {
        Opcode::Ats | Opcode::Error => (status as u8) <= WireStatus::Protocol as u8,
        Opcode::RmaReply => status == WireStatus::Ok || (status as u8) >= WireStatus::BadKey as u8,
        _ => status == WireStatus::Ok,
    };
    if !status_ok {
        return Err(DecodeError::BadStatus(status as u8));
    }
    Ok(Frame { header, body })
}

/// An encoded control frame (header plus optional RTS body) held inline, without allocation.
///
/// For EAGER frames this holds only the header; the driver appends the user's payload.
///
/// Held as whole words, each the little-endian reading of 8 bytes of the encoding (so that
/// their bytes in memory are the encoding on a little-endian host; on a big-endian one each
/// word is byte-swapped first): a transport that stores words, as shared memory's rings do,
/// takes [`FrameBuf::words`] without assembling them from bytes, and one that sends bytes
/// takes [`FrameBuf::as_bytes`]. Every frame is a whole number of words long (a header,
/// or a header and an RTS body).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FrameBuf {
    words: [u64; MAX_CTRL_FRAME / 8],
    len: u8,
}

/// Words of a frame header.
pub const HEADER_WORDS: usize = HEADER_LEN / 8;

impl FrameBuf {
    /// Encodes `header` followed by an optional RTS body.
    ///
    /// `header.payload_len` must already describe the whole payload (for EAGER, the user
    /// payload the driver will append).
    #[inline]
    pub fn encode(header: &Header, rts: Option<&RtsBody>) -> Self {
        Self::encode_words(header, rts.map(RtsBody::words))
    }

    /// Encodes `header` followed by an optional [`RmaBody`] (a put's bytes, which the
    /// driver appends, are counted in `header.payload_len` with the body's).
    pub fn encode_rma(header: &Header, body: &RmaBody) -> Self {
        Self::encode_words(header, Some(body.words()))
    }

    #[inline]
    fn encode_words(header: &Header, body: Option<[u64; 3]>) -> Self {
        let mut words = [0u64; MAX_CTRL_FRAME / 8];
        header.write_words(&mut words);
        let mut len = HEADER_LEN;
        if let Some(r) = body {
            for (w, v) in words[HEADER_WORDS..].iter_mut().zip(r) {
                *w = v.to_le();
            }
            len += RTS_BODY_LEN;
        }
        FrameBuf {
            words,
            len: len as u8,
        }
    }

    /// The encoded bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &zerocopy::IntoBytes::as_bytes(&self.words)[..self.len as usize]
    }

    /// The encoded bytes as words ([`FrameBuf::as_bytes`] read 8 at a time, in native
    /// order: their bytes in memory are the encoding).
    #[inline]
    pub fn words(&self) -> &[u64] {
        &self.words[..self.len as usize / 8]
    }

    /// The decoded header (always valid: it was produced by [`FrameBuf::encode`]).
    pub fn header(&self) -> Header {
        decode_header(self.as_bytes()).unwrap_or_else(|_| Header::new(Opcode::Error))
    }
}

impl std::fmt::Debug for FrameBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameBuf")
            .field("header", &self.header())
            .field("len", &self.len)
            .finish()
    }
}

/// Magic word opening an encoded [`Handshake`].
pub const HANDSHAKE_MAGIC: u32 = u32::from_le_bytes(*b"RDMX");

/// Connection handshake exchanged in rdmacm private data (at most 56 bytes; 14 encoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handshake {
    /// Must be [`HANDSHAKE_MAGIC`].
    pub magic: u32,
    /// Wire protocol version ([`VERSION`]).
    pub version: u16,
    /// Size in bytes of each receive buffer the sender of this handshake posts.
    pub recv_buf_size: u32,
    /// Frames the peer may send before waiting for credit returns: the initial grant.
    pub credits: u16,
    /// The most credits the sender of this handshake ever grants (the largest window it
    /// may grow the initial grant to, on demand).
    pub max_credits: u16,
}

fn handshake_options() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(MAX_HANDSHAKE_LEN as u64)
        .allow_trailing_bytes()
}

impl Handshake {
    /// Encodes the handshake with bincode 1.3 (fixed-width little-endian, 14 bytes).
    pub fn encode(&self) -> Vec<u8> {
        use bincode::Options;
        // Serialising a plain struct of integers into a Vec cannot fail.
        handshake_options().serialize(self).unwrap_or_default()
    }

    /// Decodes untrusted bytes. Never panics. rdmacm zero-pads private data (to 56 bytes
    /// on connect, 196 on accept): bytes past [`MAX_HANDSHAKE_LEN`] are accepted only when
    /// they are all zero.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        use bincode::Options;
        if bytes.len() > MAX_HANDSHAKE_LEN
            && (bytes.len() > 256 || bytes[MAX_HANDSHAKE_LEN..].iter().any(|&b| b != 0))
        {
            return Err(DecodeError::Handshake(format!(
                "{} bytes exceed the {MAX_HANDSHAKE_LEN}-byte limit",
                bytes.len()
            )));
        }
        let bytes = &bytes[..bytes.len().min(MAX_HANDSHAKE_LEN)];
        let hs: Handshake = handshake_options()
            .deserialize(bytes)
            .map_err(|e| DecodeError::Handshake(e.to_string()))?;
        if hs.magic != HANDSHAKE_MAGIC {
            return Err(DecodeError::Handshake(format!("bad magic {:#x}", hs.magic)));
        }
        Ok(hs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frames_words_are_its_encoding() {
        let mut h = Header::new(Opcode::Rts);
        h.flags = FLAG_CREDIT_WANTED;
        h.credits = 0x0a0b;
        h.seq = 0x0c0d_0e0f;
        h.payload_len = RTS_BODY_LEN as u32;
        h.tag = 0x1112_1314_1516_1718;
        h.sreq = 0x2122_2324_2526_2728;
        h.rreq = 0x3132_3334_3536_3738;
        let body = RtsBody {
            addr: 0x4142_4344_4546_4748,
            rkey: 0x5152_5354,
            len: 0x0102_0304,
        };
        let f = FrameBuf::encode(&h, Some(&body));
        let mut want = [0u8; MAX_CTRL_FRAME];
        h.write(&mut want);
        want[40..48].copy_from_slice(&body.addr.to_le_bytes());
        want[48..52].copy_from_slice(&body.rkey.to_le_bytes());
        want[56..64].copy_from_slice(&body.len.to_le_bytes());
        assert_eq!(f.as_bytes(), &want[..HEADER_LEN + RTS_BODY_LEN]);
        assert_eq!(f.words().len() * 8, f.as_bytes().len());
        for (w, b) in f.words().iter().zip(f.as_bytes().chunks(8)) {
            assert_eq!(&w.to_ne_bytes()[..], b);
        }
        let d = decode(f.as_bytes()).unwrap();
        assert_eq!(d.header, h);
        assert_eq!(d.body, Body::Rts(body));
        let plain = FrameBuf::encode(&Header::new(Opcode::Credit), None);
        assert_eq!(plain.as_bytes().len(), HEADER_LEN);
        assert_eq!(plain.words().len(), HEADER_WORDS);
    }

    proptest::proptest! {
        /// The EAGER fast path of `decode` gives what the field-by-field decoding gives, for
        /// eager frames with any header (every field and flag) and for bytes near them.
        #[test]
        fn the_eager_fast_path_decodes_as_the_general_one(
            credits in proptest::prelude::any::<u16>(),
            seq in proptest::prelude::any::<u32>(),
            tag in proptest::prelude::any::<u64>(),
            sreq in proptest::prelude::any::<u64>(),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            flip in proptest::option::of((0usize..48, 0u8..8)),
            cut in proptest::option::of(0usize..48),
            extra in proptest::option::of(0u8..=255),
        ) {
            let mut h = Header::new(Opcode::Eager);
            h.flags = (seq & 1) as u8 * FLAG_CREDIT_WANTED;
            h.credits = credits;
            h.seq = seq;
            h.payload_len = payload.len() as u32;
            h.tag = tag;
            h.sreq = sreq;
            h.rreq = !sreq;
            let mut bytes = FrameBuf::encode(&h, None).as_bytes().to_vec();
            bytes.extend_from_slice(&payload);
            if let Some((at, bit)) = flip {
                if let Some(b) = bytes.get_mut(at) {
                    *b ^= 1 << bit;
                }
            }
            if let Some(extra) = extra {
                bytes.push(extra);
            }
            if let Some(cut) = cut {
                bytes.truncate(cut);
            }
            proptest::prop_assert_eq!(decode(&bytes), decode_any(&bytes));
        }
    }

    fn rts(addr: u64, len: u64) -> Vec<u8> {
        let mut h = Header::new(Opcode::Rts);
        h.payload_len = RTS_BODY_LEN as u32;
        FrameBuf::encode(&h, Some(&RtsBody { addr, rkey: 7, len }))
            .as_bytes()
            .to_vec()
    }

    #[test]
    fn rts_must_advertise_a_buffer_that_can_exist() {
        assert!(matches!(
            decode(&rts(0x1000, 1)).map(|f| f.body),
            Ok(Body::Rts(RtsBody {
                addr: 0x1000,
                rkey: 7,
                len: 1
            }))
        ));
        assert!(decode(&rts(u64::MAX - 100, 100)).is_ok());
        assert!(decode(&rts(0, MAX_RNDV_LEN)).is_ok());
        for (addr, len) in [(0x1000, 0), (0, MAX_RNDV_LEN + 1), (u64::MAX - 99, 100)] {
            assert_eq!(
                decode(&rts(addr, len)).map(|f| f.header),
                Err(DecodeError::RtsOutOfRange { addr, len })
            );
        }
    }
}
