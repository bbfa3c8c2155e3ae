//! Endpoints.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bincode::Options;
use rdmx_proto::{ConnId, ConnStats, Tag};

use crate::ep_flush::{Closing, Flushing};
use crate::error::{Error, Result};
use crate::request::Request;
use crate::transport::{Conn, Transport};
use crate::usermem::SendData;
use crate::worker::{WaitFor, Worker};

/// The bincode settings of [`Ep::send_obj`] / [`Worker::recv_obj`]: bincode 1.3's
/// fixed-width little-endian encoding.
pub(crate) fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
}

/// A connection to a peer worker, like UCP's ep. Made by [`Worker::connect`] or
/// [`Listener::accept`](crate::Listener::accept).
///
/// Cheap to clone (all clones are the same endpoint), `Send` and `Sync`: several threads may
/// send on one endpoint at once. Messages from one endpoint are matched at the peer in the
/// order they were sent. [`Ep::close`] flushes and disconnects; dropping the last clone
/// does the same.
#[derive(Clone)]
pub struct Ep {
    pub(crate) inner: Arc<EpInner>,
}

impl Ep {
    /// The worker's connection behind the endpoint.
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        &self.inner.cs
    }
}

pub(crate) struct EpInner {
    pub(crate) worker: Worker,
    pub(crate) cs: Arc<Conn>,
    /// Closed through this handle (a close or the last handle's drop took it).
    pub(crate) closed: AtomicBool,
}

impl Ep {
    pub(crate) fn new(worker: Worker, cs: Arc<Conn>) -> Self {
        Ep {
            inner: Arc::new(EpInner {
                worker,
                cs,
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// Sends `buf` with `tag`, nonblocking. The buffer is moved into the request and handed
    /// back by [`Request::wait`]; up to `RDMX_EAGER_THRESHOLD` bytes it is copied out at
    /// once, above that the peer reads it straight from this buffer (rendezvous), which is
    /// why the request must own it.
    ///
    /// On a closed endpoint the request completes at once with
    /// [`crate::Status::ConnectionClosed`].
    pub fn tag_send(&self, tag: Tag, buf: Vec<u8>) -> Request {
        let w = &self.inner.worker;
        w.driver
            .tag_send(w, &self.inner.cs, tag, SendData::Owned(buf))
    }

    /// Sends the bytes of `data` with `tag`, nonblocking, without taking them from you: as
    /// MPI and UCP allow several sends from one buffer at once, any number of sends (to any
    /// endpoints) may share one `Arc`, and you may read it meanwhile. Nobody can write it
    /// while a send holds a clone (that would take `Arc::get_mut` or `Arc::try_unwrap`,
    /// which fail while it is shared), so a peer reading it by rendezvous, or the NIC
    /// sending it, sees the bytes as they were at the call.
    ///
    /// Eager messages are copied out at once and rendezvous messages are read by the peer
    /// from the shared buffer itself (over RDMA registered in place for the send's duration,
    /// or staged through the registration cache, as `RDMX_RNDV_REG` says), as with
    /// [`Ep::tag_send`]. The completion's buffer ([`crate::Done::buf`]) is empty; the request
    /// holds a clone until it completes. (Taken by reference: a send that goes out at once
    /// copies it and leaves its count alone.)
    ///
    /// ```no_run
    /// # fn demo(ep: &rdmx::Ep, others: &[rdmx::Ep]) -> rdmx::Result<()> {
    /// use std::sync::Arc;
    /// let block = Arc::new(vec![7u8; 1 << 20]);
    /// let sends: Vec<_> = others.iter().map(|ep| ep.tag_send_shared(9, &block)).collect();
    /// for s in sends {
    ///     s.wait()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn tag_send_shared(&self, tag: Tag, data: &Arc<Vec<u8>>) -> Request {
        let w = &self.inner.worker;
        w.driver.tag_send_shared(w, &self.inner.cs, tag, data)
    }

    /// Sends a copy of `data` with `tag` and waits until the send completes.
    pub fn send(&self, tag: Tag, data: &[u8]) -> Result<()> {
        self.tag_send(tag, data.to_vec()).wait().map(drop)
    }

    /// Sends `value` encoded with serde + bincode, blocking; receive it with
    /// [`Worker::recv_obj`].
    pub fn send_obj<T: serde::Serialize + ?Sized>(&self, tag: Tag, value: &T) -> Result<()> {
        let bytes = codec().serialize(value)?;
        self.tag_send(tag, bytes).wait().map(drop)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.cs.peer
    }

    /// This endpoint's id on its worker, stable for the endpoint's life and never reused by
    /// the worker: what a receive's [`crate::Done::conn`] / [`crate::RecvInfo::conn`] and a
    /// probe's [`crate::ProbeInfo::conn`] name, to map a message to the endpoint it came from.
    pub fn id(&self) -> ConnId {
        self.inner.cs.id
    }

    /// The transport this endpoint runs on.
    pub fn transport(&self) -> Transport {
        self.inner.cs.transport()
    }

    /// How this endpoint carries data, for logs and diagnostics: its transport, and for
    /// shared memory how rendezvous data moves — `"shm, rendezvous by CMA"`, or
    /// `"shm, rendezvous by copy (why)"` where the kernel refused CMA or `RDMX_SHM_CMA=0`.
    pub fn data_path(&self) -> String {
        self.inner.cs.link.data_path()
    }

    /// The local address of the connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.cs.local
    }

    /// The largest message this endpoint sends eagerly: `RDMX_EAGER_THRESHOLD`, capped by the
    /// peer's receive buffer size less the 40-byte header. Larger messages go by rendezvous.
    /// `None` once the connection is gone.
    pub fn eager_limit(&self) -> Option<u64> {
        self.stats().map(|s| s.eager_limit)
    }

    /// The most frames (eager messages, rendezvous announcements) this endpoint may have
    /// in flight to its peer: the largest credit window the peer grants — `RDMX_CREDITS`
    /// over RDMA and TCP, where windows grow to it on demand, and over shared memory the
    /// ring's fixed window. Further sends wait for the peer to take frames (their requests
    /// stay pending). `None` once the connection is gone.
    pub fn send_window(&self) -> Option<u32> {
        self.stats().map(|s| s.peer_max_credits)
    }

    /// The engine's figures for this endpoint's connection.
    fn stats(&self) -> Option<ConnStats> {
        self.inner.worker.driver.conn_stats(self.inner.cs.id)
    }

    /// The worker this endpoint belongs to.
    pub fn worker(&self) -> &Worker {
        &self.inner.worker
    }

    /// Whether the endpoint is still connected (neither side closed it, the peer is alive
    /// as far as the worker knows).
    pub fn is_connected(&self) -> bool {
        !self.inner.cs.is_closing()
    }

    /// Why the endpoint closed, once it has: e.g. `"protocol error: …"` naming what was wrong
    /// with a peer's frame, `"the peer disconnected …"`, `"connection lost: …"`, or
    /// `"closed locally"`. `None` while it is connected.
    pub fn close_reason(&self) -> Option<String> {
        self.inner.cs.close_reason.lock().clone()
    }

    /// Waits until every send on this endpoint has completed and nothing is left to post,
    /// or `timeout` passes (an [`Error::Timeout`]).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.inner.flush(timeout)
    }

    /// Flushes (bounded by the connect timeout), then disconnects: [`Ep::close_timeout`]
    /// with `RDMX_CONNECT_TIMEOUT_MS`. The peer's requests on this connection then fail with
    /// [`crate::Status::ConnectionClosed`]. Closing an endpoint closes it for every clone.
    pub fn close(&self) -> Result<()> {
        self.inner
            .close(self.inner.worker.driver.cfg.connect_timeout())
    }

    /// Flush-then-close with a deadline (UCP's `UCP_EP_CLOSE_MODE_FLUSH`): waits until every
    /// send on the endpoint completed, at most `timeout`, then disconnects. Sends still
    /// pending at the deadline fail with [`crate::Status::ConnectionClosed`] and the result
    /// is an [`Error::Timeout`]; the endpoint is closed either way.
    pub fn close_timeout(&self, timeout: Duration) -> Result<()> {
        self.inner.close(timeout)
    }

    /// Starts flushing, nonblocking: the [`Flushing`] future is ready once every send on the
    /// endpoint has completed and nothing is left to post (or the endpoint is closing), as
    /// [`Ep::flush`] waits for. It has no deadline of its own: bound it with the event
    /// loop's timer (`tokio::time::timeout`). Dropping it changes nothing.
    pub fn flush_nb(&self) -> Flushing {
        Flushing::new(self.clone())
    }

    /// Starts closing, nonblocking (UCP's `ucp_ep_close_nbx` in flush mode): the endpoint
    /// closes once every send on it has completed, or at the connect timeout
    /// (`RDMX_CONNECT_TIMEOUT_MS`) with what is still pending failed, as [`Ep::close`] does
    /// — whether or not the [`Closing`] future is awaited: dropping it leaves the close to
    /// the worker's progress. The future is ready once the endpoint is closed: `Ok`, or an
    /// [`Error::Timeout`] when sends were still pending at the deadline.
    pub fn close_nb(&self) -> Closing {
        Closing::new(self.clone(), self.inner.worker.driver.cfg.connect_timeout())
    }

    /// Closes at once (UCP's `UCP_EP_CLOSE_MODE_FORCE`): every pending request on the
    /// endpoint fails with [`crate::Status::ConnectionClosed`] without waiting for the peer
    /// — over TCP now; over RDMA as soon as the NIC has given back the buffers it may still
    /// access (the disconnect flushes the queue pair; this worker's progress sees it). The
    /// peer's requests on the endpoint fail too once it notices.
    pub fn close_force(&self) {
        if !self.inner.closed.swap(true, Ordering::AcqRel) {
            self.inner.worker.driver.close_conn(self.inner.cs.id);
        }
    }
}

impl EpInner {
    fn flush(&self, timeout: Duration) -> Result<()> {
        let cs = &self.cs;
        let done = self.worker.driver.wait_until(
            WaitFor::News,
            || cs.flush_over(),
            Some(Instant::now() + timeout),
        );
        if done {
            Ok(())
        } else {
            Err(Error::Timeout(
                timeout,
                format!(
                    "flushing the endpoint to {:?}: {} sends still pending",
                    cs.peer,
                    cs.pending_sends.load(Ordering::Acquire)
                ),
            ))
        }
    }

    fn close(&self, timeout: Duration) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let flushed = self.flush(timeout);
        self.worker.driver.close_conn(self.cs.id);
        flushed
    }
}

impl EpInner {
    /// Closes the connection now if its flush is over, else leaves the close to the worker,
    /// which closes it once its sends completed or at `timeout` from now (failing those
    /// still pending): never blocks. Returns that deadline (the worker's coarse clock), or
    /// `None` when it closed now.
    pub(crate) fn close_when_flushed(&self, timeout: Duration) -> Option<u64> {
        let driver = &self.worker.driver;
        if self.cs.flush_over() {
            driver.close_conn(self.cs.id);
            None
        } else {
            Some(driver.linger(&self.cs, timeout))
        }
    }
}

impl Drop for EpInner {
    /// The last handle is gone: never blocks. An endpoint with nothing pending closes now;
    /// one with sends still in flight (dropped requests go on, fire and forget) lingers,
    /// and the worker's progress closes it once they complete, or fails them and closes it
    /// when the connect timeout has passed.
    fn drop(&mut self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.close_when_flushed(self.worker.driver.cfg.connect_timeout());
    }
}

impl std::fmt::Debug for Ep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ep")
            .field("peer", &self.peer_addr())
            .field("connected", &self.is_connected())
            .finish()
    }
}
