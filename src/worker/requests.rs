//! The request table: every request a worker's handles name, in a slab. A request's slot
//! holds its engine id and, once it completes, its outcome, under the protocol lock; its
//! *done* flag lives in a shared block of atomics that the request's handle reads without any
//! lock. Slots and their blocks are reused, so a request in steady state allocates nothing of
//! its own (no `Arc` or mutex per request).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdmx_proto::RequestId;

use crate::request::Outcome;

/// Slots per block of done flags.
const BLOCK: usize = 64;

/// Done flags of [`BLOCK`] consecutive slots: `(generation << 1) | done`.
pub(crate) struct DoneFlags([AtomicU64; BLOCK]);

/// What a request's handle holds to find its entry in the table: the block of its done flag,
/// its index and the generation it was opened in.
pub(crate) struct RequestKey {
    flags: Arc<DoneFlags>,
    pub(crate) index: u32,
    pub(crate) generation: u64,
}

impl RequestKey {
    /// Whether the request completed (no lock taken).
    pub(crate) fn is_done(&self) -> bool {
        self.flags.0[self.index as usize % BLOCK].load(Ordering::SeqCst)
            == (self.generation << 1) | 1
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

/// The slab (see the module docs). Lives in the protocol state, under its lock.
#[derive(Default)]
pub(crate) struct RequestTable {
    blocks: Vec<Arc<DoneFlags>>,
    entries: Vec<Entry>,
    free: Vec<u32>,
}

impl RequestTable {
    /// A slot for a new request, not done.
    pub(crate) fn open(&mut self) -> RequestKey {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.entries.len() as u32;
                if i as usize % BLOCK == 0 {
                    self.blocks
                        .push(Arc::new(DoneFlags(std::array::from_fn(|_| {
                            AtomicU64::new(0)
                        }))));
                }
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
        let flags = self.blocks[index as usize / BLOCK].clone();
        // (No order to keep with the sleepers here, unlike `finish`: a handle that looks at
        // this flag gets its generation from this call, after the store. A plain store, not
        // the `xchg` a sequentially consistent one costs.)
        flags.0[index as usize % BLOCK].store(e.generation << 1, Ordering::Release);
        RequestKey {
            flags,
            index,
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
        self.blocks[index as usize / BLOCK].0[index as usize % BLOCK]
            .store((e.generation << 1) | 1, Ordering::SeqCst);
        None
    }

    /// Takes a completed request's outcome and frees its slot.
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

    #[test]
    fn slots_complete_are_taken_and_reused_without_confusing_generations() {
        let mut t = RequestTable::default();
        let a = t.open();
        let b = t.open();
        t.set_id(a.index, RequestId(10));
        assert_eq!(t.pending_id(&a), Some(RequestId(10)));
        assert!(!a.is_done());
        assert!(t.finish(a.index, outcome(3)).is_none());
        assert!(a.is_done() && !b.is_done());
        assert_eq!(t.pending_id(&a), None);
        assert_eq!(t.take(&a).unwrap().length, 3);
        assert!(t.take(&a).is_none());
        // The slot is reused under a new generation: the old handle's view is not done.
        let c = t.open();
        assert_eq!(c.index, a.index);
        assert!(!c.is_done() && !a.is_done());
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
    fn many_slots_span_blocks() {
        let mut t = RequestTable::default();
        let slots: Vec<RequestKey> = (0..200).map(|_| t.open()).collect();
        for s in slots.iter().step_by(3) {
            t.finish(s.index, outcome(0));
        }
        for (i, s) in slots.iter().enumerate() {
            assert_eq!(s.is_done(), i % 3 == 0);
        }
    }
}
