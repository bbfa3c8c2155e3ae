//! What each transport keeps for all of a worker's connections over it, like UCX's
//! interfaces: [`Ifaces`] is used without the worker's protocol lock (RDMA's device
//! resources, TCP's exposure table), [`LockedIfaces`] under it (RDMA's send buffers,
//! registration cache, memory windows and frames from QPs not yet known). Both hold one part
//! per transport, which only that transport's code looks into.

#[cfg(feature = "rdma")]
use smallvec::SmallVec;

use rdmx_proto::{ConnId, UserBufId};

#[cfg(feature = "rdma")]
use super::rdma;
use super::shm::ShmRings;
use super::{shm, tcp, LinkEvent, RecvFrame};
use crate::config::Config;
use crate::error::Result;
use crate::usermem::UserMem;

/// The transports' worker-wide parts used without the protocol lock.
pub(crate) struct Ifaces {
    /// RDMA: one device's PD, CQ (with its completion channel) and SRQ, made on first use.
    #[cfg(feature = "rdma")]
    pub(crate) rdma: rdma::RdmaIface,
    /// TCP: the send buffers exposed to READ requests.
    pub(crate) tcp: tcp::TcpIface,
    /// Shared memory: the receive rings, the doorbell, finished READs, made on first use.
    pub(crate) shm: shm::ShmIface,
}

impl Ifaces {
    pub(crate) fn new() -> Self {
        Ifaces {
            #[cfg(feature = "rdma")]
            rdma: rdma::RdmaIface::default(),
            tcp: tcp::TcpIface::new(),
            shm: shm::ShmIface::default(),
        }
    }

    /// The part of the transports' state kept under the protocol lock.
    pub(crate) fn locked(&self, cfg: &Config) -> LockedIfaces {
        LockedIfaces {
            #[cfg(feature = "rdma")]
            rdma: rdma::RdmaLockedIface::new(cfg),
            tcp: self.tcp.locked(),
        }
    }

    /// RDMA: posts the SRQ's reserve if it reported running low; returns whether it did.
    pub(crate) fn srq_low(&self) -> bool {
        #[cfg(feature = "rdma")]
        return self.rdma.srq_low();
        #[cfg(not(feature = "rdma"))]
        false
    }

    /// Polls the worker-wide completion queues (RDMA's CQ) into `scratch`, for
    /// [`LockedIfaces::next_completion`] under the lock; returns how many completions it
    /// found.
    #[inline]
    pub(crate) fn poll(&self, scratch: &mut PollScratch) -> usize {
        #[cfg(feature = "rdma")]
        let n = {
            let n = self.rdma.poll(&mut scratch.wcs);
            // Taken from the end by `LockedIfaces::next_completion`, in order.
            scratch.wcs.reverse();
            n
        };
        #[cfg(not(feature = "rdma"))]
        let n = 0;
        let m = self.shm.poll(&mut scratch.shm_rings, &mut scratch.shm);
        n + m
    }

    /// Whether [`Ifaces::poll`] would surely find nothing now, told without polling: no
    /// RDMA device (whose completion queue only a poll reads) and nothing in shared memory
    /// ([`shm::ShmIface::quiet`]).
    #[inline]
    pub(crate) fn quiet(&self, scratch: &PollScratch) -> bool {
        #[cfg(feature = "rdma")]
        if self.rdma.get().is_some() {
            return false;
        }
        self.shm.quiet(&scratch.shm_rings)
    }

    /// Under the protocol lock, after [`Ifaces::poll`]: hands `frame` every frame waiting
    /// in the shared-memory rings the poll found ready (see [`shm::ShmIface::deliver`]),
    /// and leaves their other events to [`LockedIfaces::next_completion`].
    #[inline]
    pub(crate) fn deliver_shm(&self, scratch: &mut PollScratch, frame: impl FnMut(ConnId, &[u8])) {
        self.shm
            .deliver(&mut scratch.shm_rings, &mut scratch.shm, frame);
        // (Taken from the end, as the RDMA completions are: reversed.)
        if !scratch.shm.is_empty() {
            scratch.shm.reverse();
        }
    }

    /// Before sleeping on the registry: asks for a wake-up on the next completion (RDMA)
    /// and on the next frame (shared memory: `scratch` is the progress lock's, which holds
    /// the rings).
    pub(crate) fn arm(&self, scratch: &mut PollScratch) -> Result<()> {
        #[cfg(feature = "rdma")]
        self.rdma.arm()?;
        self.shm.arm(&mut scratch.shm_rings);
        Ok(())
    }

    /// Awake again after [`Ifaces::arm`]: peers need not ring for what they send (shared
    /// memory's doorbell).
    pub(crate) fn disarm(&self, scratch: &mut PollScratch) {
        self.shm.disarm(&mut scratch.shm_rings);
    }

    /// A readiness token of a worker-wide fd (below the connections' tokens) was reported:
    /// takes what it signalled (RDMA: the completion channel's events). Returns whether
    /// connection events are due (RDMA's rdmacm event channel: [`Ifaces::cm_ready`]).
    pub(crate) fn ready(&self, token: u64) -> Result<bool> {
        #[cfg(feature = "rdma")]
        let cm = self.rdma.ready(token)?;
        #[cfg(not(feature = "rdma"))]
        let cm = false;
        self.shm.ready(token)?;
        Ok(cm)
    }

    /// At housekeeping: appends the tokens (`ConnId`s) of the links whose connection events
    /// came through a worker-wide channel (RDMA's rdmacm event channel) rather than a fd of
    /// their own, each to [`poll`](super::TransportLink::poll).
    pub(crate) fn cm_ready(&self, tokens: &mut Vec<u64>) {
        #[cfg(feature = "rdma")]
        self.rdma.cm_ready(tokens);
        #[cfg(not(feature = "rdma"))]
        let _ = tokens;
    }

    /// Runs what a locked section deferred until after the lock (RDMA: reposting receive
    /// buffers), leaving `deferred` empty with its capacity kept; returns what failed, for
    /// [`LockedIfaces::retry`].
    pub(crate) fn run_deferred(&self, deferred: &mut Deferred) -> Deferred {
        #[cfg(feature = "rdma")]
        return self.rdma.run_deferred(deferred);
        #[cfg(not(feature = "rdma"))]
        std::mem::take(deferred)
    }

    /// Resource figures for [`crate::WorkerStats`].
    pub(crate) fn usage(&self, st: &LockedIfaces) -> Usage {
        #[cfg(feature = "rdma")]
        return self.rdma.usage(&st.rdma);
        #[cfg(not(feature = "rdma"))]
        Usage::default()
    }
}

/// The transports' worker-wide state kept under the protocol lock.
pub(crate) struct LockedIfaces {
    /// RDMA: send buffers, the registration cache, memory windows, frames from unknown QPs.
    #[cfg(feature = "rdma")]
    pub(crate) rdma: rdma::RdmaLockedIface,
    /// TCP: the exposure table, to withdraw exposures.
    pub(crate) tcp: tcp::TcpLockedIface,
}

impl LockedIfaces {
    /// Takes back a bounce buffer a one-sided operation went through (its report's piece:
    /// see [`TransportLink::start_rma`]).
    pub(crate) fn give_bounce(&mut self, piece: super::ReadPiece) {
        #[cfg(feature = "rdma")]
        self.rdma.give_bounce(piece);
        #[cfg(not(feature = "rdma"))]
        match piece {}
    }

    /// The next event of what [`Ifaces::poll`] found (RDMA: work completions), in order,
    /// deferring what must wait for the lock's release; `None` once all were taken.
    /// `recv_buf_size` is the receive buffers' size, for errors.
    #[inline]
    pub(crate) fn next_completion(
        &mut self,
        scratch: &mut PollScratch,
        recv_buf_size: u32,
        deferred: &mut Deferred,
    ) -> Option<LinkEvent> {
        // (`poll` left them in reverse order: the next is the last.)
        #[cfg(feature = "rdma")]
        while let Some(wc) = scratch.wcs.pop() {
            if let Some(ev) = self.rdma.completion(wc, recv_buf_size, deferred) {
                return Some(ev);
            }
        }
        let _ = (recv_buf_size, deferred);
        scratch.shm.pop()
    }

    /// Ends every transport's hold on the user buffer `buf` (`mem`, if it is still there):
    /// its exposure (TCP key, RDMA memory window) and registration (copying `copy_back`
    /// bytes back from a staged receive), leaving it plain memory when nothing else holds
    /// it.
    ///
    /// The buffer's memory window goes first: it kills the rkey, and neither the buffer nor
    /// a staging region may be reused while a window over it could still be bound. False
    /// when the window cannot be invalidated yet (its bind is still posted): then nothing is
    /// released, and the caller must try again after a [`LinkEvent::Bound`] or
    /// housekeeping.
    #[inline]
    pub(crate) fn release(
        &mut self,
        buf: UserBufId,
        mem: Option<&mut UserMem>,
        copy_back: u64,
    ) -> bool {
        #[cfg(feature = "rdma")]
        if !self.rdma.withdraw(buf) {
            return false;
        }
        let _ = buf;
        let Some(mem) = mem else {
            return true;
        };
        self.tcp.withdraw(mem);
        #[cfg(feature = "rdma")]
        self.rdma.unregister(mem, copy_back);
        let _ = copy_back;
        true
    }

    /// Periodic care (RDMA: frames parked too long from a QP never known are reposted, and
    /// failed reposts retried), deferring what must wait for the lock's release.
    pub(crate) fn housekeeping(&mut self, now: u64, deferred: &mut Deferred) {
        #[cfg(feature = "rdma")]
        self.rdma.housekeeping(now, deferred);
        let _ = (now, deferred);
    }

    /// Keeps what [`Ifaces::run_deferred`] could not do, for the next housekeeping.
    pub(crate) fn retry(&mut self, failed: Deferred) {
        #[cfg(feature = "rdma")]
        self.rdma.retry(failed);
        let _ = failed;
    }

    /// Whether something waits for housekeeping (RDMA: parked frames).
    pub(crate) fn waiting(&self) -> bool {
        #[cfg(feature = "rdma")]
        return self.rdma.waiting();
        #[cfg(not(feature = "rdma"))]
        false
    }
}

/// Transport work a locked section leaves for after the lock's release.
#[derive(Default)]
pub(crate) struct Deferred {
    /// SRQ receive buffers to repost, with their index.
    #[cfg(feature = "rdma")]
    pub(crate) reposts: SmallVec<[(rdmx_conn::RegisteredBuf, u64); 2]>,
}

impl Deferred {
    /// Gives a frame's buffer back without its link (the link is gone, or the frame was
    /// never handed over): an SRQ buffer is reposted, a stream's buffer dropped.
    pub(crate) fn return_frame(&mut self, frame: RecvFrame) {
        match frame {
            #[cfg(feature = "rdma")]
            RecvFrame::Srq { buf, index } => self.reposts.push((buf, index)),
            RecvFrame::Owned(_) => {}
        }
    }

    /// How many things there are to do.
    pub(crate) fn len(&self) -> usize {
        #[cfg(feature = "rdma")]
        return self.reposts.len();
        #[cfg(not(feature = "rdma"))]
        0
    }

    /// Whether there is nothing to do.
    pub(crate) fn is_empty(&self) -> bool {
        #[cfg(feature = "rdma")]
        return self.reposts.is_empty();
        #[cfg(not(feature = "rdma"))]
        true
    }
}

/// What a progress call reuses for the transports, so that it allocates nothing when there
/// is nothing new.
pub(crate) struct PollScratch {
    /// RDMA: work completions polled from the CQ (in reverse order: see
    /// [`LockedIfaces::next_completion`]).
    #[cfg(feature = "rdma")]
    pub(crate) wcs: Vec<rdmx_conn::Completion>,
    /// TCP: what a link's input meant, before it becomes [`LinkEvent`]s.
    pub(crate) tcp: Vec<rdmx_tcp::Event>,
    /// TCP: the one buffer every link of the worker reads through (64 KiB once a link was
    /// read): links keep no receive buffer of their own.
    pub(crate) tcp_rbuf: Vec<u8>,
    /// Shared memory: the receive rings, polled by whoever holds this scratch (their
    /// frames are delivered before the other events: [`Ifaces::deliver_shm`]).
    pub(crate) shm_rings: ShmRings,
    /// Shared memory: the other events (finished READs, rings found corrupt), in reverse
    /// order, like `wcs`.
    pub(crate) shm: Vec<LinkEvent>,
}

impl PollScratch {
    pub(crate) fn new() -> Self {
        PollScratch {
            #[cfg(feature = "rdma")]
            wcs: Vec::with_capacity(64),
            tcp: Vec::new(),
            tcp_rbuf: Vec::new(),
            shm_rings: ShmRings::default(),
            shm: Vec::new(),
        }
    }
}

/// Resource figures of the transports (zero where a transport is not in use).
#[derive(Debug, Default)]
pub(crate) struct Usage {
    /// The RDMA device, once chosen.
    pub(crate) device: Option<String>,
    /// Bytes of receive buffers on the SRQ.
    pub(crate) recv_buffer_bytes: u64,
    /// Times the SRQ ran low and its reserve was posted.
    pub(crate) srq_limit_events: u64,
    /// Bytes registered for send buffers.
    pub(crate) send_buffer_bytes: u64,
    /// Bytes held by the registration cache.
    pub(crate) rcache_bytes: u64,
    /// Regions the registration cache registered so far.
    pub(crate) rcache_registrations: u64,
}
