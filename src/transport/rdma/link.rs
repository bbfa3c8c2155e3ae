//! An RDMA connection of a worker: its ordered queue of work to post, and what the worker
//! asks of it ([`TransportLink`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdmx_conn::{Access, CmEventKind, Connection, MemoryWindow, RegisteredBuf, RemoteBuf};
use rdmx_proto::rma::AtomicOp;
use rdmx_proto::{ConnId, UserBufId, VerbsOp};

use super::{Rdma, COOKIE_BIND, COOKIE_KIND, COOKIE_READ, COOKIE_SEND};
use crate::transport::{
    LinkEvent, LockedIfaces, PollScratch, Queued, ReadOp, RmaWork, Transport, TransportLink,
};
use crate::usermem::UserMem;

/// The largest frame sent inline (copied into the work request): what rdmx asks of the QP,
/// held in the queue without an allocation.
pub(super) const INLINE_MAX: usize = 128;

/// Work waiting to be posted on a connection.
pub(super) enum Outgoing {
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
    /// A one-sided RDMA WRITE from a piece of a user buffer.
    Write {
        source: RegisteredBuf,
        len: usize,
        remote: RemoteBuf,
        cookie: u64,
    },
    /// A one-sided atomic operation, its result into a buffer of the worker's pool.
    Atomic {
        result: RegisteredBuf,
        remote: RemoteBuf,
        op: rdmx_conn::AtomicOp,
        cookie: u64,
    },
    /// Bind a memory window on the connection's QP (before the RTS that announces it).
    Bind(MemoryWindow),
    /// A liveness probe (a zero-length RDMA WRITE: see [`RdmaLink::keepalive`]).
    Probe,
    /// Disconnect once everything before it is posted.
    Disconnect,
}

/// When a link last looked at its own activity, for the keepalive.
#[derive(Default)]
struct Liveness {
    /// The coarse time of the next look.
    next_check: u64,
    /// Work requests posted (probes aside) as of the last look.
    posts_seen: u64,
}

/// An RDMA connection of a worker, with its queue of work to post.
pub(crate) struct RdmaLink {
    id: ConnId,
    conn: Connection,
    /// The worker's device resources (the PD its memory is registered with).
    rdma: Arc<Rdma>,
    /// Work to post, in order (its capacity is kept: no allocation per message).
    queue: Mutex<VecDeque<Outgoing>>,
    in_flight: AtomicU32,
    depth: u32,
    /// Work whose post failed, for the worker to report as failed completions.
    failures: Mutex<Vec<Outgoing>>,
    /// Work requests posted so far, probes aside (the keepalive's sign of activity).
    posts: AtomicU64,
    liveness: Mutex<Liveness>,
}

impl RdmaLink {
    /// The link of the worker's connection `id` over `conn`, made with `rdma`'s QP settings
    /// (its events come through the worker's event channel, which names it by `id`).
    pub(crate) fn new(id: ConnId, conn: Connection, rdma: Arc<Rdma>) -> Self {
        rdma.link_joined();
        conn.set_event_token(id.0);
        RdmaLink {
            id,
            conn,
            depth: rdma.qp_config.send_depth,
            rdma,
            queue: Mutex::new(VecDeque::new()),
            in_flight: AtomicU32::new(0),
            failures: Mutex::new(Vec::new()),
            posts: AtomicU64::new(0),
            liveness: Mutex::new(Liveness::default()),
        }
    }

    fn max_inline(&self) -> usize {
        self.conn.max_inline() as usize
    }

    /// Queues work; it is posted by the next [`TransportLink::flush`], after the worker's
    /// state lock is released.
    pub(super) fn push(&self, item: Outgoing) {
        self.queue.lock().push_back(item);
    }

    /// A posted work request completed.
    fn completed(&self) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Work requests posted and not completed.
    fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// How much work may be in flight on this link now: its send queue's depth, or less while
    /// many links share the device.
    fn depth_now(&self) -> u32 {
        self.depth.min(self.rdma.link_share())
    }

    /// Posts one piece of work (not a disconnect), counting it in flight; on failure it is
    /// counted out again and given back with the error.
    // (The error hands the work item back by value, as the posting calls do: no allocation
    // on the path of a failure that requeues it.)
    #[allow(clippy::result_large_err)]
    fn post_one(&self, item: Outgoing) -> Result<(), (rdmx_conn::Error, Outgoing)> {
        let cookie_send = COOKIE_SEND | self.id.0;
        self.counted(matches!(item, Outgoing::Probe), || match item {
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
            Outgoing::Write {
                source,
                len,
                remote,
                cookie,
            } => self
                .conn
                .post_write(source, len, remote, cookie)
                .map_err(|(e, source)| {
                    (
                        e,
                        Outgoing::Write {
                            source,
                            len,
                            remote,
                            cookie,
                        },
                    )
                }),
            Outgoing::Atomic {
                result,
                remote,
                op,
                cookie,
            } => self
                .conn
                .post_atomic(result, remote.addr, remote.rkey, op, cookie)
                .map_err(|(e, result)| {
                    (
                        e,
                        Outgoing::Atomic {
                            result,
                            remote,
                            op,
                            cookie,
                        },
                    )
                }),
            Outgoing::Bind(window) => match self.conn.post_bind(&window, COOKIE_BIND | self.id.0) {
                Ok(()) => Ok(()),
                Err(e) => Err((e, Outgoing::Bind(window))),
            },
            Outgoing::Probe => self
                .conn
                .post_probe(cookie_send)
                .map_err(|e| (e, Outgoing::Probe)),
            Outgoing::Disconnect => unreachable!("`post` handles disconnects"),
        })
    }

    /// Runs `post`, counting its work request in flight (and among the link's posts unless
    /// it is a `probe`); a failed post is counted out again.
    fn counted<E>(&self, probe: bool, post: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if !probe {
            self.posts.fetch_add(1, Ordering::Relaxed);
        }
        let result = post();
        if result.is_err() {
            self.completed();
        }
        result
    }

    /// Posts queued work in order while the send queue has room. Returns whether a post
    /// failed (the failure is recorded in `failures` for the worker to report). `closing`
    /// says whether failures are expected (the connection is going away).
    fn post(&self, closing: bool) -> bool {
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
            let in_flight = self.in_flight.load(Ordering::Acquire);
            // Soft-RoCE (Linux 6.1, at least) retransmits from the oldest unacknowledged work
            // request and executes again a bind it finds on the way that already took effect
            // and waits only for the work before it to complete. The window is bound by then,
            // so the bind fails, which puts the QP's sender in its error state; there it drops
            // every acknowledgement, so the work before the bind never completes, and no error
            // is ever reported: the connection hangs for good (seen across two guests: a
            // retransmission on a timeout, the RTS of a rendezvous two sends later). Posted on
            // an idle queue, the bind completes at once and no retransmission can reach it.
            if in_flight >= self.depth_now()
                || (in_flight > 0 && self.rdma.bind_when_idle && matches!(item, Outgoing::Bind(_)))
            {
                stalled.push_front(item);
                break;
            }
            if let Err((e, item)) = self.post_one(item) {
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

impl Drop for RdmaLink {
    fn drop(&mut self) {
        self.rdma.link_left();
    }
}

impl TransportLink for RdmaLink {
    fn transport(&self) -> Transport {
        Transport::Rdma
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.conn.peer_addr()
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.conn.local_addr()
    }

    fn peer_private_data(&self) -> &[u8] {
        self.conn.peer_private_data()
    }

    /// None: its rdmacm events come through the worker's event channel, which says when
    /// this link has some.
    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Also reports the rdmacm events that came before the worker knew the link (its
    /// channel said so then, to nobody).
    fn joined(&self, st: &mut LockedIfaces, out: &mut Vec<LinkEvent>) {
        st.rdma.adopt(self.conn.qp_num(), self.id, out);
        self.cm_events(out);
    }

    fn reaped(&self, st: &mut LockedIfaces) {
        st.rdma.forget(self.id);
    }

    /// A frame up to the QP's inline limit is copied into the work request — posted at once
    /// when nothing is queued before it and the send queue has room (the caller holds the
    /// worker's protocol lock: a doorbell, one `write` on Soft-RoCE; it saves the queueing,
    /// the flush after the lock and their atomics on the path of every small message) — and
    /// a larger one into a registered send buffer.
    fn queue_frame(
        &self,
        st: &mut LockedIfaces,
        frame: &rdmx_proto::wire::FrameBuf,
        payload: &[u8],
    ) -> Result<Queued, String> {
        let frame = frame.as_bytes();
        let total = frame.len() + payload.len();
        let item = if total <= self.max_inline().min(INLINE_MAX) {
            let mut queue = self.queue.lock();
            if queue.is_empty() && self.in_flight() < self.depth_now() {
                // Posted at once, gathered from where the frame and the payload are. (If it
                // fails, the flush tries again and reports the failure if it fails again.)
                let posted = self.counted(false, || {
                    self.conn
                        .post_send_inline_gather(&[frame, payload], COOKIE_SEND | self.id.0)
                });
                if posted.is_ok() {
                    return Ok(Queued::Posted);
                }
            }
            let mut bytes = [0u8; INLINE_MAX];
            bytes[..frame.len()].copy_from_slice(frame);
            bytes[frame.len()..total].copy_from_slice(payload);
            queue.push_back(Outgoing::Inline {
                bytes,
                len: total as u16,
            });
            return Ok(Queued::ForFlush);
        } else {
            let pool = &mut st.rdma.send_pool;
            if total > pool.buf_len() {
                return Err(format!("a {total}-byte frame exceeds the send buffers"));
            }
            let mut buf = pool
                .take(&self.rdma.pd)
                .map_err(|e| format!("no send buffer: {e}"))?;
            buf[..frame.len()].copy_from_slice(frame);
            buf[frame.len()..total].copy_from_slice(payload);
            Outgoing::Frame { buf, len: total }
        };
        self.push(item);
        Ok(Queued::ForFlush)
    }

    /// The destination is registered (per operation or through the cache, as configured)
    /// and the READ's range of it taken out until the READ completes.
    fn start_read(
        &self,
        st: &mut LockedIfaces,
        read: ReadOp,
        mem: &mut UserMem,
    ) -> Result<(), String> {
        let st = &mut st.rdma;
        mem.register(
            st.mode,
            &self.rdma.pd,
            &mut st.rcache,
            Access::LOCAL_WRITE,
            true,
        )?;
        let target = mem
            .take_range(read.offset, read.len)
            .ok_or("the READ falls outside the receive buffer")?;
        self.push(Outgoing::Read {
            target,
            len: read.len as usize,
            remote: RemoteBuf {
                addr: read.remote.addr,
                len: read.len as u32,
                rkey: read.remote.rkey,
            },
            cookie: COOKIE_READ | read.key,
        });
        Ok(())
    }

    /// Up to [`super::BOUNCE_LEN`] bytes, a WRITE or READ through a bounce buffer of the
    /// worker's pool (a put's bytes copied into it now); above, a READ into `mem` as a
    /// rendezvous's ([`RdmaLink::start_read`]) or a WRITE from a piece of it registered in
    /// place (or staged); an atomic operation's result goes into an 8-byte buffer of another
    /// pool (`mem` is not used). Reported under the READs' cookie kind: the completion's
    /// kind tells them apart.
    fn start_rma(
        &self,
        st: &mut LockedIfaces,
        work: RmaWork,
        mem: &mut UserMem,
    ) -> Result<bool, String> {
        let cookie = COOKIE_READ | work.key;
        let remote = RemoteBuf {
            addr: work.remote.addr,
            len: u32::try_from(work.len).map_err(|_| "a one-sided work request over 4 GiB")?,
            rkey: work.remote.rkey,
        };
        // Small ones go through a registered bounce buffer: a copy of a few KiB costs less
        // than staging the user's buffer (or registering it).
        if work.len <= super::BOUNCE_LEN as u64 && !matches!(work.op, VerbsOp::Atomic(_)) {
            let mut piece = st.rdma.bounce(&self.rdma.pd)?;
            let len = work.len as usize;
            if work.op == VerbsOp::Write {
                let at = work.offset as usize;
                let src = mem
                    .head(at + len)
                    .and_then(|b| b.get(at..))
                    .ok_or("the WRITE falls outside the put's buffer")?;
                piece[..len].copy_from_slice(src);
                self.push(Outgoing::Write {
                    source: piece,
                    len,
                    remote,
                    cookie,
                });
            } else {
                self.push(Outgoing::Read {
                    target: piece,
                    len,
                    remote,
                    cookie,
                });
            }
            return Ok(true);
        }
        match work.op {
            VerbsOp::Read => self
                .start_read(
                    st,
                    ReadOp {
                        key: work.key,
                        remote: work.remote,
                        len: work.len,
                        buf: UserBufId(0),
                        offset: work.offset,
                    },
                    mem,
                )
                .map(|()| false),
            VerbsOp::Write => {
                let st = &mut st.rdma;
                mem.register(st.mode, &self.rdma.pd, &mut st.rcache, Access::SEND, false)?;
                let source = mem
                    .take_range(work.offset, work.len)
                    .ok_or("the WRITE falls outside the put's buffer")?;
                self.push(Outgoing::Write {
                    source,
                    len: work.len as usize,
                    remote,
                    cookie,
                });
                Ok(false)
            }
            VerbsOp::Atomic(op) => {
                let result = st.rdma.atomic_result(&self.rdma.pd)?;
                let op = match op {
                    AtomicOp::FetchAdd(v) => rdmx_conn::AtomicOp::FetchAdd(v),
                    AtomicOp::CompareSwap { expected, new } => {
                        rdmx_conn::AtomicOp::CompareSwap { expected, new }
                    }
                };
                self.push(Outgoing::Atomic {
                    result,
                    remote,
                    op,
                    cookie,
                });
                Ok(false)
            }
        }
    }

    /// Through a memory window bound to this QP where the device has them (see
    /// [`super::Windows::expose`]).
    fn expose(
        &self,
        st: &mut LockedIfaces,
        buf: UserBufId,
        mem: &mut UserMem,
        len: u64,
    ) -> Result<rdmx_proto::RemoteBuf, String> {
        let st = &mut st.rdma;
        st.windows
            .expose(&self.rdma, st.mode, self, buf, mem, &mut st.rcache, len)
    }

    fn work_done(&self) -> bool {
        self.completed();
        !self.queue.lock().is_empty()
    }

    fn close(&self) {
        self.push(Outgoing::Disconnect);
    }

    fn take_failures(&self, st: &mut LockedIfaces, out: &mut Vec<LinkEvent>) {
        let items: Vec<Outgoing> = std::mem::take(&mut *self.failures.lock());
        let conn = self.id;
        for item in items {
            match item {
                Outgoing::Frame { buf, .. } => {
                    st.rdma.send_pool.give(buf);
                    out.push(LinkEvent::SendFailed { conn });
                }
                Outgoing::Inline { .. } => out.push(LinkEvent::SendFailed { conn }),
                Outgoing::Probe => out.push(LinkEvent::Down {
                    conn,
                    reason: "cannot post a keepalive probe".to_string(),
                    reads_lost: false,
                }),
                Outgoing::Read {
                    target: piece,
                    cookie,
                    ..
                }
                | Outgoing::Write {
                    source: piece,
                    cookie,
                    ..
                } => out.push(LinkEvent::ReadDone {
                    key: cookie & !COOKIE_KIND,
                    piece: Some(piece),
                    ok: false,
                    refused: false,
                    value: 0,
                    posted: false,
                }),
                Outgoing::Atomic { result, cookie, .. } => {
                    st.rdma.atomic_results.push(result);
                    out.push(LinkEvent::ReadDone {
                        key: cookie & !COOKIE_KIND,
                        piece: None,
                        ok: false,
                        refused: false,
                        value: 0,
                        posted: false,
                    });
                }
                // The RTS behind it would announce a key that grants nothing.
                Outgoing::Bind(_) => out.push(LinkEvent::Down {
                    conn,
                    reason: "cannot bind a memory window".to_string(),
                    reads_lost: false,
                }),
                Outgoing::Disconnect => {}
            }
        }
    }

    fn flush(&self, closing: bool) -> bool {
        self.post(closing)
    }

    /// The keepalive, at housekeeping (`now`, coarse ns): a link that posted nothing and
    /// has nothing in flight for a whole interval probes its peer with a zero-length RDMA
    /// WRITE, which the peer's NIC must acknowledge. A dead or unreachable peer fails the
    /// probe (`IBV_WC_RETRY_EXC_ERR`, after the QP's tries) and so the connection. Work in
    /// flight needs no probe: it fails the same way. Returns whether a probe was queued.
    fn keepalive(&self, now: u64) -> bool {
        let interval = self.rdma.keepalive_ns;
        if interval == 0 {
            return false;
        }
        let mut l = self.liveness.lock();
        if now < l.next_check {
            return false;
        }
        let first = l.next_check == 0;
        l.next_check = now.saturating_add(interval);
        let posts = self.posts.load(Ordering::Relaxed);
        let active = posts != l.posts_seen || self.in_flight() > 0;
        l.posts_seen = posts;
        if first || active {
            return false;
        }
        self.push(Outgoing::Probe);
        true
    }

    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0 && self.queue.lock().is_empty()
    }

    /// Takes the connection's rdmacm events, at housekeeping only (when the worker's event
    /// channel said it has some).
    fn poll(&self, housekeeping: bool, _: &mut PollScratch, out: &mut Vec<LinkEvent>) -> usize {
        if housekeeping {
            self.cm_events(out);
        }
        0
    }
}

impl RdmaLink {
    /// Takes the connection's rdmacm events waiting (on the worker's channel), appending what
    /// they mean to `out`.
    fn cm_events(&self, out: &mut Vec<LinkEvent>) {
        loop {
            match self.conn.next_event(Some(Duration::ZERO)) {
                Ok(Some(ev)) => match ev.kind {
                    CmEventKind::DISCONNECTED | CmEventKind::DEVICE_REMOVAL => {
                        let reason = if ev.kind == CmEventKind::DISCONNECTED {
                            "the peer disconnected (rdmacm DISCONNECTED)"
                        } else {
                            "the RDMA device was removed"
                        };
                        out.push(LinkEvent::Down {
                            conn: self.id,
                            reason: reason.to_string(),
                            reads_lost: false,
                        });
                    }
                    other => log::debug!("{:?}: {}", self.id, other.name()),
                },
                Ok(None) => break,
                Err(e) => {
                    log::debug!("events of {:?}: {e}", self.id);
                    break;
                }
            }
        }
    }
}
