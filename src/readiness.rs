//! Readiness: which of a worker's sources (TCP sockets, RDMA completion and rdmacm event
//! channels, the waker) have something to do, from one `epoll_wait` for all of them.
//!
//! A [`Registry`] is an epoll set in mio's model: each source is registered under a token of
//! the caller's choice with an [`Interest`] (read, or read and write), and [`Registry::wait`]
//! reports [`Ready`] entries naming the token and what it is ready for. Registrations are
//! level-triggered, so a source stays reported for as long as it has unread input (or room
//! for output, when write interest is on): a TCP link asks for write interest only while it
//! has output a full socket buffer held back, and drops it once that is written.
//!
//! Built on rustix's epoll and eventfd (no `unsafe` here), not on rdmx-conn, so that a
//! TCP-only build needs no RDMA library.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::epoll;
use rustix::event::{eventfd, EventfdFlags};

/// How many ready sources one `epoll_wait` reports at most.
const WAIT_BATCH: usize = 64;

/// What a registered source is watched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Interest {
    /// Input (or hang-up, or an error).
    Read,
    /// Input, and room for output.
    ReadWrite,
    /// Room for output only (a TCP link whose input is paused until its peer reads: its
    /// socket stays readable, and watching that would wake every wait at once).
    Write,
}

impl Interest {
    /// Input, and room for output if `wants_write`.
    #[inline]
    pub(crate) fn for_output(wants_write: bool) -> Interest {
        if wants_write {
            Interest::ReadWrite
        } else {
            Interest::Read
        }
    }

    fn flags(self) -> epoll::EventFlags {
        match self {
            Interest::Read => epoll::EventFlags::IN,
            Interest::ReadWrite => epoll::EventFlags::IN | epoll::EventFlags::OUT,
            Interest::Write => epoll::EventFlags::OUT,
        }
    }
}

/// A source the last wait reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ready {
    /// The token it was registered with.
    pub(crate) token: u64,
    /// Input, a hang-up or an error is waiting (reading it reports which).
    pub(crate) readable: bool,
    /// Output can be written (only reported under [`Interest::ReadWrite`]).
    pub(crate) writable: bool,
}

/// An epoll set (see the module docs). The set is closed when the registry is dropped;
/// registering a source does not keep it open, so remove it before closing it.
pub(crate) struct Registry {
    epoll: OwnedFd,
}

impl Registry {
    /// The epoll set's fd: readable while any source in it is ready (an event loop can
    /// watch it).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }

    /// An empty set.
    pub(crate) fn new() -> io::Result<Registry> {
        Ok(Registry {
            epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?,
        })
    }

    /// Watches `source` for `interest`, reported as `token`.
    pub(crate) fn add(
        &self,
        source: BorrowedFd<'_>,
        token: u64,
        interest: Interest,
    ) -> io::Result<()> {
        epoll::add(
            &self.epoll,
            source,
            epoll::EventData::new_u64(token),
            interest.flags(),
        )?;
        Ok(())
    }

    /// Changes what `source` is watched for.
    pub(crate) fn modify(
        &self,
        source: BorrowedFd<'_>,
        token: u64,
        interest: Interest,
    ) -> io::Result<()> {
        epoll::modify(
            &self.epoll,
            source,
            epoll::EventData::new_u64(token),
            interest.flags(),
        )?;
        Ok(())
    }

    /// Stops watching `source`; one that is not registered is not an error.
    pub(crate) fn remove(&self, source: BorrowedFd<'_>) -> io::Result<()> {
        match epoll::delete(&self.epoll, source) {
            Err(e) if e == rustix::io::Errno::NOENT => Ok(()),
            other => Ok(other?),
        }
    }

    /// Appends what is ready to `out` (cleared first), waiting up to `timeout` (`None`:
    /// until something is) for the first. An interrupted wait reports nothing.
    pub(crate) fn wait(
        &self,
        out: &mut Vec<Ready>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        out.clear();
        let mut events = [const { MaybeUninit::<epoll::Event>::uninit() }; WAIT_BATCH];
        let timeout = timeout.map(|t| rustix::time::Timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: t.subsec_nanos().into(),
        });
        let events = match epoll::wait(&self.epoll, &mut events, timeout.as_ref()) {
            Ok((events, _)) => events,
            Err(rustix::io::Errno::INTR) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let bad = epoll::EventFlags::ERR | epoll::EventFlags::HUP;
        out.extend(events.iter().map(|e| {
            let flags = e.flags;
            Ready {
                token: e.data.u64(),
                readable: flags.intersects(epoll::EventFlags::IN | bad),
                writable: flags.intersects(epoll::EventFlags::OUT | bad),
            }
        }));
        Ok(out.len())
    }
}

/// Wakes a thread sleeping in [`Registry::wait`] from another thread: an eventfd that
/// [`Waker::wake`] makes readable and [`Waker::drain`] resets.
pub(crate) struct Waker {
    fd: OwnedFd,
}

impl Waker {
    pub(crate) fn new() -> io::Result<Waker> {
        Ok(Waker {
            fd: eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?,
        })
    }

    /// Makes the eventfd readable. Never blocks: a saturated counter is readable already.
    pub(crate) fn wake(&self) {
        match rustix::io::retry_on_intr(|| rustix::io::write(&self.fd, &1u64.to_ne_bytes())) {
            Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
            Err(e) => log::error!("writing the waker's eventfd failed: {e}"),
        }
    }

    /// Consumes every wakeup so far.
    pub(crate) fn drain(&self) {
        let mut value = [0u8; 8];
        match rustix::io::retry_on_intr(|| rustix::io::read(&self.fd, &mut value)) {
            Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
            Err(e) => log::error!("reading the waker's eventfd failed: {e}"),
        }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    const SHORT: Duration = Duration::from_millis(20);

    #[test]
    fn a_waker_is_reported_until_drained() {
        let reg = Registry::new().unwrap();
        let waker = Waker::new().unwrap();
        reg.add(waker.fd(), 7, Interest::Read).unwrap();
        let mut out = Vec::new();
        assert_eq!(reg.wait(&mut out, Some(Duration::ZERO)).unwrap(), 0);
        waker.wake();
        waker.wake();
        reg.wait(&mut out, Some(SHORT)).unwrap();
        assert_eq!(
            out,
            [Ready {
                token: 7,
                readable: true,
                writable: false
            }]
        );
        // Level-triggered: still there until drained.
        reg.wait(&mut out, Some(Duration::ZERO)).unwrap();
        assert_eq!(out.len(), 1);
        waker.drain();
        assert_eq!(reg.wait(&mut out, Some(Duration::ZERO)).unwrap(), 0);
    }

    #[test]
    fn write_interest_is_reported_only_when_asked_for() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        let reg = Registry::new().unwrap();
        reg.add(b.as_fd(), 3, Interest::Read).unwrap();
        let mut out = Vec::new();
        assert_eq!(reg.wait(&mut out, Some(Duration::ZERO)).unwrap(), 0);
        reg.modify(b.as_fd(), 3, Interest::ReadWrite).unwrap();
        reg.wait(&mut out, Some(SHORT)).unwrap();
        assert_eq!(
            out,
            [Ready {
                token: 3,
                readable: false,
                writable: true
            }]
        );
        // Readable, watched for output only: not reported while there is no room.
        a.write_all(b"x").unwrap();
        reg.modify(b.as_fd(), 3, Interest::Write).unwrap();
        reg.wait(&mut out, Some(SHORT)).unwrap();
        assert_eq!(
            out,
            [Ready {
                token: 3,
                readable: false,
                writable: true
            }]
        );
        reg.modify(b.as_fd(), 3, Interest::Read).unwrap();
        reg.wait(&mut out, Some(SHORT)).unwrap();
        assert_eq!(
            out,
            [Ready {
                token: 3,
                readable: true,
                writable: false
            }]
        );
        reg.remove(b.as_fd()).unwrap();
        reg.remove(b.as_fd()).unwrap();
        assert_eq!(reg.wait(&mut out, Some(Duration::ZERO)).unwrap(), 0);
    }

    #[test]
    fn a_hang_up_is_readable() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        let reg = Registry::new().unwrap();
        reg.add(b.as_fd(), 1, Interest::Read).unwrap();
        drop(a);
        let mut out = Vec::new();
        reg.wait(&mut out, Some(SHORT)).unwrap();
        assert_eq!(out.len(), 1);
        assert!(out[0].readable);
    }
}
