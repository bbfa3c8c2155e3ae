//! The engine's sends, in a slab: a [`RequestId`] is a slot index and the slot's
//! generation (`(generation - 1) << 32 | (index + 1)`: the first requests are 1, 2, 3 …),
//! so finding a request is an array index and a
//! comparison, not a hash lookup, and a freed slot is reused without an allocation. An id
//! from an earlier generation — a stale or forged one in a peer's frame — finds nothing.
//!
//! Written here rather than taken from `slab` or `slotmap`: the ids must stay 1, 2, 3 … for
//! the first requests (peers and the fuzz corpus name requests by them), bit 63 is kept for
//! ids that name no slot ([`IMMEDIATE`], and [`RECEIVE`] for receives, which are kept
//! elsewhere: see [`receive_id`]), and drivers index arrays by an id's slot
//! ([`RequestId::index`]). `insert` and `discard`, once per request, are inlined: as calls
//! (the compiler's choice otherwise) their register saves and moves were a measurable part
//! of a small message's cost under callgrind.

use crate::RequestId;

/// Ids with this bit set name requests that completed as they were made and were never
/// stored (an eager send that went out at once); no slab id has it.
pub(crate) const IMMEDIATE: u64 = 1 << 63;

/// Ids with this bit set (and not [`IMMEDIATE`]) name receives: no slab slot holds a
/// receive. A posted receive is only an entry of the posted queue until a message matches
/// it, so the common small message needs no slot at all; a receive being filled by a
/// rendezvous is kept in a map by its id. See [`receive_id`].
pub(crate) const RECEIVE: u64 = 1 << 62;

/// The id of a receive made when the slab's counter of requests made stood at `made`
/// ([`Requests::stamp`]): the low bits are that stamp, so receives and sends sort together
/// in the order they were made ([`made_of`]).
pub(crate) fn receive_id(made: u64) -> RequestId {
    RequestId(RECEIVE | (made & !(IMMEDIATE | RECEIVE)))
}

/// When the receive `id` was made (see [`receive_id`]).
pub(crate) fn made_of(id: RequestId) -> u64 {
    id.0 & !(IMMEDIATE | RECEIVE)
}

const MAX_GENERATION: u32 = 1 << 31;

struct Slot<T> {
    /// Starts at 1, so no id is ever 0; bumped when the slot is freed.
    generation: u32,
    /// When the request was made (engine-wide order).
    made: u64,
    value: Option<T>,
}

/// Requests by id (see the module docs).
pub(crate) struct Requests<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
    next_made: u64,
}

impl<T> Default for Requests<T> {
    fn default() -> Self {
        Requests {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            next_made: 0,
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Requests<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.slots.iter().enumerate().filter_map(|(i, s)| {
                let v = s.value.as_ref()?;
                Some((encode(i, s.generation), v))
            }))
            .finish()
    }
}

fn encode(index: usize, generation: u32) -> RequestId {
    RequestId(u64::from(generation - 1) << 32 | (index as u64 + 1))
}

/// The slot index an id names, if any (see [`RequestId::index`]).
pub(crate) fn index_of(id: RequestId) -> Option<usize> {
    let low = id.0 & u64::from(u32::MAX);
    (id.0 & (IMMEDIATE | RECEIVE) == 0 && low != 0).then(|| (low - 1) as usize)
}

/// The slot index and generation an id names (`usize::MAX` for an id that names none).
fn split(id: RequestId) -> (usize, u32) {
    let low = id.0 & u64::from(u32::MAX);
    let index = if low == 0 {
        usize::MAX
    } else {
        (low - 1) as usize
    };
    (index, ((id.0 >> 32) as u32).wrapping_add(1))
}

impl<T> Requests<T> {
    /// Stores `value` under a new id.
    #[inline(always)]
    pub(crate) fn insert(&mut self, value: T) -> RequestId {
        let made = self.next_made;
        self.next_made += 1;
        self.len += 1;
        let index = match self.free.pop() {
            Some(i) => {
                let slot = &mut self.slots[i as usize];
                slot.made = made;
                slot.value = Some(value);
                i
            }
            None => {
                assert!(
                    self.slots.len() < u32::MAX as usize,
                    "4 billion requests at once"
                );
                self.slots.push(Slot {
                    generation: 1,
                    made,
                    value: Some(value),
                });
                (self.slots.len() - 1) as u32
            }
        };
        encode(index as usize, self.slots[index as usize].generation)
    }

    /// Takes a stamp of the order requests are made in, for a request kept elsewhere (a
    /// receive: [`receive_id`]).
    #[inline(always)]
    pub(crate) fn stamp(&mut self) -> u64 {
        let made = self.next_made;
        self.next_made += 1;
        made
    }

    pub(crate) fn get(&self, id: RequestId) -> Option<&T> {
        let (index, generation) = split(id);
        self.slots
            .get(index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.value.as_ref())
    }

    pub(crate) fn get_mut(&mut self, id: RequestId) -> Option<&mut T> {
        let (index, generation) = split(id);
        self.slots
            .get_mut(index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.value.as_mut())
    }

    /// Drops the request in place; its id is dead from then on.
    #[inline(always)]
    pub(crate) fn discard(&mut self, id: RequestId) {
        let (index, generation) = split(id);
        let Some(slot) = self
            .slots
            .get_mut(index)
            .filter(|s| s.generation == generation && s.value.is_some())
        else {
            return;
        };
        slot.value = None;
        slot.generation = if slot.generation >= MAX_GENERATION {
            1
        } else {
            slot.generation + 1
        };
        self.free.push(index as u32);
        self.len -= 1;
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The ids of the requests `keep` selects, with when each was made (unsorted).
    pub(crate) fn ids_made(&self, mut keep: impl FnMut(&T) -> bool) -> Vec<(u64, RequestId)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let v = s.value.as_ref()?;
                keep(v).then(|| (s.made, encode(i, s.generation)))
            })
            .collect()
    }

    /// The ids of the requests `keep` selects, in the order they were made.
    #[cfg(test)]
    pub(crate) fn ids_in_order(&self, keep: impl FnMut(&T) -> bool) -> Vec<RequestId> {
        let mut found = self.ids_made(keep);
        found.sort_unstable_by_key(|&(made, _)| made);
        found.into_iter().map(|(_, id)| id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_zero_and_never_reused_for_another_request() {
        let mut r = Requests::default();
        let a = r.insert("a");
        assert_eq!(a, RequestId(1), "the first ids are 1, 2, 3 …");
        let b = r.insert("b");
        r.discard(a);
        assert_eq!(r.get(a), None);
        r.discard(a);
        assert_eq!(r.len(), 1);
        // The slot is reused under another id; the old id still finds nothing.
        let c = r.insert("c");
        assert_ne!(c, a);
        assert_eq!(split(c).0, split(a).0);
        assert_eq!(r.get(a), None);
        assert_eq!(r.get(c), Some(&"c"));
        *r.get_mut(b).unwrap() = "B";
        assert_eq!(r.len(), 2);
        // Made order, whatever the slots' order.
        assert_eq!(r.ids_in_order(|_| true), vec![b, c]);
        assert_eq!(r.ids_in_order(|v| *v == "c"), vec![c]);
    }

    #[test]
    fn receive_ids_name_no_slot_and_sort_with_sends_in_made_order() {
        let mut r = Requests::default();
        let a = r.insert("send a");
        let recv = receive_id(r.stamp());
        let b = r.insert("send b");
        assert_eq!(recv.index(), None, "no slot holds a receive");
        assert!(!recv.is_immediate());
        assert_eq!(r.get(recv), None);
        r.discard(recv);
        assert_eq!(r.len(), 2, "a receive's id frees no send");
        let mut made = r.ids_made(|_| true);
        made.push((made_of(recv), recv));
        made.sort_unstable_by_key(|&(m, _)| m);
        let order: Vec<RequestId> = made.into_iter().map(|(_, id)| id).collect();
        assert_eq!(order, vec![a, recv, b]);
        assert_ne!(
            receive_id(r.stamp()),
            recv,
            "a receive's id is never reused"
        );
    }

    #[test]
    fn indices_are_dense_and_immediate_ids_have_none() {
        let mut r = Requests::default();
        let a = r.insert(());
        let b = r.insert(());
        assert_eq!((a.index(), b.index()), (Some(0), Some(1)));
        r.discard(a);
        let c = r.insert(());
        assert_eq!(c.index(), Some(0), "the freed slot is reused");
        assert_ne!(c, a);
        assert_eq!(RequestId(IMMEDIATE | 7).index(), None);
        assert_eq!(RequestId(0).index(), None);
    }

    #[test]
    fn forged_ids_find_nothing() {
        let mut r = Requests::default();
        let a = r.insert(1);
        for forged in [
            0,
            2,
            a.0 + 1,
            a.0 ^ (1 << 32),
            u64::MAX,
            1 << 32,
            u64::from(u32::MAX),
        ] {
            assert_eq!(r.get(RequestId(forged)), None, "{forged:#x}");
            assert_eq!(r.get_mut(RequestId(forged)), None);
            r.discard(RequestId(forged));
        }
        assert_eq!(r.get(a), Some(&1));
        assert_eq!(r.len(), 1);
    }
}
