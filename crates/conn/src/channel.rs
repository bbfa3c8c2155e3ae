//! rdmacm event channels, and the ids on them.
//!
//! An [`EventChannel`] is shared by many rdmacm ids — all of a worker's connections use one,
//! as UCX's worker does — so a connection costs no file descriptor of its own. Whoever reads
//! the channel sorts each event into a queue of the id it concerns (a connect request into its
//! listener's), and each id's owner takes its own events from its queue, reading or waiting on
//! the channel while the queue is empty ([`RawId::next_event`]). An event is never handed to
//! another id than its own: an event for an id the channel does not know (any more) is
//! dropped.
//!
//! Every event is acknowledged as it is read, its contents copied out, under the channel's
//! lock: nothing ever holds an unacknowledged event across a wait, so `rdma_destroy_id` and
//! `rdma_migrate_id` (which wait until the id's events are acknowledged) never block on one.
//! An id leaves its channel's table before it is destroyed and joins a channel's table before
//! it is moved onto it, and its [`RawId`] holds the channel, so a channel outlives its ids.
//!
//! One thread at a time sleeps on the channel's descriptor (the others on a condition
//! variable, woken whenever events were sorted); [`EventChannel::take_ready`] never reads
//! while one sleeps there (that thread reads as soon as it wakes), and a thread that sorts
//! events for connections named by a token calls the channel's [`EventChannel::on_ready`]
//! hook, so the owner of those connections looks at them.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::{Condvar, Mutex, MutexGuard};
use rdmx_sys as sys;

use crate::addr::sockaddr_to_std;
use crate::cq::{poll_readable, set_nonblocking};
use crate::{Error, Result};

/// The most events kept for one id that its owner has not taken. The CM gives a connection a
/// handful in its life (ESTABLISHED, DISCONNECTED, TIMEWAIT_EXIT, ...); past this, its owner
/// is not reading them, and later ones are dropped.
const MAX_QUEUED: usize = 32;

/// An id's place in a channel's table: its address (unique while it lives; an id leaves
/// the table before it is destroyed, and the kernel discards its unread events then).
type Key = usize;

/// An rdmacm event channel that many connections share (see the module docs): one per
/// worker costs one descriptor, however many connections it has. Cheap to clone.
///
/// Give it to [`crate::connect`] and [`crate::ConnectionRequest::accept`] through
/// [`crate::QpConfig::events`]; watch [`EventChannel::event_fd`] and call
/// [`EventChannel::take_ready`] to learn which connections (named by
/// [`crate::Connection::set_event_token`]) have events, then take them with
/// [`crate::Connection::next_event`].
#[derive(Clone)]
pub struct EventChannel {
    inner: Arc<Channel>,
}

struct Channel {
    raw: *mut sys::rdma_event_channel,
    sorted: Mutex<Sorted>,
    /// Signalled whenever events were sorted, or the thread sleeping on the descriptor woke.
    news: Condvar,
    /// Called when a thread waiting for its own id's events sorted some for an id with a token.
    on_ready: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

// SAFETY: rdmacm channels may be used from any thread (rdma_get_cm_event is thread-safe, and
// the channel is only read under `sorted`'s lock here); the rest is Send and Sync.
unsafe impl Send for Channel {}
// SAFETY: as above.
unsafe impl Sync for Channel {}

/// The events read from the channel and not yet taken, by id.
#[derive(Default)]
struct Sorted {
    queues: HashMap<Key, Queue>,
    /// Ids with a token that got events since the last [`EventChannel::take_ready`].
    ready: Vec<(Key, u64)>,
    /// A thread sleeps on the channel's descriptor.
    polling: bool,
}

/// One id's events, and the token its owner named it by (0: none).
struct Queue {
    events: VecDeque<CmEvent>,
    token: u64,
    /// In `ready` (once is enough).
    flagged: bool,
    /// The most events kept for it (`MAX_QUEUED`, or a listener's backlog).
    limit: usize,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            events: VecDeque::new(),
            token: 0,
            flagged: false,
            limit: MAX_QUEUED,
        }
    }
}

impl Sorted {
    fn take(&mut self, key: Key) -> Option<CmEvent> {
        self.queues.get_mut(&key)?.events.pop_front()
    }
}

impl EventChannel {
    /// A new channel (`rdma_create_event_channel`, made nonblocking).
    pub fn new() -> Result<EventChannel> {
        // SAFETY: no preconditions; returns an owned channel or NULL.
        let raw = unsafe { sys::rdma_create_event_channel() };
        if raw.is_null() {
            return Err(Error::last_rdmacm(
                "rdma_create_event_channel",
                "cannot create an rdmacm event channel (is rdma_ucm loaded? /dev/infiniband/rdma_cm)",
            ));
        }
        // SAFETY: raw is a valid channel.
        if let Err(err) = set_nonblocking(unsafe { (*raw).fd }, "rdma_create_event_channel") {
            // SAFETY: raw was created above and has no ids.
            unsafe { sys::rdma_destroy_event_channel(raw) };
            return Err(err);
        }
        Ok(EventChannel {
            inner: Arc::new(Channel {
                raw,
                sorted: Mutex::new(Sorted::default()),
                news: Condvar::new(),
                on_ready: OnceLock::new(),
            }),
        })
    }

    /// The channel's descriptor: readable when events wait to be read (and sorted by
    /// [`EventChannel::take_ready`]).
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open until the channel is destroyed, when the last
        // clone of `self` is dropped, so it outlives the borrow.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel is valid while self lives.
        unsafe { (*self.inner.raw).fd }
    }

    /// Reads the events waiting on the channel (unless a thread sleeps on it: that thread
    /// reads them as it wakes) and sorts them to their connections; then appends the tokens
    /// of the connections that got events since the last call (each once). Their events are
    /// taken with [`crate::Connection::next_event`].
    pub fn take_ready(&self, tokens: &mut Vec<u64>) -> Result<()> {
        let mut unclaimed = Vec::new();
        let result = {
            let mut st = self.inner.sorted.lock();
            let read = if st.polling {
                Ok(())
            } else {
                self.read_waiting(&mut st, &mut unclaimed).map(|_| ())
            };
            let Sorted { queues, ready, .. } = &mut *st;
            for (key, token) in ready.drain(..) {
                if let Some(q) = queues.get_mut(&key) {
                    q.flagged = false;
                }
                tokens.push(token);
            }
            read
        };
        // (Dropped after the lock: a connect request's event owns its new id.)
        drop(unclaimed);
        result
    }

    /// Sets the hook called when a thread that waited for its own connection's events (a
    /// connect or accept) sorted events for connections named by a token: their owner is to
    /// call [`EventChannel::take_ready`] (the channel's descriptor may not say so any more).
    /// Set once; returns false (and drops `hook`) if a hook was set already.
    pub fn on_ready(&self, hook: impl Fn() + Send + Sync + 'static) -> bool {
        self.inner.on_ready.set(Box::new(hook)).is_ok()
    }

    /// Reads every event waiting (the channel is nonblocking), acknowledging each, and sorts
    /// it into its id's queue; events for no known id go to `unclaimed`, to be dropped after
    /// the lock. Returns whether an id with a token got events (and wakes the waiters if any
    /// event was read).
    fn read_waiting(&self, st: &mut Sorted, unclaimed: &mut Vec<CmEvent>) -> Result<bool> {
        let mut flagged = false;
        let mut read = 0usize;
        let result = loop {
            let mut event = ptr::null_mut();
            // SAFETY: the channel is valid and nonblocking; event is a valid out-pointer.
            let ret = unsafe { sys::rdma_get_cm_event(self.inner.raw, &mut event) };
            if ret != 0 {
                let err = std::io::Error::last_os_error();
                match err.kind() {
                    std::io::ErrorKind::WouldBlock => break Ok(flagged),
                    std::io::ErrorKind::Interrupted => continue,
                    _ => {
                        break Err(Error::new(
                            "rdma_get_cm_event",
                            err.raw_os_error().unwrap_or(libc::EIO),
                            "cannot read the rdmacm event channel",
                        ))
                    }
                }
            }
            read += 1;
            // SAFETY: event came from rdma_get_cm_event and is not acknowledged yet.
            let (key, ev) = unsafe { CmEvent::take(event) };
            let Sorted { queues, ready, .. } = &mut *st;
            match queues.get_mut(&key) {
                Some(q) if q.events.len() < q.limit => {
                    q.events.push_back(ev);
                    if q.token != 0 && !q.flagged {
                        q.flagged = true;
                        ready.push((key, q.token));
                        flagged = true;
                    }
                }
                Some(q) => {
                    log::warn!(
                        "dropping an rdmacm {} event: {} events wait for its id",
                        ev.kind.name(),
                        q.limit
                    );
                    unclaimed.push(ev);
                }
                None => {
                    log::debug!(
                        "dropping an rdmacm {} event of an id no longer known",
                        ev.kind.name()
                    );
                    unclaimed.push(ev);
                }
            }
        };
        if read > 0 {
            self.inner.news.notify_all();
        }
        result
    }

    /// The next event of the id `key`, reading and waiting on the channel until `deadline`
    /// (`None`: for ever). `Ok(None)` at the deadline.
    fn next_for(
        &self,
        key: Key,
        deadline: Option<Instant>,
        call: &'static str,
    ) -> Result<Option<CmEvent>> {
        let mut unclaimed = Vec::new();
        let mut flagged = false;
        let result = self.wait_for(key, deadline, call, &mut unclaimed, &mut flagged);
        drop(unclaimed);
        if flagged {
            if let Some(hook) = self.inner.on_ready.get() {
                hook();
            }
        }
        result
    }

    fn wait_for(
        &self,
        key: Key,
        deadline: Option<Instant>,
        call: &'static str,
        unclaimed: &mut Vec<CmEvent>,
        flagged: &mut bool,
    ) -> Result<Option<CmEvent>> {
        let ch = &*self.inner;
        let mut st = ch.sorted.lock();
        loop {
            if let Some(ev) = st.take(key) {
                return Ok(Some(ev));
            }
            if !st.polling {
                *flagged |= self.read_waiting(&mut st, unclaimed)?;
                if let Some(ev) = st.take(key) {
                    return Ok(Some(ev));
                }
            }
            let remaining = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(r) if !r.is_zero() => Some(r),
                    _ => return Ok(None),
                },
            };
            if st.polling {
                // Another thread sleeps on the descriptor; it wakes this one when it sorted
                // what arrived, or when it stops sleeping there.
                match deadline {
                    Some(d) => {
                        ch.news.wait_until(&mut st, d);
                    }
                    None => ch.news.wait(&mut st),
                }
                continue;
            }
            st.polling = true;
            let fd = self.fd();
            let polled = MutexGuard::unlocked(&mut st, || poll_readable(fd, remaining, call));
            st.polling = false;
            ch.news.notify_all();
            polled?;
        }
    }

    /// Takes `key` into the table (before its id is moved onto the channel).
    fn join(&self, key: Key) {
        self.inner.sorted.lock().queues.entry(key).or_default();
    }

    /// Takes `key` out of the table (before its id is destroyed or moved away); returns its
    /// queue, to be dropped by the caller after the lock.
    fn leave(&self, key: Key) -> Option<Queue> {
        self.inner.sorted.lock().queues.remove(&key)
    }

    /// Puts `earlier` (events of `key` read on its former channel) before the events of
    /// `key` read here since it joined.
    fn prepend(&self, key: Key, earlier: Queue) {
        let mut st = self.inner.sorted.lock();
        if let Some(q) = st.queues.get_mut(&key) {
            for ev in earlier.events.into_iter().rev() {
                q.events.push_front(ev);
            }
        }
    }

    /// Names `key` by `token` for [`EventChannel::take_ready`]; events that came before
    /// are reported under it too.
    fn set_token(&self, key: Key, token: u64) {
        let mut st = self.inner.sorted.lock();
        let Sorted { queues, ready, .. } = &mut *st;
        if let Some(q) = queues.get_mut(&key) {
            q.token = token;
            if token != 0 && !q.events.is_empty() && !q.flagged {
                q.flagged = true;
                ready.push((key, token));
            }
        }
    }

    /// Keeps up to `limit` untaken events for `key` (in place of `MAX_QUEUED`).
    fn set_limit(&self, key: Key, limit: usize) {
        if let Some(q) = self.inner.sorted.lock().queues.get_mut(&key) {
            q.limit = limit.max(1);
        }
    }

    fn same(&self, other: &EventChannel) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // Events not taken may own connect requests' ids, which live on this channel:
        // destroyed first (every id of its own was destroyed already: each held the channel).
        drop(std::mem::take(self.sorted.get_mut()));
        // SAFETY: the channel is valid and has no ids left; destroyed once, here.
        unsafe { sys::rdma_destroy_event_channel(self.raw) };
    }
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// An rdmacm id on an [`EventChannel`], its events sorted into its own queue there.
pub(crate) struct RawId {
    id: *mut sys::rdma_cm_id,
    channel: EventChannel,
}

// SAFETY: rdmacm ids may be used from any thread; the channel is Send and Sync.
unsafe impl Send for RawId {}
// SAFETY: as above.
unsafe impl Sync for RawId {}

impl RawId {
    /// A fresh id (TCP port space, RC QPs) on a channel of its own.
    pub(crate) fn create(call: &'static str) -> Result<Self> {
        let channel = EventChannel::new()?;
        let mut id = ptr::null_mut();
        // SAFETY: the channel is valid and id a valid out-pointer.
        let ret = unsafe {
            sys::rdma_create_id(
                channel.inner.raw,
                &mut id,
                ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 {
            return Err(Error::last_rdmacm(call, "cannot create an rdmacm id"));
        }
        channel.join(id as Key);
        Ok(RawId { id, channel })
    }

    /// Moves `id` (synchronous: made by `rdma_create_ep`) onto `channel`. On failure the id
    /// is destroyed.
    ///
    /// # Safety
    /// `id` must be a valid rdmacm id without a QP that nothing else will use or destroy, with
    /// every event already acknowledged.
    pub(crate) unsafe fn adopt(
        id: *mut sys::rdma_cm_id,
        channel: &EventChannel,
        call: &'static str,
    ) -> Result<Self> {
        channel.join(id as Key);
        // SAFETY: id and the channel are valid.
        if unsafe { sys::rdma_migrate_id(id, channel.inner.raw) } != 0 {
            let err = Error::last_os(call, "cannot move the rdmacm id to the event channel");
            drop(channel.leave(id as Key));
            // SAFETY: the id stays on its own synchronous channel, which it destroys with it.
            unsafe { sys::rdma_destroy_id(id) };
            return Err(err);
        }
        Ok(RawId {
            id,
            channel: channel.clone(),
        })
    }

    /// The new id of a connect request, on its listener's `channel`.
    pub(crate) fn of_request(new: NewId, channel: &EventChannel) -> Self {
        let id = new.into_raw();
        // (Events of the id read before this are dropped: the request was withdrawn.)
        channel.join(id as Key);
        RawId {
            id,
            channel: channel.clone(),
        }
    }

    /// Moves the id onto `to`, its events still unread here following it (in order).
    pub(crate) fn move_to(&mut self, to: &EventChannel, call: &'static str) -> Result<()> {
        if self.channel.same(to) {
            return Ok(());
        }
        let key = self.key();
        to.join(key);
        // SAFETY: the id and `to` are valid. rdmacm moves the id's unread events along and
        // waits until those read here are acknowledged (they are, as they are read).
        if unsafe { sys::rdma_migrate_id(self.id, to.inner.raw) } != 0 {
            let err = Error::last_os(call, "cannot move the rdmacm id to the event channel");
            drop(to.leave(key));
            return Err(err);
        }
        // No event of the id is read here any more: what was, goes first.
        if let Some(earlier) = self.channel.leave(key) {
            to.prepend(key, earlier);
        }
        self.channel = to.clone();
        Ok(())
    }

    fn key(&self) -> Key {
        self.id as Key
    }

    pub(crate) fn id(&self) -> *mut sys::rdma_cm_id {
        self.id
    }

    pub(crate) fn channel(&self) -> &EventChannel {
        &self.channel
    }

    pub(crate) fn context(&self) -> *mut sys::ibv_context {
        // SAFETY: id is valid while self lives.
        unsafe { (*self.id).verbs }
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: id is valid; rdma_get_local_addr returns a pointer into the id.
        unsafe { sockaddr_to_std(sys::rdma_get_local_addr(self.id).cast(), 0) }
    }

    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe { sockaddr_to_std(sys::rdma_get_peer_addr(self.id).cast(), 0) }
    }

    /// Names this id by `token` in its channel's [`EventChannel::take_ready`].
    pub(crate) fn set_token(&self, token: u64) {
        self.channel.set_token(self.key(), token);
    }

    /// Keeps up to `limit` of this id's events that its owner has not taken (a listener:
    /// its backlog of connect requests), in place of the default for a connection.
    pub(crate) fn set_queue_limit(&self, limit: usize) {
        self.channel.set_limit(self.key(), limit);
    }

    /// The next event of this id, waiting until `deadline` (None: forever).
    pub(crate) fn next_event(
        &self,
        deadline: Option<Instant>,
        call: &'static str,
    ) -> Result<Option<CmEvent>> {
        self.channel.next_for(self.key(), deadline, call)
    }
}

impl Drop for RawId {
    fn drop(&mut self) {
        // Out of the table first: an event of the id read from now on is dropped, and every
        // one read so far is acknowledged, so the destroy cannot wait for one.
        let queued = self.channel.leave(self.key());
        // SAFETY: every event read was acknowledged when read, and the QP (if any) was
        // destroyed by its owner before this drop; destroyed once, here.
        if unsafe { sys::rdma_destroy_id(self.id) } != 0 {
            log::error!(
                "rdma_destroy_id failed: {}",
                std::io::Error::last_os_error()
            );
        }
        drop(queued);
        // Then the channel, if this id was its last user.
    }
}

/// The new id a connect request carries, until it is taken (destroyed if it never is).
pub(crate) struct NewId(*mut sys::rdma_cm_id);

// SAFETY: an rdmacm id may be used and destroyed from any thread.
unsafe impl Send for NewId {}
// SAFETY: nothing is done through a shared reference.
unsafe impl Sync for NewId {}

impl NewId {
    fn into_raw(self) -> *mut sys::rdma_cm_id {
        let id = self.0;
        std::mem::forget(self);
        id
    }
}

impl Drop for NewId {
    fn drop(&mut self) {
        // SAFETY: the request's id is ours alone (its event is acknowledged, it has no QP and
        // no table entry), destroyed once, here: the kernel refuses the connection.
        unsafe { sys::rdma_destroy_id(self.0) };
    }
}

impl std::fmt::Debug for NewId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NewId")
    }
}

/// The kind of an rdmacm event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmEventKind(pub u32);

impl CmEventKind {
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`.
    pub const CONNECT_REQUEST: Self =
        Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST.0);
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    pub const ESTABLISHED: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED.0);
    /// `RDMA_CM_EVENT_REJECTED`.
    pub const REJECTED: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED.0);
    /// `RDMA_CM_EVENT_DISCONNECTED`: the peer (or we) disconnected.
    pub const DISCONNECTED: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED.0);
    /// `RDMA_CM_EVENT_UNREACHABLE`.
    pub const UNREACHABLE: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_UNREACHABLE.0);
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    pub const CONNECT_ERROR: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_ERROR.0);
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    pub const DEVICE_REMOVAL: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL.0);
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the QP may be reused.
    pub const TIMEWAIT_EXIT: Self = Self(sys::rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT.0);

    /// The event's name from `rdma_event_str`.
    pub fn name(self) -> String {
        // SAFETY: rdma_event_str accepts any value and returns a static string.
        let s = unsafe { sys::rdma_event_str(sys::rdma_cm_event_type(self.0)) };
        if s.is_null() {
            return format!("event {}", self.0);
        }
        // SAFETY: checked non-NULL; static string.
        unsafe { std::ffi::CStr::from_ptr(s) }
            .to_string_lossy()
            .into_owned()
    }
}

/// An rdmacm event, copied out of rdmacm and already acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// The event's status (for rejects: the CM reject reason; otherwise 0 or a negative errno).
    pub status: i32,
    /// Private data carried by the event. IB/RoCE deliver it zero-padded to the message's
    /// maximum, so its length is not the length the peer sent.
    pub private_data: Vec<u8>,
    /// A connect request's new id.
    pub(crate) new_id: Option<NewId>,
}

impl CmEvent {
    /// Copies what rdmx needs out of `event` and acknowledges it; returns it with the key of
    /// the id it concerns (a connect request: its listener's).
    ///
    /// # Safety
    /// `event` must come from `rdma_get_cm_event` and not be acknowledged yet.
    unsafe fn take(event: *mut sys::rdma_cm_event) -> (Key, CmEvent) {
        // SAFETY: the caller guarantees event is valid and unacknowledged.
        let e = unsafe { &*event };
        let kind = CmEventKind(e.event.0);
        // SAFETY: for connection events param.conn is the active union member; the data pointer
        // is valid for private_data_len bytes until the event is acknowledged.
        let private_data = unsafe {
            let conn = e.param.conn;
            if conn.private_data.is_null() || conn.private_data_len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len.into(),
                )
                .to_vec()
            }
        };
        let (key, new_id) = if kind == CmEventKind::CONNECT_REQUEST && !e.id.is_null() {
            (e.listen_id as Key, Some(NewId(e.id)))
        } else {
            (e.id as Key, None)
        };
        let out = CmEvent {
            kind,
            status: e.status,
            private_data,
            new_id,
        };
        // SAFETY: event is valid and acknowledged exactly once, here.
        if unsafe { sys::rdma_ack_cm_event(event) } != 0 {
            log::error!(
                "rdma_ack_cm_event failed: {}",
                std::io::Error::last_os_error()
            );
        }
        (key, out)
    }
}
