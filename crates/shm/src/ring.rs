//! Single-producer single-consumer rings of frames in a shared [`Segment`].
//!
//! A ring is a header of three cache lines followed by a data area of `capacity` bytes:
//!
//! | offset | written by | field |
//! |-------:|------------|-------|
//! | 0 | producer | `head`: bytes published since the start (`u64`) |
//! | 64 | consumer | `tail`: bytes consumed since the start (`u64`) |
//! | 128 | consumer | `waiting`: 1 while the consumer may sleep on its doorbell |
//! | 192 | producer | the data area: records |
//!
//! A record is an 8-byte header — `len` in its low 32 bits, the record's `kind` (a byte the
//! user gives meaning to; [`Producer::push`] makes kind 0) in the next 8, zero in the top 24 —
//! followed by `len` bytes padded to a multiple of 8; records wrap around the end of the data
//! area.
//! Indices only grow (a record at `pos` lies at `pos % capacity`), so `head - tail` is what
//! waits, and each field has one writer, so no read-modify-write is needed: the producer
//! publishes with a release store of `head`, the consumer frees with one of `tail`.
//!
//! Each side keeps its own index privately and only ever reads the other's, and validates
//! what it reads: a `head` more than `capacity` ahead of the consumer or not a multiple of 8,
//! a record header with reserved bits or a length past what was published, a `tail` behind
//! the last one seen or past `head` — each is [`Error::Corrupt`], after which the ring must
//! not be used. Record bytes are copied out word by word into private memory before anything
//! looks at them, so a peer rewriting them mid-copy yields only wrong bytes in a frame, which
//! the protocol engine above validates like any frame from the network.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

use crate::{Error, Result, Segment};

/// Bytes of a ring's header (three cache lines: `head`, `tail`, `waiting`).
pub const RING_HEADER_LEN: usize = 192;
const HEAD: usize = 0;
const TAIL: usize = 64;
const WAITING: usize = 128;
/// Bytes of a record's header.
const RECORD_HEADER: u64 = 8;
/// Indices past this are corruption: an honest ring takes 4 EiB of traffic to reach it, and
/// below it no index arithmetic can overflow.
const MAX_INDEX: u64 = 1 << 62;

/// Bytes a ring with a data area of `capacity` bytes takes in a segment.
pub const fn ring_len(capacity: usize) -> usize {
    RING_HEADER_LEN + capacity
}

/// `n` rounded up to a multiple of 8.
const fn padded(n: u64) -> u64 {
    (n + 7) & !7
}

/// The part of a segment one ring occupies.
#[derive(Clone)]
struct Place {
    seg: Arc<Segment>,
    /// The ring's offset in the segment.
    base: usize,
    /// Bytes of its data area (a multiple of 8, at least 64).
    capacity: u64,
}

impl Place {
    fn new(seg: Arc<Segment>, base: usize, capacity: usize) -> Result<Place> {
        if capacity < 64 || capacity % 8 != 0 || base % 64 != 0 || capacity > u32::MAX as usize {
            return Err(Error::Invalid(format!(
                "a ring of {capacity} bytes at {base} (at least 64 bytes, a multiple of 8, at a \
                 cache-line boundary, and under 4 GiB)"
            )));
        }
        if base
            .checked_add(ring_len(capacity))
            .map_or(true, |end| end > seg.len())
        {
            return Err(Error::Invalid(format!(
                "a ring of {capacity} bytes at {base} does not fit a segment of {} bytes",
                seg.len()
            )));
        }
        Ok(Place {
            seg,
            base,
            capacity: capacity as u64,
        })
    }

    /// A header field.
    fn field(&self, offset: usize) -> &AtomicU64 {
        self.seg
            .word(self.base + offset)
            .expect("ring header inside the segment: checked by Place::new")
    }

    /// Where a side starts: its own index `field` as the segment holds it (zero when fresh;
    /// a peer that made the segment may have put anything there), validated.
    fn start(&self, field: usize) -> Result<u64> {
        let index = self.field(field).load(Ordering::Acquire);
        if index % 8 != 0 || index > MAX_INDEX {
            return Err(Error::Corrupt(format!("the ring starts at index {index}")));
        }
        Ok(index)
    }

    /// The data word at index `pos` (a multiple of 8).
    fn data(&self, pos: u64) -> &AtomicU64 {
        let offset = self.base + RING_HEADER_LEN + (pos % self.capacity) as usize;
        self.seg
            .word(offset)
            .expect("data word inside the ring: checked by Place::new")
    }

    /// The data words holding the `bytes` (a multiple of 8, at most the capacity) from index
    /// `pos` on: up to the end of the data area, and what wraps to its start.
    fn span(&self, pos: u64, bytes: u64) -> (&[AtomicU64], &[AtomicU64]) {
        let start = pos % self.capacity;
        let first = bytes.min(self.capacity - start);
        let words = |offset: u64, n: u64| {
            self.seg
                .words(
                    self.base + RING_HEADER_LEN + offset as usize,
                    (n / 8) as usize,
                )
                .expect("data words inside the ring: checked by Place::new")
        };
        (words(start, first), words(0, bytes - first))
    }

    /// The longest record payload the ring takes.
    fn max_payload(&self) -> usize {
        (self.capacity - RECORD_HEADER) as usize
    }
}

/// The writing end of a ring.
pub struct Producer {
    place: Place,
    /// Bytes published (private: `head` in shared memory is only written from here).
    head: u64,
    /// The consumer's `tail` when last read.
    tail: u64,
}

/// The reading end of a ring.
pub struct Consumer {
    place: Place,
    /// Bytes consumed (private: `tail` in shared memory is only written from here).
    tail: u64,
    /// The producer's `head` when last read (validated).
    head: u64,
}

impl Producer {
    /// The producer of the ring at `base` in `seg` with a data area of `capacity` bytes,
    /// which must be freshly zeroed or left by a producer and consumer that both stopped.
    pub fn new(seg: Arc<Segment>, base: usize, capacity: usize) -> Result<Producer> {
        let place = Place::new(seg, base, capacity)?;
        let head = place.start(HEAD)?;
        Ok(Producer {
            place,
            head,
            tail: head,
        })
    }

    /// The longest frame [`push`](Producer::push) takes.
    pub fn max_frame(&self) -> usize {
        self.place.max_payload()
    }

    /// Appends one record holding `pieces` one after another. `Ok(false)`: the ring has no
    /// room for it now (nothing was written). [`Error::TooLong`] if it could never fit;
    /// [`Error::Corrupt`] if the consumer's `tail` is out of range.
    pub fn push(&mut self, pieces: &[&[u8]]) -> Result<bool> {
        self.push_kind(0, pieces)
    }

    /// [`Producer::push`] of a record of `kind`.
    pub fn push_kind(&mut self, kind: u8, pieces: &[&[u8]]) -> Result<bool> {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        if len > self.max_frame() {
            return Err(Error::TooLong {
                len,
                max: self.max_frame(),
            });
        }
        let need = RECORD_HEADER + padded(len as u64);
        let cap = self.place.capacity;
        if cap - (self.head - self.tail) < need {
            self.refresh_tail()?;
            if cap - (self.head - self.tail) < need {
                return Ok(false);
            }
        }
        let (a, b) = self.place.span(self.head, need);
        let mut w = Words {
            a,
            b,
            at: 0,
            acc: [0; 8],
            fill: 0,
        };
        w.store(len as u64 | u64::from(kind) << 32);
        for p in pieces {
            w.put(p);
        }
        w.finish();
        self.head += need;
        self.place.field(HEAD).store(self.head, Ordering::Release);
        Ok(true)
    }

    /// Reads and validates the consumer's `tail`.
    fn refresh_tail(&mut self) -> Result<()> {
        let t = self.place.field(TAIL).load(Ordering::Acquire);
        if t % 8 != 0 || t < self.tail || t > self.head {
            return Err(Error::Corrupt(format!(
                "the consumer's index {t} lies outside {}..={} (what it had consumed and what \
                 was published)",
                self.tail, self.head
            )));
        }
        self.tail = t;
        Ok(())
    }

    /// Whether the consumer said it may sleep, so that what was just pushed needs its
    /// doorbell rung. (A full fence first: the push's `head` and this read of `waiting` are
    /// not reordered, pairing with [`Consumer::may_sleep`].)
    pub fn consumer_waiting(&self) -> bool {
        fence(Ordering::SeqCst);
        self.place.field(WAITING).load(Ordering::Relaxed) != 0
    }

    /// Whether everything pushed was consumed (reads the consumer's `tail`).
    pub fn drained(&mut self) -> Result<bool> {
        self.refresh_tail()?;
        Ok(self.tail == self.head)
    }
}

impl Consumer {
    /// The consumer of the ring at `base` in `seg` with a data area of `capacity` bytes (see
    /// [`Producer::new`]).
    pub fn new(seg: Arc<Segment>, base: usize, capacity: usize) -> Result<Consumer> {
        let place = Place::new(seg, base, capacity)?;
        let tail = place.start(TAIL)?;
        Ok(Consumer {
            place,
            tail,
            head: tail,
        })
    }

    /// The longest frame the ring carries.
    pub fn max_frame(&self) -> usize {
        self.place.max_payload()
    }

    /// Reads and validates the producer's `head`. True when something waits.
    fn refresh_head(&mut self) -> Result<bool> {
        let h = self.place.field(HEAD).load(Ordering::Acquire);
        let waiting = h.wrapping_sub(self.tail);
        if h % 8 != 0 || waiting > self.place.capacity || h < self.head || h > MAX_INDEX {
            return Err(Error::Corrupt(format!(
                "the producer's index {h} lies outside {}..={} (what was consumed and a full \
                 ring past it)",
                self.head,
                self.tail.saturating_add(self.place.capacity)
            )));
        }
        self.head = h;
        Ok(h != self.tail)
    }

    /// Takes the next record: its bytes replace `out`'s and `Ok(true)`; `Ok(false)` when the
    /// ring is empty. [`Error::Corrupt`] if the peer broke the ring's rules (`out` is then
    /// unspecified, and the ring must not be used again).
    pub fn pop(&mut self, out: &mut Vec<u8>) -> Result<bool> {
        match self.pop_kind(out)? {
            None => Ok(false),
            Some(0) => Ok(true),
            Some(kind) => Err(Error::Corrupt(format!(
                "a record of kind {kind} where only kind 0 is expected"
            ))),
        }
    }

    /// [`Consumer::pop`] of a record of any kind: `Ok(Some(kind))`, or `Ok(None)` when the
    /// ring is empty.
    pub fn pop_kind(&mut self, out: &mut Vec<u8>) -> Result<Option<u8>> {
        if self.head == self.tail && !self.refresh_head()? {
            return Ok(None);
        }
        let waiting = self.head - self.tail;
        let header = self.place.data(self.tail).load(Ordering::Relaxed);
        let len = header & 0xffff_ffff;
        let kind = (header >> 32) as u8;
        if header >> 40 != 0 {
            return Err(Error::Corrupt(format!(
                "a record header has reserved bits set ({header:#x})"
            )));
        }
        let size = RECORD_HEADER + padded(len);
        if size > waiting {
            return Err(Error::Corrupt(format!(
                "a record of {len} bytes, but {} were published after its header",
                waiting - RECORD_HEADER
            )));
        }
        // (Only what `out` lacks is zeroed first: a reused buffer keeps its length.)
        out.resize(padded(len) as usize, 0);
        let (a, b) = self.place.span(self.tail + RECORD_HEADER, padded(len));
        let (x, y) = out.split_at_mut(a.len() * 8);
        copy_out(a, x);
        copy_out(b, y);
        out.truncate(len as usize);
        self.tail += size;
        self.place.field(TAIL).store(self.tail, Ordering::Release);
        Ok(Some(kind))
    }

    /// Whether a record waits (reads the producer's `head` when none is known).
    pub fn is_empty(&mut self) -> Result<bool> {
        Ok(self.head == self.tail && !self.refresh_head()?)
    }

    /// Says whether this consumer may sleep (`true`) before it checks the ring one last time
    /// and sleeps on its doorbell, and that it is awake again (`false`). While it is set,
    /// producers ring the doorbell after pushing ([`Producer::consumer_waiting`]).
    pub fn may_sleep(&self, sleeping: bool) {
        self.place
            .field(WAITING)
            .store(u64::from(sleeping), Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }
}

/// Writes bytes into a ring's data area a word at a time, from index `pos`.
/// Writes a record into the data words `a` then `b` (the ring wrapping between them), a
/// word at a time: bytes gather in `acc` until a word is full.
struct Words<'a> {
    a: &'a [AtomicU64],
    b: &'a [AtomicU64],
    /// The next word, counted from the start of `a`.
    at: usize,
    acc: [u8; 8],
    fill: usize,
}

/// Stores `src` (a multiple of 8 bytes) into the words `dst`, one relaxed store each.
fn copy_in(dst: &[AtomicU64], src: &[u8]) {
    for (d, s) in dst.iter().zip(src.chunks_exact(8)) {
        d.store(
            u64::from_ne_bytes(s.try_into().expect("8 bytes")),
            Ordering::Relaxed,
        );
    }
}

/// Loads the words `src` into `dst` (a multiple of 8 bytes), one relaxed load each.
fn copy_out(src: &[AtomicU64], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(8)) {
        d.copy_from_slice(&s.load(Ordering::Relaxed).to_ne_bytes());
    }
}

impl Words<'_> {
    fn store(&mut self, w: u64) {
        let slot = match self.a.get(self.at) {
            Some(slot) => slot,
            None => &self.b[self.at - self.a.len()],
        };
        slot.store(w, Ordering::Relaxed);
        self.at += 1;
    }

    /// Stores whole words (`bytes` is a multiple of 8 long).
    fn store_all(&mut self, bytes: &[u8]) {
        let n = bytes.len() / 8;
        let in_a = self.a.len().saturating_sub(self.at).min(n);
        let (x, y) = bytes.split_at(in_a * 8);
        if in_a > 0 {
            copy_in(&self.a[self.at..self.at + in_a], x);
        }
        if !y.is_empty() {
            let at = self.at + in_a - self.a.len();
            copy_in(&self.b[at..at + y.len() / 8], y);
        }
        self.at += n;
    }

    fn put(&mut self, mut bytes: &[u8]) {
        if self.fill > 0 {
            let n = (8 - self.fill).min(bytes.len());
            self.acc[self.fill..self.fill + n].copy_from_slice(&bytes[..n]);
            self.fill += n;
            bytes = &bytes[n..];
            if self.fill < 8 {
                return;
            }
            self.fill = 0;
            self.store(u64::from_ne_bytes(self.acc));
        }
        let whole = bytes.len() / 8 * 8;
        self.store_all(&bytes[..whole]);
        let rest = &bytes[whole..];
        self.acc[..rest.len()].copy_from_slice(rest);
        self.fill = rest.len();
    }

    fn finish(&mut self) {
        if self.fill > 0 {
            self.acc[self.fill..].fill(0);
            self.fill = 0;
            self.store(u64::from_ne_bytes(self.acc));
        }
    }
}
