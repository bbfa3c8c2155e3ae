//! Completion queues, completion channels, and the table of posted work.
//!
//! Every work request posted through this crate (on a connection or on a shared receive queue)
//! that uses a buffer or a window is recorded in its completion queue's table, together with
//! it. The `wr_id` given to the NIC is the record's slot and generation, so a completion finds
//! its buffer again and hands it back; a stale completion (of a QP already destroyed) finds
//! nothing and is dropped.
//!
//! An inline SEND uses nothing once posted (its bytes are copied into the work request), so it
//! is not recorded: its `wr_id` is its cookie with [`UNRECORDED`] set, and its completion is
//! made from that alone (no table lock on either side of the message's hot path).

use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdmx_sys as sys;

use crate::device::Device;
use crate::memory::RegisteredBuf;
use crate::window::WindowInner;
use crate::{Error, Result};

/// The `wr_id` bit of work not recorded in the table (inline SENDs): the other bits are the
/// caller's cookie. Recorded work's ids keep it clear (their generation has 31 bits).
pub(crate) const UNRECORDED: u64 = 1 << 63;

/// How many completion events are collected before `ibv_ack_cq_events` is called.
const ACK_BATCH: u32 = 16;
/// How many work completions one `ibv_poll_cq` call may return.
const POLL_BATCH: usize = 32;

/// What kind of work a completion is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkKind {
    /// A SEND (or inline SEND).
    Send,
    /// A receive, on a QP or a shared receive queue.
    Recv,
    /// An RDMA READ.
    Read,
    /// An RDMA WRITE.
    Write,
    /// The bind of a memory window ([`crate::Connection::post_bind`]).
    Bind,
    /// An atomic operation ([`crate::Connection::post_atomic`]).
    Atomic,
}

/// An atomic operation on a peer's 8-byte word ([`crate::Connection::post_atomic`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Adds the value (wrapping).
    FetchAdd(u64),
    /// Replaces the word with `new` if it holds `expected`.
    CompareSwap {
        /// The value the word must hold.
        expected: u64,
        /// Its replacement.
        new: u64,
    },
}

/// A work completion status (`ibv_wc_status`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WcStatus(pub u32);

impl WcStatus {
    /// `IBV_WC_SUCCESS`.
    pub const SUCCESS: WcStatus = WcStatus(sys::ibv_wc_status::IBV_WC_SUCCESS.0);
    /// `IBV_WC_WR_FLUSH_ERR`: the QP went to the error state (disconnect) before this work ran.
    pub const FLUSHED: WcStatus = WcStatus(sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR.0);
    /// `IBV_WC_REM_ACCESS_ERR`: the peer refused the remote access (bad rkey or range).
    pub const REMOTE_ACCESS: WcStatus = WcStatus(sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR.0);

    /// True for `IBV_WC_SUCCESS`.
    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }

    /// The status's description from `ibv_wc_status_str`.
    pub fn description(self) -> String {
        // SAFETY: ibv_wc_status_str accepts any value and returns a static NUL-terminated string.
        let s = unsafe { sys::ibv_wc_status_str(sys::ibv_wc_status(self.0)) };
        if s.is_null() {
            return format!("status {}", self.0);
        }
        // SAFETY: checked non-NULL; the string is static.
        unsafe { std::ffi::CStr::from_ptr(s) }
            .to_string_lossy()
            .into_owned()
    }
}

impl std::fmt::Debug for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.description(), self.0)
    }
}

/// One finished piece of work.
#[derive(Debug)]
pub struct Completion {
    /// The caller's cookie given when the work was posted.
    pub cookie: u64,
    /// What the work was.
    pub kind: WorkKind,
    /// Whether it succeeded.
    pub status: WcStatus,
    /// Bytes received (receives) or transferred, as the NIC reports them.
    pub byte_len: u32,
    /// The QP the work ran on (for SRQ receives: the QP whose peer sent the message).
    pub qp_num: u32,
    /// Immediate data, when the sender attached any.
    pub imm_data: Option<u32>,
    /// The buffer the work used, handed back (`None` for inline sends).
    pub buffer: Option<RegisteredBuf>,
}

/// Identifies who posted a pending record (a QP or an SRQ), so their records can be dropped
/// when they are destroyed.
pub(crate) type Owner = u64;

static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

pub(crate) fn new_owner() -> Owner {
    NEXT_OWNER.fetch_add(1, Ordering::Relaxed)
}

struct Pending {
    owner: Owner,
    kind: WorkKind,
    cookie: u64,
    buffer: Option<RegisteredBuf>,
    /// The window a posted bind binds: kept (not deallocated) until the bind completes or
    /// its QP is destroyed.
    window: Option<Arc<WindowInner>>,
}

#[derive(Default)]
struct Slot {
    generation: u32,
    pending: Option<Pending>,
}

/// Posted work that has not completed yet.
#[derive(Default)]
pub(crate) struct WorkTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    len: usize,
}

impl WorkTable {
    fn insert(&mut self, pending: Pending) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        // (31 bits: the top bit of a wr_id marks unrecorded work.)
        slot.generation = slot.generation.wrapping_add(1) & 0x7fff_ffff;
        slot.pending = Some(pending);
        self.len += 1;
        (u64::from(slot.generation) << 32) | u64::from(index)
    }

    fn remove(&mut self, wr_id: u64) -> Option<Pending> {
        if wr_id & UNRECORDED != 0 {
            return None;
        }
        let index = (wr_id & 0xffff_ffff) as usize;
        let generation = (wr_id >> 32) as u32;
        let slot = self.slots.get_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        let pending = slot.pending.take()?;
        self.free.push(index as u32);
        self.len -= 1;
        Some(pending)
    }

    /// Takes every record of `owner` out of the table.
    fn take_owner(&mut self, owner: Owner) -> Vec<Pending> {
        let mut taken = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.pending.as_ref().is_some_and(|p| p.owner == owner) {
                taken.extend(slot.pending.take());
                self.free.push(index as u32);
            }
        }
        self.len -= taken.len();
        taken
    }
}

/// A completion channel (`ibv_comp_channel`): a file descriptor that becomes readable when an
/// armed completion queue gets a completion.
pub struct CompletionChannel {
    raw: *mut sys::ibv_comp_channel,
    _device: Device,
}

// SAFETY: the channel is a file descriptor wrapper; ibv_get_cq_event may be called from any
// thread (and from several, the kernel serialises reads of the fd).
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    fn new(device: &Device) -> Result<Self> {
        // SAFETY: the device context is open while `device` lives (we keep a clone).
        let raw = unsafe { sys::ibv_create_comp_channel(device.context()) };
        if raw.is_null() {
            return Err(Error::last_os(
                "ibv_create_comp_channel",
                format!("cannot create a completion channel on {}", device.name()),
            ));
        }
        let channel = CompletionChannel {
            raw,
            _device: device.clone(),
        };
        set_nonblocking(channel.as_raw_fd(), "ibv_create_comp_channel")?;
        Ok(channel)
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: raw is valid while self lives.
        unsafe { (*self.raw).fd }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: the only CQ using this channel is destroyed before the channel (CqInner's drop
        // destroys the CQ, then drops the channel).
        let ret = unsafe { sys::ibv_destroy_comp_channel(self.raw) };
        if ret != 0 {
            log::error!(
                "ibv_destroy_comp_channel failed: {}",
                std::io::Error::from_raw_os_error(ret)
            );
        }
    }
}

pub(crate) struct CqInner {
    pub(crate) cq: *mut sys::ibv_cq,
    channel: Option<CompletionChannel>,
    unacked_events: AtomicU32,
    table: Mutex<WorkTable>,
    device: Device,
    capacity: u32,
}

// SAFETY: ibv_poll_cq and ibv_req_notify_cq are thread-safe in rdma-core providers, and the
// table is behind a mutex.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        let unacked = *self.unacked_events.get_mut();
        if unacked > 0 {
            // SAFETY: cq is valid; every event counted here was returned by ibv_get_cq_event.
            unsafe { sys::ibv_ack_cq_events(self.cq, unacked) };
        }
        // SAFETY: every QP and SRQ posting to this CQ holds an Arc<CqInner>, so none is left, and
        // all events are acknowledged (ibv_destroy_cq would wait for them otherwise).
        let ret = unsafe { sys::ibv_destroy_cq(self.cq) };
        if ret != 0 {
            // A queue that could not be destroyed (and with it this CQ) may still complete
            // work into the buffers in the table, and the channel may still be signalled:
            // leak them rather than free memory the NIC may write.
            let table = mem::take(self.table.get_mut());
            log::error!(
                "ibv_destroy_cq failed: {}; leaking the {} buffers still posted",
                std::io::Error::from_raw_os_error(ret),
                table.len
            );
            mem::forget(table);
            mem::forget(self.channel.take());
            return;
        }
        // Buffers still in the table are dropped now that nothing can complete into them.
        self.channel.take();
    }
}

/// A completion queue, optionally with its own completion channel for event-driven waiting.
/// Cheap to clone; shared by every connection and SRQ that posts to it.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl CompletionQueue {
    /// Creates a CQ of at least `capacity` entries. With `events`, it also gets a completion
    /// channel so that [`CompletionQueue::wait`] can sleep instead of spinning.
    pub fn new(device: &Device, capacity: u32, events: bool) -> Result<Self> {
        let channel = if events {
            Some(CompletionChannel::new(device)?)
        } else {
            None
        };
        let channel_ptr = channel.as_ref().map_or(ptr::null_mut(), |c| c.raw);
        let cqe = i32::try_from(capacity).map_err(|_| {
            Error::invalid(
                "ibv_create_cq",
                format!("capacity {capacity} is out of range"),
            )
        })?;
        // SAFETY: the context is open, and the channel (if any) outlives the CQ (CqInner drops it
        // after destroying the CQ).
        let cq =
            unsafe { sys::ibv_create_cq(device.context(), cqe, ptr::null_mut(), channel_ptr, 0) };
        if cq.is_null() {
            return Err(Error::last_os(
                "ibv_create_cq",
                format!(
                    "cannot create a CQ of {capacity} entries on {}",
                    device.name()
                ),
            ));
        }
        // SAFETY: cq is valid; the provider may round the size up.
        let actual = unsafe { (*cq).cqe }.max(0) as u32;
        Ok(CompletionQueue {
            inner: Arc::new(CqInner {
                cq,
                channel,
                unacked_events: AtomicU32::new(0),
                table: Mutex::new(WorkTable::default()),
                device: device.clone(),
                capacity: actual,
            }),
        })
    }

    /// The device this CQ is on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The number of entries the CQ actually has.
    pub fn capacity(&self) -> u32 {
        self.inner.capacity
    }

    /// How many posted work requests have not completed yet, inline SENDs aside (they hold
    /// nothing, and are not recorded).
    pub fn pending(&self) -> usize {
        self.inner.table.lock().len
    }

    /// The completion channel's file descriptor (for epoll), when the CQ has one.
    pub fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the channel's fd stays open until the channel is destroyed, which happens
        // only when the last handle of this CQ is dropped, so it outlives the borrow.
        self.inner
            .channel
            .as_ref()
            .map(|c| unsafe { BorrowedFd::borrow_raw(c.as_raw_fd()) })
    }

    /// Records posted work; returns the `wr_id` to give the NIC.
    pub(crate) fn record(
        &self,
        owner: Owner,
        kind: WorkKind,
        cookie: u64,
        buffer: Option<RegisteredBuf>,
    ) -> u64 {
        self.inner.table.lock().insert(Pending {
            owner,
            kind,
            cookie,
            buffer,
            window: None,
        })
    }

    /// Records a posted window bind, keeping the window alive until it completes.
    pub(crate) fn record_bind(&self, owner: Owner, cookie: u64, window: Arc<WindowInner>) -> u64 {
        self.inner.table.lock().insert(Pending {
            owner,
            kind: WorkKind::Bind,
            cookie,
            buffer: None,
            window: Some(window),
        })
    }

    /// Takes back a record whose post failed; returns its buffer.
    pub(crate) fn unrecord(&self, wr_id: u64) -> Option<RegisteredBuf> {
        let pending = self.inner.table.lock().remove(wr_id)?;
        pending.buffer
    }

    /// Forgets every record of a destroyed QP or SRQ, dropping their buffers (and windows).
    pub(crate) fn forget_owner(&self, owner: Owner) -> usize {
        let taken = self.inner.table.lock().take_owner(owner);
        if !taken.is_empty() {
            log::debug!(
                "dropped {} work requests left posted on a destroyed queue",
                taken.len()
            );
        }
        taken.len()
    }

    /// Leaks every record of a QP or SRQ that could not be destroyed: the NIC may still
    /// write their buffers, so they are never freed (nor their windows deallocated).
    pub(crate) fn leak_owner(&self, owner: Owner) -> usize {
        let taken = self.inner.table.lock().take_owner(owner);
        let n = taken.len();
        mem::forget(taken);
        n
    }

    /// Polls up to `max` completions into `out` without blocking; returns how many were added.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        // Not zeroed: ibv_poll_cq writes every entry it returns, and a busy-polling worker
        // polls an empty CQ over and over (zeroing 32 entries was a 1.5 KiB memset per poll).
        let mut wcs = [const { mem::MaybeUninit::<sys::ibv_wc>::uninit() }; POLL_BATCH];
        let mut added = 0;
        while added < max {
            let want = (max - added).min(POLL_BATCH);
            // SAFETY: cq is valid and wcs has room for `want` entries (ibv_wc is plain data).
            let n = unsafe {
                sys::ibv_poll_cq(
                    self.inner.cq,
                    want as i32,
                    wcs.as_mut_ptr().cast::<sys::ibv_wc>(),
                )
            };
            if n < 0 {
                return Err(Error::from_ret(
                    "ibv_poll_cq",
                    n,
                    "cannot poll the completion queue",
                ));
            }
            let n = (n as usize).min(want);
            if n == 0 {
                break;
            }
            // SAFETY: ibv_poll_cq initialised the first `n` entries.
            let polled =
                unsafe { std::slice::from_raw_parts(wcs.as_ptr().cast::<sys::ibv_wc>(), n) };
            let mut done_windows = Vec::new();
            // Taken at the first recorded completion: a batch of inline SENDs needs no lock.
            let mut table = None;
            for wc in polled {
                let imm = (wc.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0) != 0;
                let mut completion = Completion {
                    cookie: wc.wr_id & !UNRECORDED,
                    kind: WorkKind::Send,
                    status: WcStatus(wc.status.0),
                    byte_len: wc.byte_len,
                    qp_num: wc.qp_num,
                    // SAFETY: with IBV_WC_WITH_IMM the union holds imm_data (network order).
                    imm_data: imm.then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data })),
                    buffer: None,
                };
                if wc.wr_id & UNRECORDED == 0 {
                    let table = table.get_or_insert_with(|| self.inner.table.lock());
                    let Some(pending) = table.remove(wc.wr_id) else {
                        log::debug!(
                            "completion for work no longer tracked (qp {} destroyed?)",
                            wc.qp_num
                        );
                        continue;
                    };
                    completion.cookie = pending.cookie;
                    completion.kind = pending.kind;
                    completion.buffer = pending.buffer;
                    done_windows.extend(pending.window);
                }
                out.push(completion);
                added += 1;
            }
            // A window whose last handle is gone is deallocated here, outside the lock.
            drop(table);
            drop(done_windows);
            if n < want {
                break;
            }
        }
        Ok(added)
    }

    /// Arms the CQ: the channel becomes readable at the next completion.
    pub fn request_notify(&self) -> Result<()> {
        // SAFETY: cq is valid.
        let ret = unsafe { sys::ibv_req_notify_cq(self.inner.cq, 0) };
        if ret != 0 {
            return Err(Error::from_ret(
                "ibv_req_notify_cq",
                ret,
                "cannot arm the completion queue",
            ));
        }
        Ok(())
    }

    /// Returns completions, sleeping on the completion channel until there are some or until
    /// `timeout` passes (then returns 0). `None` waits without limit.
    ///
    /// The loop is the classic one, so no wakeup is lost: poll; if empty, arm the CQ and poll
    /// again (a completion may have landed before the arming); if still empty, sleep on the
    /// channel, take the event (acknowledged in batches), and start over.
    pub fn wait(
        &self,
        out: &mut Vec<Completion>,
        max: usize,
        timeout: Option<Duration>,
    ) -> Result<usize> {
        let channel = self.inner.channel.as_ref().ok_or_else(|| {
            Error::invalid(
                "ibv_get_cq_event",
                "this CQ was created without a completion channel; create it with events = true",
            )
        })?;
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let n = self.poll(out, max)?;
            if n > 0 {
                return Ok(n);
            }
            self.request_notify()?;
            let n = self.poll(out, max)?;
            if n > 0 {
                return Ok(n);
            }
            let remaining = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(r) => Some(r),
                    None => return Ok(0),
                },
                None => None,
            };
            if !poll_readable(channel.as_raw_fd(), remaining, "ibv_get_cq_event")? {
                return Ok(0);
            }
            self.take_event(channel)?;
        }
    }

    /// Takes every event waiting on the completion channel, without blocking, and returns how
    /// many it took (`Ok(0)` when none was waiting, or when the CQ has no channel). The events
    /// are acknowledged in batches, as [`CompletionQueue::wait`] does.
    ///
    /// This is for callers that sleep on [`CompletionQueue::event_fd`] themselves, e.g. with a
    /// [`crate::Poller`]: when the descriptor is readable, take the events (so it stops being
    /// readable), then poll the CQ until it is empty, then [`CompletionQueue::request_notify`]
    /// and poll once more before sleeping again (a completion may have landed before the
    /// arming). Taking events does not re-arm the CQ.
    pub fn take_events(&self) -> Result<usize> {
        let Some(channel) = self.inner.channel.as_ref() else {
            return Ok(0);
        };
        let mut taken = 0;
        while self.take_event(channel)? {
            taken += 1;
        }
        Ok(taken)
    }

    /// Takes one event from the channel (if any is there) and counts it for acknowledgement;
    /// returns whether there was one.
    fn take_event(&self, channel: &CompletionChannel) -> Result<bool> {
        let mut cq = ptr::null_mut();
        let mut ctx = ptr::null_mut();
        // SAFETY: the channel is valid and non-blocking; the out-pointers are valid.
        let ret = unsafe { sys::ibv_get_cq_event(channel.raw, &mut cq, &mut ctx) };
        if ret != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(Error::last_os(
                "ibv_get_cq_event",
                "cannot read the completion channel",
            ));
        }
        let unacked = self.inner.unacked_events.fetch_add(1, Ordering::AcqRel) + 1;
        if unacked >= ACK_BATCH {
            let n = self.inner.unacked_events.swap(0, Ordering::AcqRel);
            if n > 0 {
                // SAFETY: cq is valid and n events were returned by ibv_get_cq_event for it.
                unsafe { sys::ibv_ack_cq_events(self.inner.cq, n) };
            }
        }
        Ok(true)
    }
}

pub(crate) fn set_nonblocking(fd: RawFd, call: &'static str) -> Result<()> {
    // SAFETY: fcntl on a valid fd with integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(Error::last_os(
            call,
            "cannot make the channel's file descriptor non-blocking",
        ));
    }
    Ok(())
}

/// A timeout in milliseconds for poll(2) and epoll_wait(2): -1 (no limit) for `None`.
pub(crate) fn timeout_ms(timeout: Option<Duration>) -> i32 {
    match timeout {
        None => -1,
        // Round up so that a sub-millisecond remainder still sleeps instead of spinning.
        Some(t) => i32::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX),
    }
}

/// Sleeps in poll(2) until `fd` is readable or `timeout` passes; returns whether it is readable.
pub(crate) fn poll_readable(
    fd: RawFd,
    timeout: Option<Duration>,
    call: &'static str,
) -> Result<bool> {
    let ms = timeout_ms(timeout);
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: pfd is a valid pollfd array of length 1.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::last_os(
                call,
                "poll on the channel's file descriptor failed",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(owner: Owner, cookie: u64) -> Pending {
        Pending {
            owner,
            kind: WorkKind::Send,
            cookie,
            buffer: None,
            window: None,
        }
    }

    #[test]
    fn timeouts_round_up_to_whole_milliseconds() {
        assert_eq!(timeout_ms(None), -1);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_nanos(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1500))), 2);
        assert_eq!(timeout_ms(Some(Duration::from_millis(7))), 7);
        assert_eq!(timeout_ms(Some(Duration::from_secs(u64::MAX))), i32::MAX);
    }

    #[test]
    fn table_round_trips_and_rejects_stale_ids() {
        let mut t = WorkTable::default();
        let a = t.insert(pending(1, 10));
        let b = t.insert(pending(2, 20));
        assert_eq!(t.len, 2);
        assert_eq!(t.remove(a).unwrap().cookie, 10);
        assert!(t.remove(a).is_none(), "a wr_id completes once");
        let c = t.insert(pending(1, 30));
        assert_ne!(a, c, "a reused slot gets a new generation");
        assert!(t.remove(a).is_none());
        assert_eq!(t.take_owner(1).len(), 1);
        assert!(t.remove(c).is_none());
        assert_eq!(t.remove(b).unwrap().cookie, 20);
        assert_eq!(t.len, 0);
        assert!(t.remove(u64::MAX).is_none(), "garbage ids are ignored");
    }
}
