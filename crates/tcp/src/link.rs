//! An established connection: the output queue and the incremental input parser.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::wire::{
    self, HEADER_LEN, KIND_ACCEPT, KIND_FRAME, KIND_HELLO, KIND_READ_DATA, KIND_READ_REQ,
    KIND_REJECT, MAX_READ_DATA, READ_DATA_HEAD, READ_REQ_LEN, STATUS_FAILED, STATUS_OK,
};
use crate::{Error, Result, MAX_FRAME_LEN};

/// Size of the reusable receive buffer (headers, frames, READ_REQs).
const READ_CHUNK: usize = 64 * 1024;
/// Bytes one [`Link::poll`] reads at most, so one busy link cannot starve a worker.
const POLL_BUDGET: usize = 4 << 20;
/// Small messages are appended to the last queued buffer while it stays below this size.
const COALESCE_LIMIT: usize = 64 * 1024;
/// Smallest buffer allocated for small queued messages.
const SMALL_BUF: usize = 4096;
/// I/O vectors per `writev`.
const MAX_IOVECS: usize = 64;
/// Header and sub-header of READ_DATA, written in front of the data.
const READ_DATA_PREFIX: usize = HEADER_LEN + READ_DATA_HEAD;

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
pub struct Link {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
    peer_data: Vec<u8>,
    output: Mutex<Output>,
    input: Mutex<Input>,
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
        })
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
            return;
        }
        out.push_bytes(&[&wire::header(KIND_FRAME, body), frame, payload]);
    }

    /// Queues a READ_REQ asking the peer for `len` bytes at `addr` under `rkey`; the peer's
    /// [`Link::poll`] reports it as [`Event::ReadRequest`]. Register where the answer lands
    /// with [`Link::expect_read`] first.
    pub fn queue_read_request(&self, read_id: u64, addr: u64, rkey: u32, len: u64) {
        let mut out = self.output.lock();
        if out.failed.is_none() {
            out.push_bytes(&[&wire::read_req(read_id, addr, rkey, len)]);
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
            Ok(Some((data, start, len))) if len > 0 => out.queue.push_back(OutItem::Data {
                head: wire::read_data_head(read_id, STATUS_OK, len),
                data,
                start,
                len,
                pos: 0,
            }),
            Ok(_) => out.push_bytes(&[&wire::read_data_head(read_id, STATUS_OK, 0)]),
            Err(()) => out.push_bytes(&[&wire::read_data_head(read_id, STATUS_FAILED, 0)]),
        }
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
            if out.queue.is_empty() {
                return Ok(true);
            }
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let mut n = 0;
            for item in &out.queue {
                if n + 2 > MAX_IOVECS {
                    break;
                }
                item.slices(&mut iov, &mut n);
            }
            match (&self.stream).write_vectored(&iov[..n]) {
                Ok(0) => {
                    let e = io::Error::from(io::ErrorKind::WriteZero);
                    out.fail(e.to_string());
                    return Err(Error::io("flush", self.peer, e));
                }
                Ok(written) => out.advance(written),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => {
                    out.fail(format!("send failed: {e}"));
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

    /// Reads what the socket has without blocking (at most a few MiB per call) and appends
    /// what it means to `out`; returns how many events were appended.
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
        let before = out.len();
        let mut guard = self.input.lock();
        let input = &mut *guard;
        if input.dead {
            return Ok(0);
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
                if input.rbuf.is_empty() {
                    input.rbuf = vec![0; READ_CHUNK];
                }
                let want = READ_CHUNK.min(budget);
                last_want = want;
                match (&self.stream).read(&mut input.rbuf[..want]) {
                    Ok(n) if n > 0 => match input.parser.consume(&input.rbuf[..n], out) {
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
                Ok(n) => budget = budget.saturating_sub(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.close_input(input, out, format!("receive failed: {e}"), false);
                    break;
                }
            }
        }
        Ok(out.len() - before)
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

// ---- output side internals

#[derive(Default)]
struct Output {
    queue: VecDeque<OutItem>,
    /// Why the output side died, if it did.
    failed: Option<String>,
    /// The buffer of the last small message written, kept for the next one (no allocation
    /// per message in steady state).
    spare: Vec<u8>,
}

enum OutItem {
    /// Whole messages (possibly several), `pos` bytes of them written.
    Bytes { buf: Vec<u8>, pos: usize },
    /// A READ_DATA header followed by `data[start..start + len]` (in range, checked when
    /// queued), `pos` bytes of header and data written.
    Data {
        head: [u8; READ_DATA_PREFIX],
        data: Arc<Vec<u8>>,
        start: usize,
        len: usize,
        pos: usize,
    },
}

impl Output {
    /// Appends the concatenation of `parts` as one or more whole messages.
    fn push_bytes(&mut self, parts: &[&[u8]]) {
        let need: usize = parts.iter().map(|p| p.len()).sum();
        if let Some(OutItem::Bytes { buf, .. }) = self.queue.back_mut() {
            if buf.len() + need <= COALESCE_LIMIT {
                for p in parts {
                    buf.extend_from_slice(p);
                }
                return;
            }
        }
        let mut buf = if self.spare.capacity() >= need {
            std::mem::take(&mut self.spare)
        } else {
            Vec::with_capacity(need.max(SMALL_BUF))
        };
        for p in parts {
            buf.extend_from_slice(p);
        }
        self.queue.push_back(OutItem::Bytes { buf, pos: 0 });
    }

    /// Drops `written` bytes from the front of the queue.
    fn advance(&mut self, mut written: usize) {
        while written > 0 {
            let Some(front) = self.queue.front_mut() else {
                break;
            };
            let left = front.remaining();
            if written >= left {
                written -= left;
                if let Some(OutItem::Bytes { mut buf, .. }) = self.queue.pop_front() {
                    if buf.capacity() <= COALESCE_LIMIT && self.spare.capacity() == 0 {
                        buf.clear();
                        self.spare = buf;
                    }
                }
            } else {
                front.advance(written);
                written = 0;
            }
        }
    }

    fn fail(&mut self, reason: String) {
        self.failed = Some(reason);
        self.queue.clear();
    }
}

impl OutItem {
    fn remaining(&self) -> usize {
        match self {
            OutItem::Bytes { buf, pos } => buf.len() - pos,
            OutItem::Data { len, pos, .. } => READ_DATA_PREFIX + len - pos,
        }
    }

    fn advance(&mut self, n: usize) {
        match self {
            OutItem::Bytes { pos, .. } | OutItem::Data { pos, .. } => *pos += n,
        }
    }

    /// Appends this item's unwritten bytes to `iov` (at most two slices).
    fn slices<'a>(&'a self, iov: &mut [IoSlice<'a>; MAX_IOVECS], n: &mut usize) {
        let mut push = |s: &'a [u8]| {
            if !s.is_empty() && *n < MAX_IOVECS {
                iov[*n] = IoSlice::new(s);
                *n += 1;
            }
        };
        match self {
            OutItem::Bytes { buf, pos } => push(&buf[*pos..]),
            OutItem::Data {
                head,
                data,
                start,
                len,
                pos,
            } => {
                let end = start + len;
                if *pos < READ_DATA_PREFIX {
                    push(&head[*pos..]);
                    push(&data[*start..end]);
                } else {
                    push(&data[start + (pos - READ_DATA_PREFIX)..end]);
                }
            }
        }
    }
}

// ---- input side internals

#[derive(Default)]
struct Input {
    /// Reusable receive buffer, allocated on first use.
    rbuf: Vec<u8>,
    parser: Parser,
    /// An `Event::Closed` was reported.
    dead: bool,
}

/// A buffer lent by the worker, and how many expected reads target it.
struct Lent {
    buf: Vec<u8>,
    pending: usize,
}

#[derive(Clone, Copy)]
struct Expected {
    key: u64,
    offset: usize,
    len: usize,
}

/// Where the parser is in the byte stream.
enum State {
    Header {
        hdr: [u8; HEADER_LEN],
        got: usize,
    },
    Frame {
        body: Vec<u8>,
        len: usize,
    },
    ReadReq {
        body: [u8; READ_REQ_LEN],
        got: usize,
    },
    ReadDataHead {
        head: [u8; READ_DATA_HEAD],
        got: usize,
        data_len: usize,
    },
    /// Inside a READ_DATA payload (`done < len`) landing at `lent[key].buf[offset..]`.
    ReadData {
        read_id: u64,
        key: u64,
        offset: usize,
        len: usize,
        done: usize,
    },
}

impl State {
    fn header() -> State {
        State::Header {
            hdr: [0; HEADER_LEN],
            got: 0,
        }
    }
}

/// The incremental input parser: survives short reads at any byte boundary.
pub(crate) struct Parser {
    state: State,
    lent: HashMap<u64, Lent>,
    expected: HashMap<u64, Expected>,
    /// Frame buffers handed back with [`Link::recycle`], for the next frames.
    spare: Vec<Vec<u8>>,
}

/// How many recycled frame buffers a link keeps at most.
const SPARE_FRAMES: usize = 8;

impl Default for Parser {
    fn default() -> Self {
        Parser {
            state: State::header(),
            lent: HashMap::new(),
            expected: HashMap::new(),
            spare: Vec::new(),
        }
    }
}

/// Copies as much of `data` as fits into `dst[*got..]`, advancing both.
fn fill(dst: &mut [u8], got: &mut usize, data: &mut &[u8]) -> bool {
    let take = (dst.len() - *got).min(data.len());
    dst[*got..*got + take].copy_from_slice(&data[..take]);
    *got += take;
    *data = &data[take..];
    *got == dst.len()
}

impl Parser {
    /// Parses `data` (all of it, unless an error is returned: the reason to close).
    pub(crate) fn consume(&mut self, mut data: &[u8], out: &mut Vec<Event>) -> Result<(), String> {
        while !data.is_empty() {
            match &mut self.state {
                State::Header { hdr, got } => {
                    if fill(hdr, got, &mut data) {
                        let hdr = *hdr;
                        self.on_header(&hdr, out)?;
                    }
                }
                State::Frame { body, len } => {
                    let take = (*len - body.len()).min(data.len());
                    let need = body.len() + take;
                    if need > body.capacity() {
                        // Grow geometrically but never past the announced (bounded) length.
                        let target = (*len).min(need.max(body.capacity() * 2));
                        body.reserve_exact(target - body.len());
                    }
                    body.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if body.len() == *len {
                        let body = std::mem::take(body);
                        self.state = State::header();
                        out.push(Event::Frame(body));
                    }
                }
                State::ReadReq { body, got } => {
                    if fill(body, got, &mut data) {
                        let body = *body;
                        self.on_read_req(&body, out)?;
                    }
                }
                State::ReadDataHead {
                    head,
                    got,
                    data_len,
                } => {
                    if fill(head, got, &mut data) {
                        let (head, data_len) = (*head, *data_len);
                        self.on_read_data_head(&head, data_len, out)?;
                    }
                }
                State::ReadData { .. } => {
                    let dst = self.payload_dest()?;
                    let take = dst.len().min(data.len());
                    dst[..take].copy_from_slice(&data[..take]);
                    data = &data[take..];
                    self.payload_advanced(take, out);
                }
            }
        }
        Ok(())
    }

    fn on_header(&mut self, hdr: &[u8; HEADER_LEN], out: &mut Vec<Event>) -> Result<(), String> {
        let (kind, len) = wire::parse_header(hdr)?;
        self.state = match kind {
            KIND_FRAME if len > MAX_FRAME_LEN => {
                return Err(format!(
                    "FRAME body of {len} bytes exceeds the limit of {MAX_FRAME_LEN} bytes"
                ))
            }
            KIND_FRAME if len == 0 => {
                out.push(Event::Frame(Vec::new()));
                State::header()
            }
            KIND_FRAME => {
                let mut body = self.spare.pop().unwrap_or_default();
                body.reserve_exact(len.min(READ_CHUNK));
                State::Frame { body, len }
            }
            KIND_READ_REQ if len != READ_REQ_LEN => {
                return Err(format!(
                    "READ_REQ body of {len} bytes (must be {READ_REQ_LEN})"
                ))
            }
            KIND_READ_REQ => State::ReadReq {
                body: [0; READ_REQ_LEN],
                got: 0,
            },
            KIND_READ_DATA if len < READ_DATA_HEAD => {
                return Err(format!(
                    "READ_DATA body of {len} bytes (at least {READ_DATA_HEAD} needed)"
                ))
            }
            KIND_READ_DATA => State::ReadDataHead {
                head: [0; READ_DATA_HEAD],
                got: 0,
                data_len: len - READ_DATA_HEAD,
            },
            KIND_HELLO | KIND_ACCEPT | KIND_REJECT => {
                return Err(format!(
                    "unexpected {} after the handshake",
                    wire::kind_name(kind)
                ))
            }
            other => {
                return Err(format!(
                    "unknown message kind {other} (body of {len} bytes)"
                ))
            }
        };
        Ok(())
    }

    fn on_read_req(&mut self, b: &[u8; READ_REQ_LEN], out: &mut Vec<Event>) -> Result<(), String> {
        let read_id = wire::u64_at(b, 0);
        let reserved = wire::u32_at(b, 20);
        if reserved != 0 {
            return Err(format!(
                "non-zero reserved field {reserved:#x} in READ_REQ for read {read_id}"
            ));
        }
        out.push(Event::ReadRequest {
            read_id,
            addr: wire::u64_at(b, 8),
            rkey: wire::u32_at(b, 16),
            len: wire::u64_at(b, 24),
        });
        self.state = State::header();
        Ok(())
    }

    fn on_read_data_head(
        &mut self,
        h: &[u8; READ_DATA_HEAD],
        data_len: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        let read_id = wire::u64_at(h, 0);
        let status = h[8];
        if h[9..] != [0; 7] {
            return Err(format!(
                "non-zero reserved bytes {:?} in READ_DATA for read {read_id}",
                &h[9..]
            ));
        }
        let Some(exp) = self.expected.get(&read_id).copied() else {
            return Err(format!(
                "unexpected READ_DATA for read {read_id} (status {status}, {data_len} bytes): \
                 no such read is expected"
            ));
        };
        match status {
            STATUS_FAILED if data_len != 0 => Err(format!(
                "failed READ_DATA for read {read_id} carries {data_len} bytes (must be 0)"
            )),
            STATUS_FAILED => {
                self.expected.remove(&read_id);
                self.release(exp.key);
                self.state = State::header();
                out.push(Event::ReadDone { read_id, ok: false });
                Ok(())
            }
            STATUS_OK if data_len != exp.len => Err(format!(
                "READ_DATA for read {read_id} carries {data_len} bytes, {} expected",
                exp.len
            )),
            STATUS_OK => {
                self.expected.remove(&read_id);
                self.state = State::ReadData {
                    read_id,
                    key: exp.key,
                    offset: exp.offset,
                    len: exp.len,
                    done: 0,
                };
                if exp.len == 0 {
                    self.finish_read(out);
                }
                Ok(())
            }
            other => Err(format!(
                "unknown READ_DATA status {other} for read {read_id}"
            )),
        }
    }

    fn release(&mut self, key: u64) {
        if let Some(lent) = self.lent.get_mut(&key) {
            lent.pending = lent.pending.saturating_sub(1);
        }
    }

    fn in_payload(&self) -> bool {
        matches!(self.state, State::ReadData { .. })
    }

    /// The unfilled part of the current READ_DATA's destination (empty outside a payload).
    fn payload_dest(&mut self) -> Result<&mut [u8], String> {
        let State::ReadData {
            read_id,
            key,
            offset,
            len,
            done,
        } = self.state
        else {
            return Ok(&mut []);
        };
        let Some(lent) = self.lent.get_mut(&key) else {
            return Err(format!(
                "the buffer lent under key {key} was reclaimed while READ_DATA for read \
                 {read_id} was arriving"
            ));
        };
        let size = lent.buf.len();
        lent.buf
            .get_mut(offset + done..offset + len)
            .ok_or_else(|| {
                format!(
                    "the buffer lent under key {key} ({size} bytes) no longer holds \
                 {offset}..{} for read {read_id}",
                    offset + len
                )
            })
    }

    /// `n` more payload bytes landed.
    fn payload_advanced(&mut self, n: usize, out: &mut Vec<Event>) {
        if let State::ReadData { len, done, .. } = &mut self.state {
            *done += n;
            if *done >= *len {
                self.finish_read(out);
            }
        }
    }

    fn finish_read(&mut self, out: &mut Vec<Event>) {
        if let State::ReadData { read_id, key, .. } = self.state {
            self.release(key);
            self.state = State::header();
            out.push(Event::ReadDone { read_id, ok: true });
        }
    }

    /// Why the connection ended, given that the peer closed it now.
    fn eof_reason(&self) -> String {
        let mid = "the peer closed the connection in the middle of";
        match &self.state {
            State::Header { got: 0, .. } => "the peer closed the connection".to_string(),
            State::Header { got, .. } => format!(
                "the peer closed the connection mid-header ({got} of {HEADER_LEN} header bytes)"
            ),
            State::Frame { body, len } => {
                format!("{mid} a FRAME body ({} of {len} bytes)", body.len())
            }
            State::ReadReq { got, .. } => {
                format!("{mid} a READ_REQ ({got} of {READ_REQ_LEN} body bytes)")
            }
            State::ReadDataHead { got, .. } => {
                format!("{mid} a READ_DATA header ({got} of {READ_DATA_HEAD} bytes)")
            }
            State::ReadData {
                read_id, len, done, ..
            } => format!("{mid} READ_DATA for read {read_id} ({done} of {len} bytes)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut m = wire::header(KIND_FRAME, body.len()).to_vec();
        m.extend_from_slice(body);
        m
    }

    fn read_data(read_id: u64, status: u8, data: &[u8]) -> Vec<u8> {
        let mut m = wire::read_data_head(read_id, status, data.len()).to_vec();
        m.extend_from_slice(data);
        m
    }

    /// A parser with buffer key 1 (20 bytes of 0xEE) lent, read 7 expected at 3..13 and
    /// read 8 at 0..2.
    fn parser() -> Parser {
        let mut p = Parser::default();
        p.lent.insert(
            1,
            Lent {
                buf: vec![0xEE; 20],
                pending: 2,
            },
        );
        p.expected.insert(
            7,
            Expected {
                key: 1,
                offset: 3,
                len: 10,
            },
        );
        p.expected.insert(
            8,
            Expected {
                key: 1,
                offset: 0,
                len: 2,
            },
        );
        p
    }

    fn stream() -> (Vec<u8>, Vec<Event>) {
        let big: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let mut s = Vec::new();
        s.extend(frame(b""));
        s.extend(frame(b"hello"));
        s.extend(wire::read_req(42, 0x1000, 0xabcd, 1 << 40));
        s.extend(read_data(7, STATUS_OK, b"0123456789"));
        s.extend(read_data(8, STATUS_FAILED, b""));
        s.extend(frame(&big));
        let events = vec![
            Event::Frame(Vec::new()),
            Event::Frame(b"hello".to_vec()),
            Event::ReadRequest {
                read_id: 42,
                addr: 0x1000,
                rkey: 0xabcd,
                len: 1 << 40,
            },
            Event::ReadDone {
                read_id: 7,
                ok: true,
            },
            Event::ReadDone {
                read_id: 8,
                ok: false,
            },
            Event::Frame(big),
        ];
        (s, events)
    }

    fn check(p: &Parser, events: &[Event], expected: &[Event]) {
        assert_eq!(events, expected);
        let lent = &p.lent[&1];
        assert_eq!(lent.pending, 0);
        let mut want = vec![0xEE; 20];
        want[3..13].copy_from_slice(b"0123456789");
        assert_eq!(lent.buf, want);
        assert!(p.expected.is_empty());
        assert!(matches!(p.state, State::Header { got: 0, .. }));
    }

    #[test]
    fn parser_survives_every_split_point() {
        let (s, expected) = stream();
        for cut in 0..=s.len() {
            let mut p = parser();
            let mut events = Vec::new();
            p.consume(&s[..cut], &mut events).unwrap();
            p.consume(&s[cut..], &mut events).unwrap();
            check(&p, &events, &expected);
        }
        let mut p = parser();
        let mut events = Vec::new();
        for b in &s {
            p.consume(std::slice::from_ref(b), &mut events).unwrap();
        }
        check(&p, &events, &expected);
    }

    #[test]
    fn parser_never_panics_on_garbage() {
        // Deterministic pseudo-random streams, some starting with a valid prefix so the
        // parser gets into every state before the garbage.
        let (valid, _) = stream();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..2000 {
            let mut p = parser();
            let mut events = Vec::new();
            let prefix = round % (valid.len() + 1);
            let mut input = valid[..prefix].to_vec();
            for _ in 0..64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Bias kinds and lengths towards plausible values.
                input.push(match x % 4 {
                    0 => (x >> 8) as u8 % 8,
                    1 => 0,
                    _ => (x >> 16) as u8,
                });
            }
            let mut rest = &input[..];
            while !rest.is_empty() {
                let n = 1 + (x as usize % 9).min(rest.len() - 1);
                if p.consume(&rest[..n], &mut events).is_err() {
                    break;
                }
                rest = &rest[n..];
            }
            let _ = p.eof_reason();
        }
    }
}
