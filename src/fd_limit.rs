//! The process's descriptor limit: raised to its hard limit when a context is made (as Go's
//! runtime does), and named in errors when it is reached.
//!
//! A TCP connection costs a socket on each side, and a shared-memory one a Unix socket and the
//! peer's doorbell (see the crate docs' bounds); Linux's default soft limit of 1024
//! descriptors runs out near 500 such endpoints in one process, far below what the hard
//! limit allows (commonly 4096 to a million). RDMA connections cost none: they share their
//! worker's rdmacm event channel.

use std::io;

use rustix::process::{getrlimit, setrlimit, Resource};

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (logged at debug level). A failure is
/// logged, not an error: the process keeps the limit it has.
pub(crate) fn raise() {
    let lim = getrlimit(Resource::Nofile);
    let (Some(soft), Some(hard)) = (lim.current, lim.maximum) else {
        return; // unlimited
    };
    if soft >= hard {
        return;
    }
    let raised = rustix::process::Rlimit {
        current: Some(hard),
        maximum: Some(hard),
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => log::debug!(
            "raised the process's descriptor limit (soft RLIMIT_NOFILE) from {soft} to its \
             hard limit {hard} (RDMX_RAISE_NOFILE=0 leaves it)"
        ),
        Err(e) => {
            log::debug!("cannot raise the process's descriptor limit from {soft} to {hard}: {e}")
        }
    }
}

/// The process's soft descriptor limit, if it has one.
fn soft_limit() -> Option<u64> {
    getrlimit(Resource::Nofile).current
}

/// What an errno of running out of descriptors means, with the limit reached: `None` for
/// any other errno.
pub(crate) fn note(errno: i32) -> Option<String> {
    match rustix::io::Errno::from_raw_os_error(errno) {
        rustix::io::Errno::MFILE => Some(format!(
            "too many open files (EMFILE): the process's descriptor limit ({}) is reached",
            soft_limit().map_or_else(|| "none".to_string(), |n| n.to_string())
        )),
        rustix::io::Errno::NFILE => Some(
            "too many open files in the system (ENFILE): the system's descriptor limit \
             (fs.file-max) is reached"
                .to_string(),
        ),
        _ => None,
    }
}

/// [`note`] of an I/O error, as `": <note>"` to append to its message (empty otherwise).
pub(crate) fn suffix(err: &io::Error) -> String {
    err.raw_os_error()
        .and_then(note)
        .map_or_else(String::new, |n| format!(": {n}"))
}

/// [`note`] of the process being out of descriptors now (an eventfd cannot be made), for
/// errors whose own text lost the errno (shared memory's setup): `": <note>"`, or empty.
pub(crate) fn suffix_if_exhausted() -> String {
    match rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC) {
        Ok(_) => String::new(),
        Err(e) => note(e.raw_os_error()).map_or_else(String::new, |n| format!(": {n}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_descriptors_is_named_with_the_limit() {
        let soft = soft_limit().unwrap();
        let text = suffix(&io::Error::from_raw_os_error(24));
        assert_eq!(
            text,
            format!(
                ": too many open files (EMFILE): the process's descriptor limit ({soft}) is \
                 reached"
            )
        );
        assert!(note(23).unwrap().contains("fs.file-max"));
        assert_eq!(suffix(&io::Error::from_raw_os_error(22)), "");
        assert_eq!(suffix_if_exhausted(), "");
    }
}
