//! The RDMA transport under a worker: one device's PD, CQ, SRQ and buffer pools (this
//! module; made on first use by [`RdmaIface`]), the state its connections share under the
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

use std::sync::atomic::{AtomicU32, Ordering};

use rdmx_conn::{
    Access, CompletionQueue, Device, ProtectionDomain, QpConfig, RegisteredBuf, SharedReceiveQueue,
};

use crate::config::Config;
use crate::error::{Error, Result};

/// Cookie tags: the top two bits of a work request's cookie say what it was (a READ's key
/// leaves them free: [`super::READ_KEY_MASK`]).
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
    pub(crate) qp_config: QpConfig,
    /// Bytes of receive buffers posted on the SRQ (fixed for the worker's life).
    pub(crate) recv_bytes: u64,
    /// Whether rendezvous sends are exposed through memory windows (the device has type-2
    /// windows): each bound to one connection's QP, over exactly one message.
    pub(crate) windows: bool,
    /// Completion queue entries left for send work once every SRQ buffer has its own.
    send_cqes: u32,
    /// Connections over these resources (see [`Rdma::link_share`]).
    links: AtomicU32,
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
                send_cqes: cqe - srq_depth,
                links: AtomicU32::new(0),
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
