//! The worker's regions mapped for remote access: their keys (`rdmx_proto::rma::Regions`)
//! and their memory, under a lock of their own (off the messaging path's state lock).

use rand::rngs::StdRng;
use rand::Rng;
use rdmx_proto::rma::{KeyRef, Refusal, Regions, RemoteAccess, RmaOp};
use rustc_hash::FxHashMap as HashMap;

use super::RmaMemory;
use crate::{Error, Result};

/// The regions of one worker.
pub(crate) struct RegionTable {
    keys: Regions,
    /// The memory of each mapped region, by slot.
    memory: HashMap<u32, RmaMemory>,
    /// Where keys' secrets come from: a CSPRNG seeded by the OS, so one key tells nothing
    /// about another.
    secrets: StdRng,
}

impl RegionTable {
    pub(crate) fn new() -> Self {
        RegionTable {
            keys: Regions::default(),
            memory: HashMap::default(),
            secrets: rand::make_rng(),
        }
    }

    /// Maps `mem` with `access`; its key.
    pub(crate) fn map(&mut self, mem: RmaMemory, access: RemoteAccess) -> Result<KeyRef> {
        let secret = self.secrets.next_u64();
        let key = self
            .keys
            .map(mem.len() as u64, access, secret)
            .ok_or_else(|| Error::Invalid("every region slot of the worker is taken".into()))?;
        self.memory.insert(key.region, mem);
        Ok(key)
    }

    /// Unmaps the region `key` names, if it is mapped (whether it was).
    pub(crate) fn unmap(&mut self, key: &KeyRef) -> bool {
        if self.keys.unmap(key).is_err() {
            return false;
        }
        self.memory.remove(&key.region);
        true
    }

    /// The memory of the region `key` names, if `op` on `len` bytes at `offset` of it may
    /// go ahead (a clone: it stays alive while the operation uses it, even if the region is
    /// unmapped meanwhile).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn access(
        &self,
        key: &KeyRef,
        op: RmaOp,
        offset: u64,
        len: u64,
    ) -> std::result::Result<RmaMemory, Refusal> {
        let id = self.keys.check(key, op, offset, len)?;
        // (A mapped slot always has its memory.)
        self.memory.get(&id.0).cloned().ok_or(Refusal::StaleKey)
    }

    /// How many regions are mapped.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An access that passed keeps its memory, even once the region is unmapped meanwhile;
    /// later accesses with the key are refused.
    #[test]
    fn unmapping_revokes_the_key_but_not_memory_in_use() {
        let mut t = RegionTable::new();
        let key = t.map(RmaMemory::zeroed(64), RemoteAccess::ALL).unwrap();
        let other = t.map(RmaMemory::zeroed(8), RemoteAccess::READ).unwrap();
        assert_ne!(key.secret, other.secret);
        let in_use = t.access(&key, RmaOp::Put, 0, 64).unwrap();
        assert!(t.unmap(&key));
        assert!(!t.unmap(&key));
        assert_eq!(t.len(), 1);
        assert_eq!(
            t.access(&key, RmaOp::Put, 0, 8).err(),
            Some(Refusal::StaleKey)
        );
        in_use.write(56, &[7; 8]).unwrap();
        assert_eq!(in_use.load(56), Ok(u64::from_ne_bytes([7; 8])));
        assert_eq!(
            t.access(&other, RmaOp::Put, 0, 8).err(),
            Some(Refusal::NotPermitted {
                op: RmaOp::Put,
                granted: RemoteAccess::READ
            })
        );
    }
}
