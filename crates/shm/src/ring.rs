//! Single-producer single-consumer rings of frames in a shared [`Segment`].
//!
//! A ring is a header of three cache lines followed by a data area of `capacity` bytes:
//!
//! | offset | written by | field |
//! |-------:|------------|-------|
//! | 0 | nobody | reserved (zero) |
//! | 64 | consumer | `tail`: bytes consumed since the start (`u64`) |
//! | 128 | consumer | `waiting`: 1 while the consumer may sleep on its doorbell; [`NEVER_SLEEPS`] from the start if it never does |
//! | 192 | producer | the data area: records |
//!
//! A record is an 8-byte header — `len` in its low 32 bits, the record's `kind` (a byte the
//! user gives meaning to; [`Producer::push`] makes kind 0) in the next 8, [`PUBLISHED`] in
//! the top bit and zero in the 23 between — followed by `len` bytes padded to a multiple of
//! 8; records wrap around the end of the data area. Indices only grow (a record at `pos`
//! lies at `pos % capacity`).
//!
//! **The header is the signal.** The producer writes a record's bytes, then a zero word just
//! past it (where the next record's header goes), then the header, with a release store.
//! The consumer polls the header word at its `tail`: zero means nothing waits; a published
//! header (acquire load) means the record's bytes, and the zero past it, are visible. So a
//! small message costs the consumer one cache line from the producer — the line holding the
//! header and the first bytes — instead of a shared `head` index and then the record (on a
//! two-socket or multi-die host each line is a transfer of ~100 ns). The zero-ahead rule is
//! why a record needs 8 bytes of room beyond its own: a ring never fills up entirely. Could
//! the consumer read a stale word where a header will go (bytes of a record from the lap
//! before)? No: the zero there was written before the previous record's header was
//! released, and the consumer acquired that header before it looks here.
//!
//! The consumer frees space with a release store of `tail`, which the producer reads (only
//! when it runs out of the room it knew of); it may free a run of records with one store
//! ([`Consumer::take_words`], then [`Consumer::free`]). Each field has one writer, so no
//! read-modify-write is needed.
//!
//! Each side keeps its own index privately and validates what it reads of the other: a
//! record header with reserved bits, without [`PUBLISHED`] or longer than the ring, a `tail`
//! behind the last one seen or past what was published — each is [`Error::Corrupt`], after
//! which the ring must not be used. Record bytes are copied out word by word into private
//! memory before anything looks at them, so a peer rewriting them mid-copy yields only wrong
//! bytes in a frame, which the protocol engine above validates like any frame from the
//! network.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

use crate::segment::HeldWords;
use crate::{Error, Result, Segment};

/// Bytes of a ring's header (three cache lines: reserved, `tail`, `waiting`).
pub const RING_HEADER_LEN: usize = 192;
const TAIL: usize = 64;
const WAITING: usize = 128;
/// Bytes of a record's header.
const RECORD_HEADER: u64 = 8;
/// The `waiting` of a consumer that never sleeps on its doorbell (it busy-polls), set before
/// its first poll and never changed: its producer need not look at `waiting` again, nor
/// fence before looking (see [`Producer::consumer_waiting`]). A consumer that says so and
/// sleeps all the same misses its wake-ups: only its own loss.
pub const NEVER_SLEEPS: u64 = 2;
/// The top bit of a record header: set in every published record (a header of kind 0 and
/// length 0 is not zero, the word that says nothing waits).
pub const PUBLISHED: u64 = 1 << 63;
/// Header bits that must be zero: between the kind and [`PUBLISHED`].
const RESERVED: u64 = !PUBLISHED & !((1 << 40) - 1);
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

/// The part of a segment one ring occupies: its header's words and its data area's, held
/// (looked up once, not on every access).
#[derive(Clone)]
struct Place {
    /// The header's words (`RING_HEADER_LEN / 8`).
    header: HeldWords,
    /// The data area's words (`capacity / 8`).
    words: HeldWords,
    /// Bytes of its data area (a power of two, at least 64).
    capacity: u64,
}

impl Place {
    fn new(seg: Arc<Segment>, base: usize, capacity: usize) -> Result<Place> {
        if capacity < 64
            || !capacity.is_power_of_two()
            || base % 64 != 0
            || capacity > u32::MAX as usize
        {
            return Err(Error::Invalid(format!(
                "a ring of {capacity} bytes at {base} (a power of two of at least 64 bytes, \
                 at a cache-line boundary, and under 4 GiB)"
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
        let inside = "inside the segment: checked above";
        Ok(Place {
            header: seg
                .held_words(base, RING_HEADER_LEN / 8)
                .ok_or_else(|| Error::Invalid(format!("the ring header {inside}")))?,
            words: seg
                .held_words(base + RING_HEADER_LEN, capacity / 8)
                .ok_or_else(|| Error::Invalid(format!("the data area {inside}")))?,
            capacity: capacity as u64,
        })
    }

    /// A header field (`TAIL` or `WAITING`).
    #[inline]
    fn field(&self, offset: usize) -> &AtomicU64 {
        &self.header.get()[offset / 8]
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

    /// The data area, a word per 8 bytes: the word of index `pos` is `pos / 8` masked
    /// with [`Area::mask`] (a power of two long, so no division places a word).
    #[inline]
    fn area(&self) -> Area<'_> {
        let words = self.words.get();
        Area {
            words,
            mask: words.len() - 1,
        }
    }

    /// The longest record payload the ring takes: the whole data area but the header and
    /// the zero word kept past every record.
    fn max_payload(&self) -> usize {
        (self.capacity - RECORD_HEADER - 8) as usize
    }
}

/// The writing end of a ring.
pub struct Producer {
    place: Place,
    /// The consumer said it never sleeps ([`NEVER_SLEEPS`]).
    never_rings: bool,
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
    /// The `tail` last stored in shared memory: the producer may reuse the ring up to it.
    /// Behind `tail` while records taken by [`Consumer::take_words`] wait for
    /// [`Consumer::free`].
    freed: u64,
    /// The words [`Consumer::pop`] takes a record into before it copies it out (boxed, made
    /// by the first pop: the worker takes records with `take_words` into a buffer of its
    /// own, and a larger consumer made its progress calls 57 instructions longer per shm
    /// round trip, callgrind).
    popped: Option<Box<RecordBuf>>,
}

/// A record's words, copied out of a ring by [`Consumer::take_words`]: private memory,
/// reused record after record (it only grows, to the longest record taken).
#[derive(Default)]
pub struct RecordBuf {
    words: Vec<u64>,
}

impl RecordBuf {
    /// The first `len` bytes of the last record taken (its length, as `take_words` said).
    #[inline]
    pub fn bytes(&self, len: usize) -> &[u8] {
        let bytes: &[u8] = zerocopy::IntoBytes::as_bytes(&self.words[..]);
        &bytes[..len.min(bytes.len())]
    }
}

impl Producer {
    /// The producer of the ring at `base` in `seg` with a data area of `capacity` bytes,
    /// which must be freshly zeroed or left by a producer and consumer that both stopped
    /// with nothing waiting. It starts where the consumer's `tail` is.
    pub fn new(seg: Arc<Segment>, base: usize, capacity: usize) -> Result<Producer> {
        let place = Place::new(seg, base, capacity)?;
        let head = place.start(TAIL)?;
        Ok(Producer {
            place,
            never_rings: false,
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
        self.push_words_then(kind, &[], pieces)
    }

    /// [`Producer::push_kind`] of a record that starts with whole words, `head` (each
    /// stored as it is: its bytes in the record are its bytes in memory), followed by
    /// `pieces`: a frame whose header is already words goes into the ring without being
    /// taken apart into bytes and put together again.
    #[inline]
    pub fn push_words_then(&mut self, kind: u8, head: &[u64], pieces: &[&[u8]]) -> Result<bool> {
        let len: usize = head.len() * 8 + pieces.iter().map(|p| p.len()).sum::<usize>();
        if len > self.max_frame() {
            return Err(Error::TooLong {
                len,
                max: self.max_frame(),
            });
        }
        let need = RECORD_HEADER + padded(len as u64);
        // (The record, and the zero word past it.)
        let room = need + 8;
        let cap = self.place.capacity;
        if cap - (self.head - self.tail) < room {
            self.refresh_tail()?;
            if cap - (self.head - self.tail) < room {
                return Ok(false);
            }
        }
        if self.head + room > MAX_INDEX {
            return Err(Error::Corrupt(format!(
                "the ring's index reached {} (it started near the end of its range)",
                self.head
            )));
        }
        // The bytes after the header word, then the zero past the record, then the header.
        let area = self.place.area();
        let at = (self.head / 8) as usize;
        let mut w = Words {
            area,
            at: at + 1,
            acc: 0,
            fill: 0,
        };
        // (At the record's start: no bytes are over from a piece yet.)
        match area.run(at + 1, head.len()) {
            // (The words do not wrap: one slice, no index to mask or check per word. The
            // push of an 8 B message's frame: 114 -> 110 instructions, callgrind.)
            Some(dst) => {
                for (d, &word) in dst.iter().zip(head) {
                    d.store(word, Ordering::Relaxed);
                }
                w.at += head.len();
            }
            None => {
                for &word in head {
                    w.store(word);
                }
            }
        }
        for p in pieces {
            w.put(p);
        }
        w.finish();
        area.word(at + (need / 8) as usize)
            .store(0, Ordering::Relaxed);
        area.word(at).store(
            PUBLISHED | u64::from(kind) << 32 | len as u64,
            Ordering::Release,
        );
        self.head += need;
        Ok(true)
    }

    /// Reads and validates the consumer's `tail`.
    fn refresh_tail(&mut self) -> Result<()> {
        let t = self.place.field(TAIL).load(Ordering::Acquire);
        if t % 8 != 0 || t < self.tail || t > self.head {
            // (Past what was published, or going back.)
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
    /// not reordered, pairing with [`Consumer::may_sleep`].) Once the consumer was seen to
    /// say it never sleeps ([`NEVER_SLEEPS`]), false at once: no fence, no read of its line.
    pub fn consumer_waiting(&mut self) -> bool {
        if self.never_rings {
            return false;
        }
        fence(Ordering::SeqCst);
        match self.place.field(WAITING).load(Ordering::Relaxed) {
            0 => false,
            NEVER_SLEEPS => {
                self.never_rings = true;
                false
            }
            _ => true,
        }
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
            freed: tail,
            popped: None,
        })
    }

    /// The longest frame the ring carries.
    pub fn max_frame(&self) -> usize {
        self.place.max_payload()
    }

    /// Takes the next record: its bytes replace `out`'s and `Ok(true)`; `Ok(false)` when the
    /// ring is empty. Either way it frees the space of what it took (and of every record
    /// [`Consumer::take_words`] took before it). [`Error::Corrupt`] if the peer broke the ring's rules (`out` is then
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
        out.clear();
        self.pop_kind_append(out)
    }

    /// [`Consumer::pop_kind`] appending the record's bytes to `out`, after what it holds:
    /// several records popped one after another share one buffer, and none needs a buffer
    /// of its own. On `Ok(Some(kind))` the record is `out[before..]`; otherwise `out` is as
    /// it was (`Ok(None)`) or unspecified past its old length ([`Error::Corrupt`]).
    pub fn pop_kind_append(&mut self, out: &mut Vec<u8>) -> Result<Option<u8>> {
        let before = out.len();
        let popped = self.pop_kind_at(out, before)?;
        out.truncate(popped.map_or(before, |(_, len)| before + len));
        Ok(popped.map(|(kind, _)| kind))
    }

    /// [`Consumer::pop_kind`] writing the record's bytes at `out[offset..]`: `Ok(Some((kind,
    /// len)))`, the record being `out[offset..offset + len]`. `out` grows (zeroed) only where it is
    /// shorter than the record's padded end, and keeps its length otherwise: the bytes past
    /// the record are unspecified. So a buffer reused for record after record is written
    /// only, never zeroed or truncated first. Otherwise as [`Consumer::pop_kind_append`].
    #[inline]
    pub fn pop_kind_at(&mut self, out: &mut Vec<u8>, offset: usize) -> Result<Option<(u8, usize)>> {
        // (Taken as words, then copied: one way to read and check a record, `take_words`.)
        let mut words = self.popped.take().unwrap_or_default();
        let taken = self.take_words(&mut words);
        if let Ok(Some((_, len))) = taken {
            let end = offset.saturating_add(padded(len as u64) as usize);
            if out.len() < end {
                out.resize(end, 0);
            }
            out[offset..offset + len].copy_from_slice(words.bytes(len));
        }
        self.popped = Some(words);
        // (Records taken by `take_words` before it are freed too, found or not.)
        self.free();
        taken
    }

    /// Takes the next record, as [`Consumer::pop_kind`] does, into `out`'s words
    /// ([`RecordBuf::bytes`] of the length returned), but leaves its space to the producer
    /// only at the next [`Consumer::free`]: a run of records taken one after another frees
    /// their space with one store, not one each. `Ok(Some((kind, len)))`, `Ok(None)` when
    /// the ring is empty, [`Error::Corrupt`] as for `pop_kind` (then `out` is unspecified).
    // (Inlined into the worker's loop over a ring's records, where it runs once per frame.)
    #[inline(always)]
    pub fn take_words(&mut self, out: &mut RecordBuf) -> Result<Option<(u8, usize)>> {
        let area = self.place.area();
        let at = (self.tail / 8) as usize;
        let header = area.word(at).load(Ordering::Acquire);
        if header == 0 {
            return Ok(None);
        }
        if header & PUBLISHED == 0 || header & RESERVED != 0 {
            return Err(bad_header(header));
        }
        let len = header & 0xffff_ffff;
        let kind = (header >> 32) as u8;
        if len > self.place.max_payload() as u64 {
            return Err(too_long_record(len, self.place.max_payload()));
        }
        let size = RECORD_HEADER + padded(len);
        if self.tail + size > MAX_INDEX {
            return Err(index_exhausted(self.tail));
        }
        let n = (padded(len) / 8) as usize;
        if out.words.len() < n {
            out.words.resize(n, 0);
        }
        let dst = &mut out.words[..n];
        match area.run(at + 1, n) {
            // (The record does not wrap: one slice, no index to mask or check per word;
            // four words a turn, as a compiler unrolls a plain copy but not one of atomics.)
            Some(words) => {
                let (mut d4, mut w4) = (dst.chunks_exact_mut(4), words.chunks_exact(4));
                for (d, w) in (&mut d4).zip(&mut w4) {
                    d[0] = w[0].load(Ordering::Relaxed);
                    d[1] = w[1].load(Ordering::Relaxed);
                    d[2] = w[2].load(Ordering::Relaxed);
                    d[3] = w[3].load(Ordering::Relaxed);
                }
                for (d, w) in d4.into_remainder().iter_mut().zip(w4.remainder()) {
                    *d = w.load(Ordering::Relaxed);
                }
            }
            None => {
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = area.word(at + 1 + i).load(Ordering::Relaxed);
                }
            }
        }
        self.tail += size;
        Ok(Some((kind, len as usize)))
    }

    /// Gives the producer the space of every record taken so far (one release store of
    /// `tail`, none when nothing was taken since the last).
    #[inline]
    pub fn free(&mut self) {
        if self.freed != self.tail {
            self.freed = self.tail;
            self.place.field(TAIL).store(self.tail, Ordering::Release);
        }
    }

    /// Whether no record waits (one load of the header word at `tail`; a corrupt header
    /// counts as waiting: the next pop reports it).
    pub fn is_empty(&self) -> bool {
        self.place
            .area()
            .word((self.tail / 8) as usize)
            .load(Ordering::Relaxed)
            == 0
    }

    /// Says that this consumer never sleeps on its doorbell ([`NEVER_SLEEPS`]): its producer
    /// then stops fencing and reading `waiting` after each push. Before the first poll, and
    /// never followed by [`Consumer::may_sleep`].
    pub fn never_sleeps(&self) {
        self.place
            .field(WAITING)
            .store(NEVER_SLEEPS, Ordering::Release);
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

// What a consumer finds wrong with a record: made out of line, as cold calls, so that their
// formatting is not inlined into the pop of every record.

#[cold]
#[inline(never)]
fn bad_header(header: u64) -> Error {
    Error::Corrupt(format!(
        "a record header is not published or has reserved bits set ({header:#x})"
    ))
}

#[cold]
#[inline(never)]
fn too_long_record(len: u64, max: usize) -> Error {
    Error::Corrupt(format!(
        "a record of {len} bytes, longer than the ring holds ({max})"
    ))
}

#[cold]
#[inline(never)]
fn index_exhausted(index: u64) -> Error {
    Error::Corrupt(format!(
        "the ring's index reached {index} (it started near the end of its range)"
    ))
}

/// A ring's data area: its words, and the mask that wraps a word number into it.
#[derive(Clone, Copy)]
struct Area<'a> {
    words: &'a [AtomicU64],
    mask: usize,
}

impl<'a> Area<'a> {
    /// Word `n` of the ring's endless sequence (index `8 * n`), wrapped.
    #[inline]
    fn word(self, n: usize) -> &'a AtomicU64 {
        &self.words[n & self.mask]
    }

    /// Words `n .. n + len` of the endless sequence, when they lie in one run of the area
    /// (do not wrap round its end).
    #[inline]
    fn run(self, n: usize, len: usize) -> Option<&'a [AtomicU64]> {
        let start = n & self.mask;
        self.words.get(start..start.checked_add(len)?)
    }
}

/// Writes a record's bytes into a ring's data area from word `at` on, a word at a time:
/// bytes gather in `acc` (its low `fill` bytes, in memory order) until a word is full.
struct Words<'a> {
    area: Area<'a>,
    at: usize,
    acc: u64,
    fill: usize,
}

impl Words<'_> {
    #[inline]
    fn store(&mut self, w: u64) {
        self.area.word(self.at).store(w, Ordering::Relaxed);
        self.at += 1;
    }

    #[inline]
    fn put(&mut self, mut bytes: &[u8]) {
        if self.fill > 0 {
            // (Rare: only a piece that is not a multiple of 8 long leaves bytes over.)
            let mut acc = self.acc.to_ne_bytes();
            let n = (8 - self.fill).min(bytes.len());
            acc[self.fill..self.fill + n].copy_from_slice(&bytes[..n]);
            self.acc = u64::from_ne_bytes(acc);
            self.fill += n;
            bytes = &bytes[n..];
            if self.fill < 8 {
                return;
            }
            self.fill = 0;
            self.store(self.acc);
        }
        while let Some((word, rest)) = bytes.split_first_chunk::<8>() {
            self.store(u64::from_ne_bytes(*word));
            bytes = rest;
        }
        let rest = bytes;
        if rest.is_empty() {
            // (A frame header, a payload of whole words: nothing over, and no copy of it.)
            return;
        }
        let mut acc = [0u8; 8];
        acc[..rest.len()].copy_from_slice(rest);
        self.acc = u64::from_ne_bytes(acc);
        self.fill = rest.len();
    }

    fn finish(&mut self) {
        if self.fill > 0 {
            // (The bytes past `fill` are zero: see `put`.)
            self.fill = 0;
            self.store(self.acc);
        }
    }
}
