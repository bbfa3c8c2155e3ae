//! The request table: every request a worker's handles name, in a slab. A request's slot
//! holds its engine id and, once it completes, its outcome, under the protocol lock; its
//! *done* flag lives in the worker's [`DoneFlags`], which the request's handle reads through
//! its worker without any lock. Slots and flags are reused, so a request in steady state
//! allocates nothing of its own, and its handle holds no reference of its own (no `Arc`,
//! whose count two atomic read-modify-writes would keep, or mutex per request).
//!
//! Its operations run once or twice per message and are `#[inline(always)]`, as are the
//! other tables' (`tables`, the engine's slab): as calls (the compiler's choice even
//! with `#[inline]`), their register saves and argument moves cost 269 of 5015 user-space
//! instructions per shared-memory round trip (callgrind, `roundtrip_cost`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rdmx_proto::RequestId;

use crate::request::Outcome;

/// Slots of the first chunk of done flags; chunk `k` has `FIRST_CHUNK << k`.
const FIRST_CHUNK: usize = 64;
/// Chunks: enough for every `u32` slot index (`FIRST_CHUNK << CHUNKS` is past `2^32`).
const CHUNKS: usize = 27;

/// The done flags of every slot of a worker's request table, `(generation << 1) | done`,
/// readable without a lock: chunks that double in size, each made once (under the protocol
/// lock, when the table first grows into it) and never moved or freed while the worker
/// lives, so a flag's place never changes.
pub(crate) struct DoneFlags([OnceLock<Box<[AtomicU64]>>; CHUNKS]);

impl Default for DoneFlags {
    fn default() -> Self {
        DoneFlags(std::array::from_fn(|_| OnceLock::new()))
    }
}

impl DoneFlags {
    /// Slot `index`'s chunk and place in it.
    #[inline]
    fn place(index: u32) -> (usize, usize) {
        // Chunk k holds the indices from FIRST_CHUNK * (2^k - 1) on.
        let i = u64::from(index) + FIRST_CHUNK as u64;
        let k = (u64::BITS - 1 - i.leading_zeros() - FIRST_CHUNK.trailing_zeros()) as usize;
        (k, (i - ((FIRST_CHUNK as u64) << k)) as usize)
    }

    /// The flag at `at` in chunk `k`, if the chunk was made.
    #[inline]
    fn get(&self, (k, at): (usize, usize)) -> Option<&AtomicU64> {
        self.0.get(k)?.get()?.get(at)
    }

    /// The flag at `at` in chunk `k`, the chunk made if it was not.
    #[inline(always)]
    fn make(&self, (k, at): (usize, usize)) -> &AtomicU64 {
        let chunk =
            self.0[k].get_or_init(|| (0..FIRST_CHUNK << k).map(|_| AtomicU64::new(0)).collect());
        &chunk[at]
    }
}

/// What a request's handle holds to find its entry in the table: its index, the generation
/// it was opened in, and where its done flag is ([`DoneFlags::place`] of the index, worked
/// out once).
pub(crate) struct RequestKey {
    pub(crate) index: u32,
    chunk: u32,
    at: u32,
    pub(crate) generation: u64,
}

impl RequestKey {
    /// Whether the request completed (no lock taken), by its worker's `flags`.
    #[inline]
    pub(crate) fn is_done(&self, flags: &DoneFlags) -> bool {
        flags
            .get((self.chunk as usize, self.at as usize))
            .is_some_and(|f| f.load(Ordering::SeqCst) == (self.generation << 1) | 1)
    }
}

struct Entry {
    generation: u64,
    id: Option<RequestId>,
    outcome: Option<Outcome>,
    /// The handle was dropped before completion: the slot is freed when it completes.
    abandoned: bool,
    open: bool,
}

/// The slab (see the module docs). Lives in the protocol state, under its lock; its done
/// flags are shared with the worker's handles.
pub(crate) struct RequestTable {
    flags: Arc<DoneFlags>,
    entries: Vec<Entry>,
    free: Vec<u32>,
}

impl RequestTable {
    /// A table whose done flags are `flags`.
    pub(crate) fn new(flags: Arc<DoneFlags>) -> Self {
        RequestTable {
            flags,
            entries: Vec::new(),
            free: Vec::new(),
        }
    }

    /// A slot for a new request, not done.
    #[inline(always)]
    pub(crate) fn open(&mut self) -> RequestKey {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.entries.len() as u32;
                self.entries.push(Entry {
                    generation: 0,
                    id: None,
                    outcome: None,
                    abandoned: false,
                    open: false,
                });
                i
            }
        };
        let e = &mut self.entries[index as usize];
        e.generation += 1;
        e.id = None;
        e.outcome = None;
        e.abandoned = false;
        e.open = true;
        // (No order to keep with the sleepers here, unlike `finish`: a handle that looks at
        // this flag gets its generation from this call, after the store. A plain store, not
        // the `xchg` a sequentially consistent one costs.)
        let (chunk, at) = DoneFlags::place(index);
        self.flags
            .make((chunk, at))
            .store(e.generation << 1, Ordering::Release);
        RequestKey {
            index,
            // (Under 27 and 2^32: see `place`.)
            chunk: chunk as u32,
            at: at as u32,
            generation: e.generation,
        }
    }

    fn entry(&mut self, index: u32, generation: u64) -> Option<&mut Entry> {
        self.entries
            .get_mut(index as usize)
            .filter(|e| e.open && e.generation == generation)
    }

    /// Records the engine's id of the request in `index`.
    pub(crate) fn set_id(&mut self, index: u32, id: RequestId) {
        if let Some(e) = self.entries.get_mut(index as usize) {
            e.id = Some(id);
        }
    }

    /// The engine's id of a request not yet done.
    pub(crate) fn pending_id(&mut self, slot: &RequestKey) -> Option<RequestId> {
        self.entry(slot.index, slot.generation)
            .filter(|e| e.outcome.is_none())
            .and_then(|e| e.id)
    }

    /// Completes the request in `index` with `outcome`. Returns the outcome back when the
    /// request's handle is gone (the caller drops it, outside the lock if it likes).
    #[inline(always)]
    pub(crate) fn finish(&mut self, index: u32, outcome: Outcome) -> Option<Outcome> {
        let e = self.entries.get_mut(index as usize)?;
        if !e.open {
            return Some(outcome);
        }
        if e.abandoned {
            e.open = false;
            self.free.push(index);
            return Some(outcome);
        }
        e.outcome = Some(outcome);
        self.flags
            .make(DoneFlags::place(index))
            .store((e.generation << 1) | 1, Ordering::SeqCst);
        None
    }

    /// Takes a completed request's outcome and frees its slot.
    #[inline(always)]
    pub(crate) fn take(&mut self, slot: &RequestKey) -> Option<Outcome> {
        let e = self.entry(slot.index, slot.generation)?;
        let outcome = e.outcome.take()?;
        e.open = false;
        self.free.push(slot.index);
        Some(outcome)
    }

    /// Slots in use (requests whose handles or outcomes are still held).
    #[cfg(test)]
    pub(crate) fn open_slots(&self) -> usize {
        self.entries.iter().filter(|e| e.open).count()
    }

    /// The handle of `slot` is gone: a completed request's slot is freed (its outcome
    /// returned to be dropped); a pending one is freed when it completes.
    pub(crate) fn abandon(&mut self, slot: &RequestKey) -> Option<Outcome> {
        let index = slot.index;
        let e = self.entry(index, slot.generation)?;
        match e.outcome.take() {
            Some(outcome) => {
                e.open = false;
                self.free.push(index);
                Some(outcome)
            }
            None => {
                e.abandoned = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmx_proto::Status;

    fn outcome(len: u64) -> Outcome {
        Outcome {
            status: Status::Ok,
            length: len,
            tag: 1,
            buf: vec![0; len as usize],
            conn: None,
        }
    }

    fn table() -> (RequestTable, Arc<DoneFlags>) {
        let flags = Arc::new(DoneFlags::default());
        (RequestTable::new(flags.clone()), flags)
    }

    #[test]
    fn slots_complete_are_taken_and_reused_without_confusing_generations() {
        let (mut t, flags) = table();
        let done = |k: &RequestKey| k.is_done(&flags);
        let a = t.open();
        let b = t.open();
        t.set_id(a.index, RequestId(10));
        assert_eq!(t.pending_id(&a), Some(RequestId(10)));
        assert!(!done(&a));
        assert!(t.finish(a.index, outcome(3)).is_none());
        assert!(done(&a) && !done(&b));
        assert_eq!(t.pending_id(&a), None);
        assert_eq!(t.take(&a).unwrap().length, 3);
        assert!(t.take(&a).is_none());
        // The slot is reused under a new generation: the old handle's view is not done.
        let c = t.open();
        assert_eq!(c.index, a.index);
        assert!(!done(&c) && !done(&a));
        assert!(t.take(&a).is_none());
        // An abandoned pending request frees its slot when it completes.
        assert!(t.abandon(&b).is_none());
        assert!(t.finish(b.index, outcome(1)).is_some());
        let d = t.open();
        assert_eq!(d.index, b.index);
        // An abandoned completed one at once.
        t.finish(d.index, outcome(2));
        assert_eq!(t.abandon(&d).unwrap().length, 2);
        assert_eq!(t.free, vec![d.index]);
    }

    #[test]
    fn many_slots_span_chunks() {
        let (mut t, flags) = table();
        let slots: Vec<RequestKey> = (0..1000).map(|_| t.open()).collect();
        for s in slots.iter().step_by(3) {
            t.finish(s.index, outcome(0));
        }
        for (i, s) in slots.iter().enumerate() {
            assert_eq!(s.is_done(&flags), i % 3 == 0);
        }
    }

    #[test]
    fn every_slot_index_has_one_place() {
        // Chunk k starts at 64 * (2^k - 1) and holds 64 << k flags.
        assert_eq!(DoneFlags::place(0), (0, 0));
        assert_eq!(DoneFlags::place(63), (0, 63));
        assert_eq!(DoneFlags::place(64), (1, 0));
        assert_eq!(DoneFlags::place(191), (1, 127));
        assert_eq!(DoneFlags::place(192), (2, 0));
        let (k, at) = DoneFlags::place(u32::MAX);
        assert!(k < CHUNKS && at < FIRST_CHUNK << k);
        for i in (0..100_000u32).chain(u32::MAX - 1000..=u32::MAX) {
            let (k, at) = DoneFlags::place(i);
            assert_eq!(FIRST_CHUNK * ((1 << k) - 1) + at, i as usize);
            assert!(at < FIRST_CHUNK << k);
        }
        // A slot whose chunk was never made is not done (and has no flag).
        assert!(DoneFlags::default().get(DoneFlags::place(5000)).is_none());
    }
}
