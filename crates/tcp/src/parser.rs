//! A link's input side: the incremental parser of the byte stream (frames, READ requests,
//! READ data landing in lent buffers), which survives short reads at any byte boundary.

use std::collections::HashMap;

use crate::link::Event;
use crate::link::READ_CHUNK;
use crate::wire::{
    self, HEADER_LEN, KIND_ACCEPT, KIND_FRAME, KIND_HELLO, KIND_READ_DATA, KIND_READ_REQ,
    KIND_REJECT, READ_DATA_HEAD, READ_REQ_LEN, STATUS_FAILED, STATUS_OK,
};
use crate::MAX_FRAME_LEN;

#[derive(Default)]
pub(crate) struct Input {
    /// Receive buffer of [`crate::Link::poll`], allocated on first use (empty when the
    /// caller lends one: [`crate::Link::poll_with`]).
    pub(crate) rbuf: Vec<u8>,
    pub(crate) parser: Parser,
    /// An `Event::Closed` was reported.
    pub(crate) dead: bool,
}

/// A buffer lent by the worker, and how many expected reads target it.
pub(crate) struct Lent {
    pub(crate) buf: Vec<u8>,
    pub(crate) pending: usize,
}

#[derive(Clone, Copy)]
pub(crate) struct Expected {
    pub(crate) key: u64,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// Where the parser is in the byte stream.
enum State {
    Header {
        hdr: [u8; HEADER_LEN],
        got: usize,
    },
    Frame {
        body: Vec<u8>,
        len: usize,
    },
    ReadReq {
        body: [u8; READ_REQ_LEN],
        got: usize,
    },
    ReadDataHead {
        head: [u8; READ_DATA_HEAD],
        got: usize,
        data_len: usize,
    },
    /// Inside a READ_DATA payload (`done < len`) landing at `lent[key].buf[offset..]`.
    ReadData {
        read_id: u64,
        key: u64,
        offset: usize,
        len: usize,
        done: usize,
    },
}

impl State {
    fn header() -> State {
        State::Header {
            hdr: [0; HEADER_LEN],
            got: 0,
        }
    }
}

/// The incremental input parser: survives short reads at any byte boundary.
pub(crate) struct Parser {
    state: State,
    pub(crate) lent: HashMap<u64, Lent>,
    pub(crate) expected: HashMap<u64, Expected>,
    /// Frame buffers handed back with [`Link::recycle`], for the next frames.
    pub(crate) spare: Vec<Vec<u8>>,
}

/// How many recycled frame buffers a link keeps at most.
pub(crate) const SPARE_FRAMES: usize = 8;

impl Default for Parser {
    fn default() -> Self {
        Parser {
            state: State::header(),
            lent: HashMap::new(),
            expected: HashMap::new(),
            spare: Vec::new(),
        }
    }
}

/// Copies as much of `data` as fits into `dst[*got..]`, advancing both.
fn fill(dst: &mut [u8], got: &mut usize, data: &mut &[u8]) -> bool {
    let take = (dst.len() - *got).min(data.len());
    dst[*got..*got + take].copy_from_slice(&data[..take]);
    *got += take;
    *data = &data[take..];
    *got == dst.len()
}

impl Parser {
    /// Bytes held between polls: a frame partly read and recycled frame buffers.
    pub(crate) fn held_bytes(&self) -> usize {
        let partial = match &self.state {
            State::Frame { body, .. } => body.capacity(),
            _ => 0,
        };
        partial + self.spare.iter().map(Vec::capacity).sum::<usize>()
    }

    /// Parses `data` (all of it, unless an error is returned: the reason to close).
    pub(crate) fn consume(&mut self, mut data: &[u8], out: &mut Vec<Event>) -> Result<(), String> {
        while !data.is_empty() {
            match &mut self.state {
                State::Header { hdr, got } => {
                    if fill(hdr, got, &mut data) {
                        let hdr = *hdr;
                        self.on_header(&hdr, out)?;
                    }
                }
                State::Frame { body, len } => {
                    let take = (*len - body.len()).min(data.len());
                    let need = body.len() + take;
                    if need > body.capacity() {
                        // Grow geometrically but never past the announced (bounded) length.
                        let target = (*len).min(need.max(body.capacity() * 2));
                        body.reserve_exact(target - body.len());
                    }
                    body.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if body.len() == *len {
                        let body = std::mem::take(body);
                        self.state = State::header();
                        out.push(Event::Frame(body));
                    }
                }
                State::ReadReq { body, got } => {
                    if fill(body, got, &mut data) {
                        let body = *body;
                        self.on_read_req(&body, out)?;
                    }
                }
                State::ReadDataHead {
                    head,
                    got,
                    data_len,
                } => {
                    if fill(head, got, &mut data) {
                        let (head, data_len) = (*head, *data_len);
                        self.on_read_data_head(&head, data_len, out)?;
                    }
                }
                State::ReadData { .. } => {
                    let dst = self.payload_dest()?;
                    let take = dst.len().min(data.len());
                    dst[..take].copy_from_slice(&data[..take]);
                    data = &data[take..];
                    self.payload_advanced(take, out);
                }
            }
        }
        Ok(())
    }

    fn on_header(&mut self, hdr: &[u8; HEADER_LEN], out: &mut Vec<Event>) -> Result<(), String> {
        let (kind, len) = wire::parse_header(hdr)?;
        self.state = match kind {
            KIND_FRAME if len > MAX_FRAME_LEN => {
                return Err(format!(
                    "FRAME body of {len} bytes exceeds the limit of {MAX_FRAME_LEN} bytes"
                ))
            }
            KIND_FRAME if len == 0 => {
                out.push(Event::Frame(Vec::new()));
                State::header()
            }
            KIND_FRAME => {
                let mut body = self.spare.pop().unwrap_or_default();
                body.reserve_exact(len.min(READ_CHUNK));
                State::Frame { body, len }
            }
            KIND_READ_REQ if len != READ_REQ_LEN => {
                return Err(format!(
                    "READ_REQ body of {len} bytes (must be {READ_REQ_LEN})"
                ))
            }
            KIND_READ_REQ => State::ReadReq {
                body: [0; READ_REQ_LEN],
                got: 0,
            },
            KIND_READ_DATA if len < READ_DATA_HEAD => {
                return Err(format!(
                    "READ_DATA body of {len} bytes (at least {READ_DATA_HEAD} needed)"
                ))
            }
            KIND_READ_DATA => State::ReadDataHead {
                head: [0; READ_DATA_HEAD],
                got: 0,
                data_len: len - READ_DATA_HEAD,
            },
            KIND_HELLO | KIND_ACCEPT | KIND_REJECT => {
                return Err(format!(
                    "unexpected {} after the handshake",
                    wire::kind_name(kind)
                ))
            }
            other => {
                return Err(format!(
                    "unknown message kind {other} (body of {len} bytes)"
                ))
            }
        };
        Ok(())
    }

    fn on_read_req(&mut self, b: &[u8; READ_REQ_LEN], out: &mut Vec<Event>) -> Result<(), String> {
        let read_id = wire::u64_at(b, 0);
        let reserved = wire::u32_at(b, 20);
        if reserved != 0 {
            return Err(format!(
                "non-zero reserved field {reserved:#x} in READ_REQ for read {read_id}"
            ));
        }
        out.push(Event::ReadRequest {
            read_id,
            addr: wire::u64_at(b, 8),
            rkey: wire::u32_at(b, 16),
            len: wire::u64_at(b, 24),
        });
        self.state = State::header();
        Ok(())
    }

    fn on_read_data_head(
        &mut self,
        h: &[u8; READ_DATA_HEAD],
        data_len: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        let read_id = wire::u64_at(h, 0);
        let status = h[8];
        if h[9..] != [0; 7] {
            return Err(format!(
                "non-zero reserved bytes {:?} in READ_DATA for read {read_id}",
                &h[9..]
            ));
        }
        let Some(exp) = self.expected.get(&read_id).copied() else {
            return Err(format!(
                "unexpected READ_DATA for read {read_id} (status {status}, {data_len} bytes): \
                 no such read is expected"
            ));
        };
        match status {
            STATUS_FAILED if data_len != 0 => Err(format!(
                "failed READ_DATA for read {read_id} carries {data_len} bytes (must be 0)"
            )),
            STATUS_FAILED => {
                self.expected.remove(&read_id);
                self.release(exp.key);
                self.state = State::header();
                out.push(Event::ReadDone { read_id, ok: false });
                Ok(())
            }
            STATUS_OK if data_len != exp.len => Err(format!(
                "READ_DATA for read {read_id} carries {data_len} bytes, {} expected",
                exp.len
            )),
            STATUS_OK => {
                self.expected.remove(&read_id);
                self.state = State::ReadData {
                    read_id,
                    key: exp.key,
                    offset: exp.offset,
                    len: exp.len,
                    done: 0,
                };
                if exp.len == 0 {
                    self.finish_read(out);
                }
                Ok(())
            }
            other => Err(format!(
                "unknown READ_DATA status {other} for read {read_id}"
            )),
        }
    }

    fn release(&mut self, key: u64) {
        if let Some(lent) = self.lent.get_mut(&key) {
            lent.pending = lent.pending.saturating_sub(1);
        }
    }

    pub(crate) fn in_payload(&self) -> bool {
        matches!(self.state, State::ReadData { .. })
    }

    /// The unfilled part of the current READ_DATA's destination (empty outside a payload).
    pub(crate) fn payload_dest(&mut self) -> Result<&mut [u8], String> {
        let State::ReadData {
            read_id,
            key,
            offset,
            len,
            done,
        } = self.state
        else {
            return Ok(&mut []);
        };
        let Some(lent) = self.lent.get_mut(&key) else {
            return Err(format!(
                "the buffer lent under key {key} was reclaimed while READ_DATA for read \
                 {read_id} was arriving"
            ));
        };
        let size = lent.buf.len();
        lent.buf
            .get_mut(offset + done..offset + len)
            .ok_or_else(|| {
                format!(
                    "the buffer lent under key {key} ({size} bytes) no longer holds \
                 {offset}..{} for read {read_id}",
                    offset + len
                )
            })
    }

    /// `n` more payload bytes landed.
    pub(crate) fn payload_advanced(&mut self, n: usize, out: &mut Vec<Event>) {
        if let State::ReadData { len, done, .. } = &mut self.state {
            *done += n;
            if *done >= *len {
                self.finish_read(out);
            }
        }
    }

    fn finish_read(&mut self, out: &mut Vec<Event>) {
        if let State::ReadData { read_id, key, .. } = self.state {
            self.release(key);
            self.state = State::header();
            out.push(Event::ReadDone { read_id, ok: true });
        }
    }

    /// Why the connection ended, given that the peer closed it now.
    pub(crate) fn eof_reason(&self) -> String {
        let mid = "the peer closed the connection in the middle of";
        match &self.state {
            State::Header { got: 0, .. } => "the peer closed the connection".to_string(),
            State::Header { got, .. } => format!(
                "the peer closed the connection mid-header ({got} of {HEADER_LEN} header bytes)"
            ),
            State::Frame { body, len } => {
                format!("{mid} a FRAME body ({} of {len} bytes)", body.len())
            }
            State::ReadReq { got, .. } => {
                format!("{mid} a READ_REQ ({got} of {READ_REQ_LEN} body bytes)")
            }
            State::ReadDataHead { got, .. } => {
                format!("{mid} a READ_DATA header ({got} of {READ_DATA_HEAD} bytes)")
            }
            State::ReadData {
                read_id, len, done, ..
            } => format!("{mid} READ_DATA for read {read_id} ({done} of {len} bytes)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut m = wire::header(KIND_FRAME, body.len()).to_vec();
        m.extend_from_slice(body);
        m
    }

    fn read_data(read_id: u64, status: u8, data: &[u8]) -> Vec<u8> {
        let mut m = wire::read_data_head(read_id, status, data.len()).to_vec();
        m.extend_from_slice(data);
        m
    }

    /// A parser with buffer key 1 (20 bytes of 0xEE) lent, read 7 expected at 3..13 and
    /// read 8 at 0..2.
    fn parser() -> Parser {
        let mut p = Parser::default();
        p.lent.insert(
            1,
            Lent {
                buf: vec![0xEE; 20],
                pending: 2,
            },
        );
        p.expected.insert(
            7,
            Expected {
                key: 1,
                offset: 3,
                len: 10,
            },
        );
        p.expected.insert(
            8,
            Expected {
                key: 1,
                offset: 0,
                len: 2,
            },
        );
        p
    }

    fn stream() -> (Vec<u8>, Vec<Event>) {
        let big: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let mut s = Vec::new();
        s.extend(frame(b""));
        s.extend(frame(b"hello"));
        s.extend(wire::read_req(42, 0x1000, 0xabcd, 1 << 40));
        s.extend(read_data(7, STATUS_OK, b"0123456789"));
        s.extend(read_data(8, STATUS_FAILED, b""));
        s.extend(frame(&big));
        let events = vec![
            Event::Frame(Vec::new()),
            Event::Frame(b"hello".to_vec()),
            Event::ReadRequest {
                read_id: 42,
                addr: 0x1000,
                rkey: 0xabcd,
                len: 1 << 40,
            },
            Event::ReadDone {
                read_id: 7,
                ok: true,
            },
            Event::ReadDone {
                read_id: 8,
                ok: false,
            },
            Event::Frame(big),
        ];
        (s, events)
    }

    fn check(p: &Parser, events: &[Event], expected: &[Event]) {
        assert_eq!(events, expected);
        let lent = &p.lent[&1];
        assert_eq!(lent.pending, 0);
        let mut want = vec![0xEE; 20];
        want[3..13].copy_from_slice(b"0123456789");
        assert_eq!(lent.buf, want);
        assert!(p.expected.is_empty());
        assert!(matches!(p.state, State::Header { got: 0, .. }));
    }

    #[test]
    fn parser_survives_every_split_point() {
        let (s, expected) = stream();
        for cut in 0..=s.len() {
            let mut p = parser();
            let mut events = Vec::new();
            p.consume(&s[..cut], &mut events).unwrap();
            p.consume(&s[cut..], &mut events).unwrap();
            check(&p, &events, &expected);
        }
        let mut p = parser();
        let mut events = Vec::new();
        for b in &s {
            p.consume(std::slice::from_ref(b), &mut events).unwrap();
        }
        check(&p, &events, &expected);
    }

    #[test]
    fn parser_never_panics_on_garbage() {
        // Deterministic pseudo-random streams, some starting with a valid prefix so the
        // parser gets into every state before the garbage.
        let (valid, _) = stream();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..2000 {
            let mut p = parser();
            let mut events = Vec::new();
            let prefix = round % (valid.len() + 1);
            let mut input = valid[..prefix].to_vec();
            for _ in 0..64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Bias kinds and lengths towards plausible values.
                input.push(match x % 4 {
                    0 => (x >> 8) as u8 % 8,
                    1 => 0,
                    _ => (x >> 16) as u8,
                });
            }
            let mut rest = &input[..];
            while !rest.is_empty() {
                let n = 1 + (x as usize % 9).min(rest.len() - 1);
                if p.consume(&rest[..n], &mut events).is_err() {
                    break;
                }
                rest = &rest[n..];
            }
            let _ = p.eof_reason();
        }
    }
}
