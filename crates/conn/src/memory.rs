//! Protection domains and registered memory.
//!
//! Registered memory is handed out as [`RegisteredBuf`]s: each one owns a disjoint byte range of
//! a region, the way a `Vec<u8>` owns its bytes. Posting work moves the buffer into the
//! completion queue's table of pending work; the completion hands it back. So while the NIC may
//! write a buffer (a receive, or the target of an RDMA READ) nobody else can reach it, and while
//! the user holds it the NIC is not using it. A region's memory is freed only after the region is
//! deregistered, which happens only when no buffer of it is left anywhere — in user hands or in
//! flight — so the NIC can never touch freed memory, even if a buffer is `mem::forget`-ed (that
//! leaks the region instead).
//!
//! Memory is either allocated and registered here ([`ProtectionDomain::register`] and friends:
//! zeroed and page-aligned), or a caller's `Vec<u8>` registered in place, without copying
//! ([`ProtectionDomain::register_vec`]). The region then owns the vector exactly as it owns
//! allocated memory, and [`RegisteredBuf::into_vec`] deregisters it and gives the vector back.
//!
//! The safe API never grants `REMOTE_WRITE` to byte buffers: a peer writing into memory the
//! user can hold a `&[u8]` to would be a data race. (Memory peers may write and apply
//! atomics to is registered as atomic words instead: [`crate::WordRegion`].) `REMOTE_READ` is granted only when asked for, either to
//! every QP of the protection domain ([`Access::REMOTE_READ`], the region's own rkey) or,
//! narrower, to one QP and one byte range at a time through a memory window
//! ([`Access::WINDOW_READ`] and [`crate::MemoryWindow`]).

use std::alloc::{self, Layout};
use std::mem;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rdmx_sys as sys;

use crate::device::Device;
use crate::{Error, Result};

pub(crate) struct PdInner {
    pub(crate) pd: *mut sys::ibv_pd,
    pub(crate) device: Device,
}

// SAFETY: a PD is a kernel object handle; verbs calls that take it are thread-safe.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every MR, SRQ and QP of this PD holds an Arc<PdInner>, so all are gone by now.
        let ret = unsafe { sys::ibv_dealloc_pd(self.pd) };
        if ret != 0 {
            log::error!(
                "ibv_dealloc_pd on {} failed: {}",
                self.device.name(),
                std::io::Error::from_raw_os_error(ret)
            );
        }
    }
}

/// A protection domain on one device. Cheap to clone; the PD is deallocated when the last clone
/// and the last object made from it (memory region, SRQ, connection) are gone.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

/// Access rights of a memory region. Local read is always allowed; remote write is never
/// offered by the safe API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Access {
    /// The NIC may write the region: needed for receive buffers and RDMA READ targets.
    pub local_write: bool,
    /// Peers holding the region's rkey may RDMA READ it (any QP of the protection domain).
    pub remote_read: bool,
    /// Memory windows may be bound to the region ([`crate::MemoryWindow`]): each grants RDMA
    /// READ of one byte range to one QP while it is bound. The region's own rkey grants
    /// nothing remotely.
    pub window_read: bool,
}

impl Access {
    /// Send sources only: the NIC reads, nobody writes, no peer access.
    pub const SEND: Access = Access {
        local_write: false,
        remote_read: false,
        window_read: false,
    };
    /// Receive buffers and RDMA READ targets: the NIC writes locally.
    pub const LOCAL_WRITE: Access = Access {
        local_write: true,
        remote_read: false,
        window_read: false,
    };
    /// Rendezvous sources: peers may RDMA READ with the rkey.
    pub const REMOTE_READ: Access = Access {
        local_write: false,
        remote_read: true,
        window_read: false,
    };
    /// Rendezvous sources read through memory windows: no access by the region's rkey, READ
    /// of a bound range by the one QP a window is bound to.
    pub const WINDOW_READ: Access = Access {
        local_write: false,
        remote_read: false,
        window_read: true,
    };

    fn verbs_flags(self) -> u32 {
        let mut flags = 0;
        if self.local_write {
            flags |= sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        }
        if self.remote_read {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        if self.window_read {
            flags |= sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0;
        }
        flags
    }
}

impl ProtectionDomain {
    /// Allocates a protection domain on `device`.
    pub fn new(device: &Device) -> Result<Self> {
        // SAFETY: the device's context is open while `device` lives, and the PD keeps a clone.
        let pd = unsafe { sys::ibv_alloc_pd(device.context()) };
        if pd.is_null() {
            return Err(Error::last_os(
                "ibv_alloc_pd",
                format!("cannot allocate a protection domain on {}", device.name()),
            ));
        }
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                pd,
                device: device.clone(),
            }),
        })
    }

    /// The device this PD belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Registers a new zeroed region of `len` bytes and returns it as one buffer.
    pub fn register(&self, len: usize, access: Access) -> Result<RegisteredBuf> {
        let region = Region::new(self, len, access)?;
        Ok(RegisteredBuf {
            offset: 0,
            len,
            region,
        })
    }

    /// Registers a region of the given contents (copied into registered memory). To register
    /// a vector's memory without copying it, see [`ProtectionDomain::register_vec`].
    pub fn register_from(&self, data: &[u8], access: Access) -> Result<RegisteredBuf> {
        let mut buf = self.register(data.len(), access)?;
        buf.copy_from_slice(data);
        Ok(buf)
    }

    /// Registers `data`'s heap memory in place (no copy): its first `data.len()` bytes become a
    /// region, returned as one buffer covering `[0, data.len())`.
    ///
    /// The region takes ownership of the vector: while it is registered, its bytes are reachable
    /// only through the returned buffer (and the pieces split from it), like any other
    /// registered memory. [`RegisteredBuf::into_vec`] gives the vector back, unchanged except
    /// for what the NIC wrote into it; dropping the last buffer of the region drops the vector.
    /// The spare capacity past `data.len()` is not registered.
    ///
    /// Unlike [`ProtectionDomain::register`]'s memory, the vector is not page-aligned, so the
    /// pages pinned for it may hold unrelated heap data too (the NIC still only accesses the
    /// registered bytes).
    ///
    /// # Errors
    /// An empty vector is refused (`EINVAL`): a region needs at least one byte. When
    /// `ibv_reg_mr` fails (often the locked-memory limit), the error comes back with the vector.
    pub fn register_vec(
        &self,
        data: Vec<u8>,
        access: Access,
    ) -> Result<RegisteredBuf, (Error, Vec<u8>)> {
        let len = data.len();
        let region = Region::from_vec(self, data, access)?;
        Ok(RegisteredBuf {
            offset: 0,
            len,
            region,
        })
    }

    /// Registers the bytes of a shared vector in place (no copy) for the NIC to read: a send
    /// source, or a rendezvous source peers READ. The region holds a clone of `data` until
    /// it is deregistered ([`SharedBuf::into_shared`], or dropping the last holder), so the
    /// memory outlives every use the NIC makes of it, however the caller's clones are
    /// dropped or forgotten.
    ///
    /// Other clones of `data` read the same bytes at any time, which is sound because nobody
    /// writes them: `access` must not include [`Access::local_write`] (the only write access
    /// the safe API offers), and no [`RegisteredBuf`] (which derefs mutably) is made of the
    /// region, only a [`SharedBuf`], which derefs to `&[u8]`.
    ///
    /// # Errors
    /// Local write access, or an empty vector, is refused (`EINVAL`). When `ibv_reg_mr`
    /// fails (often the locked-memory limit), the error comes back with `data`.
    pub fn register_shared(
        &self,
        data: Arc<Vec<u8>>,
        access: Access,
    ) -> Result<SharedBuf, (Error, Arc<Vec<u8>>)> {
        if access.local_write {
            return Err((
                Error::invalid(
                    "ibv_reg_mr",
                    "shared memory is registered for the NIC to read only, not with local write",
                ),
                data,
            ));
        }
        let len = data.len();
        let region = Region::from_shared(self, data, access)?;
        Ok(SharedBuf { len, region })
    }

    /// Registers one region of `count * chunk_len` bytes and splits it into `count` buffers of
    /// `chunk_len` bytes: one registration for a whole pool of send or receive buffers.
    pub fn register_chunks(
        &self,
        chunk_len: usize,
        count: usize,
        access: Access,
    ) -> Result<Vec<RegisteredBuf>> {
        let total = chunk_len.checked_mul(count).ok_or_else(|| {
            Error::invalid(
                "ibv_reg_mr",
                format!("{count} chunks of {chunk_len} bytes overflow"),
            )
        })?;
        if chunk_len == 0 {
            return Err(Error::invalid(
                "ibv_reg_mr",
                "chunks must be at least one byte long",
            ));
        }
        let mut rest = self.register(total, access)?;
        let mut chunks = Vec::with_capacity(count);
        for _ in 1..count {
            let tail = rest.split_off(chunk_len);
            chunks.push(rest);
            rest = tail;
        }
        chunks.push(rest);
        Ok(chunks)
    }
}

/// One registered region: memory allocated here or a caller's vector, registered with
/// `ibv_reg_mr`.
pub(crate) struct Region {
    pub(crate) mr: *mut sys::ibv_mr,
    /// The first registered byte. RegisteredBufs reach the memory only through this pointer.
    base: NonNull<u8>,
    /// How many bytes starting at `base` are registered.
    pub(crate) len: usize,
    backing: Backing,
    pub(crate) access: Access,
    pub(crate) pd: ProtectionDomain,
}

/// Who owns a region's memory, and so how it is given up once the MR is deregistered.
enum Backing {
    /// Zeroed, page-aligned memory allocated by `Region::new` with this layout.
    Allocated(Layout),
    /// A caller's vector, registered in place by `Region::from_vec`; `base` is its heap buffer.
    /// Its bytes are never accessed through the vector while the region is registered.
    Vec(Vec<u8>),
    /// A caller's shared vector, registered in place by `Region::from_shared` for the NIC to
    /// read only; `base` is its heap buffer, which no one writes while the `Arc` exists.
    Shared(Arc<Vec<u8>>),
    /// Given up by `Region::release`: deregistered and freed or handed back, or leaked because
    /// deregistration failed.
    Released,
}

// SAFETY: the region's memory is only reached through RegisteredBufs that own disjoint ranges
// (or by the NIC while a buffer is in flight); the MR handle itself is thread-safe.
unsafe impl Send for Region {}
// SAFETY: shared references to Region only read immutable fields (keys, base address).
unsafe impl Sync for Region {}

impl Region {
    fn new(pd: &ProtectionDomain, len: usize, access: Access) -> Result<Arc<Region>> {
        // Page alignment keeps registrations from sharing pages with unrelated heap data.
        let layout = Layout::from_size_align(len.max(1), 4096).map_err(|_| {
            Error::invalid(
                "ibv_reg_mr",
                format!("a region of {len} bytes is too large"),
            )
        })?;
        // SAFETY: layout has a non-zero size.
        let base = unsafe { alloc::alloc_zeroed(layout) };
        let Some(base) = NonNull::new(base) else {
            return Err(Error::new(
                "ibv_reg_mr",
                libc::ENOMEM,
                format!("cannot allocate {len} bytes to register"),
            ));
        };
        // SAFETY: base points to layout.size() bytes that stay allocated until after the MR is
        // deregistered (Region::drop deregisters first, through Region::release, then frees).
        let mr = unsafe {
            sys::__ibv_reg_mr(
                pd.inner.pd,
                base.as_ptr().cast(),
                layout.size(),
                access.verbs_flags(),
                1,
            )
        };
        if mr.is_null() {
            let err = Error::last_os(
                "ibv_reg_mr",
                format!(
                    "cannot register {len} bytes on {} (locked-memory limit? see `ulimit -l`)",
                    pd.device().name()
                ),
            );
            // SAFETY: base was allocated above with this layout and never registered.
            unsafe { alloc::dealloc(base.as_ptr(), layout) };
            return Err(err);
        }
        count_registration(layout.size());
        Ok(Arc::new(Region {
            mr,
            base,
            len: layout.size(),
            backing: Backing::Allocated(layout),
            access,
            pd: pd.clone(),
        }))
    }

    fn from_vec(
        pd: &ProtectionDomain,
        mut data: Vec<u8>,
        access: Access,
    ) -> Result<Arc<Region>, (Error, Vec<u8>)> {
        let len = data.len();
        // as_mut_ptr creates no reference to the elements, so this pointer stays valid while the
        // vector is moved into the region, for as long as the vector is neither accessed nor
        // reallocated (it is not: the region only ever drops it or hands it back).
        let base = data.as_mut_ptr();
        // SAFETY: base points to len initialised bytes of the vector's heap buffer. The vector
        // moves into the region below, which keeps it (without touching its bytes) until after
        // the MR is deregistered (Region::release deregisters before handing the vector out).
        match unsafe { Region::in_place(pd, base, len, access, "a Vec") } {
            Ok((mr, base)) => Ok(Region::of(pd, mr, base, len, Backing::Vec(data), access)),
            Err(e) => Err((e, data)),
        }
    }

    fn from_shared(
        pd: &ProtectionDomain,
        data: Arc<Vec<u8>>,
        access: Access,
    ) -> Result<Arc<Region>, (Error, Arc<Vec<u8>>)> {
        debug_assert!(!access.local_write, "checked by register_shared");
        let len = data.len();
        let base = data.as_ptr().cast_mut();
        // SAFETY: base points to len initialised bytes of the vector's heap buffer, which the
        // Arc moved into the region below keeps allocated (and, being shared, unmodified)
        // until after the MR is deregistered. The access flags give the NIC no write access,
        // so its bytes stay as every clone of the Arc sees them.
        match unsafe { Region::in_place(pd, base, len, access, "a shared Vec") } {
            Ok((mr, base)) => Ok(Region::of(pd, mr, base, len, Backing::Shared(data), access)),
            Err(e) => Err((e, data)),
        }
    }

    /// Registers `len` bytes at `base`, a caller's memory (`what`, in errors); refuses an
    /// empty range.
    ///
    /// # Safety
    /// `base` must point to `len` initialised bytes that stay allocated, at the same
    /// address, until the returned MR is deregistered.
    unsafe fn in_place(
        pd: &ProtectionDomain,
        base: *mut u8,
        len: usize,
        access: Access,
        what: &str,
    ) -> Result<(*mut sys::ibv_mr, NonNull<u8>)> {
        // SAFETY: passed on from the caller.
        unsafe { register_raw(pd, base, len, access.verbs_flags(), what) }
    }

    /// The region of a registered caller's memory.
    fn of(
        pd: &ProtectionDomain,
        mr: *mut sys::ibv_mr,
        base: NonNull<u8>,
        len: usize,
        backing: Backing,
        access: Access,
    ) -> Arc<Region> {
        Arc::new(Region {
            mr,
            base,
            len,
            backing,
            access,
            pd: pd.clone(),
        })
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: mr is valid until drop.
        unsafe { (*self.mr).lkey }
    }

    fn rkey(&self) -> u32 {
        // SAFETY: mr is valid until drop.
        unsafe { (*self.mr).rkey }
    }

    /// What a peer needs to RDMA READ `len` bytes of this region from `addr`, or `None` when
    /// it was not registered with [`Access::remote_read`] (or `len` does not fit a READ).
    fn remote(&self, addr: u64, len: usize) -> Option<RemoteBuf> {
        if !self.access.remote_read {
            return None;
        }
        Some(RemoteBuf {
            addr,
            len: u32::try_from(len).ok()?,
            rkey: self.rkey(),
        })
    }

    /// Deregisters the MR and gives up the memory: returns its backing, to be freed or handed
    /// back, or `None` when there is nothing to give up (already released, or deregistration
    /// failed and the memory is leaked). Afterwards the region is `Released`.
    ///
    /// `&mut self` means the region is no longer shared: every RegisteredBuf holds an
    /// `Arc<Region>`, so none is left, in user hands or in flight.
    fn release(&mut self) -> Option<Backing> {
        let backing = mem::replace(&mut self.backing, Backing::Released);
        if matches!(backing, Backing::Released) {
            return None;
        }
        // SAFETY: mr is registered (the backing was not released yet), and no RegisteredBuf of
        // this region exists (see above), so no work using it is posted.
        let ret = unsafe { sys::ibv_dereg_mr(self.mr) };
        if ret != 0 {
            // The NIC may still map this memory: leaking it is the only safe choice.
            log::error!(
                "ibv_dereg_mr failed ({}); leaking {} bytes",
                std::io::Error::from_raw_os_error(ret),
                self.len
            );
            mem::forget(backing);
            return None;
        }
        count_deregistration(self.len);
        Some(backing)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        match self.release() {
            Some(Backing::Allocated(layout)) => {
                // SAFETY: base was allocated with layout in Region::new, the MR over it is
                // deregistered, and it is freed once, here (the backing is now Released).
                unsafe { alloc::dealloc(self.base.as_ptr(), layout) };
            }
            // Deregistered: the vector frees its buffer like any other.
            Some(Backing::Vec(data)) => drop(data),
            Some(Backing::Shared(data)) => drop(data),
            Some(Backing::Released) | None => {}
        }
    }
}

/// Registers `len` bytes at `base` with the verbs access `flags` (`what`, in errors);
/// refuses an empty range.
///
/// # Safety
/// `base` must point to `len` initialised bytes that stay allocated, at the same address,
/// until the returned MR is deregistered; and if `flags` let the NIC write them, nothing
/// may read or write them but through atomic operations (or after deregistration).
pub(crate) unsafe fn register_raw(
    pd: &ProtectionDomain,
    base: *mut u8,
    len: usize,
    flags: u32,
    what: &str,
) -> Result<(*mut sys::ibv_mr, NonNull<u8>)> {
    if len == 0 {
        return Err(Error::invalid(
            "ibv_reg_mr",
            format!("cannot register {what} that is empty: a region needs at least one byte"),
        ));
    }
    let Some(base) = NonNull::new(base) else {
        return Err(Error::invalid(
            "ibv_reg_mr",
            format!("{what} of {len} bytes has a null buffer"),
        ));
    };
    // SAFETY: the caller promises base points to len bytes that outlive the MR.
    let mr = unsafe { sys::__ibv_reg_mr(pd.inner.pd, base.as_ptr().cast(), len, flags, 1) };
    if mr.is_null() {
        return Err(Error::last_os(
            "ibv_reg_mr",
            format!(
                "cannot register {what} of {len} bytes on {} (locked-memory limit? see `ulimit -l`)",
                pd.device().name()
            ),
        ));
    }
    count_registration(len);
    Ok((mr, base))
}

/// Memory regions registered by this process through rdmx-conn and not yet deregistered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegistrationCount {
    /// Live memory regions (`ibv_mr`s).
    pub regions: usize,
    /// Bytes they cover.
    pub bytes: usize,
}

static LIVE_REGIONS: AtomicUsize = AtomicUsize::new(0);
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A registration of `bytes` was deregistered.
pub(crate) fn count_deregistration(bytes: usize) {
    LIVE_REGIONS.fetch_sub(1, Ordering::Relaxed);
    LIVE_BYTES.fetch_sub(bytes, Ordering::Relaxed);
}

/// How many memory regions this process has registered and not deregistered: the figure leak
/// tests compare before and after (a region whose deregistration failed stays counted, as its
/// memory stays leaked).
pub fn live_registrations() -> RegistrationCount {
    RegistrationCount {
        regions: LIVE_REGIONS.load(Ordering::Relaxed),
        bytes: LIVE_BYTES.load(Ordering::Relaxed),
    }
}

fn count_registration(bytes: usize) {
    LIVE_REGIONS.fetch_add(1, Ordering::Relaxed);
    LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

/// Exclusive ownership of a byte range of registered memory. Derefs to `[u8]`.
///
/// Buffers are moved into posted work and handed back by its [`crate::Completion`].
pub struct RegisteredBuf {
    pub(crate) region: Arc<Region>,
    offset: usize,
    len: usize,
}

/// What a peer needs to RDMA READ a buffer: its address, length and rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The region's rkey.
    pub rkey: u32,
}

/// A shared vector registered in place for the NIC to read
/// ([`ProtectionDomain::register_shared`]). Derefs to `[u8]`, never mutably: other clones of
/// the vector may read it at any time.
pub struct SharedBuf {
    region: Arc<Region>,
    len: usize,
}

impl SharedBuf {
    /// The local key for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        self.region.lkey()
    }

    /// The address of the first byte.
    pub fn addr(&self) -> u64 {
        self.region.base.as_ptr() as u64
    }

    /// The access rights of the region.
    pub fn access(&self) -> Access {
        self.region.access
    }

    /// The address, length and rkey a peer uses to RDMA READ the buffer, or `None` when it
    /// was not registered with [`Access::remote_read`].
    pub fn remote(&self) -> Option<RemoteBuf> {
        self.region.remote(self.addr(), self.len)
    }

    /// Deregisters the region and gives back the shared vector (the same `Arc`). While
    /// something else still holds the region (a [`crate::MemoryWindow`] over it), the buffer
    /// comes back unchanged as `Err`. If `ibv_dereg_mr` fails, the NIC may still read the
    /// memory, so the region's clone is leaked (the bytes stay allocated for good) and a
    /// clone of it comes back.
    pub fn into_shared(self) -> Result<Arc<Vec<u8>>, SharedBuf> {
        let SharedBuf { region, len } = self;
        let mut region = match Arc::try_unwrap(region) {
            Ok(region) => region,
            Err(region) => return Err(SharedBuf { region, len }),
        };
        let data = match &region.backing {
            Backing::Shared(data) => data.clone(),
            _ => unreachable!("a SharedBuf is only made over a shared backing"),
        };
        // (release leaks the region's own clone when deregistration fails.)
        drop(region.release());
        Ok(data)
    }

    pub(crate) fn region(&self) -> &Arc<Region> {
        &self.region
    }
}

impl Deref for SharedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.region.backing {
            Backing::Shared(data) => &data[..self.len],
            _ => &[],
        }
    }
}

impl std::fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

impl RegisteredBuf {
    /// The local key for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        self.region.lkey()
    }

    /// The address of the first byte.
    pub fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }

    /// The access rights of the region this buffer belongs to.
    pub fn access(&self) -> Access {
        self.region.access
    }

    /// The protection domain this buffer is registered in.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.region.pd
    }

    /// The address, length and rkey a peer uses to RDMA READ this buffer, or `None` when the
    /// region was not registered with [`Access::remote_read`].
    pub fn remote(&self) -> Option<RemoteBuf> {
        self.region.remote(self.addr(), self.len)
    }

    /// Splits the buffer in two at `at`: `self` keeps `[0, at)`, the result owns `[at, len)`.
    ///
    /// # Panics
    /// When `at > len`, as `Vec::split_off` does.
    pub fn split_off(&mut self, at: usize) -> RegisteredBuf {
        assert!(
            at <= self.len,
            "split_off at {at} past the end of a {}-byte buffer",
            self.len
        );
        let tail = RegisteredBuf {
            region: self.region.clone(),
            offset: self.offset + at,
            len: self.len - at,
        };
        self.len = at;
        tail
    }

    /// Deregisters the region and gives back the vector it was made from by
    /// [`ProtectionDomain::register_vec`]: same buffer, same length, holding whatever the NIC
    /// wrote into it. No bytes are copied.
    ///
    /// This works only for a buffer that is the whole region and the last one of it: pieces
    /// split off must be joined back with [`RegisteredBuf::unsplit`] (and none may still be
    /// posted). Otherwise, or when the region was not made by `register_vec`, the buffer is
    /// given back unchanged as `Err`.
    ///
    /// If `ibv_dereg_mr` fails, the NIC may still map the memory, so it must never be reused:
    /// the vector is leaked, the failure logged, and `Ok` holds a new, empty vector.
    pub fn into_vec(self) -> Result<Vec<u8>, RegisteredBuf> {
        if !matches!(self.region.backing, Backing::Vec(_))
            || self.offset != 0
            || self.len != self.region.len
        {
            return Err(self);
        }
        let RegisteredBuf {
            region,
            offset,
            len,
        } = self;
        let mut region = match Arc::try_unwrap(region) {
            Ok(region) => region,
            Err(region) => {
                return Err(RegisteredBuf {
                    region,
                    offset,
                    len,
                })
            }
        };
        match region.release() {
            Some(Backing::Vec(data)) => Ok(data),
            // Deregistration failed: the vector is leaked (release logged it).
            _ => Ok(Vec::new()),
        }
    }

    /// Joins `next` back onto the end of `self` when it is the adjacent range of the same
    /// region; otherwise gives `next` back.
    pub fn unsplit(&mut self, next: RegisteredBuf) -> Result<(), RegisteredBuf> {
        if Arc::ptr_eq(&self.region, &next.region) && self.offset + self.len == next.offset {
            self.len += next.len;
            Ok(())
        } else {
            Err(next)
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        // SAFETY: offset <= region size, so the result stays inside (or one past) the allocation.
        unsafe { self.region.base.as_ptr().add(self.offset) }
    }

    /// A scatter/gather entry covering the first `len` bytes.
    pub(crate) fn sge(&self, len: usize) -> sys::ibv_sge {
        debug_assert!(len <= self.len);
        sys::ibv_sge {
            addr: self.addr(),
            length: len as u32,
            lkey: self.lkey(),
        }
    }
}

impl Deref for RegisteredBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: this buffer exclusively owns [offset, offset+len) of the live region, and the
        // NIC is not writing it (it is not posted while the user can reach it).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
}

impl DerefMut for RegisteredBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for deref; &mut self guarantees no other reference to this range.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for RegisteredBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredBuf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_access_right_grants_remote_write_or_atomics() {
        let forbidden = sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        for local_write in [false, true] {
            for remote_read in [false, true] {
                for window_read in [false, true] {
                    let a = Access {
                        local_write,
                        remote_read,
                        window_read,
                    };
                    assert_eq!(a.verbs_flags() & forbidden, 0, "{a:?}");
                    let mw_bind = sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0;
                    assert_eq!(a.verbs_flags() & mw_bind != 0, window_read, "{a:?}");
                }
            }
        }
        assert_eq!(
            Access::REMOTE_READ.verbs_flags(),
            sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
        );
        // A window region grants nothing remotely by its own rkey.
        assert_eq!(
            Access::WINDOW_READ.verbs_flags(),
            sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0
        );
        assert_eq!(Access::SEND.verbs_flags(), 0);
    }
}
