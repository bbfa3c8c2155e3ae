//! Shared receive queues.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rdmx_sys as sys;

use crate::cq::{new_owner, CompletionQueue, Owner, WorkKind};
use crate::memory::{ProtectionDomain, RegisteredBuf};
use crate::{Error, Result};

pub(crate) struct SrqInner {
    pub(crate) srq: *mut sys::ibv_srq,
    owner: Owner,
    pub(crate) cq: CompletionQueue,
    pub(crate) pd: ProtectionDomain,
    capacity: u32,
    /// Raised by the device's async events when the armed limit is reached.
    limit_hit: Arc<AtomicBool>,
}

// SAFETY: ibv_post_srq_recv is thread-safe in rdma-core providers; the handle is immutable.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        crate::async_events::unwatch_srq(self.srq);
        // SAFETY: every QP attached to this SRQ holds an Arc<SrqInner>, so none is left.
        let ret = unsafe { sys::ibv_destroy_srq(self.srq) };
        if ret != 0 {
            log::error!(
                "ibv_destroy_srq failed: {}",
                std::io::Error::from_raw_os_error(ret)
            );
            // The receives may still be reachable by the NIC: keep their buffers alive forever.
            return;
        }
        self.cq.forget_owner(self.owner);
    }
}

/// A shared receive queue: one pool of receive buffers that every connection attached to it
/// receives into. Its receives complete on the completion queue given at creation, which must
/// be the receive CQ of every attached connection. Cheap to clone.
#[derive(Clone)]
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<SrqInner>,
}

impl SharedReceiveQueue {
    /// Creates an SRQ that holds up to `capacity` posted receives, completing on `cq`.
    pub fn new(pd: &ProtectionDomain, cq: &CompletionQueue, capacity: u32) -> Result<Self> {
        if pd.device() != cq.device() {
            return Err(Error::invalid(
                "ibv_create_srq",
                "the PD and the CQ are on different devices",
            ));
        }
        let mut attr = sys::ibv_srq_init_attr::default();
        attr.attr.max_wr = capacity;
        attr.attr.max_sge = 1;
        // SAFETY: the PD is valid and attr is a valid in/out attribute struct.
        let srq = unsafe { sys::ibv_create_srq(pd.inner.pd, &mut attr) };
        if srq.is_null() {
            return Err(Error::last_os(
                "ibv_create_srq",
                format!(
                    "cannot create an SRQ of {capacity} receives on {}",
                    pd.device().name()
                ),
            ));
        }
        Ok(SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                srq,
                owner: new_owner(),
                cq: cq.clone(),
                pd: pd.clone(),
                capacity: attr.attr.max_wr,
                limit_hit: Arc::new(AtomicBool::new(false)),
            }),
        })
    }

    /// Arms the SRQ limit: once fewer than `limit` receives are posted, the device reports
    /// it (once; arm again afterwards), and [`SharedReceiveQueue::limit_reached`] says so.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        crate::async_events::watch_srq(self.inner.srq, &self.inner.limit_hit);
        let mut attr = sys::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: srq is valid; attr is a valid attribute struct of which only srq_limit is
        // read (IBV_SRQ_LIMIT).
        let ret = unsafe {
            sys::ibv_modify_srq(
                self.inner.srq,
                &mut attr,
                sys::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32,
            )
        };
        if ret != 0 {
            return Err(Error::from_ret(
                "ibv_modify_srq",
                ret,
                format!("cannot arm the SRQ limit at {limit} receives"),
            ));
        }
        Ok(())
    }

    /// Whether the limit armed by [`SharedReceiveQueue::arm_limit`] was reached since the
    /// last call that said so. Reads the device's pending async events first, without
    /// blocking (one system call when there are none).
    pub fn limit_reached(&self) -> bool {
        crate::async_events::drain(self.inner.pd.device());
        self.inner.limit_hit.swap(false, Ordering::AcqRel)
    }

    /// How many receives the SRQ holds (the provider may have rounded the request up).
    pub fn capacity(&self) -> u32 {
        self.inner.capacity
    }

    /// Posts `buf` as a receive buffer. Its completion (on the SRQ's CQ) hands the buffer back
    /// with the received bytes at its start. On failure the buffer is given back with the error.
    pub fn post_recv(&self, buf: RegisteredBuf, cookie: u64) -> Result<(), (Error, RegisteredBuf)> {
        if !buf.access().local_write {
            return Err((
                Error::invalid(
                    "ibv_post_srq_recv",
                    "receive buffers need Access::LOCAL_WRITE",
                ),
                buf,
            ));
        }
        if buf.pd().inner.pd != self.inner.pd.inner.pd {
            return Err((
                Error::invalid(
                    "ibv_post_srq_recv",
                    "the buffer is registered in another protection domain",
                ),
                buf,
            ));
        }
        let mut sge = buf.sge(buf.len());
        let wr_id = self
            .inner
            .cq
            .record(self.inner.owner, WorkKind::Recv, cookie, Some(buf));
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: srq is valid; wr and sge live across the call; the buffer's memory stays
        // allocated and untouched by anyone else until its completion returns it (it sits in
        // the CQ's table), or until the SRQ is destroyed.
        let ret = unsafe { sys::ibv_post_srq_recv(self.inner.srq, &mut wr, &mut bad) };
        if ret != 0 {
            let buf = self.inner.cq.unrecord(wr_id).expect("recorded just above");
            return Err((
                Error::from_ret(
                    "ibv_post_srq_recv",
                    ret,
                    "cannot post a receive (SRQ full?)",
                ),
                buf,
            ));
        }
        Ok(())
    }
}
