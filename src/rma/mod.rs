//! One-sided operations' memory: regions mapped for remote access ([`MemHandle`], UCP's
//! `ucp_mem_h`) and the keys peers reach them by ([`RemoteKey`], UCP's `ucp_rkey_h`).
//!
//! [`Worker::mem_map`] maps a region with exactly the remote access asked for — read,
//! write, atomic, none by default ([`RemoteAccess`]); [`MemHandle::pack_rkey`] gives the
//! bytes an application sends its peers however it likes (a tag message, say); a peer's
//! [`Ep::unpack_rkey`] turns them into a [`RemoteKey`] bound to that endpoint.
//!
//! What [`MemHandle`] documents: why its local access is sound, and what unmapping does;
//! the operations on a peer's region, and their semantics, are `operations`'s
//! ([`Ep::put`] and the others).

mod memory;
mod operations;
mod table;

use std::fmt;
use std::sync::{Arc, Weak};

use rdmx_proto::rma::{KeyRef, PackedKey, Refusal};
use rdmx_proto::ConnId;

use crate::transport::Conn;
use crate::{Ep, Error, Result, Worker};

pub use rdmx_proto::rma::RemoteAccess;

pub(crate) use memory::RmaMemory;
pub(crate) use table::SharedRegions;

/// A region of memory mapped for remote access ([`Worker::mem_map`]); unmapped when
/// dropped.
///
/// ## Why local access is sound
///
/// A peer holding a key with write or atomic access may change the region's bytes at any
/// moment, from outside the program (its NIC, or the link executing its operations). A
/// plain `&[u8]` to those bytes would then be a data race, so there is none: the region is
/// kept as atomic 8-byte words, and [`MemHandle`] only copies out of and into them
/// ([`MemHandle::read`], [`MemHandle::write`]) or applies one atomic operation to a word
/// ([`MemHandle::fetch_add`], [`MemHandle::compare_swap`], [`MemHandle::load`],
/// [`MemHandle::store`]). [`MemHandle::unmap`] revokes remote access first and then hands
/// the bytes back as a `Vec<u8>`, which nobody else can reach any more. Over RDMA the NIC
/// writes the words by DMA: another writer the atomic words allow for. (Its atomic
/// operations are atomic among themselves, as the verbs promise, not with respect to this
/// handle's: use one side's atomics on a word, not both at once.)
///
/// ## Unmapping
///
/// Unmapping (or dropping the handle) revokes the key at once: every later access with it
/// is refused, as a forged key is (`RefusalKind::BadKey`: a peer is not told which of the
/// worker's regions were unmapped). Over RDMA the region is deregistered from the NIC
/// first, which refuses the key from then on. The memory itself is shared by the worker's table of regions, by
/// each operation executing on it and by the NIC's registration (until it is
/// deregistered), and is freed only after the last of them lets go, so an
/// operation in flight never touches freed memory; `mem::forget` of a handle leaves the
/// region mapped (and leaked) rather than freed under a peer.
pub struct MemHandle {
    worker: Worker,
    key: KeyRef,
    access: RemoteAccess,
    mem: RmaMemory,
}

impl fmt::Debug for MemHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemHandle")
            .field("len", &self.mem.len())
            .field("access", &self.access)
            .field("region", &self.key.region)
            .finish()
    }
}

impl Worker {
    /// Maps `len` zeroed bytes for the remote `access` given (and no other).
    pub fn mem_map(&self, len: usize, access: RemoteAccess) -> Result<MemHandle> {
        self.map_memory(RmaMemory::zeroed(len), access)
    }

    /// Maps a copy of `data` for the remote `access` given (and no other).
    pub fn mem_map_from(&self, data: &[u8], access: RemoteAccess) -> Result<MemHandle> {
        self.map_memory(RmaMemory::from_bytes(data), access)
    }

    fn map_memory(&self, mem: RmaMemory, access: RemoteAccess) -> Result<MemHandle> {
        let key = self.driver.regions.lock().map(mem.clone(), access)?;
        log::debug!(
            "mapped region {} ({} bytes, {access})",
            key.region,
            mem.len()
        );
        Ok(MemHandle {
            worker: self.clone(),
            key,
            access,
            mem,
        })
    }
}

impl MemHandle {
    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.mem.len() == 0
    }

    /// The remote access it was mapped with.
    pub fn access(&self) -> RemoteAccess {
        self.access
    }

    /// The key peers reach the region by, packed for sending ([`Ep::unpack_rkey`] unpacks
    /// it). Valid until the region is unmapped; any number of peers may hold it.
    ///
    /// Once the worker uses an RDMA device, the key also names the region for the NIC (it is
    /// registered with it, for exactly the region's access, on first packing): peers on
    /// RDMA endpoints then reach it with RDMA WRITE, READ and atomics, without this
    /// worker's progress. Over TCP and shared memory, and for keys packed before the worker
    /// had a device, this worker's progress performs their operations.
    pub fn pack_rkey(&self) -> Vec<u8> {
        PackedKey {
            key: self.key,
            len: self.mem.len() as u64,
            access: self.access,
            rdma: self.worker.driver.nic_part(&self.key, self.access),
        }
        .encode()
    }

    fn bounds(&self, offset: usize, len: usize) -> Refusal {
        Refusal::OutOfBounds {
            offset: offset as u64,
            len: len as u64,
            region_len: self.mem.len() as u64,
        }
    }

    /// The word at `offset`'s refusal: unaligned or outside.
    fn word_refusal(&self, offset: usize) -> Error {
        if offset % 8 != 0 {
            Error::Rma(Refusal::Unaligned(offset as u64))
        } else {
            Error::Rma(self.bounds(offset, 8))
        }
    }

    /// Copies `out.len()` bytes at `offset` into `out`. Each 8-byte word is read once,
    /// atomically: what a peer writes meanwhile shows per word, old or new.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.mem
            .read(offset, out)
            .map_err(|_| Error::Rma(self.bounds(offset, out.len())))
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.mem.len()];
        // (Within bounds by construction.)
        let _ = self.mem.read(0, &mut v);
        v
    }

    /// Copies `data` into the region at `offset`; the bytes around it are left as they are
    /// (a peer may be writing them).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.mem
            .write(offset, data)
            .map_err(|_| Error::Rma(self.bounds(offset, data.len())))
    }

    /// Reads the 8-byte word at `offset` (a multiple of 8), atomically.
    pub fn load(&self, offset: usize) -> Result<u64> {
        self.mem.load(offset).map_err(|_| self.word_refusal(offset))
    }

    /// Stores `value` into the 8-byte word at `offset` (a multiple of 8), atomically.
    pub fn store(&self, offset: usize, value: u64) -> Result<()> {
        self.mem
            .store(offset, value)
            .map_err(|_| self.word_refusal(offset))
    }

    /// Adds `value` (wrapping) to the 8-byte word at `offset` (a multiple of 8), atomically
    /// with respect to peers' atomic operations on it; its old value.
    pub fn fetch_add(&self, offset: usize, value: u64) -> Result<u64> {
        self.mem
            .fetch_add(offset, value)
            .map_err(|_| self.word_refusal(offset))
    }

    /// Replaces the 8-byte word at `offset` (a multiple of 8) with `new` if it holds
    /// `expected`, atomically; its old value either way (it swapped when that is
    /// `expected`).
    pub fn compare_swap(&self, offset: usize, expected: u64, new: u64) -> Result<u64> {
        self.mem
            .compare_swap(offset, expected, new)
            .map_err(|_| self.word_refusal(offset))
    }

    /// Revokes remote access — every later access with the region's key is refused —
    /// and hands back the region's bytes.
    pub fn unmap(self) -> Vec<u8> {
        self.revoke();
        let bytes = self.to_vec();
        // (Dropping it now finds the key revoked and does nothing more.)
        drop(self);
        bytes
    }

    fn revoke(&self) {
        if self.worker.driver.regions.lock().unmap(&self.key) {
            log::debug!("unmapped region {}", self.key.region);
        }
    }
}

impl Drop for MemHandle {
    fn drop(&mut self) {
        self.revoke();
    }
}

/// A peer's region, as its packed key describes it ([`Ep::unpack_rkey`]), bound to the
/// endpoint it was unpacked on.
#[derive(Clone)]
pub struct RemoteKey {
    packed: PackedKey,
    ep: ConnId,
    /// The endpoint's connection, to tell it from other workers' endpoints of the same id
    /// (weak: the allocation, and so the address, stays while the key does).
    conn: Weak<Conn>,
}

impl fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // (Not the secret: logs are no place for it.)
        f.debug_struct("RemoteKey")
            .field("len", &self.packed.len)
            .field("access", &self.packed.access)
            .field("region", &self.packed.key.region)
            .field("ep", &self.ep)
            .finish()
    }
}

impl RemoteKey {
    /// Bytes in the remote region.
    pub fn len(&self) -> u64 {
        self.packed.len
    }

    /// Whether the remote region is empty.
    pub fn is_empty(&self) -> bool {
        self.packed.len == 0
    }

    /// The remote access the region was mapped with.
    pub fn access(&self) -> RemoteAccess {
        self.packed.access
    }

    /// The endpoint ([`Ep::id`]) the key was unpacked on, the only one it is used on.
    pub fn ep(&self) -> ConnId {
        self.ep
    }
}

impl Ep {
    /// Unpacks a peer's packed key ([`MemHandle::pack_rkey`]) for operations on this
    /// endpoint. Fails with [`Error::RemoteKey`] on bytes that are not a packed key;
    /// whether the key is still valid only the peer can tell (an operation with a stale
    /// key is refused).
    pub fn unpack_rkey(&self, bytes: &[u8]) -> Result<RemoteKey> {
        Ok(RemoteKey {
            packed: PackedKey::decode(bytes)?,
            ep: self.id(),
            conn: Arc::downgrade(self.conn()),
        })
    }
}
