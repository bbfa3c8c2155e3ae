//! The crate's single error type.

use std::io;

/// Every error returned by `rdmx-shm`, one variant per kind of failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed: `what` says which step.
    #[error("{what}: {source}")]
    Io {
        /// The step that failed.
        what: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// A segment handed over by the peer is not one this crate can map safely (its size, its
    /// seals or its kind are wrong).
    #[error("the shared segment handed over is unusable: {0}")]
    BadSegment(String),
    /// The peer wrote something into shared memory that breaks the ring's rules (an index
    /// out of range, a length past what was published, reserved bits set). The connection
    /// cannot go on; nothing outside the segment was read or written.
    #[error("the peer corrupted the shared ring: {0}")]
    Corrupt(String),
    /// A frame does not fit the ring at all (longer than its largest record).
    #[error("a frame of {len} bytes exceeds the ring's largest record of {max} bytes")]
    TooLong {
        /// The frame's length.
        len: usize,
        /// The largest record the ring carries.
        max: usize,
    },
    /// The peer's memory cannot be read with `process_vm_readv` (CMA): the kernel refused it
    /// (ptrace policy, another user) or the peer is gone.
    #[error("reading {len} bytes of process {pid}'s memory: {source}")]
    RemoteRead {
        /// The peer's process id.
        pid: i32,
        /// Bytes asked for.
        len: usize,
        /// Why.
        source: io::Error,
    },
    /// A host identity or handshake message is malformed.
    #[error("malformed {what}: {why}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// What was wrong.
        why: String,
    },
    /// A bad argument (a ring too small, a size that is not a multiple of 8, …).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl Error {
    pub(crate) fn io(what: &'static str, source: impl Into<io::Error>) -> Self {
        Error::Io {
            what,
            source: source.into(),
        }
    }
}
