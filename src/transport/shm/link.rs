//! A shared-memory connection of a worker: its way out ([`super::outbox`]: the send ring, the
//! records waiting for room in it, the peer's doorbell), and the READs it makes into buffers
//! lent to it — by CMA, or by copy through the rings where CMA is not allowed (see
//! [`super::copy`]).

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rdmx_proto::{ConnId, RemoteBuf, UserBufId};
use rdmx_shm::Consumer;

use super::copy::{Copying, DataHeader, Get, Serving, KIND_FRAME, KIND_GET, MAX_GETS};
use super::iface::Shared;
use super::outbox::Outbox;
use super::setup::DataPath;
use crate::transport::tcp::{Answer, Exposures};
use crate::transport::{
    Deferred, LinkEvent, LockedIfaces, PollScratch, Queued, ReadOp, RecvFrame, Transport,
    TransportLink,
};
use crate::usermem::UserMem;

/// A READ to make: `len` bytes at `addr` in the peer into the lent buffer `buf` at `offset`.
struct QueuedRead {
    key: u64,
    buf: u64,
    addr: u64,
    len: usize,
    offset: usize,
}

/// A destination buffer lent to the link: `None` while a READ copies into it.
struct Lent {
    vec: Option<Vec<u8>>,
    outstanding: usize,
}

/// The READs of a link (shared with the worker's ring poller, which takes DATA records).
#[derive(Default)]
pub(crate) struct Reads {
    /// READs to make by CMA.
    queued: VecDeque<QueuedRead>,
    /// READs by copy waiting for DATA, by key.
    copying: HashMap<u64, Copying>,
    /// GETs sent for them and not yet answered in full: at most [`MAX_GETS`], what the peer
    /// answers without failing the connection.
    asked: usize,
    /// GETs of READs by copy waiting for one of those places, in order.
    held_back: VecDeque<Get>,
    lent: HashMap<u64, Lent>,
}

impl Reads {
    /// `get`, the GET of a READ by copy just added: to send now, taking one of the
    /// [`MAX_GETS`] places, or `None` when it is held back, behind any held back before it
    /// (sent by [`Reads::next_get`] as answers complete).
    fn ask(&mut self, get: Get) -> Option<Get> {
        if self.asked < MAX_GETS && self.held_back.is_empty() {
            self.asked += 1;
            return Some(get);
        }
        if let Some(c) = self.copying.get_mut(&get.key) {
            c.asked = false;
        }
        self.held_back.push_back(get);
        None
    }

    /// The GET held back that takes a free place, if any (its READ still waits for DATA).
    fn next_get(&mut self) -> Option<Get> {
        while self.asked < MAX_GETS {
            let get = self.held_back.pop_front()?;
            if let Some(c) = self.copying.get_mut(&get.key) {
                c.asked = true;
                self.asked += 1;
                return Some(get);
            }
        }
        None
    }
}

/// What the worker's ring poller needs of a link to handle the records that are not frames.
#[derive(Clone)]
pub(crate) struct RecordSink {
    pub(crate) conn: ConnId,
    out: Arc<Outbox>,
    reads: Arc<Mutex<Reads>>,
    exposures: Arc<Mutex<Exposures>>,
}

impl RecordSink {
    /// The connection broke: nothing more goes out, what waits is dropped.
    pub(crate) fn close(&self) {
        self.out.close();
    }

    /// A GET from the peer: answered from the exposure table. `Err`: a protocol error.
    pub(crate) fn get(&self, shared: &Shared, record: &[u8]) -> Result<(), String> {
        let g = Get::decode(record)?;
        let answer = self
            .exposures
            .lock()
            .answer_at_address(self.conn, g.addr, g.rkey, g.len);
        let serving = match answer {
            Answer::Data { data, offset, len } => Serving {
                key: g.key,
                data: Some(data),
                start: offset,
                len,
                sent: 0,
            },
            Answer::Refused => {
                log::debug!("{:?}: GET {g:?} refused", self.conn);
                Serving {
                    key: g.key,
                    data: None,
                    start: 0,
                    len: 0,
                    sent: 0,
                }
            }
            Answer::OtherEndpoint => {
                return Err(format!(
                    "the peer asked for a buffer exposed to another endpoint ({g:?})"
                ))
            }
        };
        self.out.serve(shared, serving)
    }

    /// DATA for one of this link's READs: copied into its lent buffer; the READ is reported
    /// once complete. `Err`: a protocol error.
    pub(crate) fn data(&self, shared: &Shared, record: &[u8]) -> Result<(), String> {
        let (h, bytes) = DataHeader::decode(record)?;
        let mut guard = self.reads.lock();
        let Reads { copying, lent, .. } = &mut *guard;
        let Some(c) = copying.get_mut(&h.key) else {
            // Reclaimed meanwhile (the connection is closing).
            return Ok(());
        };
        if !c.asked {
            return Err(format!(
                "DATA for a READ whose GET was not sent yet ({:#x})",
                h.key
            ));
        }
        let ok = if h.refused {
            false
        } else {
            if h.offset != c.got as u64 || bytes.len() > c.len - c.got {
                return Err(format!(
                    "DATA of {} bytes at {} for a READ of {} of which {} arrived",
                    bytes.len(),
                    h.offset,
                    c.len,
                    c.got
                ));
            }
            let at = c.offset + c.got;
            match lent.get_mut(&c.buf).and_then(|l| l.vec.as_mut()) {
                Some(v) if at + bytes.len() <= v.len() => {
                    v[at..at + bytes.len()].copy_from_slice(bytes);
                }
                _ => return Err("DATA for a buffer no longer lent".into()),
            }
            c.got += bytes.len();
            if c.got < c.len {
                return Ok(());
            }
            true
        };
        let c = copying.remove(&h.key).expect("found above");
        if let Some(l) = lent.get_mut(&c.buf) {
            l.outstanding -= 1;
        }
        // Its place goes to the next GET held back.
        guard.asked -= 1;
        let next = guard.next_get();
        drop(guard);
        shared.read_done(h.key, ok);
        if let Some(get) = next {
            self.out.send(shared, KIND_GET, &[], &[&get.encode()])?;
        }
        Ok(())
    }
}

/// A shared-memory connection (see the module docs of `transport::shm`).
pub(crate) struct ShmLink {
    /// Its id, send ring, READs and the worker's exposure table (which holds exposed send
    /// buffers until withdrawn): what the ring poller gets a clone of when the link joins.
    sink: RecordSink,
    /// The receive ring, until the worker takes the link in ([`TransportLink::joined`]).
    rx: Mutex<Option<Consumer>>,
    /// The Unix socket the segment came over: its hang-up says the peer is gone.
    sock: UnixStream,
    peer_pid: i32,
    peer_data: Vec<u8>,
    peer_addr: Option<SocketAddr>,
    local_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    /// `Ok`: READs by CMA; `Err`: why not, and READs by copy.
    cma: Result<(), String>,
    down_reported: AtomicBool,
}

/// What a link is made of, from the connection's setup.
pub(crate) struct Parts {
    /// The rings, doorbell, socket and peer the shared-memory setup gave.
    pub(crate) path: DataPath,
    /// The peer's rdmx handshake.
    pub(crate) peer_data: Vec<u8>,
    pub(crate) peer_addr: Option<SocketAddr>,
    pub(crate) local_addr: Option<SocketAddr>,
    /// This side's receive buffers (`RDMX_RECV_BUF_SIZE` on shared memory), which the
    /// bound of the link's outbox derives from (see [`Outbox`]).
    pub(crate) recv_buf_size: u32,
}

impl ShmLink {
    pub(crate) fn new(
        id: ConnId,
        parts: Parts,
        shared: Arc<Shared>,
        exposures: Arc<Mutex<Exposures>>,
    ) -> std::io::Result<ShmLink> {
        let DataPath {
            tx,
            rx,
            peer_bell,
            sock,
            peer_pid,
            cma,
        } = parts.path;
        sock.set_nonblocking(true)?;
        Ok(ShmLink {
            sink: RecordSink {
                conn: id,
                out: Arc::new(Outbox::new(
                    id,
                    tx,
                    peer_bell,
                    parts.recv_buf_size,
                    shared.queued_total(),
                )),
                reads: Arc::new(Mutex::new(Reads::default())),
                exposures,
            },
            rx: Mutex::new(Some(rx)),
            sock,
            peer_pid,
            peer_data: parts.peer_data,
            peer_addr: parts.peer_addr,
            local_addr: parts.local_addr,
            shared,
            cma,
            down_reported: AtomicBool::new(false),
        })
    }

    /// How this link's rendezvous data moves, for logs and [`TransportLink::data_path`].
    fn rendezvous_path(&self) -> String {
        match &self.cma {
            Ok(()) => "rendezvous by CMA".into(),
            Err(why) => format!("rendezvous by copy ({why})"),
        }
    }

    /// Makes the queued READs, one at a time, without holding the link's lock while a copy
    /// runs.
    fn run_reads(&self) {
        loop {
            let (op, mut vec) = {
                let mut r = self.sink.reads.lock();
                let Some(op) = r.queued.pop_front() else {
                    return;
                };
                match r.lent.get_mut(&op.buf).map(|l| l.vec.take()) {
                    Some(Some(v)) => (op, v),
                    None => {
                        log::warn!(
                            "{:?}: READ into a buffer not lent (dropped)",
                            self.sink.conn
                        );
                        continue;
                    }
                    Some(None) => {
                        // Another thread copies into it: that thread makes this one next.
                        r.queued.push_front(op);
                        return;
                    }
                }
            };
            let ok = match op.offset.checked_add(op.len) {
                Some(end) if end <= vec.len() => {
                    match rdmx_shm::cma::read_remote(
                        self.peer_pid,
                        op.addr,
                        &mut vec[op.offset..end],
                    ) {
                        Ok(()) => true,
                        Err(e) => {
                            log::warn!("{:?}: READ of {} bytes: {e}", self.sink.conn, op.len);
                            false
                        }
                    }
                }
                _ => false,
            };
            {
                let mut r = self.sink.reads.lock();
                if let Some(l) = r.lent.get_mut(&op.buf) {
                    l.vec = Some(vec);
                    l.outstanding -= 1;
                }
            }
            log::trace!(
                "{:?}: READ {:#x} of {} bytes done: {ok}",
                self.sink.conn,
                op.key,
                op.len
            );
            self.shared.read_done(op.key, ok);
        }
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        // The worker stops polling its ring (at its next poll); what is left in it is
        // dropped.
        self.shared.drop_rx(self.sink.conn);
        self.sink.out.close();
    }
}

impl TransportLink for ShmLink {
    fn transport(&self) -> Transport {
        Transport::Shm
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    fn peer_private_data(&self) -> &[u8] {
        &self.peer_data
    }

    /// Frames arrive on the worker's rings ([`super::ShmIface`]), not on the socket.
    fn frames_on_event_fd(&self) -> bool {
        false
    }

    /// The Unix socket: readable when the peer hangs up.
    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn data_path(&self) -> String {
        format!("shm, {}", self.rendezvous_path())
    }

    fn joined(&self, _: &mut LockedIfaces, _: &mut Vec<LinkEvent>) {
        if let Some(rx) = self.rx.lock().take() {
            self.shared.add_rx(rx, self.sink.clone());
        }
    }

    fn queue_frame(
        &self,
        _: &mut LockedIfaces,
        frame: &rdmx_proto::wire::FrameBuf,
        payload: &[u8],
    ) -> Result<Queued, String> {
        match self
            .sink
            .out
            .send(&self.shared, KIND_FRAME, frame.words(), &[payload])
        {
            Ok(true) => Ok(Queued::Posted),
            Ok(false) => Ok(Queued::ForFlush),
            // The peer broke the ring or left it full past the outbox's bound: the flush
            // reports the connection down, with why.
            Err(_) if self.sink.out.broken.get().is_some() => Ok(Queued::ForFlush),
            Err(e) => Err(e),
        }
    }

    /// The destination is lent to the link, which reads the peer's memory straight into it
    /// by CMA, or asks the peer for the bytes and copies them in as they arrive.
    fn start_read(
        &self,
        _: &mut LockedIfaces,
        read: ReadOp,
        mem: &mut UserMem,
    ) -> Result<(), String> {
        let key = read.buf.0;
        let mut r = self.sink.reads.lock();
        match std::mem::replace(mem, UserMem::Lent) {
            UserMem::Plain(vec) => {
                r.lent.insert(
                    key,
                    Lent {
                        vec: Some(vec),
                        outstanding: 0,
                    },
                );
            }
            UserMem::Lent if r.lent.contains_key(&key) => {}
            other => {
                *mem = other;
                return Err("the receive buffer cannot be lent to the link".into());
            }
        }
        if let Some(l) = r.lent.get_mut(&key) {
            l.outstanding += 1;
        }
        log::trace!(
            "{:?}: READ {:#x} of {} bytes queued",
            self.sink.conn,
            read.key,
            read.len
        );
        if self.cma.is_ok() {
            r.queued.push_back(QueuedRead {
                key: read.key,
                buf: key,
                addr: read.remote.addr,
                len: read.len as usize,
                offset: read.offset as usize,
            });
            return Ok(());
        }
        r.copying.insert(
            read.key,
            Copying {
                buf: key,
                offset: read.offset as usize,
                len: read.len as usize,
                got: 0,
                asked: true,
            },
        );
        let get = r.ask(Get {
            key: read.key,
            rkey: read.remote.rkey,
            addr: read.remote.addr,
            len: read.len,
        });
        drop(r);
        if let Some(get) = get {
            self.sink
                .out
                .send(&self.shared, KIND_GET, &[], &[&get.encode()])?;
        }
        Ok(())
    }

    /// Exposed in the worker's exposure table (which keeps the buffer alive and unmoved until
    /// it is withdrawn); the peer reads it at its address.
    fn expose(
        &self,
        _: &mut LockedIfaces,
        _: UserBufId,
        mem: &mut UserMem,
        _: u64,
    ) -> Result<RemoteBuf, String> {
        let remote = self.sink.exposures.lock().expose(self.sink.conn, mem)?;
        let addr = match mem {
            UserMem::Exposed { data, .. } => data.as_ptr() as u64,
            _ => return Err("the send buffer could not be exposed".into()),
        };
        Ok(RemoteBuf {
            addr,
            rkey: remote.rkey,
        })
    }

    fn read_finished(&self, buf: UserBufId, mem: Option<&mut UserMem>) {
        let mut r = self.sink.reads.lock();
        let done = r
            .lent
            .get(&buf.0)
            .is_some_and(|l| l.outstanding == 0 && l.vec.is_some());
        if !done {
            return;
        }
        if let (Some(l), Some(mem)) = (r.lent.remove(&buf.0), mem) {
            if let Some(vec) = l.vec {
                *mem = UserMem::Plain(vec);
            }
        }
    }

    fn give_back(&self, frame: RecvFrame, deferred: &mut Deferred) {
        match frame {
            // (Only frames left in a ring as it was removed come as buffers of their own.)
            RecvFrame::Owned(_) => {}
            #[allow(unreachable_patterns)]
            other => deferred.return_frame(other),
        }
    }

    fn reclaim_lent(&self) -> Vec<(UserBufId, Vec<u8>)> {
        let mut r = self.sink.reads.lock();
        r.queued.clear();
        r.copying.clear();
        r.held_back.clear();
        r.asked = 0;
        r.lent
            .drain()
            .filter_map(|(key, l)| l.vec.map(|v| (UserBufId(key), v)))
            .collect()
    }

    fn close(&self) {}

    fn take_failures(&self, _: &mut LockedIfaces, out: &mut Vec<LinkEvent>) {
        if let Some(why) = self.sink.out.broken.get() {
            if !self.down_reported.swap(true, Ordering::AcqRel) {
                out.push(super::iface::ring_down(self.sink.conn, why));
            }
        }
    }

    fn flush(&self, closing: bool) -> bool {
        if self.sink.out.has_waiting.load(Ordering::Acquire) {
            self.sink.out.push_waiting();
        }
        self.run_reads();
        if closing && self.idle() {
            // The peer sees the hang-up once it has what was sent.
            let _ = self.sock.shutdown(Shutdown::Both);
        }
        self.sink.out.broken.get().is_some()
    }

    fn idle(&self) -> bool {
        let r = self.sink.reads.lock();
        !self.sink.out.has_waiting.load(Ordering::Acquire)
            && r.queued.is_empty()
            && r.copying.is_empty()
    }

    /// The Unix socket is readable: the peer hung up (or wrote, which it never does).
    fn poll(&self, _: bool, scratch: &mut PollScratch, out: &mut Vec<LinkEvent>) -> usize {
        let mut b = [0u8; 1];
        let reason = match (&self.sock).read(&mut b) {
            Ok(0) => "connection lost: the peer hung up".to_string(),
            Ok(_) => "protocol error: the peer wrote on its shared-memory socket".to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return 0,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return 0,
            Err(e) => format!("connection lost: {e}"),
        };
        if !self.down_reported.swap(true, Ordering::AcqRel) {
            // What the peer sent before it went is delivered first; nothing more goes out.
            self.shared
                .remove_rx(&mut scratch.shm_rings, self.sink.conn, out);
            self.sink.out.close();
            out.push(LinkEvent::Down {
                conn: self.sink.conn,
                reason,
                reads_lost: true,
            });
        }
        0
    }
}
