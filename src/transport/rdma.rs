//! The RDMA transport under a worker: one device's PD, CQ, SRQ and buffer pools, and the
//! connections, each with an ordered queue of work to post.
//!
//! Work for a connection is pushed (in protocol order, under the worker's state lock) onto
//! its lock-free queue and posted later by whichever thread flushes the connection, holding
//! only that connection's post lock — no worker-wide lock is held across a post. A connection
//! never has more than `send_depth` work requests posted; the rest waits in its queue, so a
//! full send queue is back-pressure, not an error.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use rdmx_conn::{
    Access, CompletionQueue, Connection, Device, MemoryWindow, ProtectionDomain, QpConfig,
    RegisteredBuf, RemoteBuf, SharedReceiveQueue,
};
use rdmx_proto::{ConnId, UserBufId};
use rustc_hash::FxHashMap as HashMap;

use crate::config::{Config, RndvRegistration};
use crate::error::{Error, Result};
use crate::usermem::{RegCache, UserMem};

/// Cookie tags: the top two bits of a work request's cookie say what it was.
pub(crate) const COOKIE_SEND: u64 = 1 << 62;
pub(crate) const COOKIE_READ: u64 = 2 << 62;
pub(crate) const COOKIE_BIND: u64 = 3 << 62;
pub(crate) const COOKIE_KIND: u64 = 3 << 62;

/// One device's shared resources.
pub(crate) struct Rdma {
    pub(crate) device: Device,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) srq: SharedReceiveQueue,
    pub(crate) qp_config: QpConfig,
    /// Bytes of receive buffers posted on the SRQ (fixed for the worker's life).
    pub(crate) recv_bytes: u64,
    /// Whether rendezvous sends are exposed through memory windows (the device has type-2
    /// windows): each bound to one connection's QP, over exactly one message.
    pub(crate) windows: bool,
}

impl Rdma {
    /// Creates the PD, CQ (with a completion channel), SRQ and its receive buffers, and
    /// returns them with the receive buffers to post (cookie = buffer index).
    pub(crate) fn new(device: &Device, cfg: &Config) -> Result<(Rdma, Vec<RegisteredBuf>)> {
        let limits = device.limits()?;
        let srq_depth = cfg.srq_depth();
        if srq_depth > limits.max_srq_wr {
            return Err(Error::Config(format!(
                "RDMX_SRQ_DEPTH={srq_depth} exceeds {}'s limit of {} receive buffers per SRQ",
                device.name(),
                limits.max_srq_wr
            )));
        }
        let send_depth = send_depth(cfg).min(limits.max_qp_wr);
        let max_conns = (srq_depth / u32::from(cfg.credits())).max(1);
        let want_cqe = u64::from(srq_depth) + u64::from(max_conns) * u64::from(send_depth);
        let cqe = want_cqe.min(u64::from(limits.max_cqe)) as u32;
        let pd = ProtectionDomain::new(device)?;
        let cq = CompletionQueue::new(device, cqe, true)?;
        let srq = SharedReceiveQueue::new(&pd, &cq, srq_depth)?;
        let bufs = pd.register_chunks(
            cfg.recv_buf_size() as usize,
            srq_depth as usize,
            Access::LOCAL_WRITE,
        )?;
        let mut qp_config = QpConfig::new(&pd, &cq, Some(&srq));
        qp_config.send_depth = send_depth;
        qp_config.max_inline = INLINE_MAX as u32;
        log::debug!(
            "worker resources on {}: SRQ {srq_depth} x {} B, CQ {cqe}, send depth {send_depth}",
            device.name(),
            cfg.recv_buf_size()
        );
        Ok((
            Rdma {
                device: device.clone(),
                pd,
                cq,
                srq,
                qp_config,
                recv_bytes: u64::from(srq_depth) * u64::from(cfg.recv_buf_size()),
                windows: limits.memory_windows,
            },
            bufs,
        ))
    }
}

/// Work requests a connection may have posted: a full window of data frames and credit
/// frames, plus RDMA READs.
fn send_depth(cfg: &Config) -> u32 {
    u32::from(cfg.credits()) * 2 + 64
}

/// Registered send buffers, grown on demand in chunks of `grow` buffers.
pub(crate) struct SendPool {
    free: Vec<RegisteredBuf>,
    buf_len: usize,
    grow: usize,
    /// Bytes registered for send buffers.
    pub(crate) bytes: u64,
}

impl SendPool {
    pub(crate) fn new(buf_len: usize, grow: usize) -> Self {
        SendPool {
            free: Vec::new(),
            buf_len,
            grow: grow.max(1),
            bytes: 0,
        }
    }

    pub(crate) fn buf_len(&self) -> usize {
        self.buf_len
    }

    pub(crate) fn take(&mut self, pd: &ProtectionDomain) -> Result<RegisteredBuf> {
        if let Some(b) = self.free.pop() {
            return Ok(b);
        }
        let chunks = pd.register_chunks(self.buf_len, self.grow, Access::SEND)?;
        self.bytes += (self.buf_len * self.grow) as u64;
        self.free.extend(chunks);
        Ok(self.free.pop().expect("just registered"))
    }

    pub(crate) fn give(&mut self, buf: RegisteredBuf) {
        if buf.len() == self.buf_len {
            self.free.push(buf);
        }
    }
}

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

/// Rendezvous send buffers exposed through memory windows, by buffer.
#[derive(Default)]
pub(crate) struct Windows {
    by_buf: HashMap<UserBufId, MemoryWindow>,
}

impl Windows {
    /// Makes `len` bytes of the send buffer `buf` (`mem`) readable by the peer of `link`
    /// alone, while the rendezvous runs. Where the device has memory windows, the buffer is
    /// registered (per operation or through the cache, as `mode` says) without remote
    /// access, and a window bound to the connection's QP exposes exactly the message (its
    /// bind is queued before the RTS, so it is in place when the peer reads). Otherwise the
    /// buffer is registered in place with remote read for this one operation (never through
    /// the cache, whose regions outlive the message). The caller flushes `link`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn expose(
        &mut self,
        rdma: &Rdma,
        mode: RndvRegistration,
        link: &RdmaLink,
        buf: UserBufId,
        mem: &mut UserMem,
        rcache: &mut RegCache,
        len: u64,
    ) -> std::result::Result<rdmx_proto::RemoteBuf, String> {
        if !rdma.windows {
            mem.register(
                RndvRegistration::PerOperation,
                &rdma.pd,
                rcache,
                Access::REMOTE_READ,
                false,
            )?;
            let r = mem.remote().ok_or("no remote key")?;
            return Ok(rdmx_proto::RemoteBuf {
                addr: r.addr,
                rkey: r.rkey,
            });
        }
        mem.register(mode, &rdma.pd, rcache, Access::WINDOW_READ, false)?;
        let head = mem
            .registered()
            .ok_or("the send buffer is not registered")?;
        let len = usize::try_from(len).map_err(|_| "the message is too long")?;
        let window = MemoryWindow::new(head, len).map_err(|e| e.to_string())?;
        let remote = rdmx_proto::RemoteBuf {
            addr: window.addr(),
            rkey: window.rkey(),
        };
        link.push(Outgoing::Bind(window.clone()));
        self.by_buf.insert(buf, window);
        Ok(remote)
    }

    /// Kills the window of `buf`, if it has one: true once it is dead (or there was none),
    /// false while a bind of it is still posted (try again after polling completions).
    pub(crate) fn invalidate(&mut self, buf: UserBufId) -> bool {
        match self.by_buf.remove(&buf) {
            None => true,
            Some(window) => match window.invalidate() {
                Ok(()) => true,
                Err(window) => {
                    self.by_buf.insert(buf, window);
                    false
                }
            },
        }
    }
}
