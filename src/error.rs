//! The crate's one error type.

pub use rdmx_proto::Status;

/// Everything that can go wrong in rdmx.
#[derive(thiserror::Error)]
pub enum Error {
    /// An invalid configuration value (environment or builder).
    #[error("configuration: {0}")]
    Config(String),
    /// A protocol failure outside any one request: a peer's incompatible or malformed
    /// handshake. (Invalid settings, including the protocol's, are [`Error::Config`].)
    #[error(transparent)]
    Proto(#[from] rdmx_proto::Error),
    /// An rdmacm or verbs call failed (it names the call, the errno and what it means).
    #[cfg(feature = "rdma")]
    #[error(transparent)]
    Rdma(#[from] rdmx_conn::Error),
    /// A TCP transport operation failed.
    #[error(transparent)]
    Tcp(#[from] rdmx_tcp::Error),
    /// A shared-memory transport operation failed (setting a connection up, a segment or
    /// doorbell the peer handed over).
    #[error("shared memory: {0}")]
    Shm(#[from] rdmx_shm::Error),
    /// A system call of the worker's own failed (its epoll set or its waker's eventfd).
    /// Running out of descriptors is said in so many words, with the limit reached.
    #[error("{call} failed: {source}{}", crate::fd_limit::suffix(source))]
    Os {
        /// The system call.
        call: &'static str,
        /// What it returned.
        source: std::io::Error,
    },
    /// A request finished with an error status. The buffer it was given comes back in
    /// `buffer` (see [`Error::take_buffer`]) unless the worker had to keep it because the NIC
    /// might still be using it.
    #[error("{what} failed: {status:?} ({}){}", describe(*status), incoming(*status, *length, *tag, buffer.len()))]
    Request {
        /// The final status.
        status: Status,
        /// Which operation, on which endpoint.
        what: String,
        /// The user buffer, handed back.
        buffer: Vec<u8>,
        /// The message's length in bytes: for a receive that was [`Status::Truncated`], the
        /// length of the incoming message that did not fit (as `MPI_Get_count` would say).
        length: usize,
        /// The message's tag: for a receive, the incoming message's (the sender's) tag.
        tag: rdmx_proto::Tag,
    },
    /// The operation needs something this worker or endpoint does not have (closed endpoint,
    /// wrong device, ...).
    #[error("{0}")]
    Invalid(String),
    /// A typed message could not be encoded or decoded.
    #[error("bincode: {0}")]
    Codec(#[from] bincode::Error),
    /// The peer's worker refused the connection, and said why.
    #[error("{addr} refused the connection: {reason}")]
    Rejected {
        /// The address connected to.
        addr: String,
        /// The reason the peer gave.
        reason: String,
    },
    /// A one-sided operation or a region's local accessor was refused by a check made on
    /// this side: outside the region, an unaligned atomic word, or an access the region was
    /// not mapped with. (What only the target can tell — a stale or forged key, which it
    /// answers alike — completes the request with `Status::Refused` instead.)
    #[error("remote memory access: {0}")]
    Rma(rdmx_proto::rma::Refusal),
    /// Bytes given to [`crate::Ep::unpack_rkey`] are not a packed remote key.
    #[error("not a packed remote key: {0}")]
    RemoteKey(#[from] rdmx_proto::rma::KeyDecodeError),
    /// A blocking call ran out of time.
    #[error("timed out after {0:?}: {1}")]
    Timeout(std::time::Duration, String),
}

/// As derived, except that a request's buffer shows as its length: `unwrap` on a failed
/// 64 MiB receive must not print 64 Mi numbers.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config(s) => f.debug_tuple("Config").field(s).finish(),
            Error::Proto(e) => f.debug_tuple("Proto").field(e).finish(),
            #[cfg(feature = "rdma")]
            Error::Rdma(e) => f.debug_tuple("Rdma").field(e).finish(),
            Error::Tcp(e) => f.debug_tuple("Tcp").field(e).finish(),
            Error::Shm(e) => f.debug_tuple("Shm").field(e).finish(),
            Error::Os { call, source } => f
                .debug_struct("Os")
                .field("call", call)
                .field("source", source)
                .finish(),
            Error::Request {
                status,
                what,
                buffer,
                length,
                tag,
            } => f
                .debug_struct("Request")
                .field("status", status)
                .field("what", what)
                .field("buffer", &format_args!("<{} bytes>", buffer.len()))
                .field("length", length)
                .field("tag", &format_args!("{tag:#x}"))
                .finish(),
            Error::Invalid(s) => f.debug_tuple("Invalid").field(s).finish(),
            Error::Codec(e) => f.debug_tuple("Codec").field(e).finish(),
            Error::Rejected { addr, reason } => f
                .debug_struct("Rejected")
                .field("addr", addr)
                .field("reason", reason)
                .finish(),
            Error::Timeout(d, s) => f.debug_tuple("Timeout").field(d).field(s).finish(),
            Error::Rma(r) => f.debug_tuple("Rma").field(r).finish(),
            Error::RemoteKey(e) => f.debug_tuple("RemoteKey").field(e).finish(),
        }
    }
}

impl Error {
    pub(crate) fn os(call: &'static str, source: std::io::Error) -> Error {
        Error::Os { call, source }
    }

    /// The request status, for [`Error::Request`].
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Request { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Takes the user buffer out of an [`Error::Request`] (empty otherwise).
    pub fn take_buffer(&mut self) -> Vec<u8> {
        match self {
            Error::Request { buffer, .. } => std::mem::take(buffer),
            _ => Vec::new(),
        }
    }
}

/// The error for a connect the peer's rdmx worker rejected with a reason (reject data
/// `"rdmx: <reason>"`, possibly zero-padded as rdmacm delivers it); `None` otherwise.
pub(crate) fn rejected(addr: &str, reject_data: &[u8]) -> Option<Error> {
    let end = reject_data
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |i| i + 1);
    let reason = reject_data[..end].strip_prefix(b"rdmx: ")?;
    Some(Error::Rejected {
        addr: addr.to_string(),
        reason: String::from_utf8_lossy(reason).into_owned(),
    })
}

/// What the error message adds about the incoming message of a truncated receive.
fn incoming(status: Status, length: usize, tag: rdmx_proto::Tag, cap: usize) -> String {
    match status {
        Status::Truncated => {
            format!(": the incoming message (tag {tag:#x}) has {length} bytes, the buffer {cap}")
        }
        _ => String::new(),
    }
}

/// What a status means, in words.
pub(crate) fn describe(status: Status) -> &'static str {
    match status {
        Status::Ok => "success",
        Status::Truncated => "the message was larger than the receive buffer; nothing delivered",
        Status::Cancelled => "cancelled",
        Status::RemoteTruncated => {
            "the receiver's buffer was too small for the message; nothing delivered"
        }
        Status::RemoteReadFailed => "the receiver could not read the message",
        Status::ReadFailed => "the RDMA READ of the sender's buffer failed",
        Status::ExposeFailed => "the send buffer could not be registered for the peer",
        Status::ConnectionClosed => "the connection closed or the peer died",
        Status::TimedOut => {
            "the receiver did not read the message within RDMX_RNDV_TIMEOUT_MS; the buffer is \
             no longer exposed to it"
        }
        Status::Refused(kind) => kind.describe(),
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_error_shows_its_buffer_as_a_length() {
        let e = Error::Request {
            status: Status::ReadFailed,
            what: "tag_recv (tag 0x0)".into(),
            buffer: vec![7; 1 << 20],
            length: 0,
            tag: 0xb_0000_0000,
        };
        let shown = format!("{e:?}");
        assert_eq!(
            shown,
            "Request { status: ReadFailed, what: \"tag_recv (tag 0x0)\", \
             buffer: <1048576 bytes>, length: 0, tag: 0xb00000000 }"
        );
        assert_eq!(
            format!("{:?}", Error::Invalid("x".into())),
            "Invalid(\"x\")"
        );
    }
}
