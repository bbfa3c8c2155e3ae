//! The transport interface under a worker: how its connections move frames and rendezvous
//! data. Two implementations: RDMA (`rdma.rs`: rdmacm + verbs, SRQ, RDMA READ) and TCP
//! (`rdmx-tcp`: nonblocking sockets; a rendezvous READ becomes a request answered by the
//! sender's progress engine streaming straight from the exposed buffer). The protocol
//! engine above never learns which one it runs on: it sees frames, send completions and
//! READ completions either way.

use std::fmt;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rdmx_proto::ConnId;

use crate::rdma::RdmaLink;

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

/// A connection's transport half.
pub(crate) enum Link {
    Rdma(RdmaLink),
    Tcp(rdmx_tcp::Link),
}

impl Link {
    /// The private data the peer sent with its accept or connect.
    pub(crate) fn peer_private_data(&self) -> &[u8] {
        match self {
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
}

impl Conn {
    pub(crate) fn new(id: ConnId, link: Link) -> Self {
        let (peer, local) = match &link {
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
        }
    }

    /// The transport the connection runs on.
    pub(crate) fn transport(&self) -> Transport {
        match &self.link {
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

    /// Whether nothing is posted or waiting to be written.
    pub(crate) fn idle(&self) -> bool {
        match &self.link {
            Link::Rdma(l) => l.idle(),
            Link::Tcp(l) => !l.wants_write(),
        }
    }

    /// The fd that becomes readable when the connection has news (rdmacm events, or data).
    pub(crate) fn event_fd(&self) -> RawFd {
        match &self.link {
            Link::Rdma(l) => l.conn.event_fd(),
            Link::Tcp(l) => l.fd(),
        }
    }

    pub(crate) fn rdma(&self) -> Option<&RdmaLink> {
        match &self.link {
            Link::Rdma(l) => Some(l),
            Link::Tcp(_) => None,
        }
    }

    pub(crate) fn tcp(&self) -> Option<&rdmx_tcp::Link> {
        match &self.link {
            Link::Tcp(l) => Some(l),
            Link::Rdma(_) => None,
        }
    }
}
