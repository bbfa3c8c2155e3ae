//! A link's output queue: whole messages coalesced into reused buffers, and READ_DATA
//! answers written straight from the exposed buffer, drained by vectored writes.

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

#[derive(Default)]
pub(crate) struct Output {
    pub(crate) queue: VecDeque<OutItem>,
    /// Why the output side died, if it did.
    pub(crate) failed: Option<String>,
    /// The buffer of the last small message written, kept for the next one (no allocation
    /// per message in steady state).
    spare: Vec<u8>,
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
    /// Appends the concatenation of `parts` as one or more whole messages.
    pub(crate) fn push_bytes(&mut self, parts: &[&[u8]]) {
        let need: usize = parts.iter().map(|p| p.len()).sum();
        if let Some(OutItem::Bytes { buf, .. }) = self.queue.back_mut() {
            if buf.len() + need <= COALESCE_LIMIT {
                for p in parts {
                    buf.extend_from_slice(p);
                }
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
        self.queue.push_back(OutItem::Bytes { buf, pos: 0 });
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
    }

    pub(crate) fn fail(&mut self, reason: String) {
        self.failed = Some(reason);
        self.queue.clear();
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
