//! Envelope constants and helpers (see the crate docs for the format).

/// Length of the envelope header.
pub(crate) const HEADER_LEN: usize = 8;

pub(crate) const KIND_HELLO: u8 = 1;
pub(crate) const KIND_ACCEPT: u8 = 2;
pub(crate) const KIND_REJECT: u8 = 3;
pub(crate) const KIND_FRAME: u8 = 4;
pub(crate) const KIND_READ_REQ: u8 = 5;
pub(crate) const KIND_READ_DATA: u8 = 6;

/// Magic of handshake bodies.
pub(crate) const MAGIC: [u8; 4] = *b"RXTC";
/// Handshake protocol version.
pub(crate) const VERSION: u16 = 1;
/// Magic + version in front of the private data of a handshake body.
pub(crate) const HANDSHAKE_PREFIX: usize = 6;

/// Body length of READ_REQ.
pub(crate) const READ_REQ_LEN: usize = 32;
/// Sub-header of READ_DATA (read id, status, 7 reserved bytes).
pub(crate) const READ_DATA_HEAD: usize = 16;

pub(crate) const STATUS_OK: u8 = 0;
pub(crate) const STATUS_FAILED: u8 = 1;

/// The largest data length one READ_DATA can carry (its body length is a `u32`).
pub(crate) const MAX_READ_DATA: usize = u32::MAX as usize - READ_DATA_HEAD;

/// The name of a message kind, for error messages.
pub(crate) fn kind_name(kind: u8) -> &'static str {
    match kind {
        KIND_HELLO => "HELLO",
        KIND_ACCEPT => "ACCEPT",
        KIND_REJECT => "REJECT",
        KIND_FRAME => "FRAME",
        KIND_READ_REQ => "READ_REQ",
        KIND_READ_DATA => "READ_DATA",
        _ => "unknown",
    }
}

/// Encodes an envelope header. `len` must fit in a `u32` (callers check).
pub(crate) fn header(kind: u8, len: usize) -> [u8; HEADER_LEN] {
    debug_assert!(u32::try_from(len).is_ok());
    let mut h = [0u8; HEADER_LEN];
    h[0] = kind;
    h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// Decodes an envelope header into `(kind, body length)`; the kind is not checked, the
/// reserved bytes are.
pub(crate) fn parse_header(h: &[u8; HEADER_LEN]) -> Result<(u8, usize), String> {
    if h[1..4] != [0, 0, 0] {
        return Err(format!(
            "non-zero reserved bytes {:?} in the envelope header of a {} message (kind {})",
            &h[1..4],
            kind_name(h[0]),
            h[0]
        ));
    }
    let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    Ok((h[0], len as usize))
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

/// A whole READ_REQ message (header and body).
pub(crate) fn read_req(
    read_id: u64,
    addr: u64,
    rkey: u32,
    len: u64,
) -> [u8; HEADER_LEN + READ_REQ_LEN] {
    let mut m = [0u8; HEADER_LEN + READ_REQ_LEN];
    m[..HEADER_LEN].copy_from_slice(&header(KIND_READ_REQ, READ_REQ_LEN));
    m[8..16].copy_from_slice(&read_id.to_le_bytes());
    m[16..24].copy_from_slice(&addr.to_le_bytes());
    m[24..28].copy_from_slice(&rkey.to_le_bytes());
    m[32..40].copy_from_slice(&len.to_le_bytes());
    m
}

/// The header and sub-header of a READ_DATA message carrying `data_len` bytes.
pub(crate) fn read_data_head(
    read_id: u64,
    status: u8,
    data_len: usize,
) -> [u8; HEADER_LEN + READ_DATA_HEAD] {
    let mut m = [0u8; HEADER_LEN + READ_DATA_HEAD];
    m[..HEADER_LEN].copy_from_slice(&header(KIND_READ_DATA, READ_DATA_HEAD + data_len));
    m[8..16].copy_from_slice(&read_id.to_le_bytes());
    m[16] = status;
    m
}

/// A whole handshake message (HELLO, ACCEPT or REJECT); `data` is at most
/// [`MAX_PRIVATE_DATA`](crate::MAX_PRIVATE_DATA) bytes (callers check).
pub(crate) fn handshake(kind: u8, data: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(HEADER_LEN + HANDSHAKE_PREFIX + data.len());
    m.extend_from_slice(&header(kind, HANDSHAKE_PREFIX + data.len()));
    m.extend_from_slice(&MAGIC);
    m.extend_from_slice(&VERSION.to_le_bytes());
    m.extend_from_slice(data);
    m
}
