//! Doorbells: an eventfd a sleeping consumer waits on and producers ring.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::{eventfd, EventfdFlags};

use crate::{Error, Result};

/// An eventfd (nonblocking): readable once rung, until drained.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A new doorbell, not rung.
    pub fn new() -> Result<Doorbell> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| Error::io("creating a doorbell (eventfd)", e))?;
        Ok(Doorbell { fd })
    }

    /// The peer's doorbell, handed over as `fd`: refused unless it is an eventfd (anything
    /// else could block a write or be a file). Made nonblocking.
    pub fn from_fd(fd: OwnedFd) -> Result<Doorbell> {
        use std::os::fd::AsRawFd;
        let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| Error::io("checking the doorbell handed over", e))?;
        if target.as_os_str() != "anon_inode:[eventfd]" {
            return Err(Error::BadSegment(format!(
                "the doorbell handed over is {} rather than an eventfd",
                target.display()
            )));
        }
        let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| Error::io("reading its flags", e))?;
        rustix::fs::fcntl_setfl(&fd, flags | rustix::fs::OFlags::NONBLOCK)
            .map_err(|e| Error::io("making the doorbell nonblocking", e))?;
        Ok(Doorbell { fd })
    }

    /// Rings it. A counter already at its maximum (a peer ringing without end) is rung
    /// already, so that failure is not one.
    pub fn ring(&self) -> Result<()> {
        match rustix::io::write(&self.fd, &1u64.to_ne_bytes()) {
            Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(()),
            Err(e) => Err(Error::io("ringing a doorbell", io::Error::from(e))),
        }
    }

    /// Takes the rings so far: the fd is not readable until rung again. Returns whether it
    /// had been rung.
    pub fn drain(&self) -> Result<bool> {
        let mut buf = [0u8; 8];
        match rustix::io::read(&self.fd, &mut buf) {
            Ok(_) => Ok(true),
            Err(rustix::io::Errno::AGAIN) => Ok(false),
            Err(e) => Err(Error::io("draining a doorbell", io::Error::from(e))),
        }
    }

    /// The eventfd, to wait on (readable when rung) or to hand to a peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
