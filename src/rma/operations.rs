//! One-sided operations on a peer's region through its [`RemoteKey`]: [`Ep::put`],
//! [`Ep::get`], [`Ep::atomic_fetch_add`], [`Ep::atomic_add`],
//! [`Ep::atomic_compare_swap`]; and [`Ep::rma_flush`] / [`Worker::rma_flush`] and
//! [`Ep::fence`] / [`Worker::fence`], which order and complete them.
//!
//! ## Completion, as UCP's
//!
//! Each operation is a [`Request`], like a tag send, which owns the buffer it was given
//! until it completes. It completes when the target has performed it — **remote
//! completion**, UCP's strongest guarantee, on every transport: a put's bytes are then in
//! the target's region, a get's in the buffer [`Request::wait`] hands back, an atomic
//! operation's old value in [`crate::Done::value`].
//!
//! - **Ordering.** Operations on one endpoint reach the target in the order they were made,
//!   behind the endpoint's earlier tag sends, and are performed in that order; operations on
//!   different endpoints are not ordered. A **fence** ([`Ep::fence`], [`Worker::fence`])
//!   makes the next operation on the endpoint (on each endpoint) start only once every
//!   earlier one completed.
//! - **Flush.** [`Ep::rma_flush`] completes once every operation made on the endpoint
//!   before it completed (each with its own status); [`Worker::rma_flush`] once every one
//!   made on the worker before it did. [`Ep::flush`] and [`Ep::close`] wait for one-sided
//!   operations as for sends. A put followed by a flush and then a tag message lets the
//!   target, on receiving the message, read the put's bytes.
//! - **Refusals.** What the key itself rules out — an access outside the region it
//!   describes, or one its access does not grant — fails at once, with [`Error::Rma`]
//!   naming it, before any request is made; a key unpacked on another endpoint is an
//!   [`Error::Invalid`]. What only the target can tell — a stale key (its region was
//!   unmapped), a forged or damaged one — completes the request with
//!   [`crate::Status::Refused`] (a stale key and a forged one alike, as `BadKey`: the
//!   target does not tell a peer which of its regions were unmapped); nothing of that operation was performed (but each frame of
//!   a put over several is checked by itself: a put refused part way may have been
//!   performed in part), and **the endpoint stays connected** over TCP and shared memory,
//!   where the target's progress engine performs the operations. (Over RDMA's reliable
//!   connections a refused access breaks the queue pair, as the verbs define: the request
//!   is refused as `RemoteAccess`, the endpoint closes and its other requests fail with
//!   [`crate::Status::ConnectionClosed`].)
//! - **Failures.** An endpoint that fails or closes completes its operations with
//!   [`crate::Status::ConnectionClosed`], whatever the target performed of them.
//!
//! ## How they travel
//!
//! - **Over RDMA**, on a key whose region the target registered with its NIC (every key
//!   packed once the target worker uses an RDMA device: [`crate::MemHandle::pack_rkey`]),
//!   the operations are the verbs' own: RDMA WRITE, RDMA READ, and the atomic fetch-and-add
//!   and compare-and-swap, performed by the target's NIC without its worker's progress. The
//!   NIC checks each access against the registration — its rkey, its range, the access it
//!   was registered with — but not the key's secret (the rkey is the capability, as the
//!   verbs define). An access it refuses completes as
//!   [`RefusalKind::RemoteAccess`](rdmx_proto::rma::RefusalKind::RemoteAccess) and breaks
//!   the queue pair: the endpoint closes. The NIC's atomic operations are atomic with
//!   respect to each other (`IBV_ATOMIC_HCA`), not with respect to the target's own
//!   [`crate::MemHandle::fetch_add`] and other local atomic accessors on the same word.
//!   Zero-byte puts and gets go as messages.
//! - **Over TCP and shared memory** (and on keys without an RDMA part) they are messages
//!   the target's progress engine performs on the region, as UCX does over tcp, with the
//!   same results and ordering; the target's checks include the key's secret, and a
//!   refusal leaves the endpoint up. A put or get larger than a frame is carried as
//!   several, each at most what the receiving side's buffers hold.

use rdmx_proto::rma::{AtomicOp, RmaOp};
use std::sync::Arc;

use rdmx_proto::RequestKind;

use super::RemoteKey;
use crate::request::{Describe, Request};
use crate::worker::Start;
use crate::{Ep, Error, Result, Worker};

impl Ep {
    /// Writes the bytes of `buf` to `offset` of the remote region `key` names (RDMA
    /// WRITE; UCP's `ucp_put_nbx`). The buffer is moved into the request and handed back by
    /// [`Request::wait`], once the bytes are at the target. Needs the key's
    /// [`crate::RemoteAccess::WRITE`].
    pub fn put(&self, key: &RemoteKey, offset: u64, buf: Vec<u8>) -> Result<Request> {
        let len = buf.len() as u64;
        self.start(key, RmaOp::Put, offset, len, buf, &mut |e, b| {
            e.rma_put(self.id(), &key.packed, offset, b, len)
        })
    }

    /// Reads `buf.len()` bytes at `offset` of the remote region `key` names into `buf`
    /// (RDMA READ; UCP's `ucp_get_nbx`), which [`Request::wait`] hands back filled. Needs
    /// the key's [`crate::RemoteAccess::READ`].
    pub fn get(&self, key: &RemoteKey, offset: u64, buf: Vec<u8>) -> Result<Request> {
        let len = buf.len() as u64;
        self.start(key, RmaOp::Get, offset, len, buf, &mut |e, b| {
            e.rma_get(self.id(), &key.packed, offset, b, len)
        })
    }

    /// Adds `value` (wrapping) to the 8-byte word at `offset` (a multiple of 8) of the
    /// remote region `key` names, atomically; the word's old value is the completion's
    /// [`crate::Done::value`]. Needs the key's [`crate::RemoteAccess::ATOMIC`].
    pub fn atomic_fetch_add(&self, key: &RemoteKey, offset: u64, value: u64) -> Result<Request> {
        self.atomic(key, offset, AtomicOp::FetchAdd(value))
    }

    /// [`Ep::atomic_fetch_add`] for a caller that does not need the old value (UCP's
    /// `UCP_ATOMIC_OP_ADD`): the same operation, which completes the same way (over RDMA
    /// the verbs have only the fetching add).
    pub fn atomic_add(&self, key: &RemoteKey, offset: u64, value: u64) -> Result<Request> {
        self.atomic(key, offset, AtomicOp::FetchAdd(value))
    }

    /// Replaces the 8-byte word at `offset` (a multiple of 8) of the remote region `key`
    /// names with `new` if it holds `expected`, atomically; the word's old value is the
    /// completion's [`crate::Done::value`] either way (it swapped when that is `expected`).
    /// Needs the key's [`crate::RemoteAccess::ATOMIC`].
    pub fn atomic_compare_swap(
        &self,
        key: &RemoteKey,
        offset: u64,
        expected: u64,
        new: u64,
    ) -> Result<Request> {
        self.atomic(key, offset, AtomicOp::CompareSwap { expected, new })
    }

    fn atomic(&self, key: &RemoteKey, offset: u64, op: AtomicOp) -> Result<Request> {
        self.start(key, RmaOp::Atomic, offset, 8, Vec::new(), &mut |e, b| {
            e.rma_atomic(self.id(), &key.packed, offset, op, b)
        })
    }

    /// A request that completes once every one-sided operation made on this endpoint
    /// before it completed (UCP's `ucp_ep_flush_nbx`). On a closed endpoint it completes
    /// at once with [`crate::Status::ConnectionClosed`].
    pub fn rma_flush(&self) -> Request {
        let w = self.worker();
        let id = self.id();
        w.driver
            .one_sided(w, Some(self.conn()), FLUSH, Vec::new(), &mut |e, b| {
                e.rma_flush(id, b)
            })
            // (A flush is never refused: only its connection can be gone, a completion.)
            .unwrap_or_else(unreachable_flush)
    }

    /// Orders this endpoint's one-sided operations: the next one made on it starts only
    /// once every earlier one completed (UCP's `ucp_worker_fence`, for one endpoint).
    pub fn fence(&self) {
        self.worker().driver.fence(self.conn());
    }

    /// Checks `key` allows `op` on `len` bytes at `offset` here, then makes the request.
    fn start(
        &self,
        key: &RemoteKey,
        op: RmaOp,
        offset: u64,
        len: u64,
        buf: Vec<u8>,
        start: Start<'_>,
    ) -> Result<Request> {
        if !std::ptr::eq(key.conn.as_ptr(), Arc::as_ptr(self.conn())) {
            return Err(Error::Invalid(format!(
                "a remote key unpacked on endpoint {} used on endpoint {} (of this worker or another)",
                key.ep.0,
                self.id().0
            )));
        }
        key.packed.allows(op, offset, len).map_err(Error::Rma)?;
        let w = self.worker();
        let kind = match op {
            RmaOp::Put => RequestKind::Put,
            RmaOp::Get => RequestKind::Get,
            RmaOp::Atomic => RequestKind::Atomic,
        };
        let what = Describe { kind, tag: offset };
        w.driver.one_sided(w, Some(self.conn()), what, buf, start)
    }
}

/// What a flush request is, for its errors.
const FLUSH: Describe = Describe {
    kind: RequestKind::Flush,
    tag: 0,
};

/// A flush failed to start: it cannot (it is refused nothing), so this only logs.
fn unreachable_flush(e: Error) -> Request {
    log::error!("a flush failed to start: {e}");
    Request::done(crate::request::Outcome {
        status: crate::Status::ConnectionClosed,
        kind: RequestKind::Flush,
        length: 0,
        tag: 0,
        buf: Vec::new(),
        conn: None,
    })
}

impl Worker {
    /// A request that completes once every one-sided operation made on the worker (on any
    /// endpoint) before it completed, each with its own status (UCP's
    /// `ucp_worker_flush_nbx`).
    pub fn rma_flush(&self) -> Request {
        self.driver
            .one_sided(self, None, FLUSH, Vec::new(), &mut |e, b| {
                Ok(e.rma_flush_all(b))
            })
            .unwrap_or_else(unreachable_flush)
    }

    /// Orders the one-sided operations of every endpoint of the worker: on each, the next
    /// one made starts only once every earlier one completed (UCP's `ucp_worker_fence`).
    pub fn fence(&self) {
        self.driver.fence_all();
    }
}
