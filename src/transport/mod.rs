//! The transports under a worker, chosen per connection: how its connections move frames
//! and rendezvous data, and what each does natively ([`Capabilities`]). One module each:
//! `rdma` (rdmacm + verbs: SRQ, RDMA READ, memory windows) and `tcp` (over `rdmx-tcp`'s
//! nonblocking sockets; a rendezvous READ becomes a request answered by the sender's
//! progress engine streaming straight from the exposed buffer). The protocol engine above
//! never learns which one a connection runs on: it sees frames, send completions and READ
//! completions either way.

use std::fmt;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rdmx_proto::ConnId;

#[cfg(feature = "rdma")]
pub(crate) mod rdma;
pub(crate) mod tcp;

#[cfg(feature = "rdma")]
use rdma::RdmaLink;

/// A transport, as `RDMX_TRANSPORT` names it. A context may use several, in order of
/// preference; each connection runs on one of them (see [`crate::Ep::transport`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// In a list: RDMA for peers an RDMA device reaches, TCP for the others.
    Auto,
    /// rdmacm + verbs; an error where there is no RDMA device.
    Rdma,
    /// TCP sockets, with the same API and semantics.
    Tcp,
}

impl Transport {
    pub(crate) fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Transport::Auto),
            "rdma" | "verbs" | "rc" => Some(Transport::Rdma),
            "tcp" => Some(Transport::Tcp),
            _ => None,
        }
    }

    /// Parses `RDMX_TRANSPORT`: `auto`, or transports in order of preference separated by
    /// commas (`rdma,tcp`), each at most once.
    pub(crate) fn parse_list(value: &str) -> Option<Vec<Self>> {
        let list: Vec<Transport> = value
            .split(',')
            .map(Transport::parse)
            .collect::<Option<_>>()?;
        let auto_alone = list == [Transport::Auto] || !list.contains(&Transport::Auto);
        let unique = list.iter().enumerate().all(|(i, t)| !list[..i].contains(t));
        (auto_alone && unique).then_some(list)
    }

    /// Writes a list as `RDMX_TRANSPORT` takes it.
    pub(crate) fn list_string(list: &[Transport]) -> String {
        list.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Transport::Auto => "auto",
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
        })
    }
}

/// What a transport does natively, like UCX's interface capabilities: the worker's choices
/// per connection (how a rendezvous is exposed and read, where frames land) follow these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Frames are SENT into receive buffers pre-posted on a queue all the worker's
    /// connections share (an SRQ), so receive memory does not grow with connections.
    pub shared_receive_queue: bool,
    /// The receiver of a rendezvous GETs the data without the sender's CPU (RDMA READ).
    /// Without it, the sender's progress engine streams the data on request.
    pub zero_copy_get: bool,
    /// One side can PUT into the other's memory (RDMA WRITE); rdmx grants no peer that
    /// today.
    pub zero_copy_put: bool,
    /// Waiting can sleep on a file descriptor (completion channel, socket).
    pub event_fd: bool,
}

impl Transport {
    /// What this transport does natively (`Auto` has no capabilities of its own).
    pub fn capabilities(self) -> Capabilities {
        match self {
            Transport::Rdma => Capabilities {
                shared_receive_queue: true,
                zero_copy_get: true,
                zero_copy_put: true,
                event_fd: true,
            },
            Transport::Tcp => Capabilities {
                shared_receive_queue: false,
                zero_copy_get: false,
                zero_copy_put: false,
                event_fd: true,
            },
            Transport::Auto => Capabilities {
                shared_receive_queue: false,
                zero_copy_get: false,
                zero_copy_put: false,
                event_fd: false,
            },
        }
    }
}

/// A connection's transport half.
// One per connection, inside its `Arc<Conn>`: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Link {
    #[cfg(feature = "rdma")]
    Rdma(RdmaLink),
    Tcp(rdmx_tcp::Link),
}

impl Link {
    /// The private data the peer sent with its accept or connect.
    pub(crate) fn peer_private_data(&self) -> &[u8] {
        match self {
            #[cfg(feature = "rdma")]
            Link::Rdma(l) => l.conn.peer_private_data(),
            Link::Tcp(l) => l.peer_private_data(),
        }
    }
}

/// A connection of a worker.
pub(crate) struct Conn {
    pub(crate) id: ConnId,
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) local: Option<SocketAddr>,
    pub(crate) link: Link,
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
    pub(crate) fn new(id: ConnId, link: Link) -> Self {
        let (peer, local) = match &link {
            #[cfg(feature = "rdma")]
            Link::Rdma(l) => (l.conn.peer_addr(), l.conn.local_addr()),
            Link::Tcp(l) => (l.peer_addr(), l.local_addr()),
        };
        Conn {
            id,
            peer,
            local,
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
        match &self.link {
            #[cfg(feature = "rdma")]
            Link::Rdma(_) => Transport::Rdma,
            Link::Tcp(_) => Transport::Tcp,
        }
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Posts or writes what is queued. True when something failed that the worker must
    /// look at (RDMA: failed posts; TCP: the socket broke).
    pub(crate) fn flush(&self) -> bool {
        match &self.link {
            #[cfg(feature = "rdma")]
            Link::Rdma(l) => l.flush(self.is_closing()),
            Link::Tcp(l) => match l.flush() {
                Ok(all_written) => {
                    // A closing connection is shut down once everything is written.
                    if all_written && self.is_closing() {
                        l.shutdown();
                    }
                    false
                }
                Err(e) => {
                    if !self.is_closing() {
                        log::warn!("writing to {:?}: {e}", self.peer);
                    }
                    true
                }
            },
        }
    }

    /// Whether output waits for room in the socket (TCP only: RDMA posts never wait).
    pub(crate) fn wants_write(&self) -> bool {
        self.tcp().is_some_and(|l| l.wants_write())
    }

    /// Whether nothing is posted or waiting to be written.
    pub(crate) fn idle(&self) -> bool {
        match &self.link {
            #[cfg(feature = "rdma")]
            Link::Rdma(l) => l.idle(),
            Link::Tcp(l) => !l.wants_write(),
        }
    }

    /// The fd that becomes readable when the connection has news (rdmacm events, or data).
    pub(crate) fn event_fd(&self) -> BorrowedFd<'_> {
        match &self.link {
            #[cfg(feature = "rdma")]
            Link::Rdma(l) => l.conn.event_fd(),
            Link::Tcp(l) => l.fd(),
        }
    }

    #[cfg(feature = "rdma")]
    pub(crate) fn rdma(&self) -> Option<&RdmaLink> {
        match &self.link {
            #[cfg(feature = "rdma")]
            Link::Rdma(l) => Some(l),
            Link::Tcp(_) => None,
        }
    }

    pub(crate) fn tcp(&self) -> Option<&rdmx_tcp::Link> {
        match &self.link {
            Link::Tcp(l) => Some(l),
            #[cfg(feature = "rdma")]
            Link::Rdma(_) => None,
        }
    }
}
