//! The memory of a region mapped for remote access: words a peer may write at any moment.
//!
//! A peer with write or atomic access (its NIC, or the link executing its operations) may
//! change any byte of the region while the application runs, so no plain `&[u8]` or
//! `&mut [u8]` to it may exist: that would be a data race, undefined behaviour however the
//! reference is used. The region is therefore kept as 8-byte atomic words
//! (`Arc<[AtomicU64]>`), whose concurrent modification the language allows; local access
//! copies out of and into them ([`RmaMemory::read`], [`RmaMemory::write`]) or applies an
//! atomic operation to one word ([`RmaMemory::fetch_add`], [`RmaMemory::compare_swap`]).
//! No unsafe code is needed for any of it. A NIC writing the words by DMA is another writer
//! of atomic words, outside the program: the words' bytes are their native-order bytes, as
//! the NIC sees them in memory.
//!
//! The words are shared (`Arc`): the worker's table of mapped regions, each operation
//! executing on them and (over RDMA) the memory registration hold clones, so the memory is
//! freed only after the last of them lets go — never while a peer can still reach it, even
//! when the application's handle is `mem::forget`-ed (that leaks the region instead).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A region's memory: `len` bytes in atomic 8-byte words (the last one padded).
#[derive(Clone)]
pub(crate) struct RmaMemory {
    words: Arc<[AtomicU64]>,
    len: usize,
}

/// An access outside the region (the checks before it, `rdmx_proto::rma`, rule it out for
/// remote accesses; local ones are checked here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfBounds;

impl RmaMemory {
    /// `len` zeroed bytes.
    pub(crate) fn zeroed(len: usize) -> Self {
        let words = (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        RmaMemory { words, len }
    }

    /// A copy of `data`.
    pub(crate) fn from_bytes(data: &[u8]) -> Self {
        let words = data
            .chunks(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                AtomicU64::new(u64::from_ne_bytes(w))
            })
            .collect();
        RmaMemory {
            words,
            len: data.len(),
        }
    }

    /// Bytes in the region.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The words, for a registration with the NIC (which holds a clone until it is
    /// deregistered).
    #[cfg(feature = "rdma")]
    pub(crate) fn words(&self) -> std::sync::Arc<[AtomicU64]> {
        self.words.clone()
    }

    fn range(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfBounds),
        }
    }

    /// The words `len` bytes at `offset` touch (within bounds): for each, its index, where
    /// the bytes start in it, and the range of the `len` bytes it holds.
    fn spans(
        offset: usize,
        len: usize,
    ) -> impl Iterator<Item = (usize, usize, std::ops::Range<usize>)> {
        let mut done = 0;
        std::iter::from_fn(move || {
            (done < len).then(|| {
                let at = offset + done;
                let n = (8 - at % 8).min(len - done);
                let span = (at / 8, at % 8, done..done + n);
                done += n;
                span
            })
        })
    }

    /// Copies `out.len()` bytes at `offset` into `out`. Each word is read once, atomically:
    /// bytes a peer writes meanwhile are either old or new per word, never torn within one.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        self.range(offset, out.len())?;
        for (i, skip, part) in Self::spans(offset, out.len()) {
            let w = self.words[i].load(Ordering::Relaxed).to_ne_bytes();
            let n = part.len();
            out[part].copy_from_slice(&w[skip..skip + n]);
        }
        Ok(())
    }

    /// Copies `data` into the region at `offset`. Whole words are stored; a word `data`
    /// covers only part of is merged by compare-and-swap, so the bytes around it — which a
    /// peer may be writing — are left as they are.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        self.range(offset, data.len())?;
        for (i, skip, part) in Self::spans(offset, data.len()) {
            let (n, part) = (part.len(), &data[part]);
            if n == 8 {
                let mut w = [0u8; 8];
                w.copy_from_slice(part);
                self.words[i].store(u64::from_ne_bytes(w), Ordering::Relaxed);
            } else {
                // (A closure that always returns `Some`: `fetch_update` retries until its
                // swap lands, and cannot fail.)
                let _ = self.words[i].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                    let mut w = old.to_ne_bytes();
                    w[skip..skip + n].copy_from_slice(part);
                    Some(u64::from_ne_bytes(w))
                });
            }
        }
        Ok(())
    }

    /// The word at the 8-byte aligned `offset`.
    fn word(&self, offset: usize) -> Result<&AtomicU64, OutOfBounds> {
        self.range(offset, 8)?;
        if offset % 8 != 0 {
            return Err(OutOfBounds);
        }
        Ok(&self.words[offset / 8])
    }

    /// Reads the word at the 8-byte aligned `offset`.
    pub(crate) fn load(&self, offset: usize) -> Result<u64, OutOfBounds> {
        Ok(self.word(offset)?.load(Ordering::Acquire))
    }

    /// Stores `value` into the word at the 8-byte aligned `offset`.
    pub(crate) fn store(&self, offset: usize, value: u64) -> Result<(), OutOfBounds> {
        self.word(offset)?.store(value, Ordering::Release);
        Ok(())
    }

    /// Adds `value` (wrapping) to the word at the 8-byte aligned `offset`; its old value.
    pub(crate) fn fetch_add(&self, offset: usize, value: u64) -> Result<u64, OutOfBounds> {
        Ok(self.word(offset)?.fetch_add(value, Ordering::AcqRel))
    }

    /// Replaces the word at the 8-byte aligned `offset` with `new` if it holds `expected`;
    /// its old value either way (the swap happened when that equals `expected`), as the
    /// verbs' compare-and-swap reports.
    pub(crate) fn compare_swap(
        &self,
        offset: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, OutOfBounds> {
        let w = self.word(offset)?;
        Ok(
            match w.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(old) | Err(old) => old,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// Writes and reads at every offset and length around word edges are byte-exact and
    /// leave the bytes around them alone.
    #[test]
    fn byte_exact_at_every_edge() {
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 31, 64] {
            let base = pattern(len, 0xa5);
            for offset in 0..=len {
                for n in 0..=(len - offset) {
                    let m = RmaMemory::from_bytes(&base);
                    let data = pattern(n, 0x5a);
                    m.write(offset, &data).unwrap();
                    let mut want = base.clone();
                    want[offset..offset + n].copy_from_slice(&data);
                    let mut got = vec![0u8; len];
                    m.read(0, &mut got).unwrap();
                    assert_eq!(got, want, "len {len}, {n} bytes at {offset}");
                    let mut part = vec![0u8; n];
                    m.read(offset, &mut part).unwrap();
                    assert_eq!(part, data);
                }
            }
        }
    }

    #[test]
    fn accesses_outside_are_refused() {
        let m = RmaMemory::zeroed(20);
        assert_eq!(m.len(), 20);
        assert_eq!(m.read(20, &mut []), Ok(()));
        assert_eq!(m.read(19, &mut [0; 2]), Err(OutOfBounds));
        assert_eq!(m.write(usize::MAX, &[1]), Err(OutOfBounds));
        // The padding of the last word is not the region's.
        assert_eq!(m.load(16), Err(OutOfBounds));
        assert_eq!(m.fetch_add(4, 1), Err(OutOfBounds));
        assert_eq!(m.compare_swap(24, 0, 1), Err(OutOfBounds));
        assert_eq!(m.store(8, 3), Ok(()));
        assert_eq!(m.load(8), Ok(3));
    }

    /// 4 threads × 10 000 fetch-and-adds on one word give the exact total; 4 threads using
    /// compare-and-swap as a lock keep a counter, in another word, exact.
    #[test]
    fn atomics_from_several_threads_are_exact() {
        let m = RmaMemory::zeroed(64);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        m.fetch_add(0, 1).unwrap();
                    }
                });
            }
        });
        assert_eq!(m.load(0), Ok(40_000));
        std::thread::scope(|s| {
            for t in 1..=4u64 {
                let m = &m;
                s.spawn(move || {
                    for _ in 0..2_000 {
                        while m.compare_swap(8, 0, t).unwrap() != 0 {
                            std::hint::spin_loop();
                        }
                        // (Not an atomic increment: the lock is what keeps it exact.)
                        let v = m.load(16).unwrap();
                        m.store(16, v + 1).unwrap();
                        assert_eq!(m.compare_swap(8, t, 0), Ok(t));
                    }
                });
            }
        });
        assert_eq!(m.load(16), Ok(8_000));
    }

    /// Partial-word writes next to a concurrently updated word's bytes lose none of them.
    #[test]
    fn partial_writes_keep_their_neighbours_bytes() {
        let m = RmaMemory::zeroed(8);
        std::thread::scope(|s| {
            for lane in 0..4usize {
                let m = &m;
                s.spawn(move || {
                    for v in 1..=2_000u16 {
                        m.write(lane * 2, &v.to_ne_bytes()).unwrap();
                    }
                });
            }
        });
        let mut got = [0u8; 8];
        m.read(0, &mut got).unwrap();
        for lane in 0..4 {
            assert_eq!(
                u16::from_ne_bytes([got[lane * 2], got[lane * 2 + 1]]),
                2_000
            );
        }
    }
}
