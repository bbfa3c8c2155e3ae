//! A connection of a worker: its transport half and the worker's bookkeeping of it.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rdmx_proto::ConnId;

use super::{Transport, TransportLink};

/// A connection of a worker.
pub(crate) struct Conn {
    pub(crate) id: ConnId,
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) local: Option<SocketAddr>,
    /// Its transport half.
    pub(crate) link: Box<dyn TransportLink>,
    /// Closed by either side: no new work, reaped once nothing is posted.
    pub(crate) closing: AtomicBool,
    /// Send requests on this connection not yet completed.
    pub(crate) pending_sends: AtomicUsize,
    /// Why the connection closed (the first reason recorded wins).
    pub(crate) close_reason: parking_lot::Mutex<Option<String>>,
    /// Whether the worker's readiness registry watches the link for room to write (a TCP
    /// link with output a full socket buffer held back).
    pub(crate) write_watched: AtomicBool,
    /// Held while `write_watched` and the registration change together.
    pub(crate) watch_lock: parking_lot::Mutex<()>,
}

impl Conn {
    pub(crate) fn new(id: ConnId, link: Box<dyn TransportLink>) -> Self {
        Conn {
            id,
            peer: link.peer_addr(),
            local: link.local_addr(),
            link,
            closing: AtomicBool::new(false),
            close_reason: parking_lot::Mutex::new(None),
            pending_sends: AtomicUsize::new(0),
            write_watched: AtomicBool::new(false),
            watch_lock: parking_lot::Mutex::new(()),
        }
    }

    /// The transport the connection runs on.
    pub(crate) fn transport(&self) -> Transport {
        self.link.transport()
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Posts or writes what is queued. True when something failed that the worker must
    /// look at (see [`TransportLink::flush`]).
    pub(crate) fn flush(&self) -> bool {
        self.link.flush(self.is_closing())
    }

    /// Whether output waits for room in the socket.
    pub(crate) fn wants_write(&self) -> bool {
        self.link.wants_write()
    }

    /// Whether nothing is posted or waiting to be written.
    pub(crate) fn idle(&self) -> bool {
        self.link.idle()
    }

    /// Whether every send on the connection completed and nothing is left to post or write:
    /// what a flush waits for.
    pub(crate) fn flushed(&self) -> bool {
        self.pending_sends.load(Ordering::Acquire) == 0 && self.idle()
    }

    /// The fd that becomes readable when the connection has news (data, a hang-up), if it
    /// has one of its own (an RDMA connection's events come through its worker's channel).
    pub(crate) fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        self.link.event_fd()
    }
}
