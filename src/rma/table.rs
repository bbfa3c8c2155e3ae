//! The worker's regions mapped for remote access: their keys (`rdmx_proto::rma::Regions`)
//! and their memory, under a lock of their own (off the messaging path's state lock), and
//! the engine's way to them ([`SharedRegions`] performs peers' operations over messages).

use parking_lot::{Mutex, MutexGuard};
use rand::rngs::StdRng;
use rand::Rng;
use rdmx_proto::rma::{AtomicOp, KeyRef, Refusal, Regions, RemoteAccess, RmaOp};
use rustc_hash::FxHashMap as HashMap;

use super::RmaMemory;
use crate::{Error, Result};

/// The regions of one worker.
pub(crate) struct RegionTable {
    keys: Regions,
    /// The memory of each mapped region, by slot.
    memory: HashMap<u32, RmaMemory>,
    /// The regions registered with the worker's NIC, by slot: peers reach them with RDMA
    /// WRITE, READ and atomics, the NIC checking the access. Deregistered at unmap.
    #[cfg(feature = "rdma")]
    nic: HashMap<u32, rdmx_conn::WordRegion>,
    /// Where keys' secrets come from: a CSPRNG seeded by the OS, so one key tells nothing
    /// about another.
    secrets: StdRng,
}

impl RegionTable {
    pub(crate) fn new() -> Self {
        RegionTable {
            keys: Regions::default(),
            memory: HashMap::default(),
            #[cfg(feature = "rdma")]
            nic: HashMap::default(),
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
        // Deregistered first: from here on the NIC refuses the key's accesses.
        #[cfg(feature = "rdma")]
        self.nic.remove(&key.region);
        self.memory.remove(&key.region);
        true
    }

    /// Where the NIC on `pd` finds the region `key` names, mapped with `access`, registering
    /// it for that access on first use; `None` when it has no remote access or no bytes (peers then
    /// reach it by messages). A registration that fails is logged and leaves the region to
    /// messages.
    #[cfg(feature = "rdma")]
    pub(crate) fn nic_part(
        &mut self,
        key: &KeyRef,
        access: RemoteAccess,
        pd: &rdmx_conn::ProtectionDomain,
    ) -> Option<rdmx_proto::rma::RdmaPart> {
        let part = |r: &rdmx_conn::WordRegion| rdmx_proto::rma::RdmaPart {
            addr: r.addr(),
            rkey: r.rkey(),
        };
        if let Some(r) = self.nic.get(&key.region) {
            return Some(part(r));
        }
        let mem = self.memory.get(&key.region)?;
        if mem.len() == 0 || access == RemoteAccess::NONE {
            return None;
        }
        let nic_access = rdmx_conn::WordAccess {
            read: access.read,
            write: access.write,
            atomic: access.atomic,
        };
        match pd.register_words(mem.words(), mem.len(), nic_access) {
            Ok(r) => {
                let p = part(&r);
                self.nic.insert(key.region, r);
                Some(p)
            }
            Err(e) => {
                log::warn!(
                    "region {} stays reachable by messages only: {e}",
                    key.region
                );
                None
            }
        }
    }

    /// The memory of the region `key` names, if `op` on `len` bytes at `offset` of it may
    /// go ahead (a clone: it stays alive while the operation uses it, even if the region is
    /// unmapped meanwhile).
    pub(crate) fn access(
        &self,
        key: &KeyRef,
        op: RmaOp,
        offset: u64,
        len: u64,
    ) -> std::result::Result<RmaMemory, Refusal> {
        let id = self.keys.check(key, op, offset, len)?;
        // (A mapped slot always has its memory.)
        self.memory.get(&id.0).cloned().ok_or(Refusal::BadKey)
    }

    /// How many regions are mapped.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}

/// The worker's [`RegionTable`], shared by its memory handles and its engine, which
/// performs peers' puts, gets and atomic operations over messages through it (under the
/// worker's state lock: this lock is taken inside that one, never the other way round).
pub(crate) struct SharedRegions(Mutex<RegionTable>);

impl SharedRegions {
    pub(crate) fn new() -> Self {
        SharedRegions(Mutex::new(RegionTable::new()))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, RegionTable> {
        self.0.lock()
    }

    /// The memory `op` on `len` bytes at `offset` of `key`'s region reaches, and the
    /// offset in it, once the checks passed (the table's lock is let go before the bytes
    /// are touched: the clone keeps the memory alive).
    fn reach(
        &self,
        key: &KeyRef,
        op: RmaOp,
        offset: u64,
        len: usize,
    ) -> std::result::Result<(RmaMemory, usize), Refusal> {
        let mem = self.lock().access(key, op, offset, len as u64)?;
        // (Within the region, whose length is a `usize`: the check said so.)
        Ok((mem, offset as usize))
    }
}

/// The refusal of an access the checks let through but the memory does not hold (never
/// expected: refused rather than performed, should it happen).
fn outside(offset: u64, len: usize, mem: &RmaMemory) -> Refusal {
    Refusal::OutOfBounds {
        offset,
        len: len as u64,
        region_len: mem.len() as u64,
    }
}

impl rdmx_proto::rma::RmaMemory for SharedRegions {
    fn put(&self, key: &KeyRef, offset: u64, data: &[u8]) -> std::result::Result<(), Refusal> {
        let (mem, at) = self.reach(key, RmaOp::Put, offset, data.len())?;
        mem.write(at, data)
            .map_err(|_| outside(offset, data.len(), &mem))
    }

    fn get(
        &self,
        key: &KeyRef,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), Refusal> {
        // (Checked before `out` is sized: a refused get allocates nothing.)
        let (mem, at) = self.reach(key, RmaOp::Get, offset, len)?;
        out.clear();
        out.resize(len, 0);
        mem.read(at, out).map_err(|_| {
            out.clear();
            outside(offset, len, &mem)
        })
    }

    fn atomic(&self, key: &KeyRef, offset: u64, op: AtomicOp) -> std::result::Result<u64, Refusal> {
        let (mem, at) = self.reach(key, RmaOp::Atomic, offset, 8)?;
        match op {
            AtomicOp::FetchAdd(v) => mem.fetch_add(at, v),
            AtomicOp::CompareSwap { expected, new } => mem.compare_swap(at, expected, new),
        }
        .map_err(|_| outside(offset, 8, &mem))
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
            Some(Refusal::BadKey)
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
