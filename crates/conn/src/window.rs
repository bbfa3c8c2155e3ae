//! Memory windows (type 2): remote READ access to exactly one byte range of a registered
//! region, for exactly one queue pair, for as long as the window is bound.
//!
//! A region registered with [`Access::WINDOW_READ`] grants nothing by its own rkey. A
//! [`MemoryWindow`] made over a range of it gets an rkey of its own once
//! [`crate::Connection::post_bind`] binds it on a connection's QP: then, and only through that
//! QP, a peer may RDMA READ that range. The window is invalidated (deallocated) when its last
//! handle is dropped — unless a bind of it is still posted, in which case the CQ's record of
//! that bind keeps it until the completion is polled or the QP is destroyed, so a bind never
//! runs against a window (or a window number) that is gone.
//!
//! While a window exists it holds its region, so the memory it may expose stays registered and
//! allocated; if deallocating the window fails, the region is leaked rather than freed.
//!
//! Providers differ in one point: Soft-RoCE (rxe, Linux 6.1) enforces the QP a window is
//! bound to, but checks a READ's range against the region under the window rather than the
//! window itself. Where that matters, bind windows over regions that hold nothing else
//! (rdmx registers user buffers exactly, and wipes the staging regions it reuses).

use std::mem;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rdmx_sys as sys;

use crate::memory::{Access, ProtectionDomain, Region, RegisteredBuf, RemoteBuf, SharedBuf};
use crate::{Error, Result};

static LIVE_WINDOWS: AtomicUsize = AtomicUsize::new(0);

/// How many memory windows this process has allocated and not deallocated (for leak tests;
/// a window whose deallocation failed stays counted).
pub fn live_windows() -> usize {
    LIVE_WINDOWS.load(Ordering::Relaxed)
}

pub(crate) struct WindowInner {
    mw: *mut sys::ibv_mw,
    /// The region the window is bound (or to be bound) to.
    region: Arc<Region>,
    /// A bind was posted (a type-2 window is bound once).
    posted: AtomicBool,
}

// SAFETY: an MW is a kernel object handle; verbs calls that take it are thread-safe, and the
// struct's other fields are immutable or atomic.
unsafe impl Send for WindowInner {}
// SAFETY: as above.
unsafe impl Sync for WindowInner {}

impl Drop for WindowInner {
    fn drop(&mut self) {
        // SAFETY: mw came from ibv_alloc_mw and is deallocated once, here. No bind of it is
        // posted any more: a posted bind holds a clone of this Arc in the CQ's table until its
        // completion is polled or its QP is destroyed.
        let ret = unsafe { sys::ibv_dealloc_mw(self.mw) };
        if ret != 0 {
            // The window may still grant access to the region: keep it registered and
            // allocated for the life of the process.
            log::error!(
                "ibv_dealloc_mw failed ({}); leaking the {}-byte region it covers",
                std::io::Error::from_raw_os_error(ret),
                self.region.len
            );
            mem::forget(self.region.clone());
            return;
        }
        LIVE_WINDOWS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A type-2 memory window over the first `len` bytes of a registered buffer: once bound to a
/// connection's QP ([`crate::Connection::post_bind`]), the peer of that connection — and no
/// other — may RDMA READ exactly those bytes with [`MemoryWindow::rkey`], until the window is
/// dropped.
///
/// Cheap to clone: clones are handles to one window, which is invalidated when the last
/// handle (and any bind of it still posted) is gone.
#[derive(Clone)]
pub struct MemoryWindow {
    pub(crate) inner: Arc<WindowInner>,
    addr: u64,
    len: u64,
    rkey: u32,
}

impl MemoryWindow {
    /// Allocates a window that will expose the first `len` bytes of `buf` (which must be
    /// registered with [`Access::WINDOW_READ`]) for READ. Nothing is exposed until it is
    /// bound.
    pub fn new(buf: &RegisteredBuf, len: usize) -> Result<MemoryWindow> {
        Self::over(&buf.region, buf.addr(), buf.len(), len)
    }

    /// [`MemoryWindow::new`] over a shared vector registered in place
    /// ([`crate::ProtectionDomain::register_shared`] with [`Access::WINDOW_READ`]).
    pub fn new_shared(buf: &SharedBuf, len: usize) -> Result<MemoryWindow> {
        Self::over(buf.region(), buf.addr(), buf.len(), len)
    }

    /// A window that will expose `len` bytes of `region` from `addr`, where the buffer
    /// being exposed holds `buf_len` bytes.
    fn over(region: &Arc<Region>, addr: u64, buf_len: usize, len: usize) -> Result<MemoryWindow> {
        let access: Access = region.access;
        if !access.window_read {
            return Err(Error::invalid(
                "ibv_alloc_mw",
                "a memory window needs a region registered with Access::WINDOW_READ",
            ));
        }
        if len == 0 || len > buf_len {
            return Err(Error::invalid(
                "ibv_alloc_mw",
                format!("a window of {len} bytes over a {buf_len}-byte buffer"),
            ));
        }
        let pd: &ProtectionDomain = &region.pd;
        // SAFETY: the PD is valid while the buffer's region (which holds it) lives.
        let mw = unsafe { sys::ibv_alloc_mw(pd.inner.pd, sys::ibv_mw_type::IBV_MW_TYPE_2) };
        if mw.is_null() {
            return Err(Error::last_os(
                "ibv_alloc_mw",
                format!(
                    "cannot allocate a type-2 memory window on {}",
                    pd.device().name()
                ),
            ));
        }
        LIVE_WINDOWS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: mw is valid. A type-2 bind carries the window's next rkey: the same window
        // number with the key byte stepped, so an rkey of an earlier binding is never valid
        // again.
        let rkey = unsafe { sys::ibv_inc_rkey((*mw).rkey) };
        Ok(MemoryWindow {
            inner: Arc::new(WindowInner {
                mw,
                region: region.clone(),
                posted: AtomicBool::new(false),
            }),
            addr,
            len: len as u64,
            rkey,
        })
    }

    /// The address of the first exposed byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// How many bytes the window exposes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the window exposes no byte (never: windows cover at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The rkey the bound window answers to.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Invalidates the window now — deallocates it, so its rkey is dead and its region free
    /// of it — when this is its last handle and no bind of it is still posted (the bind's
    /// completion was polled, or its QP destroyed). Otherwise gives the handle back: try
    /// again after polling completions.
    pub fn invalidate(self) -> std::result::Result<(), MemoryWindow> {
        // Only this handle and posted binds can hold the window: with a count of one, nothing
        // else can clone it meanwhile.
        if Arc::strong_count(&self.inner) == 1 {
            drop(self);
            Ok(())
        } else {
            Err(self)
        }
    }

    /// Whether a bind of this window was posted.
    pub fn is_posted(&self) -> bool {
        self.inner.posted.load(Ordering::Acquire)
    }

    /// Marks the window as posted; false when it already was.
    pub(crate) fn claim_bind(&self) -> bool {
        !self.inner.posted.swap(true, Ordering::AcqRel)
    }

    /// The protection domain of the window's region.
    pub(crate) fn pd_ptr(&self) -> *mut sys::ibv_pd {
        self.inner.region.pd.inner.pd
    }

    /// The bind work request's parameters: the window, its new rkey, and what it exposes.
    pub(crate) fn bind_wr(&self) -> sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
        sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
            mw: self.inner.mw,
            rkey: self.rkey,
            bind_info: sys::ibv_mw_bind_info {
                mr: self.inner.region.mr,
                addr: self.addr,
                length: self.len,
                mw_access_flags: sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
            },
        }
    }

    /// What a peer needs to READ through the window (`None` past 4 GiB, which one RDMA READ
    /// cannot cover).
    pub fn remote(&self) -> Option<RemoteBuf> {
        Some(RemoteBuf {
            addr: self.addr,
            len: u32::try_from(self.len).ok()?,
            rkey: self.rkey,
        })
    }
}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}
