//! One-sided operations on the simulated fabric: a driver's memory for peers' operations
//! ([`Mem`], keys in `Regions`) and helpers that start operations and read their outcome.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::*;
use rdmx_proto::rma::{
    AtomicOp, KeyRef, PackedKey, Refusal, Regions, RemoteAccess, RmaMemory, RmaOp,
};

/// A driver's regions: keys in `Regions`, bytes in vectors.
#[derive(Default)]
pub struct Mem {
    inner: Mutex<(Regions, HashMap<u32, Vec<u8>>, u64)>,
}

impl Mem {
    pub fn map(&self, len: usize, access: RemoteAccess) -> PackedKey {
        let mut g = self.inner.lock().unwrap();
        g.2 = g.2.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let secret = g.2;
        let key = g.0.map(len as u64, access, secret).unwrap();
        g.1.insert(key.region, vec![0; len]);
        PackedKey {
            key,
            len: len as u64,
            access,
            rdma: None,
        }
    }

    pub fn unmap(&self, key: &PackedKey) {
        let mut g = self.inner.lock().unwrap();
        g.0.unmap(&key.key).unwrap();
        g.1.remove(&key.key.region);
    }

    pub fn bytes(&self, key: &PackedKey) -> Vec<u8> {
        self.inner.lock().unwrap().1[&key.key.region].clone()
    }

    pub fn set(&self, key: &PackedKey, data: &[u8]) {
        self.inner
            .lock()
            .unwrap()
            .1
            .get_mut(&key.key.region)
            .unwrap()
            .copy_from_slice(data);
    }

    pub fn word(&self, key: &PackedKey, at: usize) -> u64 {
        u64::from_le_bytes(self.bytes(key)[at..at + 8].try_into().unwrap())
    }
}

impl RmaMemory for Mem {
    fn put(&self, key: &KeyRef, offset: u64, data: &[u8]) -> Result<(), Refusal> {
        let mut g = self.inner.lock().unwrap();
        let id = g.0.check(key, RmaOp::Put, offset, data.len() as u64)?;
        let at = offset as usize;
        g.1.get_mut(&id.0).unwrap()[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn get(&self, key: &KeyRef, offset: u64, len: usize, out: &mut Vec<u8>) -> Result<(), Refusal> {
        let g = self.inner.lock().unwrap();
        let id = g.0.check(key, RmaOp::Get, offset, len as u64)?;
        let at = offset as usize;
        out.clear();
        out.extend_from_slice(&g.1[&id.0][at..at + len]);
        Ok(())
    }

    fn atomic(&self, key: &KeyRef, offset: u64, op: AtomicOp) -> Result<u64, Refusal> {
        let mut g = self.inner.lock().unwrap();
        let id = g.0.check(key, RmaOp::Atomic, offset, 8)?;
        let at = offset as usize;
        let w = &mut g.1.get_mut(&id.0).unwrap()[at..at + 8];
        let old = u64::from_le_bytes(w.try_into().unwrap());
        let new = match op {
            AtomicOp::FetchAdd(v) => old.wrapping_add(v),
            AtomicOp::CompareSwap { expected, new } => {
                if old == expected {
                    new
                } else {
                    old
                }
            }
        };
        w.copy_from_slice(&new.to_le_bytes());
        Ok(old)
    }
}

/// `sim`'s peers each with memory for peers' operations.
pub fn with_memory(sim: &mut Sim) -> Vec<Arc<Mem>> {
    sim.peers
        .iter_mut()
        .map(|p| {
            let m = Arc::new(Mem::default());
            p.engine.set_rma_memory(m.clone());
            m
        })
        .collect()
}

pub fn put(
    sim: &mut Sim,
    i: usize,
    j: usize,
    key: &PackedKey,
    off: u64,
    data: Vec<u8>,
) -> RequestId {
    let len = data.len() as u64;
    let buf = sim.alloc(i, data);
    let r = sim.peers[i]
        .engine
        .rma_put(conn(j), key, off, buf, len)
        .unwrap();
    sim.pump(i);
    r
}

pub fn get(
    sim: &mut Sim,
    i: usize,
    j: usize,
    key: &PackedKey,
    off: u64,
    len: usize,
) -> (RequestId, UserBufId) {
    let buf = sim.alloc(i, vec![0xEE; len]);
    let r = sim.peers[i]
        .engine
        .rma_get(conn(j), key, off, buf, len as u64)
        .unwrap();
    sim.pump(i);
    (r, buf)
}

pub fn atomic(
    sim: &mut Sim,
    i: usize,
    j: usize,
    key: &PackedKey,
    off: u64,
    op: AtomicOp,
) -> RequestId {
    let buf = sim.alloc(i, Vec::new());
    let r = sim.peers[i]
        .engine
        .rma_atomic(conn(j), key, off, op, buf)
        .unwrap();
    sim.pump(i);
    r
}

pub fn flush(sim: &mut Sim, i: usize, j: usize) -> RequestId {
    let buf = sim.alloc(i, Vec::new());
    let r = sim.peers[i].engine.rma_flush(conn(j), buf).unwrap();
    sim.pump(i);
    r
}

pub fn flush_all(sim: &mut Sim, i: usize) -> RequestId {
    let buf = sim.alloc(i, Vec::new());
    let r = sim.peers[i].engine.rma_flush_all(buf);
    sim.pump(i);
    r
}

/// A key of a 64-byte region, with every access, that no peer mapped.
pub fn unmapped_key() -> PackedKey {
    PackedKey {
        key: KeyRef {
            region: 0,
            generation: 0,
            secret: 1,
        },
        len: 64,
        access: RemoteAccess::ALL,
        rdma: None,
    }
}

pub fn status(sim: &Sim, i: usize, r: RequestId) -> Status {
    sim.completion(i, r).expect("completed").status
}
