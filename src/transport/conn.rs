//! A connection of a worker: its transport half and the worker's bookkeeping of it.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use rdmx_proto::ConnId;

use super::{InputFlags, Transport, TransportLink, Watch};
use crate::readiness::Interest;

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
    /// What the worker's readiness registry watches the link's fd for (an [`Interest`], as
    /// its `u8`): input, and room to write while output a full socket buffer held back
    /// waits (TCP) — room to write alone while its input is paused.
    watched: AtomicU8,
    /// Held while `watched` and the registration change together.
    pub(crate) watch_lock: parking_lot::Mutex<()>,
    /// The link's input flags (never set for a link whose input does not pause).
    input: InputFlags,
}

impl Conn {
    pub(crate) fn new(id: ConnId, link: Box<dyn TransportLink>) -> Self {
        Conn {
            id,
            peer: link.peer_addr(),
            local: link.local_addr(),
            closing: AtomicBool::new(false),
            close_reason: parking_lot::Mutex::new(None),
            pending_sends: AtomicUsize::new(0),
            watched: AtomicU8::new(Interest::Read as u8),
            watch_lock: parking_lot::Mutex::new(()),
            input: link.input_flags().unwrap_or_default(),
            link,
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

    /// What the link's fd is to be watched for now (see [`TransportLink::watch`]).
    #[inline]
    pub(crate) fn watch(&self) -> Watch {
        self.link.watch()
    }

    /// Whether the link's input is paused (see [`TransportLink::input_paused`]).
    #[inline]
    pub(crate) fn input_paused(&self) -> bool {
        self.input.paused.load(Ordering::SeqCst)
    }

    /// Whether the link's input is paused or it holds input back: what it is watched for
    /// is then not only a matter of output waiting (see [`TransportLink::watch`]).
    #[inline]
    pub(crate) fn input_stopped(&self) -> bool {
        self.input.paused.load(Ordering::SeqCst) || self.input.holding.load(Ordering::SeqCst)
    }

    /// Whether output waits for room in the socket.
    #[inline]
    pub(crate) fn wants_write(&self) -> bool {
        self.link.wants_write()
    }

    /// Whether the registry watches the link's fd for `interest`.
    #[inline]
    pub(crate) fn is_watched(&self, interest: Interest) -> bool {
        self.watched.load(Ordering::Acquire) == interest as u8
    }

    /// Records what the registry now watches the link's fd for (under `watch_lock`).
    pub(crate) fn set_watched(&self, interest: Interest) {
        self.watched.store(interest as u8, Ordering::Release);
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

    /// Whether a flush of the connection is over: it is [flushed](Conn::flushed) or closing
    /// (what is left then fails).
    pub(crate) fn flush_over(&self) -> bool {
        self.is_closing() || self.flushed()
    }

    /// The fd that becomes readable when the connection has news (data, a hang-up), if it
    /// has one of its own (an RDMA connection's events come through its worker's channel).
    pub(crate) fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        self.link.event_fd()
    }
}
