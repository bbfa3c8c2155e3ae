//! An RDMA connection of a worker and its ordered queue of work to post.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use rdmx_conn::{Connection, MemoryWindow, RegisteredBuf, RemoteBuf};
use rdmx_proto::ConnId;

use super::{COOKIE_BIND, COOKIE_SEND};

/// The largest frame sent inline (copied into the work request): what rdmx asks of the QP,
/// held in the queue without an allocation.
pub(crate) const INLINE_MAX: usize = 128;

/// Work waiting to be posted on a connection.
pub(crate) enum Outgoing {
    /// A frame small enough to be copied into the work request (its first `len` bytes).
    Inline { bytes: [u8; INLINE_MAX], len: u16 },
    /// A frame in a registered send buffer.
    Frame { buf: RegisteredBuf, len: usize },
    /// An RDMA READ into a piece of a user buffer.
    Read {
        target: RegisteredBuf,
        len: usize,
        remote: RemoteBuf,
        cookie: u64,
    },
    /// Bind a memory window on the connection's QP (before the RTS that announces it).
    Bind(MemoryWindow),
    /// Disconnect once everything before it is posted.
    Disconnect,
}

/// An RDMA connection of a worker, with its queue of work to post.
pub(crate) struct RdmaLink {
    id: ConnId,
    pub(crate) conn: Connection,
    /// Work to post, in order (its capacity is kept: no allocation per message).
    queue: Mutex<VecDeque<Outgoing>>,
    in_flight: AtomicU32,
    depth: u32,
    /// Work whose post failed, for the worker to report as failed completions.
    pub(crate) failures: Mutex<Vec<Outgoing>>,
}

impl RdmaLink {
    pub(crate) fn new(id: ConnId, conn: Connection, depth: u32) -> Self {
        RdmaLink {
            id,
            conn,
            queue: Mutex::new(VecDeque::new()),
            in_flight: AtomicU32::new(0),
            depth,
            failures: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn max_inline(&self) -> usize {
        self.conn.max_inline() as usize
    }

    /// Queues work; call [`RdmaLink::flush`] after releasing the worker's state lock.
    pub(crate) fn push(&self, item: Outgoing) {
        self.queue.lock().push_back(item);
    }

    /// A posted work request completed.
    pub(crate) fn completed(&self) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Whether nothing is posted or waiting.
    pub(crate) fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0 && self.queue.lock().is_empty()
    }

    /// Work requests posted and not completed.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Posts queued work in order while the send queue has room. Returns whether a post
    /// failed (the failure is recorded in `failures` for the worker to report). `closing`
    /// says whether failures are expected (the connection is going away).
    pub(crate) fn flush(&self, closing: bool) -> bool {
        let mut stalled = self.queue.lock();
        let mut failed = false;
        loop {
            let Some(item) = stalled.pop_front() else {
                break;
            };
            if let Outgoing::Disconnect = item {
                if let Err(e) = self.conn.disconnect() {
                    log::debug!("disconnect of {:?}: {e}", self.id);
                }
                continue;
            }
            if self.in_flight.load(Ordering::Acquire) >= self.depth {
                stalled.push_front(item);
                break;
            }
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            let cookie_send = COOKIE_SEND | self.id.0;
            let result = match item {
                Outgoing::Inline { bytes, len } => {
                    match self
                        .conn
                        .post_send_inline(&bytes[..len as usize], cookie_send)
                    {
                        Ok(()) => Ok(()),
                        Err(e) => Err((e, Outgoing::Inline { bytes, len })),
                    }
                }
                Outgoing::Frame { buf, len } => self
                    .conn
                    .post_send(buf, len, cookie_send)
                    .map_err(|(e, buf)| (e, Outgoing::Frame { buf, len })),
                Outgoing::Read {
                    target,
                    len,
                    remote,
                    cookie,
                } => self
                    .conn
                    .post_read(target, len, remote, cookie)
                    .map_err(|(e, target)| {
                        (
                            e,
                            Outgoing::Read {
                                target,
                                len,
                                remote,
                                cookie,
                            },
                        )
                    }),
                Outgoing::Bind(window) => {
                    match self.conn.post_bind(&window, COOKIE_BIND | self.id.0) {
                        Ok(()) => Ok(()),
                        Err(e) => Err((e, Outgoing::Bind(window))),
                    }
                }
                Outgoing::Disconnect => unreachable!("handled above"),
            };
            if let Err((e, item)) = result {
                self.completed();
                if e.is_queue_full() && self.in_flight() > 0 {
                    // The provider's queue is smaller than we thought: wait for completions.
                    log::debug!(
                        "send queue of {:?} full; retrying after completions",
                        self.id
                    );
                    stalled.push_front(item);
                    break;
                }
                if !closing {
                    log::warn!("posting on {:?} failed: {e}", self.id);
                }
                self.failures.lock().push(item);
                failed = true;
            }
        }
        failed
    }
}
