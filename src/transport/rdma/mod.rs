//! The RDMA transport under a worker: one device's PD, CQ, SRQ and buffer pools, and the
//! rdmacm event channel all its connections' events come through (this module; made on
//! first use by [`RdmaIface`]), the state its connections share under the
//! worker's protocol lock ([`RdmaLockedIface`]: send buffers, registration cache, memory windows),
//! what its completions mean (`completions`), and the connections, each with an ordered
//! queue of work to post ([`RdmaLink`]).
//!
//! Work for a connection is pushed (in protocol order, under the worker's state lock) onto
//! its queue and posted later by whichever thread flushes the connection, holding only that
//! connection's post lock — no worker-wide lock is held across a post. A connection never
//! has more than `send_depth` work requests posted, nor more than its share of the
//! completion queue ([`Rdma::link_share`]); the rest waits in its queue, so a full send
//! queue is back-pressure, not an error, however many connections the worker has.

mod completions;
mod iface;
mod link;
mod pool;
mod rcache;
mod windows;

pub(crate) use iface::{RdmaIface, RdmaLockedIface};
pub(crate) use link::RdmaLink;
pub(crate) use rcache::RegCache;

use link::{Outgoing, INLINE_MAX};
use pool::SendPool;
use windows::Windows;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

use rdmx_conn::{
    Access, CompletionQueue, Device, EventChannel, ProtectionDomain, QpConfig, RegisteredBuf,
    SharedReceiveQueue,
};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::Transport;

/// Cookie tags: the top two bits of a work request's cookie say what it was (a READ's key
/// leaves them free: [`super::READ_KEY_MASK`]).
/// The largest one-sided WRITE or READ that goes through a bounce buffer (see
/// [`link::RdmaLink`]'s `start_rma`).
const BOUNCE_LEN: usize = 4096;
const COOKIE_SEND: u64 = 1 << 62;
const COOKIE_READ: u64 = 2 << 62;
const COOKIE_BIND: u64 = 3 << 62;
const COOKIE_KIND: u64 = 3 << 62;
const _: () = assert!(COOKIE_KIND == !super::READ_KEY_MASK);

/// One device's shared resources.
pub(crate) struct Rdma {
    pub(crate) device: Device,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) srq: SharedReceiveQueue,
    /// The rdmacm event channel of all the worker's connections (in `qp_config` too): one
    /// descriptor however many connections there are, as UCX's worker has.
    pub(crate) events: EventChannel,
    pub(crate) qp_config: QpConfig,
    /// Bytes of receive buffers posted on the SRQ (fixed for the worker's life).
    pub(crate) recv_bytes: u64,
    /// Whether rendezvous sends are exposed through memory windows (the device has type-2
    /// windows): each bound to one connection's QP, over exactly one message.
    pub(crate) windows: bool,
    /// Whether a connection posts a memory window bind only when nothing else it posted is
    /// still in flight (see [`link::RdmaLink`]'s posting): Soft-RoCE's way around a bind that
    /// its retransmission would execute again.
    pub(crate) bind_when_idle: bool,
    /// Completion queue entries left for send work once every SRQ buffer has its own.
    send_cqes: u32,
    /// Connections over these resources (see [`Rdma::link_share`]).
    links: AtomicU32,
    /// Receive buffers held back from the SRQ, posted when it runs low (see [`Reserve`]).
    pub(crate) reserve: Reserve,
    /// How long a connection may post nothing before it probes its peer
    /// (`RDMX_KEEPALIVE_MS`, in ns; 0: never).
    pub(crate) keepalive_ns: u64,
}

/// Receive buffers held back from the SRQ: `RDMX_SRQ_DEPTH` are posted, and an eighth
/// more wait here. The SRQ's limit is armed at an eighth of the depth; when fewer are
/// posted (frames arrive faster than they are handled, past what credits promised), the
/// device says so (`IBV_EVENT_SRQ_LIMIT_REACHED`) and the reserve is posted, before the SRQ
/// runs dry and senders meet RNR. Afterwards reposted buffers refill the reserve, and the
/// limit is armed again once it is whole.
pub(crate) struct Reserve {
    bufs: Mutex<Vec<(RegisteredBuf, u64)>>,
    /// How many buffers the reserve holds when whole (0: the device's SRQ has no room for
    /// one, and no limit is armed).
    size: usize,
    /// The limit armed: fewer posted receives than this raise the event.
    limit: u32,
    /// The reserve was posted and is being refilled.
    refilling: AtomicBool,
    /// Limit events seen so far.
    pub(crate) events: AtomicU64,
}

impl Reserve {
    /// Arms the SRQ's limit (when there is a reserve).
    fn arm(&self, srq: &SharedReceiveQueue) {
        if self.size > 0 {
            if let Err(e) = srq.arm_limit(self.limit) {
                log::warn!("{e}: RNR retry is the only backstop");
            }
        }
    }

    /// Holds `bufs` back, arming the limit.
    pub(crate) fn fill(&self, srq: &SharedReceiveQueue, bufs: Vec<(RegisteredBuf, u64)>) {
        self.bufs.lock().extend(bufs);
        self.arm(srq);
    }

    /// If the SRQ reported its limit reached: posts the reserve and returns true.
    pub(crate) fn post_if_low(&self, srq: &SharedReceiveQueue) -> bool {
        if self.size == 0 || self.refilling.load(Ordering::Acquire) || !srq.limit_reached() {
            return false;
        }
        let bufs = std::mem::take(&mut *self.bufs.lock());
        log::debug!(
            "SRQ below {} receives: posting {} more",
            self.limit,
            bufs.len()
        );
        for (buf, id) in bufs {
            if let Err((e, buf)) = srq.post_recv(buf, id) {
                log::error!("posting reserve receive buffer {id}: {e}");
                self.bufs.lock().push((buf, id));
            }
        }
        self.refilling.store(true, Ordering::Release);
        self.events.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// While refilling, keeps a buffer about to be reposted (returns None); else gives it
    /// back to be posted. Arms the limit again once the reserve is whole.
    pub(crate) fn keep(
        &self,
        srq: &SharedReceiveQueue,
        buf: (RegisteredBuf, u64),
    ) -> Option<(RegisteredBuf, u64)> {
        if !self.refilling.load(Ordering::Acquire) {
            return Some(buf);
        }
        let mut bufs = self.bufs.lock();
        if bufs.len() >= self.size {
            return Some(buf);
        }
        bufs.push(buf);
        if bufs.len() == self.size {
            drop(bufs);
            self.refilling.store(false, Ordering::Release);
            self.arm(srq);
        }
        None
    }
}

/// The fewest work requests a connection may always have posted.
const MIN_LINK_SHARE: u32 = 4;

impl Rdma {
    /// How many work requests one connection may have posted: half the CQ's send entries
    /// split evenly between the connections, so that the CQ cannot overflow however many
    /// connections there are (half, because a connection that joins may find the others
    /// still holding their earlier, larger shares), at least [`MIN_LINK_SHARE`].
    pub(crate) fn link_share(&self) -> u32 {
        let links = self.links.load(Ordering::Relaxed).max(1);
        (self.send_cqes / 2 / links).max(MIN_LINK_SHARE)
    }

    /// A connection is made over these resources.
    pub(crate) fn link_joined(&self) {
        let n = self.links.fetch_add(1, Ordering::Relaxed) + 1;
        if n * MIN_LINK_SHARE * 2 > self.send_cqes {
            log::warn!(
                "{n} connections on a CQ with {} send entries: completions may overflow it",
                self.send_cqes
            );
        }
    }

    /// A connection over these resources is gone.
    pub(crate) fn link_left(&self) {
        self.links.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Rdma {
    /// Creates the PD, CQ (with a completion channel), SRQ and its receive buffers, the
    /// connections' event channel, and
    /// returns them with the receive buffers (cookie = buffer index): the first
    /// `RDMX_SRQ_DEPTH` to post, the rest for the [`Reserve`].
    pub(crate) fn new(device: &Device, cfg: &Config) -> Result<(Rdma, Vec<RegisteredBuf>)> {
        let limits = device.limits()?;
        let srq_depth = cfg.srq_depth();
        // An eighth more buffers are held in reserve, if the device's SRQ has room for them.
        let reserve = (srq_depth / 8).min(limits.max_srq_wr.saturating_sub(srq_depth));
        if srq_depth > limits.max_srq_wr {
            return Err(Error::Config(format!(
                "RDMX_SRQ_DEPTH={srq_depth} exceeds {}'s limit of {} receive buffers per SRQ",
                device.name(),
                limits.max_srq_wr
            )));
        }
        let send_depth = send_depth(cfg).min(limits.max_qp_wr);
        // Room for every SRQ buffer and for full send queues on 256 connections (more
        // share it: `link_share`), as far as the device allows.
        let want_cqe = u64::from(srq_depth) + 256 * u64::from(send_depth);
        let cqe = want_cqe.min(u64::from(limits.max_cqe)) as u32;
        if cqe <= srq_depth {
            return Err(Error::Config(format!(
                "RDMX_SRQ_DEPTH={srq_depth} leaves no room for send completions in {}'s \
                 largest completion queue ({} entries)",
                device.name(),
                limits.max_cqe
            )));
        }
        let pd = ProtectionDomain::new(device)?;
        let cq = CompletionQueue::new(device, cqe, true)?;
        let srq = SharedReceiveQueue::new(&pd, &cq, srq_depth + reserve)?;
        // (RDMA's own size: the preferred transport may be another, with larger frames.)
        let buf_size = cfg.recv_buf_size_for(Transport::Rdma);
        let bufs = pd.register_chunks(
            buf_size as usize,
            (srq_depth + reserve) as usize,
            Access::LOCAL_WRITE,
        )?;
        let events = EventChannel::new()?;
        let mut qp_config = QpConfig::new(&pd, &cq, Some(&srq), &events);
        qp_config.send_depth = send_depth;
        qp_config.max_inline = INLINE_MAX as u32;
        // A dead peer must surface as a failed work request in bounded time: QpConfig's 6
        // tries (rxe retries 7 for ever) of an ACK timeout the keepalive interval implies.
        qp_config.ack_timeout = cfg.rc_ack_timeout();
        log::debug!(
            "worker resources on {}: SRQ {srq_depth} x {} B, CQ {cqe}, send depth {send_depth}",
            device.name(),
            buf_size
        );
        Ok((
            Rdma {
                device: device.clone(),
                pd,
                cq,
                srq,
                events,
                qp_config,
                recv_bytes: u64::from(srq_depth + reserve) * u64::from(buf_size),
                windows: limits.memory_windows,
                bind_when_idle: limits.memory_windows && limits.is_soft_roce(),
                send_cqes: cqe - srq_depth,
                links: AtomicU32::new(0),
                keepalive_ns: cfg.keepalive().as_nanos() as u64,
                reserve: Reserve {
                    bufs: Mutex::new(Vec::new()),
                    size: reserve as usize,
                    limit: (srq_depth / 8).max(1),
                    refilling: AtomicBool::new(false),
                    events: AtomicU64::new(0),
                },
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
