//! Accepts whose setup waits on the peer: over RDMA for its last CM message (the RTU that
//! establishes the connection), over shared memory for the connector's doorbell. Each is a
//! [`PendingAccept`], which a listener keeps with a deadline among many (see
//! `crate::listener`) and finishes once the peer has done its part, so that no one peer
//! holds up the others.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use super::*;
#[cfg(feature = "rdma")]
use crate::transport::rdma::{Rdma, RdmaLink};
use crate::transport::shm::setup::Accepting;

/// What [`Worker::accept_start`] made of a request.
pub(crate) enum Started {
    /// The connection is set up.
    Ep(Ep),
    /// The connection waits on its peer.
    Pending(Box<PendingAccept>),
}

/// What a pending accept waits for.
pub(crate) enum Waiting {
    /// The RTU: an RDMA connection accepted, on its listener's event channel until it is
    /// established.
    #[cfg(feature = "rdma")]
    Rdma {
        accepting: rdmx_conn::Accepting,
        rdma: Arc<Rdma>,
    },
    /// The connector's doorbell, on the hand-over socket: a shared-memory connection
    /// accepted (its TCP ACCEPT sent, the segment handed over).
    Shm(Box<(Accepting, rdmx_tcp::Link)>),
}

/// A connection the engine admitted and this side answered, waiting on its peer to end
/// its setup. Dropping it closes the connection and undoes the admission.
pub(crate) struct PendingAccept {
    worker: Worker,
    id: ConnId,
    peer: Option<SocketAddr>,
    /// `None` once finished (or failed).
    waiting: Option<Waiting>,
    /// The connection joined the worker.
    joined: bool,
}

impl PendingAccept {
    pub(super) fn new(
        worker: Worker,
        id: ConnId,
        peer: Option<SocketAddr>,
        waiting: Waiting,
    ) -> Self {
        PendingAccept {
            worker,
            id,
            peer,
            waiting: Some(waiting),
            joined: false,
        }
    }

    /// The peer's address.
    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The transport it runs on.
    pub(crate) fn transport(&self) -> Transport {
        match &self.waiting {
            #[cfg(feature = "rdma")]
            Some(Waiting::Rdma { .. }) => Transport::Rdma,
            _ => Transport::Shm,
        }
    }

    /// The descriptor that polls readable when [`PendingAccept::poll`] has something to
    /// look at, if it has one of its own: shared memory's hand-over socket. (An RDMA accept's
    /// events come on its listener's event channel, named by [`PendingAccept::set_token`].)
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self.waiting.as_ref()? {
            Waiting::Shm(shm) => Some(shm.0.fd()),
            #[cfg(feature = "rdma")]
            Waiting::Rdma { .. } => None,
        }
    }

    /// Names an RDMA accept by `token` among those its listener's `take_ready` reports.
    pub(crate) fn set_token(&self, token: u64) {
        #[cfg(feature = "rdma")]
        if let Some(Waiting::Rdma { accepting, .. }) = &self.waiting {
            accepting.set_event_token(token);
        }
        #[cfg(not(feature = "rdma"))]
        let _ = token;
    }

    /// Whether the peer has done its part, without waiting: then
    /// [`PendingAccept::finish`]. An error when the setup failed (the peer rejected it,
    /// went away, or answered nonsense).
    pub(crate) fn poll(&mut self) -> Result<bool> {
        match self.waiting.as_mut() {
            #[cfg(feature = "rdma")]
            Some(Waiting::Rdma { accepting, .. }) => Ok(accepting.poll()?),
            Some(Waiting::Shm(shm)) => Ok(shm.0.answered()),
            None => Ok(false),
        }
    }

    /// The endpoint, once [`PendingAccept::poll`] said the peer did its part.
    pub(crate) fn finish(mut self) -> Result<Ep> {
        let waiting = self.waiting.take().expect("pending until finished");
        let link = self.link(waiting, None);
        self.made(link)
    }

    /// Waits up to `timeout` for the peer to do its part, then finishes.
    pub(crate) fn wait(mut self, timeout: Duration) -> Result<Ep> {
        let waiting = self.waiting.take().expect("pending until finished");
        let link = self.link(waiting, Some(timeout));
        self.made(link)
    }

    /// The link, once the peer did its part (waiting up to `timeout` for it, if given).
    fn link(&self, waiting: Waiting, timeout: Option<Duration>) -> Result<Box<dyn TransportLink>> {
        let sh = &self.worker.driver;
        match waiting {
            #[cfg(feature = "rdma")]
            Waiting::Rdma { accepting, rdma } => {
                let conn = match timeout {
                    Some(t) => accepting.wait(t)?,
                    None => accepting.finish()?,
                };
                Ok(Box::new(RdmaLink::new(self.id, conn, rdma)))
            }
            // (Reading the doorbell waits up to the socket's timeout, the connect timeout:
            // no longer than `timeout`, and not at all once it has arrived.)
            Waiting::Shm(shm) => {
                let (accepting, link) = *shm;
                let path = accepting.finish().map_err(|e| {
                    let out = crate::fd_limit::suffix_if_exhausted();
                    Error::Invalid(format!("shared memory: {e}{out}"))
                })?;
                sh.shm_link(self.id, path, &link)
            }
        }
    }

    /// The endpoint over `link`, or (on an error) the admission undone.
    fn made(mut self, link: Result<Box<dyn TransportLink>>) -> Result<Ep> {
        // (On an error, the admission is undone as `self` drops.)
        let cs = self.worker.driver.add_conn(self.id, link?);
        self.joined = true;
        Ok(Ep::new(self.worker.clone(), cs))
    }
}

impl Drop for PendingAccept {
    fn drop(&mut self) {
        // Not finished: the engine forgets the connection (what it was made of closes
        // with `waiting`).
        if !self.joined {
            self.worker.driver.engine_down(self.id);
        }
    }
}

impl Driver {
    /// Has the worker's progress look after `accepts` (a listener's) too, while it lives.
    pub(crate) fn watch_accepts(&self, accepts: &Arc<crate::listener::Accepts>) {
        let mut list = self.accepts.lock();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(accepts));
        self.has_accepts.store(true, Ordering::Release);
    }

    /// Moves the listeners' accepts under way on (from the progress's housekeeping, with
    /// no lock of the worker's held but the progress lock): a connection established while
    /// no thread is in `accept` joins the worker now, one past its deadline is dropped.
    pub(super) fn sweep_accepts(&self) {
        if !self.has_accepts.load(Ordering::Acquire) {
            return;
        }
        let live: SmallVec<[Arc<crate::listener::Accepts>; 2]> = {
            let mut list = self.accepts.lock();
            list.retain(|w| w.strong_count() > 0);
            self.has_accepts.store(!list.is_empty(), Ordering::Release);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for a in live {
            a.sweep();
        }
    }
}
