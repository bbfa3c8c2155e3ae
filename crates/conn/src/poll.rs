//! Waiting on many file descriptors at once: [`Poller`] (epoll) and [`Waker`] (eventfd).
//!
//! One thread can sleep on the completion channels of several CQs ([`CompletionQueue::event_fd`]),
//! rdmacm event channels ([`Listener::event_fd`], [`EventChannel::event_fd`]) and a [`Waker`] that
//! other threads use to interrupt the sleep, each registered with a token of the caller's choice.
//!
//! [`CompletionQueue::event_fd`]: crate::CompletionQueue::event_fd
//! [`Listener::event_fd`]: crate::Listener::event_fd
//! [`EventChannel::event_fd`]: crate::EventChannel::event_fd

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::cq::timeout_ms;
use crate::{Error, Result};

/// How many ready file descriptors one `epoll_wait` call may report.
const WAIT_BATCH: usize = 64;

/// An epoll(7) set: file descriptors registered with a token each, and a wait that reports the
/// tokens of those that are readable.
///
/// Registrations are level-triggered: a descriptor is reported by every [`Poller::wait`] for as
/// long as it stays readable, so the caller must consume what made it readable (for a CQ's
/// channel: [`crate::CompletionQueue::take_events`]; for a [`Waker`]: [`Waker::drain`]).
///
/// The epoll descriptor is closed when the `Poller` is dropped. Registering a descriptor does
/// not keep it open: remove it (or drop the `Poller`) before closing it.
pub struct Poller {
    fd: OwnedFd,
}

impl Poller {
    /// Creates an empty epoll set (`epoll_create1(EPOLL_CLOEXEC)`).
    pub fn new() -> Result<Poller> {
        // SAFETY: epoll_create1 takes only flags and returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os(
                "epoll_create1",
                "cannot create an epoll instance (descriptor limit? see `ulimit -n`)",
            ));
        }
        // SAFETY: fd is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Poller { fd })
    }

    /// Registers `fd` for readability (`EPOLLIN`, level-triggered); [`Poller::wait`] reports it
    /// as `token`. Adding a descriptor twice fails with `EEXIST`.
    pub fn add(&self, fd: RawFd, token: u64) -> Result<()> {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        let epfd = self.fd.as_raw_fd();
        // SAFETY: the epoll descriptor is valid while self lives, and event is a valid
        // epoll_event that the kernel copies during the call.
        let ret = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut event) };
        if ret < 0 {
            return Err(Error::last_os(
                "epoll_ctl",
                format!("cannot add file descriptor {fd} (token {token}) to the epoll set"),
            ));
        }
        Ok(())
    }

    /// Unregisters `fd`. A descriptor that is not registered (`ENOENT`) or already closed
    /// (`EBADF`) is not an error: either way it is no longer in the set.
    pub fn remove(&self, fd: RawFd) -> Result<()> {
        // Kernels before 2.6.9 require a non-NULL event even for EPOLL_CTL_DEL.
        let mut event = libc::epoll_event { events: 0, u64: 0 };
        let epfd = self.fd.as_raw_fd();
        // SAFETY: the epoll descriptor is valid while self lives, and event is a valid
        // epoll_event (ignored for EPOLL_CTL_DEL).
        let ret = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, &mut event) };
        if ret < 0 {
            let err = std::io::Error::last_os_error();
            let errno = err.raw_os_error().unwrap_or(libc::EIO);
            if errno == libc::ENOENT || errno == libc::EBADF {
                return Ok(());
            }
            return Err(Error::new(
                "epoll_ctl",
                errno,
                format!("cannot remove file descriptor {fd} from the epoll set"),
            ));
        }
        Ok(())
    }

    /// Sleeps until at least one registered descriptor is readable or `timeout` passes, then
    /// appends the tokens of the readable ones to `out` and returns how many it appended.
    ///
    /// Returns `Ok(0)` when the timeout passed, and also when a signal interrupted the sleep
    /// (`EINTR`), so callers loop until their own deadline. `None` waits without limit. A
    /// sub-millisecond timeout is rounded up to a millisecond so that it still sleeps. At most 64
    /// tokens are reported per call; since registrations are level-triggered, any others that
    /// are still readable are reported by the next call.
    pub fn wait(&self, out: &mut Vec<u64>, timeout: Option<Duration>) -> Result<usize> {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; WAIT_BATCH];
        // SAFETY: the epoll descriptor is valid while self lives, and events has room for
        // WAIT_BATCH entries.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                WAIT_BATCH as i32,
                timeout_ms(timeout),
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(Error::new(
                "epoll_wait",
                err.raw_os_error().unwrap_or(libc::EIO),
                "cannot wait on the epoll set",
            ));
        }
        let n = n as usize;
        // epoll_event is packed on x86-64: copy the field out instead of borrowing it.
        out.extend(events[..n].iter().map(|event| event.u64));
        Ok(n)
    }
}

/// A non-blocking eventfd that wakes a thread sleeping in [`Poller::wait`]: register
/// [`Waker::fd`] with a token, call [`Waker::wake`] from any thread, and [`Waker::drain`] it once
/// the wakeup is seen (it stays readable until drained).
///
/// The eventfd is closed when the `Waker` is dropped.
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// Creates an eventfd (`EFD_NONBLOCK | EFD_CLOEXEC`) with its counter at zero.
    pub fn new() -> Result<Waker> {
        // SAFETY: eventfd takes an initial value and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os(
                "eventfd",
                "cannot create an eventfd (descriptor limit? see `ulimit -n`)",
            ));
        }
        // SAFETY: fd is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker { fd })
    }

    /// Makes the eventfd readable (adds 1 to its counter). Never blocks and never panics: when
    /// the counter is saturated (`EAGAIN`) the eventfd is readable already, and any other
    /// failure is logged.
    pub fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        loop {
            // SAFETY: the eventfd is valid while self lives, and `one` is 8 readable bytes.
            let n = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
            if n >= 0 {
                return;
            }
            let err = std::io::Error::last_os_error();
            match err.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => return,
                _ => {
                    log::error!("writing the waker's eventfd failed: {err}");
                    return;
                }
            }
        }
    }

    /// Resets the eventfd so that it is no longer readable, consuming every wakeup so far.
    pub fn drain(&self) {
        let mut value = [0u8; 8];
        loop {
            let fd = self.fd.as_raw_fd();
            // SAFETY: the eventfd is valid while self lives, and `value` is 8 writable bytes.
            let n = unsafe { libc::read(fd, value.as_mut_ptr().cast(), value.len()) };
            if n >= 0 {
                // Reading resets the counter; loop until a read would block.
                continue;
            }
            let err = std::io::Error::last_os_error();
            match err.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => return,
                _ => {
                    log::error!("reading the waker's eventfd failed: {err}");
                    return;
                }
            }
        }
    }

    /// The eventfd, to register with [`Poller::add`]. It stays owned by the `Waker`.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_millis(20);

    fn ready(poller: &Poller, timeout: Duration) -> Vec<u64> {
        let mut out = Vec::new();
        let n = poller.wait(&mut out, Some(timeout)).unwrap();
        assert_eq!(n, out.len());
        out.sort_unstable();
        out
    }

    #[test]
    fn poller_and_waker_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Poller>();
        check::<Waker>();
    }

    #[test]
    fn nothing_ready_times_out_with_zero() {
        let poller = Poller::new().unwrap();
        let waker = Waker::new().unwrap();
        poller.add(waker.fd(), 1).unwrap();
        let mut out = vec![99];
        assert_eq!(poller.wait(&mut out, Some(SHORT)).unwrap(), 0);
        assert_eq!(out, [99], "nothing appended, nothing removed");
        // A sub-millisecond timeout is rounded up and still returns.
        assert_eq!(
            poller
                .wait(&mut out, Some(Duration::from_micros(1)))
                .unwrap(),
            0
        );
        assert_eq!(poller.wait(&mut out, Some(Duration::ZERO)).unwrap(), 0);
    }

    #[test]
    fn wake_is_reported_until_drained() {
        let poller = Poller::new().unwrap();
        let waker = Waker::new().unwrap();
        poller.add(waker.fd(), 7).unwrap();
        waker.wake();
        waker.wake();
        assert_eq!(ready(&poller, SHORT), [7]);
        assert_eq!(
            ready(&poller, SHORT),
            [7],
            "level-triggered: still readable"
        );
        waker.drain();
        assert_eq!(ready(&poller, SHORT), Vec::<u64>::new());
        waker.drain();
        waker.wake();
        assert_eq!(ready(&poller, SHORT), [7], "woken again after a drain");
    }

    #[test]
    fn a_wake_from_another_thread_ends_an_unlimited_wait() {
        let poller = Poller::new().unwrap();
        let waker = std::sync::Arc::new(Waker::new().unwrap());
        poller.add(waker.fd(), 3).unwrap();
        let remote = waker.clone();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(SHORT);
            remote.wake();
        });
        let mut out = Vec::new();
        while out.is_empty() {
            poller.wait(&mut out, None).unwrap();
        }
        assert_eq!(out, [3]);
        thread.join().unwrap();
    }

    #[test]
    fn descriptors_are_reported_independently() {
        let poller = Poller::new().unwrap();
        let a = Waker::new().unwrap();
        let b = Waker::new().unwrap();
        poller.add(a.fd(), 1).unwrap();
        poller.add(b.fd(), u64::MAX).unwrap();
        b.wake();
        assert_eq!(ready(&poller, SHORT), [u64::MAX]);
        a.wake();
        assert_eq!(ready(&poller, SHORT), [1, u64::MAX]);
        b.drain();
        assert_eq!(ready(&poller, SHORT), [1]);
        a.drain();
        assert_eq!(ready(&poller, SHORT), Vec::<u64>::new());
        let err = poller.add(a.fd(), 2).unwrap_err();
        assert_eq!(err.errno(), libc::EEXIST, "{err}");
        assert_eq!(err.call(), "epoll_ctl");
    }

    #[test]
    fn removed_descriptors_are_not_reported() {
        let poller = Poller::new().unwrap();
        let a = Waker::new().unwrap();
        let b = Waker::new().unwrap();
        poller.add(a.fd(), 1).unwrap();
        poller.add(b.fd(), 2).unwrap();
        a.wake();
        b.wake();
        poller.remove(a.fd()).unwrap();
        assert_eq!(ready(&poller, SHORT), [2]);
        // Removing again (ENOENT) or removing a closed descriptor (EBADF) is fine.
        poller.remove(a.fd()).unwrap();
        poller.remove(-1).unwrap();
        // And a removed descriptor can be added again, with a new token.
        poller.add(a.fd(), 10).unwrap();
        assert_eq!(ready(&poller, SHORT), [2, 10]);
    }
}
