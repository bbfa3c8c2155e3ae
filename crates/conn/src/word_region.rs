//! Memory registered for peers' one-sided access — RDMA WRITE, READ and atomics — kept as
//! atomic 8-byte words ([`WordRegion`]).
//!
//! A peer with remote write or atomic access may change the bytes at any moment, by DMA from
//! its side of the fabric. The memory is therefore never a `[u8]` anyone may hold a
//! reference to: it is a shared slice of `AtomicU64`s, which the language allows to change
//! concurrently, read and written locally only through atomic operations. The region holds
//! a clone of the words (`Arc`) until its MR is deregistered, so the memory stays
//! allocated, at the same address, as long as the NIC can reach it — whatever the caller
//! drops or `mem::forget`s. Dropping the region deregisters it: from then on the peer's
//! rkey is invalid (an access with it fails at the peer, and breaks its queue pair).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use rdmx_sys as sys;

use crate::memory::{count_deregistration, register_raw, ProtectionDomain};
use crate::{Error, Result};

/// What peers may do to a [`WordRegion`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WordAccess {
    /// RDMA READ.
    pub read: bool,
    /// RDMA WRITE.
    pub write: bool,
    /// Atomic fetch-and-add and compare-and-swap.
    pub atomic: bool,
}

impl WordAccess {
    fn verbs_flags(self) -> u32 {
        // (The verbs require local write with remote write or atomics.)
        let mut flags = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        if self.read {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        if self.write {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if self.atomic {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        }
        flags
    }
}

/// Atomic words registered for peers' one-sided access ([`ProtectionDomain::register_words`]);
/// deregistered when dropped.
pub struct WordRegion {
    mr: *mut sys::ibv_mr,
    len: usize,
    access: WordAccess,
    /// The memory, kept allocated until the MR is deregistered.
    words: Option<Arc<[AtomicU64]>>,
    _pd: ProtectionDomain,
}

// SAFETY: the MR is a kernel object handle, used only to read its keys and to deregister it
// (once, in drop); the words are `Send + Sync` themselves.
unsafe impl Send for WordRegion {}
// SAFETY: as above: `&WordRegion` only reads the MR's keys.
unsafe impl Sync for WordRegion {}

impl std::fmt::Debug for WordRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WordRegion")
            .field("addr", &self.addr())
            .field("len", &self.len)
            .field("access", &self.access)
            .finish()
    }
}

impl ProtectionDomain {
    /// Registers the first `len` bytes of `words` (at most all of them, at least one) for
    /// peers' `access`. The region holds `words` until it is dropped.
    pub fn register_words(
        &self,
        words: Arc<[AtomicU64]>,
        len: usize,
        access: WordAccess,
    ) -> Result<WordRegion> {
        if len > words.len() * 8 {
            return Err(Error::invalid(
                "ibv_reg_mr",
                format!("{len} bytes of {} words", words.len()),
            ));
        }
        // SAFETY: the words are `len` or more initialised bytes, allocated at a fixed address
        // for as long as the region holds its clone of them — until after the MR is
        // deregistered (drop) — and only ever accessed atomically: the NIC's writes are
        // concurrent modifications of atomic words.
        let (mr, _) = unsafe {
            register_raw(
                self,
                words.as_ptr() as *mut u8,
                len,
                access.verbs_flags(),
                "memory for remote access",
            )?
        };
        Ok(WordRegion {
            mr,
            len,
            access,
            words: Some(words),
            _pd: self.clone(),
        })
    }
}

impl WordRegion {
    /// The address peers name in their work requests.
    pub fn addr(&self) -> u64 {
        // SAFETY: mr is valid until drop.
        unsafe { (*self.mr).addr as u64 }
    }

    /// The key peers name it by.
    pub fn rkey(&self) -> u32 {
        // SAFETY: mr is valid until drop.
        unsafe { (*self.mr).rkey }
    }

    /// Registered bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: a region has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What peers may do to it.
    pub fn access(&self) -> WordAccess {
        self.access
    }
}

impl Drop for WordRegion {
    fn drop(&mut self) {
        // SAFETY: mr is registered, and deregistered once, here.
        let ret = unsafe { sys::ibv_dereg_mr(self.mr) };
        if ret != 0 {
            // The NIC may still reach the words: leak them rather than free them under it.
            log::error!(
                "ibv_dereg_mr of {} bytes for remote access failed ({}); leaking them",
                self.len,
                std::io::Error::from_raw_os_error(ret)
            );
            std::mem::forget(self.words.take());
            return;
        }
        count_deregistration(self.len);
    }
}
