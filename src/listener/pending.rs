//! The accepts a listener has under way: answered, their setup waiting on the peer, each
//! with a deadline, at most a bound at once (see [`Listener::accept`](super::Listener::accept)).
//!
//! Each is named by a token: an RDMA accept's events are sorted into its queue on the RDMA
//! listener's event channel, which reports its token; a shared-memory accept's hand-over
//! socket is in the listener's epoll set under it. Only those reported are looked at, so
//! many idle ones cost nothing per call.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::ep::Ep;
use crate::readiness::{Interest, Registry};
use crate::worker::PendingAccept;

/// The first token of an accept under way (those below are the listener's own).
const FIRST: u64 = 16;

/// Whether `token` (of the listener's epoll set) names an accept under way.
pub(super) fn is_pending(token: u64) -> bool {
    token >= FIRST
}

/// See the module docs.
pub(super) struct Pending {
    table: Mutex<Table>,
    /// How many are under way (the table's count, read without its lock).
    under_way: AtomicUsize,
    /// The most at once.
    max: usize,
    /// How long each has from its answer.
    timeout: Duration,
}

#[derive(Default)]
struct Table {
    /// By token: the order they were answered in.
    entries: BTreeMap<u64, Entry>,
    next: u64,
    /// Endpoints set up and not returned yet.
    ready: VecDeque<Ep>,
}

struct Entry {
    accept: Box<PendingAccept>,
    deadline: Instant,
}

impl Pending {
    pub(super) fn new(max: usize, timeout: Duration) -> Self {
        Pending {
            table: Mutex::default(),
            under_way: AtomicUsize::new(0),
            max: max.max(1),
            timeout,
        }
    }

    /// How many are under way.
    pub(super) fn len(&self) -> usize {
        self.under_way.load(Ordering::Acquire)
    }

    /// Whether none is under way (told without the lock).
    pub(super) fn is_idle(&self) -> bool {
        self.len() == 0
    }

    /// The earliest deadline of those under way.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let t = self.table.lock();
        // (All have the same timeout: the oldest's comes first.)
        t.entries.first_key_value().map(|(_, e)| e.deadline)
    }

    /// Keeps `accept` until its peer has done its part or its deadline passes; past the
    /// bound, the oldest is dropped.
    pub(super) fn add(&self, accept: Box<PendingAccept>, poll: &Registry) {
        let mut t = self.table.lock();
        let token = FIRST + t.next;
        t.next += 1;
        accept.set_token(token);
        if let Some(fd) = accept.fd() {
            if let Err(e) = poll.add(fd, token, Interest::Read) {
                log::warn!(
                    "dropping the connection from {:?}: cannot watch its setup: {e}",
                    accept.peer_addr()
                );
                return;
            }
        }
        let deadline = Instant::now()
            .checked_add(self.timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(1 << 32));
        t.entries.insert(token, Entry { accept, deadline });
        let oldest = match t.entries.len() > self.max {
            true => t.entries.pop_first().map(|(_, old)| old),
            false => None,
        };
        // Counted out before it is closed (see `progress`).
        self.under_way.store(t.entries.len(), Ordering::Release);
        drop(t);
        if let Some(old) = oldest {
            unwatch(&old.accept, poll);
            log::warn!(
                "dropping the {} connection from {:?}: {} accepts are under way, its setup \
                 the oldest",
                old.accept.transport(),
                old.accept.peer_addr(),
                self.max
            );
        }
    }

    /// Looks at the accepts named by `news` (which appends the tokens of those with news,
    /// called under the table's lock: tokens read are never left unhandled by a caller
    /// that waits for the lock), sets up those whose peer did its part, drops those that
    /// failed or whose deadline passed, and returns an endpoint set up (the oldest first),
    /// if there is one. With `wait` false, a table another thread holds is left to it.
    pub(super) fn progress(
        &self,
        wait: bool,
        news: impl FnOnce(&mut Vec<u64>),
        poll: &Registry,
    ) -> Option<Ep> {
        let mut t = match wait {
            true => self.table.lock(),
            false => self.table.try_lock()?,
        };
        let mut tokens = Vec::new();
        news(&mut tokens);
        if t.entries.is_empty() && t.ready.is_empty() {
            return None;
        }
        for token in &tokens {
            let Some(entry) = t.entries.get_mut(token) else {
                continue;
            };
            let done = match entry.accept.poll() {
                Ok(false) => continue,
                Ok(true) => Ok(()),
                Err(e) => Err(e),
            };
            let entry = t.entries.remove(token).expect("looked up");
            unwatch(&entry.accept, poll);
            let peer = entry.accept.peer_addr();
            let transport = entry.accept.transport();
            match done.and_then(|()| (*entry.accept).finish()) {
                Ok(ep) => t.ready.push_back(ep),
                Err(e) => log::warn!(
                    "accepting the {transport} connection from {peer:?} failed: {e}; the \
                     others go on"
                ),
            }
        }
        let now = Instant::now();
        let mut expired = Vec::new();
        while let Some(entry) = t.entries.first_entry() {
            if entry.get().deadline > now {
                break;
            }
            let entry = entry.remove();
            unwatch(&entry.accept, poll);
            expired.push(entry);
        }
        // Counted out before they are closed: whoever sees a connection closed sees it gone.
        self.under_way.store(t.entries.len(), Ordering::Release);
        let ep = t.ready.pop_front();
        drop(t);
        for entry in expired {
            log::warn!(
                "dropping the {} connection from {:?}: its setup did not complete within {:?} \
                 (the peer did not do its part)",
                entry.accept.transport(),
                entry.accept.peer_addr(),
                self.timeout
            );
        }
        ep
    }

    /// Keeps `ep`, set up, for the next [`Pending::progress`].
    pub(super) fn queue(&self, ep: Ep) {
        self.table.lock().ready.push_front(ep);
    }
}

fn unwatch(accept: &PendingAccept, poll: &Registry) {
    if let Some(fd) = accept.fd() {
        if let Err(e) = poll.remove(fd) {
            log::debug!("epoll_ctl(DEL): {e}");
        }
    }
}
