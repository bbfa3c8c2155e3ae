//! An established connection: the output queue and the incremental input parser.

use std::collections::hash_map::Entry;
use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::output::{OutItem, Output, MAX_IOVECS};
use crate::parser::{Expected, Input, Lent, SPARE_FRAMES};
use crate::wire::{self, KIND_FRAME, MAX_READ_DATA, STATUS_FAILED, STATUS_OK};
use crate::{Error, Result, MAX_FRAME_LEN};

/// Size of the reusable receive buffer (headers, frames, READ_REQs).
pub(crate) const READ_CHUNK: usize = 64 * 1024;
/// How much one read into the receive buffer takes while READ answers are expected: the
/// bytes after a READ_DATA header that land in the receive buffer are copied again into the
/// lent buffer, so a full [`READ_CHUNK`] there would copy up to a quarter of a 256 KiB
/// answer twice (1 MiB rendezvous over loopback: 6.7–7.0 → 7.7–7.8 GB/s); a few KiB still
/// takes a burst of small frames in one call.
const READ_STAGE_WHILE_READING: usize = 4 * 1024;
/// Bytes one [`Link::poll`] reads at most, so one busy link cannot starve a worker.
const POLL_BUDGET: usize = 4 << 20;
/// Events after which one [`Link::poll`] reads no more (it finishes the read under way):
/// what a caller holds of one poll's input stays small, whatever the frames' size — this
/// many and what one read of [`READ_CHUNK`] brought (1 638 messages of 40 bytes, the
/// smallest an rdmx peer sends; 8 192 empty frames).
const MAX_POLL_EVENTS: usize = 1024;

/// What [`Link::poll`] found on the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// One FRAME body, exactly as the peer passed it (frame and payload concatenated) to
    /// [`Link::queue_frame`].
    Frame(Vec<u8>),
    /// The peer asks to read `len` bytes of the buffer it names by `addr` and `rkey`; answer
    /// with [`Link::queue_read_data`] under the same `read_id`.
    ReadRequest {
        /// The requester's name for the read, to echo in the answer.
        read_id: u64,
        /// Remote address of the first byte, as the requester was told it.
        addr: u64,
        /// Remote key, as the requester was told it.
        rkey: u32,
        /// Bytes to read.
        len: u64,
    },
    /// A read registered with [`Link::expect_read`] finished: `ok` means all its bytes landed
    /// in the lent buffer; `!ok` means the peer reported failure and the buffer is untouched.
    ReadDone {
        /// The read's id, as given to [`Link::expect_read`].
        read_id: u64,
        /// Whether the data arrived.
        ok: bool,
    },
    /// The connection is over: the peer closed it, it was reset, or the peer sent malformed
    /// input (then the socket is shut down). `reason` says which, naming what was wrong.
    /// It is the link's last event.
    Closed {
        /// Human-readable cause.
        reason: String,
    },
}

/// An established connection carrying frames and emulated RDMA READs.
///
/// All methods take `&self`: the output side (`queue_*`, [`flush`](Link::flush),
/// [`wants_write`](Link::wants_write)) and the input side ([`poll`](Link::poll), the lent
/// buffers) have one mutex each, so one thread may write while another reads. The socket is
/// nonblocking and has `TCP_NODELAY` set.
///
/// # Output limit and back-pressure
///
/// What a peer asks for (READ answers, and whatever the caller queues in reply to its
/// frames) waits in the output queue until the peer reads it. A peer that asks and never
/// reads would make the queue grow without end, so the queue has a limit
/// ([`Link::set_output_limit`], default [`DEFAULT_OUTPUT_LIMIT`](crate::DEFAULT_OUTPUT_LIMIT)):
/// once the memory it holds ([`Link::queued_bytes`]: the copied messages' buffers and one
/// slot per queued item; a READ answer's data is the caller's buffer, held by `Arc`, and not
/// counted) goes above it, the link stops reading its input ([`Link::input_paused`]:
/// [`Link::poll`] returns nothing and reads nothing) until [`Link::flush`] has brought it
/// down to half the limit. Meanwhile the peer's requests wait in its own socket, and TCP's
/// flow control stops it from sending more: the peer that does not read waits, no other.
/// While paused, watch [`Link::fd`] for writability only (it stays readable).
pub struct Link {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
    peer_data: Vec<u8>,
    output: Mutex<Output>,
    input: Mutex<Input>,
    /// The output is above its limit: input is not read (see [`Link::input_paused`]).
    paused: Arc<AtomicBool>,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("peer_addr", &self.peer)
            .field("local_addr", &self.local)
            .finish_non_exhaustive()
    }
}

impl Link {
    pub(crate) fn new(stream: TcpStream, peer_data: Vec<u8>) -> io::Result<Link> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(Link {
            peer: stream.peer_addr().ok(),
            local: stream.local_addr().ok(),
            stream,
            peer_data,
            output: Mutex::new(Output::default()),
            input: Mutex::new(Input::default()),
            paused: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Bounds how long a dead or unreachable peer of an idle connection goes unnoticed: TCP
    /// keepalive probes it after `interval` (whole seconds, at least 1) without traffic,
    /// then every `interval`, and gives up after 3 unanswered probes; the socket then
    /// reports `ETIMEDOUT` and the link breaks. The peer's kernel answers probes, so a peer
    /// whose application does not progress is not mistaken for a dead one. A connection with
    /// data unacknowledged is probed by TCP's retransmissions instead, up to the kernel's
    /// limit (`tcp_retries2`, minutes). `TCP_USER_TIMEOUT` would bound that too, but Linux
    /// also counts a zero window against it: a peer slow to read (a full receive buffer for
    /// a few seconds) would be cut off, which is what the keepalive must never do.
    pub fn set_keepalive(&self, interval: std::time::Duration) -> io::Result<()> {
        use rustix::net::sockopt;
        let secs = interval.as_secs_f64().ceil().max(1.0) as u64;
        let every = std::time::Duration::from_secs(secs);
        sockopt::set_socket_keepalive(&self.stream, true)?;
        sockopt::set_tcp_keepidle(&self.stream, every)?;
        sockopt::set_tcp_keepintvl(&self.stream, every)?;
        sockopt::set_tcp_keepcnt(&self.stream, 3)?;
        Ok(())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// This side's address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// The private data the peer sent in the handshake (its HELLO if this side accepted, its
    /// ACCEPT if this side connected).
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_data
    }

    /// The socket's descriptor, to poll for readability (then call [`Link::poll`]) and, while
    /// [`Link::wants_write`], for writability (then call [`Link::flush`]). Use
    /// level-triggered readiness: [`Link::poll`] reads at most a few MiB per call.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    // ---- output side

    /// Sets the output limit (see [the type's docs](Link#output-limit-and-back-pressure)):
    /// above `bytes` held by the output queue, the link stops reading its input until the
    /// queue is down to half of it. `usize::MAX` never pauses.
    pub fn set_output_limit(&self, bytes: usize) {
        let mut out = self.output.lock();
        out.limit = bytes;
        out.resume_at = bytes / 2;
        self.settle(&mut out);
    }

    /// The memory the output queue holds, as checked against the output limit: the buffers
    /// of the messages queued (frames, READ requests, failed READ answers), and one slot per
    /// queued item (READ answers included, not their data).
    pub fn queued_bytes(&self) -> usize {
        self.output.lock().held()
    }

    /// Whether the link has stopped reading its input because its output queue went above
    /// the limit (see [the type's docs](Link#output-limit-and-back-pressure)); it reads
    /// again once [`Link::flush`] has brought the queue down to half the limit (or the
    /// output side failed, which empties it).
    #[inline]
    pub fn input_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The flag [`Link::input_paused`] reads, for a caller that checks it often without
    /// holding the link (set and cleared by the link only).
    pub fn input_paused_flag(&self) -> Arc<AtomicBool> {
        self.paused.clone()
    }

    /// Pauses or resumes the input as what `out` holds now asks.
    #[inline]
    fn settle(&self, out: &mut Output) {
        if out.should_pause() != out.paused {
            self.settle_slow(out);
        }
    }

    #[cold]
    #[inline(never)]
    fn settle_slow(&self, out: &mut Output) {
        out.paused = !out.paused;
        // (Sequentially consistent: a caller that holds input back while paused checks the
        // flag after saying so, and one that sees the input resume checks for held input.)
        self.paused.store(out.paused, Ordering::SeqCst);
        if out.paused {
            log::debug!(
                "link to {:?}: {} bytes of output queued, above the limit of {}: not reading \
                 the peer's input until it reads its own",
                self.peer,
                out.held(),
                out.limit
            );
        } else {
            log::debug!(
                "link to {:?}: output down to {} bytes: reading input again",
                self.peer,
                out.held()
            );
        }
    }

    /// Queues one FRAME whose body is `frame` followed by `payload` (both copied; small
    /// frames share one buffer, so many of them go out in one system call).
    ///
    /// A body longer than [`MAX_FRAME_LEN`] is not sent: the output side fails and the next
    /// [`Link::flush`] returns an error naming the size (the peer would have closed the
    /// connection on receiving it).
    pub fn queue_frame(&self, frame: &[u8], payload: &[u8]) {
        let mut out = self.output.lock();
        if out.failed.is_some() {
            return;
        }
        let body = frame.len().saturating_add(payload.len());
        if body > MAX_FRAME_LEN {
            let reason = format!(
                "a frame body of {body} bytes was queued, more than MAX_FRAME_LEN \
                 ({MAX_FRAME_LEN} bytes)"
            );
            log::error!("link to {:?}: {reason}", self.peer);
            out.fail(reason);
            self.settle(&mut out);
            return;
        }
        out.push_bytes(&[&wire::header(KIND_FRAME, body), frame, payload]);
        self.settle(&mut out);
    }

    /// Queues a READ_REQ asking the peer for `len` bytes at `addr` under `rkey`; the peer's
    /// [`Link::poll`] reports it as [`Event::ReadRequest`]. Register where the answer lands
    /// with [`Link::expect_read`] first.
    pub fn queue_read_request(&self, read_id: u64, addr: u64, rkey: u32, len: u64) {
        let mut out = self.output.lock();
        if out.failed.is_none() {
            out.push_bytes(&[&wire::read_req(read_id, addr, rkey, len)]);
            self.settle(&mut out);
        }
    }

    /// Queues the READ_DATA answering the peer's read `read_id`: `len` bytes of
    /// `data[offset..]`, written by vectored writes straight from `data` (no copy; the `Arc`
    /// is held until the bytes are written or the link fails).
    ///
    /// `ok = false` sends a failure without payload instead (`data` is ignored): use it when
    /// the request's addr/rkey name no exposed buffer. `ok = true` with `data = None` sends
    /// a successful zero-length answer. A range outside `data`, or longer than a READ_DATA
    /// can carry (4 GiB − 17 bytes), is answered with a failure too (and logged).
    pub fn queue_read_data(
        &self,
        read_id: u64,
        ok: bool,
        data: Option<(Arc<Vec<u8>>, usize, usize)>,
    ) {
        let mut out = self.output.lock();
        if out.failed.is_some() {
            return;
        }
        let slice = match (ok, data) {
            (false, _) => Err(()),
            (true, None) => Ok(None),
            (true, Some((data, offset, len))) => {
                let fits = offset.checked_add(len).is_some_and(|end| end <= data.len());
                if fits && len <= MAX_READ_DATA {
                    Ok(Some((data, offset, len)))
                } else {
                    log::warn!(
                        "link to {:?}: READ_DATA for read {read_id} names {len} bytes at offset \
                         {offset} of a {}-byte buffer; answering with a failure",
                        self.peer,
                        data.len()
                    );
                    Err(())
                }
            }
        };
        match slice {
            Ok(Some((data, start, len))) if len > 0 => out.push_data(OutItem::Data {
                head: wire::read_data_head(read_id, STATUS_OK, len),
                data,
                start,
                len,
                pos: 0,
            }),
            Ok(_) => out.push_bytes(&[&wire::read_data_head(read_id, STATUS_OK, 0)]),
            Err(()) => out.push_bytes(&[&wire::read_data_head(read_id, STATUS_FAILED, 0)]),
        }
        self.settle(&mut out);
    }

    /// Writes as much of the queued output as the socket takes without blocking.
    ///
    /// Returns `Ok(true)` when everything queued has been written, `Ok(false)` when the
    /// socket is full (then [`Link::wants_write`] is true: flush again once [`Link::fd`] is
    /// writable).
    ///
    /// # Errors
    ///
    /// The socket failed (e.g. reset by the peer) or an oversized frame was queued. The
    /// output side is then dead: queued output is dropped (releasing READ_DATA buffers),
    /// later `queue_*` calls are ignored and every later flush fails too.
    pub fn flush(&self) -> Result<bool> {
        let mut guard = self.output.lock();
        let out = &mut *guard;
        if let Some(reason) = &out.failed {
            return Err(Error::failed("flush", self.peer, reason.clone()));
        }
        loop {
            let written = match out.queue.front() {
                None => return Ok(true),
                // The common case, small messages coalesced into one buffer: one plain write,
                // without building an I/O vector array.
                Some(OutItem::Bytes { buf, pos }) if out.queue.len() == 1 => {
                    (&self.stream).write(&buf[*pos..])
                }
                Some(_) => {
                    let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
                    let mut n = 0;
                    for item in &out.queue {
                        if n + 2 > MAX_IOVECS {
                            break;
                        }
                        item.slices(&mut iov, &mut n);
                    }
                    (&self.stream).write_vectored(&iov[..n])
                }
            };
            match written {
                Ok(0) => {
                    let e = io::Error::from(io::ErrorKind::WriteZero);
                    out.fail(e.to_string());
                    self.settle(out);
                    return Err(Error::io("flush", self.peer, e));
                }
                Ok(written) => {
                    out.advance(written);
                    // (Writing only shrinks the queue: it may resume a paused input.)
                    if out.paused {
                        self.settle(out);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => {
                    out.fail(format!("send failed: {e}"));
                    self.settle(out);
                    return Err(Error::io("flush", self.peer, e));
                }
            }
        }
    }

    /// Whether output is waiting to be written: after a [`Link::flush`] that returned
    /// `Ok(false)`, it waits for the socket to become writable. (Also true between a
    /// `queue_*` call and the next flush; false once the output side failed.)
    pub fn wants_write(&self) -> bool {
        !self.output.lock().queue.is_empty()
    }

    // ---- input side

    /// Lends `buf` to the link as the destination of READ_DATA for reads registered with
    /// [`Link::expect_read`] under `key`. Take it back with [`Link::reclaim`].
    ///
    /// Lending under a key that is still lent replaces that buffer (the old one is dropped,
    /// and reads still expected under the key land in the new one if it is large enough;
    /// otherwise their READ_DATA closes the link). Use distinct keys.
    pub fn lend(&self, key: u64, buf: Vec<u8>) {
        let mut input = self.input.lock();
        match input.parser.lent.entry(key) {
            Entry::Occupied(mut e) => {
                log::warn!(
                    "link to {:?}: key {key} lent again, replacing its buffer",
                    self.peer
                );
                e.get_mut().buf = buf;
            }
            Entry::Vacant(e) => {
                e.insert(Lent { buf, pending: 0 });
            }
        }
    }

    /// Announces that READ_DATA for `read_id` (a read this side requested, or is about to,
    /// with [`Link::queue_read_request`]) must land in the buffer lent under `key`, at
    /// `offset`, `len` bytes. Until it does, [`Link::reclaim`] of `key` returns `None`.
    ///
    /// # Errors
    ///
    /// `read_id` is already expected, no buffer is lent under `key`, the range does not lie
    /// inside it, or `len` exceeds what one READ_DATA can carry (4 GiB − 17 bytes).
    pub fn expect_read(&self, read_id: u64, key: u64, offset: usize, len: usize) -> Result<()> {
        let mut guard = self.input.lock();
        let parser = &mut guard.parser;
        let invalid = |m: String| Error::invalid("expect_read", self.peer, m);
        if parser.expected.contains_key(&read_id) {
            return Err(invalid(format!("read {read_id} is already expected")));
        }
        let Some(lent) = parser.lent.get_mut(&key) else {
            return Err(invalid(format!("no buffer is lent under key {key}")));
        };
        if !offset
            .checked_add(len)
            .is_some_and(|end| end <= lent.buf.len())
        {
            return Err(invalid(format!(
                "{len} bytes at offset {offset} lie outside the {}-byte buffer lent under key {key}",
                lent.buf.len()
            )));
        }
        if len > MAX_READ_DATA {
            return Err(invalid(format!(
                "{len} bytes exceed what one READ_DATA can carry ({MAX_READ_DATA})"
            )));
        }
        lent.pending += 1;
        parser
            .expected
            .insert(read_id, Expected { key, offset, len });
        Ok(())
    }

    /// Takes back the buffer lent under `key`; `None` while a read into it is still expected,
    /// or if nothing is lent under `key`.
    pub fn reclaim(&self, key: u64) -> Option<Vec<u8>> {
        let mut input = self.input.lock();
        match input.parser.lent.get(&key) {
            Some(lent) if lent.pending == 0 => input.parser.lent.remove(&key).map(|l| l.buf),
            _ => None,
        }
    }

    /// Takes back every lent buffer, reads expected or not, and forgets the expected reads
    /// (for after the link failed). READ_DATA arriving later for a forgotten read closes the
    /// link as unexpected.
    pub fn reclaim_all(&self) -> Vec<(u64, Vec<u8>)> {
        let mut input = self.input.lock();
        input.parser.expected.clear();
        input.parser.lent.drain().map(|(k, l)| (k, l.buf)).collect()
    }

    /// Reads what the socket has without blocking (at most a few MiB, and about a thousand
    /// events, per call) and appends what it means to `out`; returns how many events were
    /// appended. While the input is paused ([`Link::input_paused`]) it reads nothing.
    ///
    /// READ_DATA payloads are read straight into the lent buffer (only bytes that arrived
    /// together with earlier messages are copied from the receive buffer).
    ///
    /// A clean EOF, a reset or malformed input appends one [`Event::Closed`] whose reason
    /// names what was wrong; the link's input side is dead afterwards and later calls
    /// return `Ok(0)`. Malformed input also shuts the socket down.
    ///
    /// # Errors
    ///
    /// None at present: every failure of the connection is reported as [`Event::Closed`].
    pub fn poll(&self, out: &mut Vec<Event>) -> Result<usize> {
        if self.input_paused() {
            return Ok(0);
        }
        let mut guard = self.input.lock();
        let mut rbuf = std::mem::take(&mut guard.rbuf);
        let n = self.poll_input(&mut guard, &mut rbuf, out);
        if !guard.dead {
            guard.rbuf = rbuf;
        }
        Ok(n)
    }

    /// [`Link::poll`] reading through `rbuf` (grown to 64 KiB on first use) instead of a
    /// buffer of the link's own: one caller-owned buffer serves any number of links, so a
    /// link holds no receive buffer between polls.
    ///
    /// # Errors
    ///
    /// None at present, as for [`Link::poll`].
    pub fn poll_with(&self, out: &mut Vec<Event>, rbuf: &mut Vec<u8>) -> Result<usize> {
        if self.input_paused() {
            return Ok(0);
        }
        let mut guard = self.input.lock();
        Ok(self.poll_input(&mut guard, rbuf, out))
    }

    /// Bytes the link holds for its input between polls: a frame partly read, recycled
    /// frame buffers, and its own read buffer if [`Link::poll`] made one.
    pub fn input_bytes(&self) -> usize {
        let input = self.input.lock();
        input.rbuf.capacity() + input.parser.held_bytes()
    }

    fn poll_input(&self, input: &mut Input, rbuf: &mut Vec<u8>, out: &mut Vec<Event>) -> usize {
        let before = out.len();
        if input.dead {
            return 0;
        }
        let mut budget = POLL_BUDGET;
        while budget > 0 {
            let last_want;
            let res = if input.parser.in_payload() {
                match input.parser.payload_dest() {
                    Err(reason) => {
                        self.close_input(input, out, reason, true);
                        break;
                    }
                    Ok(dst) => {
                        let want = dst.len().min(budget);
                        last_want = want;
                        match (&self.stream).read(&mut dst[..want]) {
                            Ok(n) if n > 0 => {
                                input.parser.payload_advanced(n, out);
                                Ok(n)
                            }
                            other => other,
                        }
                    }
                }
            } else {
                if rbuf.len() < READ_CHUNK {
                    rbuf.resize(READ_CHUNK, 0);
                }
                let stage = if input.parser.expected.is_empty() {
                    READ_CHUNK
                } else {
                    READ_STAGE_WHILE_READING
                };
                let want = stage.min(budget);
                last_want = want;
                match (&self.stream).read(&mut rbuf[..want]) {
                    Ok(n) if n > 0 => match input.parser.consume(&rbuf[..n], out) {
                        Ok(()) => Ok(n),
                        Err(reason) => {
                            self.close_input(input, out, reason, true);
                            break;
                        }
                    },
                    other => other,
                }
            };
            match res {
                Ok(0) => {
                    let reason = input.parser.eof_reason();
                    self.close_input(input, out, reason, false);
                    break;
                }
                Ok(n) if n < last_want => {
                    // A short read drained the socket: asking again would only fail with
                    // WouldBlock (the caller learns of new data from epoll).
                    break;
                }
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    if out.len() - before >= MAX_POLL_EVENTS {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.close_input(input, out, format!("receive failed: {e}"), false);
                    break;
                }
            }
        }
        out.len() - before
    }

    fn close_input(&self, input: &mut Input, out: &mut Vec<Event>, reason: String, shut: bool) {
        log::debug!("link to {:?} closed: {reason}", self.peer);
        input.dead = true;
        input.rbuf = Vec::new();
        if shut {
            let _ = self.stream.shutdown(Shutdown::Both);
        }
        out.push(Event::Closed { reason });
    }

    /// Hands back the buffer of a FRAME event once its contents are no longer needed: the
    /// link reuses it for a later frame instead of allocating (up to a few small buffers;
    /// others are dropped).
    pub fn recycle(&self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > READ_CHUNK {
            return;
        }
        let mut input = self.input.lock();
        if input.parser.spare.len() < SPARE_FRAMES {
            buf.clear();
            input.parser.spare.push(buf);
        }
    }

    /// Shuts the socket down both ways: the peer sees EOF, and this side's later
    /// [`Link::poll`] reports [`Event::Closed`] and [`Link::flush`] fails.
    pub fn shutdown(&self) {
        if let Err(e) = self.stream.shutdown(Shutdown::Both) {
            log::debug!("link to {:?}: shutdown: {e}", self.peer);
        }
    }
}
