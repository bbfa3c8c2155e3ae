//! The engine's connections by id: a slab of connection states, an index from id to slot,
//! and the slot of the connection looked up last.
//!
//! Every frame and every send looks its connection up, and they come in runs on one
//! connection (a burst from one peer, a reply to the frame just read): the last lookup is
//! remembered, so a run costs one hash lookup, not one per frame. As a hash lookup on every
//! call, the table cost 32 user-space instructions per frame on the shared-memory receiver
//! (callgrind) and twice that per echo (the frame in, the reply out); with the remembered
//! slot, a lookup that hits it is a compare and an index. A removed connection is forgotten
//! there too, so the remembered slot never names another connection's.

use rustc_hash::FxHashMap as HashMap;

use super::Conn;
use crate::ConnId;

/// The connections of an engine (see the module docs).
#[derive(Debug, Default)]
pub(super) struct ConnTable {
    slots: Vec<Option<(ConnId, Conn)>>,
    index: HashMap<ConnId, u32>,
    free: Vec<u32>,
    /// The id and slot of the connection looked up last, while it is in the table.
    last: Option<(ConnId, u32)>,
}

impl ConnTable {
    /// The slot of `id`, from the last lookup if it was of `id`.
    #[inline(always)]
    fn slot_of(&self, id: ConnId) -> Option<u32> {
        match self.last {
            Some((last, slot)) if last == id => Some(slot),
            _ => self.index.get(&id).copied(),
        }
    }

    /// How many connections are in the table.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether `id` is in the table.
    pub(super) fn contains_key(&self, id: &ConnId) -> bool {
        self.slot_of(*id).is_some()
    }

    /// The connection `id`.
    #[inline(always)]
    pub(super) fn get(&self, id: &ConnId) -> Option<&Conn> {
        let slot = self.slot_of(*id)?;
        self.slots.get(slot as usize)?.as_ref().map(|(_, c)| c)
    }

    /// The connection `id`, to change; remembered for the next lookup. (The index and the
    /// remembered slot always name the slot holding the id: `insert` and `remove` keep them
    /// so.)
    #[inline(always)]
    pub(super) fn get_mut(&mut self, id: &ConnId) -> Option<&mut Conn> {
        let slot = match self.last {
            Some((last, slot)) if last == *id => slot,
            _ => {
                let slot = *self.index.get(id)?;
                self.last = Some((*id, slot));
                slot
            }
        };
        self.slots.get_mut(slot as usize)?.as_mut().map(|(_, c)| c)
    }

    /// Adds connection `id` (the caller checked it is not in the table).
    pub(super) fn insert(&mut self, id: ConnId, c: Conn) {
        if let Some(old) = self.remove(&id) {
            // (Replaced, as a map would: not done by the engine, which refuses a duplicate.)
            drop(old);
        }
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some((id, c));
                s
            }
            None => {
                self.slots.push(Some((id, c)));
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(id, slot);
    }

    /// Removes connection `id`, returning its state.
    pub(super) fn remove(&mut self, id: &ConnId) -> Option<Conn> {
        let slot = self.index.remove(id)?;
        if self.last.is_some_and(|(last, _)| last == *id) {
            self.last = None;
        }
        let (_, c) = self.slots.get_mut(slot as usize)?.take()?;
        self.free.push(slot);
        Some(c)
    }
}
