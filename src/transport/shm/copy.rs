//! Rendezvous by copy, for a reader that may not use CMA (the kernel refused it at connect —
//! `yama/ptrace_scope`, another user — or `RDMX_SHM_CMA=0`).
//!
//! The reader's READ becomes a GET record in its send ring. The sender's link answers it from
//! its exposure table (the buffer an RTS named, kept alive and unmoved until its send
//! completes) with DATA records of at most [`DATA_CHUNK`] bytes, pushed as its ring has room:
//! the copy is pipelined, the reader copying one chunk out while the next goes in. The reader
//! copies each chunk into the buffer lent to its link, and reports the READ done once all of
//! it arrived (or failed, when the sender refused: no such buffer, or not that range).
//!
//! Both records come from the peer, so every field is checked before use: a GET for a buffer
//! exposed to another endpoint, a DATA record out of order or past its READ's length, or a
//! record too short for its header is a protocol error that closes the connection.
//!
//! GETs cost the peer no credit, so their number is bounded on their own: a sender answers
//! at most [`MAX_GETS`] (64) GETs of a peer's at once — answers waiting for room in the ring —
//! and a further one fails the connection; a reader sends at most as many unanswered and
//! holds the rest back in its link until answers complete. Reading a ring never waits for an
//! outbox, so two readers copying from each other never both stop.

use std::sync::Arc;

use rdmx_shm::Producer;

/// Records carrying protocol frames.
pub(super) const KIND_FRAME: u8 = 0;
/// A reader's request for bytes of an exposed buffer ([`Get`]).
pub(super) const KIND_GET: u8 = 1;
/// Bytes answering a GET ([`DataHeader`], then the bytes).
pub(super) const KIND_DATA: u8 = 2;
/// GETs a peer may have unanswered on one connection: answers queued behind a full ring.
/// A GET past them is a protocol error that fails the connection. An rdmx reader holds its
/// own GETs back past as many (they wait in its link), so no rdmx peer ever reaches the
/// bound; 64 keep far more rendezvous data asked for than a ring holds (the engine asks for
/// 1 MiB a READ by default, the ring holds 256 KiB).
pub(crate) const MAX_GETS: usize = 64;

/// Bytes per DATA record at most (a record fits one of the worker's 64 KiB frame buffers).
pub(super) const DATA_CHUNK: usize = (64 << 10) - 64;

pub(super) const GET_LEN: usize = 32;
const DATA_HEADER_LEN: usize = 24;

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A reader's request: `len` bytes at `addr` (an address in the sender, as its RTS named it)
/// of the buffer exposed under `rkey`, for the READ the reader calls `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Get {
    pub(super) key: u64,
    pub(super) rkey: u32,
    pub(super) addr: u64,
    pub(super) len: u64,
}

impl Get {
    pub(super) fn encode(&self) -> [u8; GET_LEN] {
        let mut b = [0u8; GET_LEN];
        b[0..8].copy_from_slice(&self.key.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub(super) fn decode(b: &[u8]) -> Result<Get, String> {
        if b.len() != GET_LEN {
            return Err(format!("a GET record of {} bytes, not {GET_LEN}", b.len()));
        }
        Ok(Get {
            key: word(b, 0),
            rkey: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            addr: word(b, 16),
            len: word(b, 24),
        })
    }
}

/// The head of a DATA record: bytes of the READ `key` from `offset` on, or `refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DataHeader {
    pub(super) key: u64,
    pub(super) offset: u64,
    pub(super) refused: bool,
}

impl DataHeader {
    pub(super) fn encode(&self) -> [u8; DATA_HEADER_LEN] {
        let mut b = [0u8; DATA_HEADER_LEN];
        b[0..8].copy_from_slice(&self.key.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16] = u8::from(self.refused);
        b
    }

    /// The header and the bytes after it.
    pub(super) fn decode(b: &[u8]) -> Result<(DataHeader, &[u8]), String> {
        if b.len() < DATA_HEADER_LEN {
            return Err(format!("a DATA record of {} bytes", b.len()));
        }
        if b[16] > 1 || b[17..DATA_HEADER_LEN].iter().any(|&x| x != 0) {
            return Err("a DATA record with reserved bytes set".into());
        }
        Ok((
            DataHeader {
                key: word(b, 0),
                offset: word(b, 8),
                refused: b[16] == 1,
            },
            &b[DATA_HEADER_LEN..],
        ))
    }
}

/// A GET being answered: `len` bytes of `data` from `start`, `sent` of them pushed so far;
/// `data` is `None` for a refusal (one DATA record saying so).
pub(super) struct Serving {
    pub(super) key: u64,
    pub(super) data: Option<Arc<Vec<u8>>>,
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) sent: usize,
}

impl Serving {
    /// Pushes the DATA records `tx` has room for: `Ok(true)` once all went.
    pub(super) fn push(&mut self, tx: &mut Producer) -> rdmx_shm::Result<bool> {
        let chunk = DATA_CHUNK.min(tx.max_frame() - DATA_HEADER_LEN);
        loop {
            let header = DataHeader {
                key: self.key,
                offset: self.sent as u64,
                refused: self.data.is_none(),
            }
            .encode();
            let n = (self.len - self.sent).min(chunk);
            let piece = match &self.data {
                Some(d) => &d[self.start + self.sent..self.start + self.sent + n],
                None => &[][..],
            };
            if !tx.push_kind(KIND_DATA, &[&header, piece])? {
                return Ok(false);
            }
            self.sent += n;
            if self.sent == self.len || self.data.is_none() {
                return Ok(true);
            }
        }
    }
}

/// A READ of the reader's waiting for DATA: `len` bytes into the lent buffer `buf` at
/// `offset`, `got` of them arrived; `asked`: its GET went to the sender (else it is held
/// back, see the link's `Reads`).
pub(super) struct Copying {
    pub(super) buf: u64,
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) got: usize,
    pub(super) asked: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_malformed_ones_are_errors() {
        let g = Get {
            key: 7,
            rkey: 0xdead_beef,
            addr: 0x7f00_0000_1000,
            len: 1 << 20,
        };
        assert_eq!(Get::decode(&g.encode()), Ok(g));
        assert!(Get::decode(&g.encode()[..31]).is_err());
        let h = DataHeader {
            key: 9,
            offset: 65536,
            refused: false,
        };
        let mut rec = h.encode().to_vec();
        rec.extend_from_slice(b"bytes");
        assert_eq!(DataHeader::decode(&rec), Ok((h, &b"bytes"[..])));
        assert!(DataHeader::decode(&rec[..23]).is_err());
        rec[16] = 2;
        assert!(DataHeader::decode(&rec).is_err(), "reserved flag bits");
        rec[16] = 0;
        rec[20] = 1;
        assert!(DataHeader::decode(&rec).is_err(), "reserved bytes");
    }
}
