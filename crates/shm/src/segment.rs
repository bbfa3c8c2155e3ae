//! A shared segment: a sealed memfd mapped shared, accessed only through atomics.
//!
//! The segment is a trust boundary: the peer maps it too and may write anything into it at
//! any moment. So this module never hands out a `&[u8]` or `&mut [u8]` of it (that would be
//! a data race the compiler may exploit); every access is an atomic load or store of an
//! aligned `u64`, bounds-checked against the mapping. Values read may be anything; the ring
//! validates them before it uses them.
//!
//! The creator seals the memfd against shrinking and growing before handing it over, and
//! [`Segment::open`] refuses a descriptor without those seals or of another size: a peer
//! that could shrink the file would make our next access of a mapped page a SIGBUS.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{MemfdFlags, SealFlags};

use crate::{Error, Result};

/// The seals a usable segment carries: its size is fixed for good.
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// A sealed memfd, mapped shared (see the module docs). The memfd can be closed once it was
/// handed over ([`Segment::close_fd`]): the mapping keeps the memory, and a connection then
/// holds no descriptor for its segment.
pub struct Segment {
    map: MmapRaw,
    fd: Option<OwnedFd>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment").field("len", &self.len()).finish()
    }
}

impl Segment {
    /// Creates a zero-filled segment of `len` bytes (a positive multiple of 8), named `name`
    /// in `/proc/*/fd` (a memfd has no path: nothing is left in `/dev/shm` when the
    /// processes holding it die), sealed against resizing.
    pub fn create(name: &str, len: usize) -> Result<Segment> {
        if len == 0 || len % 8 != 0 {
            return Err(Error::Invalid(format!(
                "a segment of {len} bytes (a positive multiple of 8 is needed)"
            )));
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| Error::io("memfd_create", e))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(|e| Error::io("sizing the segment", e))?;
        rustix::fs::fcntl_add_seals(&fd, SEALS).map_err(|e| Error::io("sealing the segment", e))?;
        Self::map(fd, len)
    }

    /// Maps a segment the peer handed over, which must be a memfd of exactly `len` bytes
    /// sealed against shrinking and growing.
    pub fn open(fd: OwnedFd, len: usize) -> Result<Segment> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|e| {
            Error::BadSegment(format!("its seals cannot be read ({e}): not a memfd"))
        })?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(Error::BadSegment(format!(
                "it can still be resized (seals {seals:?})"
            )));
        }
        let size = rustix::fs::fstat(&fd)
            .map_err(|e| Error::io("reading the segment's size", e))?
            .st_size;
        if u64::try_from(size).ok() != Some(len as u64) || len == 0 || len % 8 != 0 {
            return Err(Error::BadSegment(format!(
                "it holds {size} bytes, {len} were announced"
            )));
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Segment> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&fd)
            .map_err(|e| Error::io("mapping the segment", e))?;
        Ok(Segment { map, fd: Some(fd) })
    }

    /// The memfd, to hand to the peer (`None` once closed).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|fd| fd.as_fd())
    }

    /// Closes the memfd (once handed over, or once mapped by the side that opened it): the
    /// mapping stays, and with it the memory, until the segment is dropped.
    pub fn close_fd(&mut self) {
        self.fd = None;
    }

    /// The segment's size in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the segment is empty (never: a segment has at least 8 bytes).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The `count` aligned words from byte `offset` on, as atomics (`None` if `offset` is
    /// not a multiple of 8 or the words do not all lie inside the segment): what copies a
    /// run of bytes in or out with one bounds check instead of one per word.
    pub(crate) fn words(&self, offset: usize, count: usize) -> Option<&[AtomicU64]> {
        let end = count.checked_mul(8).and_then(|n| offset.checked_add(n))?;
        if offset % 8 != 0 || end > self.len() {
            return None;
        }
        // SAFETY: the words lie inside the mapping (checked above), which is page-aligned, so
        // `offset % 8 == 0` makes them 8-aligned, and `AtomicU64` has the size and alignment
        // of `u64`, so `count` of them fill exactly `offset..end`; the mapping lives as long as
        // `self`, which the returned slice borrows, and its size cannot change (the memfd is
        // sealed against shrinking, checked at `open`, set at `create`). Every access to the
        // segment from this process is atomic, so the peer's concurrent writes are not data
        // races.
        Some(unsafe {
            std::slice::from_raw_parts(self.map.as_mut_ptr().add(offset) as *const AtomicU64, count)
        })
    }

    /// [`Segment::words`] held with the segment: for a ring, which reads and writes the same
    /// words on every message, so that it does not look them up (with a bounds check) each
    /// time.
    pub(crate) fn held_words(self: &Arc<Self>, offset: usize, count: usize) -> Option<HeldWords> {
        let words = self.words(offset, count)?;
        // SAFETY: `words` borrows the mapping of `self`. The `HeldWords` keeps an `Arc` of this
        // segment for as long as it exists, so the mapping outlives every use of the extended
        // reference, and [`HeldWords::get`] lends it only for as long as the `HeldWords` is
        // borrowed, never as `'static`. The rest of the argument in `words` holds unchanged.
        let words: &'static [AtomicU64] = unsafe { &*(words as *const [AtomicU64]) };
        Some(HeldWords {
            words,
            _seg: self.clone(),
        })
    }
}

/// Words of a segment, with the segment they lie in (see [`Segment::held_words`]).
#[derive(Clone)]
pub(crate) struct HeldWords {
    words: &'static [AtomicU64],
    _seg: Arc<Segment>,
}

impl HeldWords {
    /// The words.
    #[inline]
    pub(crate) fn get(&self) -> &[AtomicU64] {
        self.words
    }
}
