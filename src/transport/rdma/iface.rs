//! The RDMA transport's worker-wide parts: the device resources, made on first use and used
//! without the worker's protocol lock ([`RdmaIface`]), and what its connections share under
//! that lock ([`RdmaLockedIface`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use rdmx_conn::{Access, Completion, Device, ProtectionDomain, RegisteredBuf};
use rdmx_proto::{ConnId, UserBufId, HEADER_LEN};
use rustc_hash::FxHashMap as HashMap;

use super::{Rdma, RegCache, SendPool, Windows};
use crate::config::{Config, RndvRegistration};
use crate::error::{Error, Result};
use crate::readiness::{Interest, Registry};
use crate::transport::ifaces::Usage;
use crate::transport::{Deferred, Transport};
use crate::usermem::UserMem;

/// The readiness token of the completion channel.
const TOKEN_CQ: u64 = 1;
/// The readiness token of the connections' rdmacm event channel (shared memory's doorbell
/// has 2).
const TOKEN_CM: u64 = 3;
/// How long a frame from a QP not (yet) known is kept before its buffer is reposted.
const PARK_TIMEOUT: Duration = Duration::from_secs(5);

/// The worker's device resources (PD, CQ, SRQ), once made.
#[derive(Default)]
pub(crate) struct RdmaIface {
    res: OnceLock<Arc<Rdma>>,
    init: Mutex<()>,
}

impl RdmaIface {
    /// The resources, if they were made.
    pub(crate) fn get(&self) -> Option<&Arc<Rdma>> {
        self.res.get()
    }

    /// The resources, made on `device` if there are none yet (their receive buffers posted,
    /// their completion channel and the connections' event channel registered with
    /// `registry`; `events_ready` called when a connect or accept, waiting on that channel
    /// for its own connection, read events of the worker's connections). A worker runs on
    /// one device.
    pub(crate) fn on(
        &self,
        device: &Device,
        cfg: &Config,
        registry: &Registry,
        events_ready: impl Fn() + Send + Sync + 'static,
    ) -> Result<&Arc<Rdma>> {
        if let Some(r) = self.res.get() {
            return same_device(r, device);
        }
        let _guard = self.init.lock();
        if let Some(r) = self.res.get() {
            return same_device(r, device);
        }
        let (rdma, bufs) = Rdma::new(device, cfg)?;
        let mut held = Vec::new();
        for (i, buf) in bufs.into_iter().enumerate() {
            if i < cfg.srq_depth() as usize {
                rdma.srq.post_recv(buf, i as u64).map_err(|(e, _)| e)?;
            } else {
                held.push((buf, i as u64));
            }
        }
        rdma.reserve.fill(&rdma.srq, held);
        if let Some(fd) = rdma.cq.event_fd() {
            registry
                .add(fd, TOKEN_CQ, Interest::Read)
                .map_err(|e| Error::os("epoll_ctl", e))?;
        }
        rdma.events.on_ready(events_ready);
        registry
            .add(rdma.events.event_fd(), TOKEN_CM, Interest::Read)
            .map_err(|e| Error::os("epoll_ctl", e))?;
        let _ = self.res.set(Arc::new(rdma));
        Ok(self.res.get().expect("just set"))
    }

    /// Polls the CQ into `wcs` (cleared first); returns how many completions it found.
    #[inline]
    pub(crate) fn poll(&self, wcs: &mut Vec<Completion>) -> usize {
        wcs.clear();
        if let Some(r) = self.res.get() {
            if let Err(e) = r.cq.poll(wcs, 64) {
                log::error!("{e}");
            }
        }
        wcs.len()
    }

    /// Asks the CQ for an event on its next completion.
    pub(crate) fn arm(&self) -> Result<()> {
        if let Some(r) = self.res.get() {
            r.cq.request_notify()?;
        }
        Ok(())
    }

    /// Takes the completion channel's events, if `token` is its; returns whether `token` is
    /// the connections' event channel's (their events are due: see [`RdmaIface::cm_ready`]).
    pub(crate) fn ready(&self, token: u64) -> Result<bool> {
        match (token, self.res.get()) {
            (TOKEN_CQ, Some(r)) => {
                r.cq.take_events()?;
            }
            (TOKEN_CM, Some(_)) => return Ok(true),
            _ => {}
        }
        Ok(false)
    }

    /// Reads the connections' event channel and appends the tokens (`ConnId`s) of the
    /// connections that have rdmacm events waiting, each to take its own
    /// ([`super::RdmaLink`]'s `poll`).
    pub(crate) fn cm_ready(&self, tokens: &mut Vec<u64>) {
        if let Some(r) = self.res.get() {
            if let Err(e) = r.events.take_ready(tokens) {
                log::error!("{e}");
            }
        }
    }

    /// Reposts receive buffers; returns those whose repost failed.
    pub(crate) fn run_deferred(&self, deferred: &mut Deferred) -> Deferred {
        let mut failed = Deferred::default();
        if let Some(rdma) = self.res.get() {
            for item in deferred.reposts.drain(..) {
                let Some((buf, id)) = rdma.reserve.keep(&rdma.srq, item) else {
                    continue;
                };
                if let Err((e, buf)) = rdma.srq.post_recv(buf, id) {
                    log::error!("reposting receive buffer {id}: {e}");
                    failed.reposts.push((buf, id));
                }
            }
        }
        deferred.reposts.clear();
        failed
    }

    /// Posts the reserve of receive buffers if the SRQ reported that it runs low; returns
    /// whether it did.
    pub(crate) fn srq_low(&self) -> bool {
        self.res
            .get()
            .is_some_and(|r| r.reserve.post_if_low(&r.srq))
    }

    /// Resource figures.
    pub(crate) fn usage(&self, st: &RdmaLockedIface) -> Usage {
        let res = self.res.get();
        Usage {
            device: res.map(|r| r.device.name()),
            recv_buffer_bytes: res.map_or(0, |r| r.recv_bytes),
            srq_limit_events: res.map_or(0, |r| r.reserve.events.load(Ordering::Relaxed)),
            send_buffer_bytes: st.send_pool.bytes,
            rcache_bytes: st.rcache.cached_bytes(),
            rcache_registrations: st.rcache.registrations,
        }
    }
}

fn same_device<'a>(r: &'a Arc<Rdma>, device: &Device) -> Result<&'a Arc<Rdma>> {
    if &r.device == device {
        Ok(r)
    } else {
        Err(Error::Invalid(format!(
            "this worker runs on {}, not {}; use one worker per device",
            r.device.name(),
            device.name()
        )))
    }
}

/// A frame that arrived on a QP not (yet) known.
pub(super) struct Parked {
    pub(super) qp: u32,
    pub(super) index: u64,
    pub(super) buf: RegisteredBuf,
    pub(super) len: usize,
    /// When it was parked (coarse clock, ns).
    pub(super) since: u64,
}

/// What the worker's RDMA connections share under its protocol lock.
pub(crate) struct RdmaLockedIface {
    /// Registered send buffers for frames too large to go inline.
    pub(super) send_pool: SendPool,
    /// Registered regions that stage rendezvous buffers.
    pub(super) rcache: RegCache,
    /// The memory window through which each exposed send buffer is read.
    pub(super) windows: Windows,
    /// How rendezvous buffers are registered.
    pub(super) mode: RndvRegistration,
    /// The connection each known QP belongs to.
    pub(super) qp_map: HashMap<u32, ConnId>,
    /// Frames from QPs not (yet) known.
    pub(super) parked: Vec<Parked>,
    /// Receive buffers whose repost failed, retried at housekeeping.
    spare_recv: Vec<(RegisteredBuf, u64)>,
    /// 8-byte buffers for one-sided atomic operations' results, registered a page at a time.
    pub(super) atomic_results: Vec<RegisteredBuf>,
    /// [`super::BOUNCE_LEN`]-byte buffers small one-sided WRITEs and READs go through.
    bounce: Vec<RegisteredBuf>,
}

impl RdmaLockedIface {
    pub(crate) fn new(cfg: &Config) -> Self {
        // (RDMA's own values: the preferred transport may be another, with larger frames.)
        let frame_len = (cfg.recv_buf_size_for(Transport::Rdma) as usize)
            .max(cfg.eager_threshold_for(Transport::Rdma) as usize + HEADER_LEN);
        RdmaLockedIface {
            send_pool: SendPool::new(frame_len, cfg.send_bufs() as usize),
            rcache: RegCache::new(cfg.rcache_bytes()),
            windows: Windows::default(),
            mode: cfg.rndv_registration(),
            qp_map: HashMap::default(),
            parked: Vec::new(),
            spare_recv: Vec::new(),
            atomic_results: Vec::new(),
            bounce: Vec::new(),
        }
    }

    /// A bounce buffer for a small one-sided WRITE or READ, from the pool (which grows by
    /// 64 of them, one registration, when it runs out).
    pub(super) fn bounce(&mut self, pd: &ProtectionDomain) -> Result<RegisteredBuf, String> {
        take_pooled(&mut self.bounce, pd, super::BOUNCE_LEN, 64)
    }

    /// Takes a bounce buffer back.
    pub(crate) fn give_bounce(&mut self, buf: RegisteredBuf) {
        self.bounce.push(buf);
    }

    /// A buffer for an atomic operation's result, from the pool (which grows by a page of
    /// them, one registration, when it runs out).
    pub(super) fn atomic_result(&mut self, pd: &ProtectionDomain) -> Result<RegisteredBuf, String> {
        take_pooled(&mut self.atomic_results, pd, 8, 512)
    }

    /// Kills the memory window of `buf`, if it has one: false while its bind is still posted.
    #[inline]
    pub(crate) fn withdraw(&mut self, buf: UserBufId) -> bool {
        self.windows.invalidate(buf)
    }

    /// Ends `mem`'s registration (deregisters it, or returns its region to the cache).
    #[inline]
    pub(crate) fn unregister(&mut self, mem: &mut UserMem, copy_back: u64) {
        mem.unregister(&mut self.rcache, copy_back);
    }

    /// Reposts frames parked too long (from a QP never known), and failed reposts.
    pub(crate) fn housekeeping(&mut self, now: u64, deferred: &mut Deferred) {
        let limit = PARK_TIMEOUT.as_nanos() as u64;
        let (old, fresh): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| now.saturating_sub(p.since) > limit);
        self.parked = fresh;
        for p in old {
            log::debug!("dropping a frame from unknown qp {}", p.qp);
            deferred.reposts.push((p.buf, p.index));
        }
        deferred.reposts.extend(self.spare_recv.drain(..));
    }

    /// Keeps receive buffers whose repost failed, for the next housekeeping.
    pub(crate) fn retry(&mut self, failed: Deferred) {
        self.spare_recv.extend(failed.reposts);
    }

    /// Whether frames are parked.
    pub(crate) fn waiting(&self) -> bool {
        !self.parked.is_empty()
    }
}

/// A buffer of `pool`, which, when empty, first gets `count` more of `len` bytes each, of
/// one registration with local write access on `pd`.
fn take_pooled(
    pool: &mut Vec<RegisteredBuf>,
    pd: &ProtectionDomain,
    len: usize,
    count: usize,
) -> Result<RegisteredBuf, String> {
    if pool.is_empty() {
        let run = pd
            .register_chunks(len, count, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        pool.extend(run);
    }
    pool.pop()
        .ok_or_else(|| "an empty pool of registered buffers".to_string())
}
