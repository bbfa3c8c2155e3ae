//! Connecting, answering, and the HELLO / ACCEPT / REJECT messages.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::link::Link;
use crate::wire::{self, HANDSHAKE_PREFIX, HEADER_LEN};
use crate::{Error, Result, MAX_PRIVATE_DATA};

/// A connection whose HELLO arrived, waiting to be accepted or rejected. Dropping it closes
/// the connection without an answer.
pub struct ConnectionRequest {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    data: Vec<u8>,
}

impl fmt::Debug for ConnectionRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionRequest")
            .field("peer_addr", &self.peer)
            .field("private_data_len", &self.data.len())
            .finish_non_exhaustive()
    }
}

impl ConnectionRequest {
    pub(crate) fn new(stream: TcpStream, peer: Option<SocketAddr>, data: Vec<u8>) -> Self {
        ConnectionRequest { stream, peer, data }
    }

    /// The connector's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The private data the connector sent in its HELLO (at most [`MAX_PRIVATE_DATA`] bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.data
    }

    /// Answers ACCEPT with `private_data` (at most [`MAX_PRIVATE_DATA`] bytes) and returns
    /// the nonblocking [`Link`]; [`Link::peer_private_data`] is the connector's HELLO data.
    ///
    /// # Errors
    ///
    /// `private_data` too long (the connection is then dropped unanswered), writing the
    /// answer failed (see [`ConnectionRequest::reject`]), or configuring the socket did.
    pub fn accept(self, private_data: &[u8]) -> Result<Link> {
        self.answer(wire::KIND_ACCEPT, private_data)?;
        let peer = self.peer;
        Link::new(self.stream, self.data).map_err(|e| Error::io("configure link", peer, e))
    }

    /// Answers REJECT with `private_data` (the reason, at most [`MAX_PRIVATE_DATA`] bytes;
    /// the connector's [`connect`] fails with [`Error::is_refused`] and
    /// [`Error::reject_data`]) and closes the connection.
    ///
    /// # Errors
    ///
    /// `private_data` too long (the connection is then dropped unanswered), or writing the
    /// answer failed. The answer is written without waiting: it is the first thing sent
    /// on the connection and a few hundred bytes, so an empty socket send buffer always
    /// takes it whole; anything else (the peer reset the connection) fails, and the
    /// connection is dropped.
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.answer(wire::KIND_REJECT, private_data)?;
        // The connector sends nothing after its HELLO, which was read exactly, so closing
        // sends a FIN (not a reset that could destroy the REJECT in flight).
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        Ok(())
    }

    fn answer(&self, kind: u8, private_data: &[u8]) -> Result<()> {
        let what = format!("send {}", wire::kind_name(kind));
        check_private_data(&what, self.peer, private_data)?;
        // The stream is nonblocking (see the listener): one write, never a wait on the peer.
        let msg = wire::handshake(kind, private_data);
        loop {
            return match (&self.stream).write(&msg) {
                Ok(n) if n == msg.len() => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(Error::io(what, self.peer, e)),
                Ok(n) => Err(Error::io(
                    what,
                    self.peer,
                    io::Error::other(format!(
                        "the socket's send buffer took {n} of the answer's {} bytes",
                        msg.len()
                    )),
                )),
            };
        }
    }
}

/// Connects to `addr` (`"host:port"`), sends HELLO with `private_data` (at most
/// [`MAX_PRIVATE_DATA`] bytes) and waits for the listener's answer.
///
/// `timeout` bounds the TCP connect and the HELLO / answer exchange together (name
/// resolution, done first by the system resolver, is not bounded). Every address `addr`
/// resolves to is tried in turn until a TCP connection is made.
///
/// # Errors
///
/// * the listener answered REJECT: [`Error::is_refused`] and [`Error::reject_data`] holds its
///   reason bytes;
/// * the operating system refused the connection (nobody listens): [`Error::is_refused`];
/// * the deadline passed, connecting or waiting for the answer: [`Error::is_timeout`];
/// * name resolution, I/O or protocol errors (an answer that is not a valid ACCEPT or
///   REJECT), or `private_data` too long.
pub fn connect(addr: &str, private_data: &[u8], timeout: Duration) -> Result<Link> {
    check_private_data("connect", None, private_data)?;
    let deadline = Instant::now().checked_add(timeout);
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("resolve {addr}"), None, e))?
        .collect();
    let mut last = None;
    for a in addrs {
        let peer = Some(a);
        let res = match remaining(deadline) {
            Ok(Some(left)) => TcpStream::connect_timeout(&a, left),
            Ok(None) => TcpStream::connect(a),
            Err(_) => return Err(last.unwrap_or_else(|| Error::timeout("connect", peer))),
        };
        match res {
            Ok(stream) => return hello(stream, peer, private_data, deadline),
            Err(e) => {
                log::debug!("connect to {a} failed: {e}");
                last = Some(Error::io("connect", peer, e));
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        Error::invalid(
            format!("resolve {addr}"),
            None,
            "the name resolves to no address",
        )
    }))
}

/// The connector's half of the exchange on a connected stream.
fn hello(
    stream: TcpStream,
    peer: Option<SocketAddr>,
    private_data: &[u8],
    deadline: Option<Instant>,
) -> Result<Link> {
    let setup = |e| Error::io("configure socket", peer, e);
    stream.set_nodelay(true).map_err(setup)?;
    write_all_by(
        &stream,
        &wire::handshake(wire::KIND_HELLO, private_data),
        deadline,
    )
    .map_err(|e| Error::io("send HELLO", peer, e))?;
    let (kind, data) = read_handshake(&stream, peer, "wait for ACCEPT", deadline)?;
    match kind {
        wire::KIND_ACCEPT => Link::new(stream, data).map_err(setup),
        wire::KIND_REJECT => Err(Error::rejected("connect", peer, data)),
        other => Err(Error::protocol(
            "wait for ACCEPT",
            peer,
            format!("expected ACCEPT or REJECT, got {}", wire::kind_name(other)),
        )),
    }
}

fn check_private_data(what: &str, peer: Option<SocketAddr>, data: &[u8]) -> Result<()> {
    if data.len() > MAX_PRIVATE_DATA {
        return Err(Error::invalid(
            what,
            peer,
            format!(
                "{} bytes of private data, at most {MAX_PRIVATE_DATA} allowed",
                data.len()
            ),
        ));
    }
    Ok(())
}

/// Reads one handshake message (exactly its bytes, nothing more) and returns its kind and
/// private data.
fn read_handshake(
    stream: &TcpStream,
    peer: Option<SocketAddr>,
    what: &str,
    deadline: Option<Instant>,
) -> Result<(u8, Vec<u8>)> {
    let mut hdr = [0u8; HEADER_LEN];
    read_exact_by(stream, &mut hdr, deadline).map_err(|e| hs_io_error(what, peer, e))?;
    let (kind, len) = check_header(what, peer, &hdr)?;
    let mut body = vec![0u8; len];
    read_exact_by(stream, &mut body, deadline).map_err(|e| hs_io_error(what, peer, e))?;
    Ok((kind, check_body(what, peer, body)?))
}

/// Checks the envelope header of a handshake message: its kind (HELLO, ACCEPT or REJECT)
/// and body length (`HANDSHAKE_PREFIX..=HANDSHAKE_PREFIX + MAX_PRIVATE_DATA`).
pub(crate) fn check_header(
    what: &str,
    peer: Option<SocketAddr>,
    hdr: &[u8; HEADER_LEN],
) -> Result<(u8, usize)> {
    let (kind, len) = wire::parse_header(hdr).map_err(|m| Error::protocol(what, peer, m))?;
    if !matches!(
        kind,
        wire::KIND_HELLO | wire::KIND_ACCEPT | wire::KIND_REJECT
    ) {
        return Err(Error::protocol(
            what,
            peer,
            format!(
                "expected a handshake message, got kind {kind} ({})",
                wire::kind_name(kind)
            ),
        ));
    }
    if !(HANDSHAKE_PREFIX..=HANDSHAKE_PREFIX + MAX_PRIVATE_DATA).contains(&len) {
        return Err(Error::protocol(
            what,
            peer,
            format!(
                "{} body of {len} bytes (must be {HANDSHAKE_PREFIX}..={})",
                wire::kind_name(kind),
                HANDSHAKE_PREFIX + MAX_PRIVATE_DATA
            ),
        ));
    }
    Ok((kind, len))
}

/// Checks the magic and version of a handshake message's body (of a length
/// [`check_header`] allowed) and returns its private data.
pub(crate) fn check_body(
    what: &str,
    peer: Option<SocketAddr>,
    mut body: Vec<u8>,
) -> Result<Vec<u8>> {
    if body.len() < HANDSHAKE_PREFIX {
        return Err(Error::protocol(what, peer, "a truncated handshake body"));
    }
    if body[..4] != wire::MAGIC {
        return Err(Error::protocol(
            what,
            peer,
            format!("bad handshake magic {:?} (expected \"RXTC\")", &body[..4]),
        ));
    }
    let version = u16::from_le_bytes([body[4], body[5]]);
    if version != wire::VERSION {
        return Err(Error::protocol(
            what,
            peer,
            format!(
                "unsupported handshake version {version} (this side speaks {})",
                wire::VERSION
            ),
        ));
    }
    body.drain(..HANDSHAKE_PREFIX);
    Ok(body)
}

fn hs_io_error(what: &str, peer: Option<SocketAddr>, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::TimedOut {
        Error::timeout(what, peer)
    } else {
        Error::io(what, peer, e)
    }
}

/// The time left before `deadline`: `Ok(None)` without deadline, a `TimedOut` error once it
/// has passed.
fn remaining(deadline: Option<Instant>) -> io::Result<Option<Duration>> {
    match deadline {
        None => Ok(None),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
            } else {
                Ok(Some(left))
            }
        }
    }
}

/// `read_exact` on a blocking stream that honours `deadline` across partial reads.
fn read_exact_by(
    stream: &TcpStream,
    mut buf: &mut [u8],
    deadline: Option<Instant>,
) -> io::Result<()> {
    while !buf.is_empty() {
        stream.set_read_timeout(remaining(deadline)?)?;
        match (&*stream).read(buf) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the handshake",
                ))
            }
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `write_all` on a blocking stream that honours `deadline` across partial writes.
fn write_all_by(stream: &TcpStream, mut buf: &[u8], deadline: Option<Instant>) -> io::Result<()> {
    while !buf.is_empty() {
        stream.set_write_timeout(remaining(deadline)?)?;
        match (&*stream).write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
