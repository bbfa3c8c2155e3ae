//! The crate's one error type.

use std::fmt;

/// A failed rdmacm or verbs operation: which call failed, the errno it reported, and a sentence
/// saying what that means for the caller.
///
/// When the peer rejected a connection, [`Error::reject_data`] holds the private data it sent
/// with the reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    call: &'static str,
    errno: i32,
    message: String,
    reject_data: Vec<u8>,
}

impl Error {
    /// An error for `call`, with an explicit errno and sentence.
    pub fn new(call: &'static str, errno: i32, message: impl Into<String>) -> Self {
        Error {
            call,
            errno,
            message: message.into(),
            reject_data: Vec::new(),
        }
    }

    /// An error for `call` whose errno is the thread's current `errno` (read immediately).
    pub fn last_os(call: &'static str, message: impl Into<String>) -> Self {
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        Self::new(call, errno, message)
    }

    /// An error for a C call that returns a negative errno or `-1` with `errno` set.
    pub(crate) fn from_ret(call: &'static str, ret: i32, message: impl Into<String>) -> Self {
        if ret < -1 {
            Self::new(call, -ret, message)
        } else if ret > 0 {
            // Verbs data-path calls (ibv_post_*, ibv_req_notify_cq) return the errno itself.
            Self::new(call, ret, message)
        } else {
            Self::last_os(call, message)
        }
    }

    /// An invalid argument detected before calling into rdma-core.
    pub fn invalid(call: &'static str, message: impl Into<String>) -> Self {
        Self::new(call, libc::EINVAL, message)
    }

    pub(crate) fn with_reject_data(mut self, data: Vec<u8>) -> Self {
        self.reject_data = data;
        self
    }

    /// The rdmacm or verbs function (or the rdmx operation) that failed.
    pub fn call(&self) -> &'static str {
        self.call
    }

    /// The errno reported by the failed call.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The human sentence describing the failure.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Private data the peer sent with a connection reject (empty otherwise).
    pub fn reject_data(&self) -> &[u8] {
        &self.reject_data
    }

    /// True when the peer (or its CM) refused the connection: nobody listens there, or the
    /// application rejected it.
    pub fn is_refused(&self) -> bool {
        self.errno == libc::ECONNREFUSED
    }

    /// True when the operation ran out of time.
    pub fn is_timeout(&self) -> bool {
        self.errno == libc::ETIMEDOUT
    }

    /// True when a queue was full and the work can be retried after completions are polled.
    pub fn is_queue_full(&self) -> bool {
        self.errno == libc::ENOMEM || self.errno == libc::EAGAIN
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let os = std::io::Error::from_raw_os_error(self.errno);
        write!(
            f,
            "{}: {} ({} failed: {})",
            self.call, self.message, self.call, os
        )
    }
}

impl From<Error> for std::io::Error {
    fn from(err: Error) -> Self {
        std::io::Error::from_raw_os_error(err.errno)
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_call_errno_and_sentence() {
        let err = Error::new(
            "rdma_connect",
            libc::ECONNREFUSED,
            "nobody listens on 192.0.2.1:7471",
        );
        let text = err.to_string();
        assert!(text.contains("rdma_connect"), "{text}");
        assert!(text.contains("nobody listens"), "{text}");
        assert!(text.contains("refused"), "{text}");
        assert!(err.is_refused());
        assert!(!err.is_timeout());
    }

    #[test]
    fn from_ret_understands_all_three_conventions() {
        assert_eq!(
            Error::from_ret("x", -libc::EINVAL, "m").errno(),
            libc::EINVAL
        );
        assert_eq!(
            Error::from_ret("x", libc::ENOMEM, "m").errno(),
            libc::ENOMEM
        );
        assert!(Error::from_ret("x", libc::ENOMEM, "m").is_queue_full());
    }
}
