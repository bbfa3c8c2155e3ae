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

/// Per-request state by the engine's request id, in an array by the engine's slot index.
/// (Sends the engine completed as it made them have no slot and are never tracked: see
/// [`RequestId::is_immediate`].)
pub(super) struct RequestMap<T> {
    /// By the engine's slot index (checked against the whole id).
    slots: Vec<Option<(RequestId, T)>>,
}

impl<T> Default for RequestMap<T> {
    fn default() -> Self {
        RequestMap { slots: Vec::new() }
    }
}

impl<T> RequestMap<T> {
    /// Tracks `value` under `id` (the engine never hands out an id that is still alive).
    /// False, tracking nothing, for an id that names no slot.
    pub(super) fn insert(&mut self, id: RequestId, value: T) -> bool {
        let Some(i) = id.index() else {
            return false;
        };
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i] = Some((id, value));
        true
    }

    pub(super) fn get(&self, id: &RequestId) -> Option<&T> {
        match self.slots.get(id.index()?) {
            Some(Some((have, v))) if have == id => Some(v),
            _ => None,
        }
    }

    pub(super) fn remove(&mut self, id: &RequestId) -> Option<T> {
        match self.slots.get_mut(id.index()?) {
            Some(entry @ Some(_)) if entry.as_ref().is_some_and(|(have, _)| have == id) => {
                entry.take().map(|(_, v)| v)
            }
            _ => None,
        }
    }
}

/// Received frames held while the engine's actions read them, by receive-buffer id: SRQ
/// buffers by their index (below `dense_limit`), others (TCP frames, numbered upwards) in a
/// short list. The engine keeps nothing of a frame once the actions it queued ran, so every
/// frame goes back within the locked section that delivered it ([`HeldFrames::drain`]).
pub(super) struct HeldFrames<T> {
    dense: Vec<Option<T>>,
    dense_limit: u64,
    /// The ids held in `dense`, so that draining visits only those.
    dense_ids: Vec<u64>,
    other: Vec<(u64, T)>,
}

impl<T> HeldFrames<T> {
    /// Ids below `dense_limit` are kept in an array.
    pub(super) fn new(dense_limit: u64) -> Self {
        HeldFrames {
            dense: Vec::new(),
            dense_limit,
            dense_ids: Vec::new(),
            other: Vec::new(),
        }
    }

    pub(super) fn insert(&mut self, id: u64, value: T) {
        if id < self.dense_limit {
            let i = id as usize;
            if self.dense.len() <= i {
                self.dense.resize_with(i + 1, || None);
            }
            if self.dense[i].replace(value).is_none() {
                self.dense_ids.push(id);
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

    /// Takes every held frame out, with its id, visiting only those held.
    #[inline]
    pub(super) fn drain(&mut self, f: impl FnMut(u64, T)) {
        // Most calls find nothing held: that check stays in the caller.
        if !self.dense_ids.is_empty() || !self.other.is_empty() {
            self.drain_held(f);
        }
    }

    #[inline(never)]
    fn drain_held(&mut self, mut f: impl FnMut(u64, T)) {
        for id in self.dense_ids.drain(..) {
            if let Some(v) = self.dense.get_mut(id as usize).and_then(Option::take) {
                f(id, v);
            }
        }
        for (id, v) in self.other.drain(..) {
            f(id, v);
        }
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
        h.insert(7, "srq 7");
        assert_eq!(h.get(&3), Some(&"srq 3"));
        assert_eq!(h.get(&4), None);
        assert_eq!(h.get(&(1 << 48)), Some(&"tcp 0"));
        let mut all = Vec::new();
        h.drain(|id, v| all.push((id, v)));
        assert_eq!(all, vec![(3, "srq 3"), (7, "srq 7"), (1 << 48, "tcp 0")]);
        let mut again = Vec::new();
        h.drain(|id, v| again.push((id, v)));
        assert!(again.is_empty() && h.get(&3).is_none());
        h.insert(3, "srq 3 again");
        assert_eq!(h.get(&3), Some(&"srq 3 again"));
    }

    #[test]
    fn requests_by_slot_and_immediate_ids() {
        let mut m = RequestMap::default();
        // Ids as the engine makes them: slot index + 1 in the low bits, or bit 63.
        let r1 = RequestId(1);
        let r1_again = RequestId((1 << 32) | 1);
        let imm = RequestId((1 << 63) | 5);
        assert!(m.insert(r1, "one"));
        assert!(!m.insert(imm, "now"), "an immediate id names no slot");
        assert_eq!(m.get(&r1), Some(&"one"));
        assert_eq!(m.get(&r1_again), None, "another generation of the slot");
        assert_eq!(m.get(&imm), None);
        assert_eq!(m.remove(&r1_again), None);
        assert_eq!(m.remove(&r1), Some("one"));
        assert_eq!(m.remove(&imm), None);
        assert_eq!(m.get(&r1), None);
        m.insert(r1_again, "again");
        assert_eq!(m.get(&r1_again), Some(&"again"));
        assert_eq!(m.get(&RequestId(0)), None);
    }
}
