//! The worker's tables of what the engine names by id: the user buffers it holds
//! ([`UserBufs`], by [`UserBufId`]), the requests it tracks ([`RequestMap`], by the
//! engine's [`RequestId`]) and the received frames whose buffers the engine still reads
//! ([`HeldFrames`], by receive-buffer id). Both index arrays instead of hashing: a buffer's id is a slotmap
//! key (index and version), and a request's id carries the index of the engine's slot
//! ([`RequestId::index`]), so a message costs no hash-table insert or removal.

use slotmap::{DefaultKey, Key, KeyData, SlotMap};

use rdmx_proto::{RequestId, UserBufId};

use crate::usermem::UserMem;

/// User buffers inside the worker, by id.
#[derive(Default)]
pub(super) struct UserBufs {
    map: SlotMap<DefaultKey, UserMem>,
}

fn key(id: &UserBufId) -> DefaultKey {
    KeyData::from_ffi(id.0).into()
}

impl UserBufs {
    /// Takes `mem` in under a new id.
    pub(super) fn insert(&mut self, mem: UserMem) -> UserBufId {
        UserBufId(self.map.insert(mem).data().as_ffi())
    }

    pub(super) fn get(&self, id: &UserBufId) -> Option<&UserMem> {
        self.map.get(key(id))
    }

    pub(super) fn get_mut(&mut self, id: &UserBufId) -> Option<&mut UserMem> {
        self.map.get_mut(key(id))
    }

    pub(super) fn remove(&mut self, id: &UserBufId) -> Option<UserMem> {
        self.map.remove(key(id))
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }
}

/// Per-request state by the engine's request id.
pub(super) struct RequestMap<T> {
    /// By the engine's slot index (checked against the whole id).
    slots: Vec<Option<(RequestId, T)>>,
    /// Requests the engine completed as it made them (no slot): at most a few at a time.
    immediate: Vec<(RequestId, T)>,
}

impl<T> Default for RequestMap<T> {
    fn default() -> Self {
        RequestMap {
            slots: Vec::new(),
            immediate: Vec::new(),
        }
    }
}

impl<T> RequestMap<T> {
    /// Tracks `value` under `id` (the engine never hands out an id that is still alive).
    pub(super) fn insert(&mut self, id: RequestId, value: T) {
        match id.index() {
            Some(i) => {
                if self.slots.len() <= i {
                    self.slots.resize_with(i + 1, || None);
                }
                self.slots[i] = Some((id, value));
            }
            None => self.immediate.push((id, value)),
        }
    }

    pub(super) fn get(&self, id: &RequestId) -> Option<&T> {
        match id.index() {
            Some(i) => match self.slots.get(i) {
                Some(Some((have, v))) if have == id => Some(v),
                _ => None,
            },
            None => self
                .immediate
                .iter()
                .find(|(have, _)| have == id)
                .map(|e| &e.1),
        }
    }

    pub(super) fn remove(&mut self, id: &RequestId) -> Option<T> {
        match id.index() {
            Some(i) => match self.slots.get_mut(i) {
                Some(entry @ Some(_)) if entry.as_ref().is_some_and(|(have, _)| have == id) => {
                    entry.take().map(|(_, v)| v)
                }
                _ => None,
            },
            None => {
                let pos = self.immediate.iter().position(|(have, _)| have == id)?;
                Some(self.immediate.swap_remove(pos).1)
            }
        }
    }
}

/// Received frames held while the engine's actions read them, by receive-buffer id: SRQ
/// buffers by their index (below `dense`), others (TCP frames, numbered upwards) in a short
/// list — the engine hands every frame back within the locked section that delivered it.
pub(super) struct HeldFrames<T> {
    dense: Vec<Option<T>>,
    dense_limit: u64,
    other: Vec<(u64, T)>,
    /// Frames held in `dense`.
    dense_held: usize,
}

impl<T> HeldFrames<T> {
    /// Ids below `dense_limit` are kept in an array.
    pub(super) fn new(dense_limit: u64) -> Self {
        HeldFrames {
            dense: Vec::new(),
            dense_limit,
            other: Vec::new(),
            dense_held: 0,
        }
    }

    pub(super) fn insert(&mut self, id: u64, value: T) {
        if id < self.dense_limit {
            let i = id as usize;
            if self.dense.len() <= i {
                self.dense.resize_with(i + 1, || None);
            }
            if self.dense[i].replace(value).is_none() {
                self.dense_held += 1;
            }
        } else {
            // (Frame ids above the dense range are numbered upwards, never reused.)
            self.other.push((id, value));
        }
    }

    pub(super) fn get(&self, id: &u64) -> Option<&T> {
        if *id < self.dense_limit {
            self.dense.get(*id as usize).and_then(Option::as_ref)
        } else {
            self.other.iter().find(|(have, _)| have == id).map(|e| &e.1)
        }
    }

    pub(super) fn remove(&mut self, id: &u64) -> Option<T> {
        if *id < self.dense_limit {
            let taken = self.dense.get_mut(*id as usize).and_then(Option::take);
            self.dense_held -= usize::from(taken.is_some());
            taken
        } else {
            let pos = self.other.iter().position(|(have, _)| have == id)?;
            Some(self.other.swap_remove(pos).1)
        }
    }

    /// Takes every held frame out (with its id).
    pub(super) fn drain(&mut self) -> Vec<(u64, T)> {
        let mut all: Vec<(u64, T)> = self
            .dense
            .iter_mut()
            .enumerate()
            .filter_map(|(i, v)| v.take().map(|v| (i as u64, v)))
            .collect();
        self.dense_held = 0;
        all.append(&mut self.other);
        all
    }

    pub(super) fn is_empty(&self) -> bool {
        self.other.is_empty() && self.dense_held == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_buffers_by_id_and_stale_ids_find_nothing() {
        let mut b = UserBufs::default();
        let a = b.insert(UserMem::Plain(vec![1]));
        let c = b.insert(UserMem::Plain(vec![2]));
        assert!(matches!(b.get(&a), Some(UserMem::Plain(v)) if v == &[1]));
        assert!(b.remove(&a).is_some());
        assert!(b.get(&a).is_none() && b.remove(&a).is_none());
        let d = b.insert(UserMem::Plain(vec![3]));
        assert_ne!(a, d, "a reused slot has a new id");
        assert!(b.get(&a).is_none());
        assert!(matches!(b.get_mut(&c), Some(UserMem::Plain(v)) if v == &[2]));
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn held_frames_dense_and_other() {
        let mut h = HeldFrames::new(100);
        h.insert(3, "srq 3");
        h.insert(1 << 48, "tcp 0");
        h.insert((1 << 48) + 1, "tcp 1");
        assert_eq!(h.get(&3), Some(&"srq 3"));
        assert_eq!(h.get(&4), None);
        assert_eq!(h.get(&(1 << 48)), Some(&"tcp 0"));
        assert_eq!(h.remove(&(1 << 48)), Some("tcp 0"));
        assert_eq!(h.remove(&(1 << 48)), None);
        assert!(!h.is_empty());
        let mut left = h.drain();
        left.sort();
        assert_eq!(left, vec![(3, "srq 3"), ((1 << 48) + 1, "tcp 1")]);
        assert!(h.is_empty());
    }

    #[test]
    fn requests_by_slot_and_immediate_ids() {
        let mut m = RequestMap::default();
        // Ids as the engine makes them: slot index + 1 in the low bits, or bit 63.
        let r1 = RequestId(1);
        let r1_again = RequestId((1 << 32) | 1);
        let imm = RequestId((1 << 63) | 5);
        m.insert(r1, "one");
        m.insert(imm, "now");
        assert_eq!(m.get(&r1), Some(&"one"));
        assert_eq!(m.get(&r1_again), None, "another generation of the slot");
        assert_eq!(m.get(&imm), Some(&"now"));
        assert_eq!(m.remove(&r1_again), None);
        assert_eq!(m.remove(&r1), Some("one"));
        assert_eq!(m.remove(&imm), Some("now"));
        assert_eq!((m.get(&r1), m.get(&imm)), (None, None));
        m.insert(r1_again, "again");
        assert_eq!(m.get(&r1_again), Some(&"again"));
        assert_eq!(m.get(&RequestId(0)), None);
    }
}
