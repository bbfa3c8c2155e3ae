//! The worker's tables of what the engine names by id: the user buffers it holds
//! ([`UserBufs`], by [`UserBufId`]) and the requests it tracks ([`RequestMap`], by the
//! engine's [`RequestId`]). Both index arrays instead of hashing: a buffer's id is a slotmap
//! key (index and version), and a request's id carries the index of the engine's slot
//! ([`RequestId::index`]), so a message costs no hash-table insert or removal. Their
//! per-message operations are inlined (see `requests`).

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
    #[inline(always)]
    pub(super) fn insert(&mut self, mem: UserMem) -> UserBufId {
        UserBufId(self.map.insert(mem).data().as_ffi())
    }

    pub(super) fn get(&self, id: &UserBufId) -> Option<&UserMem> {
        self.map.get(key(id))
    }

    pub(super) fn get_mut(&mut self, id: &UserBufId) -> Option<&mut UserMem> {
        self.map.get_mut(key(id))
    }

    #[inline(always)]
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
    #[inline(always)]
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

    #[inline(always)]
    pub(super) fn remove(&mut self, id: &RequestId) -> Option<T> {
        match self.slots.get_mut(id.index()?) {
            Some(entry @ Some(_)) if entry.as_ref().is_some_and(|(have, _)| have == id) => {
                entry.take().map(|(_, v)| v)
            }
            _ => None,
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
