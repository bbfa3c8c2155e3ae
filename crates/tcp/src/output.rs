//! A link's output queue: whole messages coalesced into reused buffers, and READ_DATA
//! answers written straight from the exposed buffer, drained by vectored writes — and what
//! the queue holds, against the link's output limit (see [`crate::Link::set_output_limit`]).

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;

use crate::wire::{HEADER_LEN, READ_DATA_HEAD};

/// Small messages are appended to the last queued buffer while it stays below this size.
const COALESCE_LIMIT: usize = 64 * 1024;
/// Smallest buffer allocated for small queued messages.
const SMALL_BUF: usize = 4096;
/// I/O vectors per `writev`.
pub(crate) const MAX_IOVECS: usize = 64;
/// Header and sub-header of READ_DATA, written in front of the data.
pub(crate) const READ_DATA_PREFIX: usize = HEADER_LEN + READ_DATA_HEAD;
/// Bytes one queued item takes in the queue itself (a slot of the queue's ring).
pub(crate) const ITEM_BYTES: usize = std::mem::size_of::<OutItem>();
/// An emptied queue whose ring grew past this many slots (a burst of READ answers) gives
/// the memory back.
const SHRINK_ABOVE: usize = 1024;

pub(crate) struct Output {
    pub(crate) queue: VecDeque<OutItem>,
    /// Why the output side died, if it did.
    pub(crate) failed: Option<String>,
    /// The buffer of the last small message written, kept for the next one (no allocation
    /// per message in steady state).
    spare: Vec<u8>,
    /// Bytes of the queued buffers (their capacity): copies of frames and small messages.
    /// READ_DATA's data is the caller's buffer, held by `Arc`, and not counted.
    bytes: usize,
    /// Above this many held bytes ([`Output::held`]) the link's input pauses...
    pub(crate) limit: usize,
    /// ...and it resumes at or below this many (half the limit).
    pub(crate) resume_at: usize,
    /// Whether the input is paused (mirrored by the link's flag, which its input side reads
    /// without this lock).
    pub(crate) paused: bool,
}

impl Default for Output {
    fn default() -> Self {
        Output {
            queue: VecDeque::new(),
            failed: None,
            spare: Vec::new(),
            bytes: 0,
            limit: crate::DEFAULT_OUTPUT_LIMIT,
            resume_at: crate::DEFAULT_OUTPUT_LIMIT / 2,
            paused: false,
        }
    }
}

pub(crate) enum OutItem {
    /// Whole messages (possibly several), `pos` bytes of them written.
    Bytes { buf: Vec<u8>, pos: usize },
    /// A READ_DATA header followed by `data[start..start + len]` (in range, checked when
    /// queued), `pos` bytes of header and data written.
    Data {
        head: [u8; READ_DATA_PREFIX],
        data: Arc<Vec<u8>>,
        start: usize,
        len: usize,
        pos: usize,
    },
}

impl Output {
    /// The memory the queue holds: its buffers' bytes and its ring of items (whatever their
    /// kind, READ answers included). What the output limit is checked against.
    #[inline]
    pub(crate) fn held(&self) -> usize {
        self.bytes + self.queue.capacity() * ITEM_BYTES
    }

    /// Whether the input should be paused now: the held memory went above the limit, and
    /// (once paused) has not yet come down to the resume mark.
    #[inline]
    pub(crate) fn should_pause(&self) -> bool {
        let held = self.held();
        if self.paused {
            held > self.resume_at
        } else {
            held > self.limit
        }
    }

    /// Appends the concatenation of `parts` as one or more whole messages.
    pub(crate) fn push_bytes(&mut self, parts: &[&[u8]]) {
        let need: usize = parts.iter().map(|p| p.len()).sum();
        if let Some(OutItem::Bytes { buf, .. }) = self.queue.back_mut() {
            if buf.len() + need <= COALESCE_LIMIT {
                let before = buf.capacity();
                for p in parts {
                    buf.extend_from_slice(p);
                }
                self.bytes += buf.capacity() - before;
                return;
            }
        }
        let mut buf = if self.spare.capacity() >= need {
            std::mem::take(&mut self.spare)
        } else {
            Vec::with_capacity(need.max(SMALL_BUF))
        };
        for p in parts {
            buf.extend_from_slice(p);
        }
        self.bytes += buf.capacity();
        self.queue.push_back(OutItem::Bytes { buf, pos: 0 });
    }

    /// Appends a READ_DATA item (its data is not copied, nor counted in the held bytes).
    pub(crate) fn push_data(&mut self, item: OutItem) {
        self.queue.push_back(item);
    }

    /// Drops `written` bytes from the front of the queue.
    pub(crate) fn advance(&mut self, mut written: usize) {
        while written > 0 {
            let Some(front) = self.queue.front_mut() else {
                break;
            };
            let left = front.remaining();
            if written >= left {
                written -= left;
                if let Some(OutItem::Bytes { mut buf, .. }) = self.queue.pop_front() {
                    self.bytes -= buf.capacity();
                    if buf.capacity() <= COALESCE_LIMIT && self.spare.capacity() == 0 {
                        buf.clear();
                        self.spare = buf;
                    }
                }
            } else {
                front.advance(written);
                written = 0;
            }
        }
        if self.queue.is_empty() && self.queue.capacity() > SHRINK_ABOVE {
            self.queue = VecDeque::new();
        }
    }

    pub(crate) fn fail(&mut self, reason: String) {
        self.failed = Some(reason);
        self.queue = VecDeque::new();
        self.bytes = 0;
    }
}

impl OutItem {
    pub(crate) fn remaining(&self) -> usize {
        match self {
            OutItem::Bytes { buf, pos } => buf.len() - pos,
            OutItem::Data { len, pos, .. } => READ_DATA_PREFIX + len - pos,
        }
    }

    pub(crate) fn advance(&mut self, n: usize) {
        match self {
            OutItem::Bytes { pos, .. } | OutItem::Data { pos, .. } => *pos += n,
        }
    }

    /// Appends this item's unwritten bytes to `iov` (at most two slices).
    pub(crate) fn slices<'a>(&'a self, iov: &mut [IoSlice<'a>; MAX_IOVECS], n: &mut usize) {
        let mut push = |s: &'a [u8]| {
            if !s.is_empty() && *n < MAX_IOVECS {
                iov[*n] = IoSlice::new(s);
                *n += 1;
            }
        };
        match self {
            OutItem::Bytes { buf, pos } => push(&buf[*pos..]),
            OutItem::Data {
                head,
                data,
                start,
                len,
                pos,
            } => {
                let end = start + len;
                if *pos < READ_DATA_PREFIX {
                    push(&head[*pos..]);
                    push(&data[*start..end]);
                } else {
                    push(&data[start + (pos - READ_DATA_PREFIX)..end]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_bytes_follow_the_queue() {
        let mut out = Output::default();
        assert_eq!(out.held(), 0);
        out.push_bytes(&[b"abc", b"def"]);
        let one = out.held();
        assert!(one >= SMALL_BUF + ITEM_BYTES, "{one}");
        // Coalesced: no new item, the same buffer.
        out.push_bytes(&[b"ghi"]);
        assert_eq!(out.held(), one);
        let big = vec![7u8; COALESCE_LIMIT];
        out.push_bytes(&[&big]);
        assert!(out.held() >= one + COALESCE_LIMIT);
        out.push_data(OutItem::Data {
            head: [0; READ_DATA_PREFIX],
            data: Arc::new(vec![0; 1 << 20]),
            start: 0,
            len: 1 << 20,
            pos: 0,
        });
        // The READ answer's data is not counted; its slot is.
        assert!(out.held() < one + 2 * COALESCE_LIMIT + 16 * ITEM_BYTES);
        let all: usize = out.queue.iter().map(OutItem::remaining).sum();
        out.advance(all);
        assert!(out.queue.is_empty());
        assert_eq!(out.bytes, 0);
    }

    #[test]
    fn pausing_has_hysteresis() {
        // (Room for the ring's slots beside the buffers.)
        let mut out = Output {
            limit: 3 * COALESCE_LIMIT + SMALL_BUF,
            resume_at: COALESCE_LIMIT + SMALL_BUF,
            ..Output::default()
        };
        let big = vec![1u8; COALESCE_LIMIT];
        for _ in 0..3 {
            out.push_bytes(&[&big]);
            assert!(!out.should_pause());
        }
        out.push_bytes(&[&big]);
        assert!(out.should_pause());
        out.paused = true;
        // Two buffers written: still above the resume mark.
        out.advance(2 * COALESCE_LIMIT);
        assert!(out.should_pause());
        out.advance(COALESCE_LIMIT);
        assert!(!out.should_pause(), "held {}", out.held());
    }

    #[test]
    fn a_burst_of_items_gives_its_ring_back_once_written() {
        let mut out = Output::default();
        let data = Arc::new(vec![0u8; 64]);
        for _ in 0..10_000 {
            out.push_data(OutItem::Data {
                head: [0; READ_DATA_PREFIX],
                data: data.clone(),
                start: 0,
                len: 64,
                pos: 0,
            });
        }
        assert!(out.held() >= 10_000 * ITEM_BYTES);
        out.advance(10_000 * (READ_DATA_PREFIX + 64));
        assert_eq!(out.held(), 0);
        assert_eq!(Arc::strong_count(&data), 1);
    }
}
