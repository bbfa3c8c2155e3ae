//! Handing descriptors (a segment, a doorbell) to the peer over a Unix socket (SCM_RIGHTS),
//! and who the peer is (SO_PEERCRED).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::{Error, Result};

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// Sends `data` (at most a few hundred bytes: one message, not a stream) with `fds`.
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    if fds.len() > MAX_FDS || data.is_empty() {
        return Err(Error::Invalid(format!(
            "{} descriptors with {} bytes (at most {MAX_FDS}, with at least a byte)",
            fds.len(),
            data.len()
        )));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Error::Invalid(
            "the descriptors do not fit a message".into(),
        ));
    }
    let sent = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(|e| Error::io("sending descriptors", e))?;
    if sent != data.len() {
        return Err(Error::io(
            "sending descriptors",
            std::io::Error::other(format!("{sent} of {} bytes went", data.len())),
        ));
    }
    Ok(())
}

/// Receives one message sent by [`send_with_fds`]: its bytes into `buf` (how many: the
/// first of the pair) and the descriptors that came with it (close-on-exec). Descriptors
/// beyond [`MAX_FDS`] are refused by the kernel's truncation, reported as an error.
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| Error::io("receiving descriptors", e))?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    if msg.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(Error::Malformed {
            what: "descriptor message",
            why: format!("more than {MAX_FDS} descriptors"),
        });
    }
    Ok((msg.bytes, fds))
}

/// The process id and user id of the peer of a connected Unix socket, as the kernel saw them
/// when it connected (the pid as this process's pid namespace numbers it: 0 when the peer's
/// is not visible from here).
pub fn peer_credentials(sock: &UnixStream) -> Result<(i32, u32)> {
    // (nix's, not rustix's: rustix's pid type cannot be 0.)
    let cred = nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| Error::io("SO_PEERCRED", e))?;
    Ok((cred.pid(), cred.uid()))
}
