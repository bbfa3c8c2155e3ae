//! The crate's single error type.

use std::fmt;
use std::io;
use std::net::SocketAddr;

/// Every error returned by `rdmx-tcp`: what failed, the peer's address when it is known, and
/// why (an I/O error, a timeout, a rejection by the peer, a protocol violation or a bad
/// argument).
///
/// Errors of one connection attempt or one link never make the [`Listener`](crate::Listener)
/// unusable; [`Error::peer_addr`] says which peer an error concerns.
#[derive(Debug, thiserror::Error)]
#[error("{what}{}: {kind}", PeerSuffix(.peer))]
pub struct Error {
    what: String,
    peer: Option<SocketAddr>,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Io(io::Error),
    Timeout,
    Rejected(Vec<u8>),
    Protocol(String),
    Invalid(String),
    Failed(String),
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Io(e) => match descriptor_note(e) {
                Some(note) => write!(f, "{e}: {note}"),
                None => write!(f, "{e}"),
            },
            Kind::Timeout => f.write_str("timed out"),
            Kind::Rejected(data) => write!(
                f,
                "connection rejected by the peer ({} bytes of reason)",
                data.len()
            ),
            Kind::Protocol(m) => write!(f, "protocol error: {m}"),
            Kind::Invalid(m) => write!(f, "invalid argument: {m}"),
            Kind::Failed(m) => write!(f, "the link failed earlier: {m}"),
        }
    }
}

/// What running out of descriptors (`EMFILE`, `ENFILE`) means, with the limit reached.
fn descriptor_note(e: &io::Error) -> Option<String> {
    match rustix::io::Errno::from_io_error(e)? {
        rustix::io::Errno::MFILE => Some(format!(
            "too many open files (EMFILE): the process's descriptor limit ({}) is reached",
            rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .map_or_else(|| "none".to_string(), |n| n.to_string())
        )),
        rustix::io::Errno::NFILE => Some(
            "too many open files in the system (ENFILE): the system's descriptor limit \
             (fs.file-max) is reached"
                .to_string(),
        ),
        _ => None,
    }
}

struct PeerSuffix<'a>(&'a Option<SocketAddr>);

impl fmt::Display for PeerSuffix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(addr) => write!(f, " (peer {addr})"),
            None => Ok(()),
        }
    }
}

impl Error {
    fn new(what: impl Into<String>, peer: Option<SocketAddr>, kind: Kind) -> Self {
        Self {
            what: what.into(),
            peer,
            kind,
        }
    }

    pub(crate) fn io(what: impl Into<String>, peer: Option<SocketAddr>, err: io::Error) -> Self {
        Self::new(what, peer, Kind::Io(err))
    }

    pub(crate) fn timeout(what: impl Into<String>, peer: Option<SocketAddr>) -> Self {
        Self::new(what, peer, Kind::Timeout)
    }

    pub(crate) fn rejected(
        what: impl Into<String>,
        peer: Option<SocketAddr>,
        data: Vec<u8>,
    ) -> Self {
        Self::new(what, peer, Kind::Rejected(data))
    }

    pub(crate) fn protocol(
        what: impl Into<String>,
        peer: Option<SocketAddr>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(what, peer, Kind::Protocol(message.into()))
    }

    pub(crate) fn invalid(
        what: impl Into<String>,
        peer: Option<SocketAddr>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(what, peer, Kind::Invalid(message.into()))
    }

    pub(crate) fn failed(
        what: impl Into<String>,
        peer: Option<SocketAddr>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(what, peer, Kind::Failed(message.into()))
    }

    /// Whether a deadline passed: the TCP connect, or the handshake exchange of
    /// [`connect`], took longer than allowed. (A connector that misses its deadline at a
    /// [`Listener`](crate::Listener) is closed there, not reported.)
    ///
    /// [`connect`]: crate::connect
    pub fn is_timeout(&self) -> bool {
        match &self.kind {
            Kind::Timeout => true,
            Kind::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            _ => false,
        }
    }

    /// Whether the peer refused the connection: the operating system refused it (nobody
    /// listens on that port), or the peer's listener rejected it with
    /// [`ConnectionRequest::reject`](crate::ConnectionRequest::reject) (then
    /// [`Error::reject_data`] holds its reason bytes).
    pub fn is_refused(&self) -> bool {
        match &self.kind {
            Kind::Rejected(_) => true,
            Kind::Io(e) => e.kind() == io::ErrorKind::ConnectionRefused,
            _ => false,
        }
    }

    /// The private data (reason bytes) the peer sent with its rejection; empty if this error
    /// is not a rejection ([`Error::is_refused`] tells an empty reason from no rejection).
    pub fn reject_data(&self) -> &[u8] {
        match &self.kind {
            Kind::Rejected(data) => data,
            _ => &[],
        }
    }

    /// Whether the process (or the system) ran out of file descriptors (`EMFILE`,
    /// `ENFILE`): the operation may succeed once descriptors are closed.
    pub fn is_out_of_descriptors(&self) -> bool {
        match &self.kind {
            Kind::Io(e) => descriptor_note(e).is_some(),
            _ => false,
        }
    }

    /// Whether the process or the system ran out of descriptors or kernel memory
    /// (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`): what a [`Listener`](crate::Listener)
    /// backs off from (see [`Listener::get_request`](crate::Listener::get_request)); the
    /// operation may succeed once some are freed.
    pub fn is_out_of_resources(&self) -> bool {
        match &self.kind {
            Kind::Io(e) => matches!(
                rustix::io::Errno::from_io_error(e),
                Some(
                    rustix::io::Errno::MFILE
                        | rustix::io::Errno::NFILE
                        | rustix::io::Errno::NOBUFS
                        | rustix::io::Errno::NOMEM
                )
            ),
            _ => false,
        }
    }

    /// The address of the peer this error concerns, when known.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_descriptors_says_so_with_the_limit() {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap();
        let err = Error::io("accept", None, io::Error::from_raw_os_error(libc_emfile()));
        let text = err.to_string();
        assert!(
            text.contains(&format!(
                "too many open files (EMFILE): the process's descriptor limit ({limit}) is \
                 reached"
            )),
            "{text}"
        );
        assert!(err.is_out_of_descriptors());
        assert!(err.is_out_of_resources());
        let other = Error::io("accept", None, io::Error::from_raw_os_error(22));
        assert!(!other.is_out_of_descriptors());
        assert!(!other.is_out_of_resources());
        assert!(!other.to_string().contains("EMFILE"));
    }

    fn libc_emfile() -> i32 {
        rustix::io::Errno::MFILE.raw_os_error()
    }
}
