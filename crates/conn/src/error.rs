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
    /// An error for `call`, with an explicit errno and sentence. Running out of descriptors
    /// (`EMFILE`, `ENFILE`) is said in so many words, with the limit reached.
    pub fn new(call: &'static str, errno: i32, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if let Some(note) = descriptor_note(errno) {
            message = format!("{message}: {note}");
        }
        Error {
            call,
            errno,
            message,
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

    /// [`Error::last_os`] for an rdmacm call that opens an event channel of its own
    /// (`rdma_create_ep`, `rdma_create_id`): rdmacm reports a channel it could not open as
    /// `ENOMEM`, also when the process is out of descriptors, which is then the error.
    pub(crate) fn last_rdmacm(call: &'static str, message: impl Into<String>) -> Self {
        let err = Self::last_os(call, message);
        match out_of_descriptors() {
            Some(errno) if err.errno == libc::ENOMEM || err.errno == libc::ENODEV => Error {
                errno,
                message: format!(
                    "{}: {}",
                    err.message,
                    descriptor_note(errno).unwrap_or_default()
                ),
                ..err
            },
            _ => err,
        }
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

    /// True when the process (or the system) ran out of file descriptors.
    pub fn is_out_of_descriptors(&self) -> bool {
        self.errno == libc::EMFILE || self.errno == libc::ENFILE
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

/// What running out of descriptors means, for an errno that says so.
fn descriptor_note(errno: i32) -> Option<String> {
    match errno {
        libc::EMFILE => Some(format!(
            "too many open files (EMFILE): the process's descriptor limit ({}) is reached",
            descriptor_limit().map_or_else(|| "?".to_string(), |n| n.to_string())
        )),
        libc::ENFILE => Some(
            "too many open files in the system (ENFILE): the system's descriptor limit \
             (fs.file-max) is reached"
                .to_string(),
        ),
        _ => None,
    }
}

/// The process's soft limit on open descriptors (`RLIMIT_NOFILE`).
fn descriptor_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit the call fills in.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim.rlim_cur)
}

/// Whether the process is out of descriptors now: for calls (rdmacm's device list) that
/// report running out of them as something else.
pub(crate) fn out_of_descriptors() -> Option<i32> {
    // SAFETY: eventfd takes an initial value and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: fd was just created and nothing else owns it.
        unsafe { libc::close(fd) };
        return None;
    }
    let errno = std::io::Error::last_os_error().raw_os_error()?;
    (errno == libc::EMFILE || errno == libc::ENFILE).then_some(errno)
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
    fn running_out_of_descriptors_says_so_with_the_limit() {
        let err = Error::new("rdma_create_ep", libc::EMFILE, "cannot resolve a route");
        let limit = descriptor_limit().unwrap();
        let text = err.to_string();
        assert!(
            text.contains(&format!(
                "too many open files (EMFILE): the process's descriptor limit ({limit}) is reached"
            )),
            "{text}"
        );
        assert!(
            text.starts_with("rdma_create_ep: cannot resolve a route: "),
            "{text}"
        );
        assert!(err.is_out_of_descriptors());
        let err = Error::new("x", libc::ENFILE, "m");
        assert!(err.to_string().contains("fs.file-max"), "{err}");
        assert!(!Error::new("x", libc::EINVAL, "m")
            .to_string()
            .contains("EMFILE"));
        assert_eq!(out_of_descriptors(), None);
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
