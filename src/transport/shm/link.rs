//! A shared-memory connection of a worker: its send ring (with the frames waiting for room
//! in it), the peer's doorbell, and the READs it makes by CMA into buffers lent to it.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rdmx_proto::{ConnId, RemoteBuf, UserBufId};
use rdmx_shm::{Consumer, Doorbell, Producer};

use super::iface::Shared;
use crate::transport::tcp::Exposures;
use crate::transport::{
    Deferred, LinkEvent, LockedIfaces, PollScratch, Queued, ReadOp, RecvFrame, Transport,
    TransportLink,
};
use crate::usermem::UserMem;

/// A link's way out: its send ring and what waits for room in it.
pub(crate) struct Outbox {
    conn: ConnId,
    tx: Mutex<Producer>,
    /// Frames waiting for room, in order (nothing goes into the ring while one waits).
    waiting: Mutex<VecDeque<Vec<u8>>>,
    has_waiting: AtomicBool,
    peer_bell: Doorbell,
    /// Why the send ring cannot be used any more (the peer corrupted it).
    broken: Mutex<Option<String>>,
}

impl Outbox {
    /// Rings the peer's doorbell if it said it may sleep.
    fn wake_peer(&self, tx: &Producer) {
        if tx.consumer_waiting() {
            if let Err(e) = self.peer_bell.ring() {
                log::warn!("{:?}: ringing the peer's doorbell: {e}", self.conn);
            }
        }
    }

    /// Pushes the waiting frames the ring has room for; returns whether some still wait.
    pub(crate) fn push_waiting(&self) -> bool {
        let mut waiting = self.waiting.lock();
        let mut tx = self.tx.lock();
        let mut pushed = false;
        while let Some(f) = waiting.front() {
            match tx.push(&[f]) {
                Ok(true) => {
                    waiting.pop_front();
                    pushed = true;
                }
                Ok(false) => break,
                Err(e) => {
                    self.broke(e.to_string());
                    waiting.clear();
                    break;
                }
            }
        }
        if pushed {
            self.wake_peer(&tx);
        }
        let left = !waiting.is_empty();
        self.has_waiting.store(left, Ordering::Release);
        left
    }

    fn broke(&self, why: String) {
        log::warn!("{:?}: {why}", self.conn);
        self.broken.lock().get_or_insert(why);
    }
}

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

#[derive(Default)]
struct Reads {
    queued: VecDeque<QueuedRead>,
    lent: HashMap<u64, Lent>,
}

/// A shared-memory connection (see the module docs of `transport::shm`).
pub(crate) struct ShmLink {
    id: ConnId,
    out: Arc<Outbox>,
    /// The receive ring, until the worker takes the link in ([`TransportLink::joined`]).
    rx: Mutex<Option<Consumer>>,
    /// The Unix socket the segment came over: its hang-up says the peer is gone.
    sock: UnixStream,
    peer_pid: i32,
    peer_data: Vec<u8>,
    peer_addr: Option<SocketAddr>,
    local_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    /// The worker's exposure table (TCP's): it holds exposed send buffers until withdrawn.
    exposures: Arc<Mutex<Exposures>>,
    reads: Mutex<Reads>,
    down_reported: AtomicBool,
}

/// What a link is made of, from the connection's setup.
pub(crate) struct Parts {
    pub(crate) tx: Producer,
    pub(crate) rx: Consumer,
    pub(crate) peer_bell: Doorbell,
    pub(crate) sock: UnixStream,
    pub(crate) peer_pid: i32,
    /// The peer's rdmx handshake.
    pub(crate) peer_data: Vec<u8>,
    pub(crate) peer_addr: Option<SocketAddr>,
    pub(crate) local_addr: Option<SocketAddr>,
}

impl ShmLink {
    pub(crate) fn new(
        id: ConnId,
        parts: Parts,
        shared: Arc<Shared>,
        exposures: Arc<Mutex<Exposures>>,
    ) -> std::io::Result<ShmLink> {
        parts.sock.set_nonblocking(true)?;
        Ok(ShmLink {
            id,
            out: Arc::new(Outbox {
                conn: id,
                tx: Mutex::new(parts.tx),
                waiting: Mutex::new(VecDeque::new()),
                has_waiting: AtomicBool::new(false),
                peer_bell: parts.peer_bell,
                broken: Mutex::new(None),
            }),
            rx: Mutex::new(Some(parts.rx)),
            sock: parts.sock,
            peer_pid: parts.peer_pid,
            peer_data: parts.peer_data,
            peer_addr: parts.peer_addr,
            local_addr: parts.local_addr,
            shared,
            exposures,
            reads: Mutex::new(Reads::default()),
            down_reported: AtomicBool::new(false),
        })
    }

    /// Makes the queued READs, one at a time, without holding the link's lock while a copy
    /// runs.
    fn run_reads(&self) {
        loop {
            let (op, mut vec) = {
                let mut r = self.reads.lock();
                let Some(op) = r.queued.pop_front() else {
                    return;
                };
                match r.lent.get_mut(&op.buf).map(|l| l.vec.take()) {
                    Some(Some(v)) => (op, v),
                    None => {
                        log::warn!("{:?}: READ into a buffer not lent (dropped)", self.id);
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
                            log::warn!("{:?}: READ of {} bytes: {e}", self.id, op.len);
                            false
                        }
                    }
                }
                _ => false,
            };
            {
                let mut r = self.reads.lock();
                if let Some(l) = r.lent.get_mut(&op.buf) {
                    l.vec = Some(vec);
                    l.outstanding -= 1;
                }
            }
            log::trace!(
                "{:?}: READ {:#x} of {} bytes done: {ok}",
                self.id,
                op.key,
                op.len
            );
            self.shared.read_done(op.key, ok);
        }
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        // The worker stops polling its ring; what is left in it is dropped.
        let mut left = Vec::new();
        self.shared.remove_rx(self.id, &mut left);
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
    fn event_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn joined(&self, _: &mut LockedIfaces, _: &mut Vec<LinkEvent>) {
        if let Some(rx) = self.rx.lock().take() {
            self.shared.add_rx(self.id, rx);
        }
    }

    fn queue_frame(
        &self,
        _: &mut LockedIfaces,
        frame: &[u8],
        payload: &[u8],
    ) -> Result<Queued, String> {
        if let Some(why) = self.out.broken.lock().as_ref() {
            return Err(why.clone());
        }
        if !self.out.has_waiting.load(Ordering::Acquire) {
            let mut tx = self.out.tx.lock();
            match tx.push(&[frame, payload]) {
                Ok(true) => {
                    self.out.wake_peer(&tx);
                    return Ok(Queued::Posted);
                }
                Ok(false) => {}
                Err(e @ rdmx_shm::Error::TooLong { .. }) => return Err(e.to_string()),
                Err(e) => {
                    self.out.broke(e.to_string());
                    return Err(e.to_string());
                }
            }
        }
        let mut f = Vec::with_capacity(frame.len() + payload.len());
        f.extend_from_slice(frame);
        f.extend_from_slice(payload);
        {
            // (Flag and queue change together: a retry draining the queue clears the flag.)
            let mut waiting = self.out.waiting.lock();
            waiting.push_back(f);
            self.out.has_waiting.store(true, Ordering::Release);
        }
        self.shared.blocked(self.out.clone());
        Ok(Queued::ForFlush)
    }

    /// The destination is lent to the link, which reads the peer's memory straight into it.
    fn start_read(
        &self,
        _: &mut LockedIfaces,
        read: ReadOp,
        mem: &mut UserMem,
    ) -> Result<(), String> {
        let key = read.buf.0;
        let mut r = self.reads.lock();
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
            self.id,
            read.key,
            read.len
        );
        r.queued.push_back(QueuedRead {
            key: read.key,
            buf: key,
            addr: read.remote.addr,
            len: read.len as usize,
            offset: read.offset as usize,
        });
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
        let remote = self.exposures.lock().expose(self.id, mem)?;
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
        let mut r = self.reads.lock();
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
            RecvFrame::Owned(bytes) => self.shared.recycle(bytes),
            #[allow(unreachable_patterns)]
            other => deferred.return_frame(other),
        }
    }

    fn reclaim_lent(&self) -> Vec<(UserBufId, Vec<u8>)> {
        let mut r = self.reads.lock();
        r.queued.clear();
        r.lent
            .drain()
            .filter_map(|(key, l)| l.vec.map(|v| (UserBufId(key), v)))
            .collect()
    }

    fn close(&self) {}

    fn take_failures(&self, _: &mut LockedIfaces, out: &mut Vec<LinkEvent>) {
        if let Some(why) = self.out.broken.lock().clone() {
            if !self.down_reported.swap(true, Ordering::AcqRel) {
                out.push(LinkEvent::Down {
                    conn: self.id,
                    reason: format!("protocol error: {why}"),
                    reads_lost: true,
                });
            }
        }
    }

    fn flush(&self, closing: bool) -> bool {
        if self.out.has_waiting.load(Ordering::Acquire) {
            self.out.push_waiting();
        }
        self.run_reads();
        if closing && self.idle() {
            // The peer sees the hang-up once it has what was sent.
            let _ = self.sock.shutdown(Shutdown::Both);
        }
        self.out.broken.lock().is_some()
    }

    fn idle(&self) -> bool {
        !self.out.has_waiting.load(Ordering::Acquire) && self.reads.lock().queued.is_empty()
    }

    /// The Unix socket is readable: the peer hung up (or wrote, which it never does).
    fn poll(&self, _: bool, _: &mut PollScratch, out: &mut Vec<LinkEvent>) -> usize {
        let mut b = [0u8; 1];
        let reason = match (&self.sock).read(&mut b) {
            Ok(0) => "connection lost: the peer hung up".to_string(),
            Ok(_) => "protocol error: the peer wrote on its shared-memory socket".to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return 0,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return 0,
            Err(e) => format!("connection lost: {e}"),
        };
        if !self.down_reported.swap(true, Ordering::AcqRel) {
            // What the peer sent before it went is delivered first.
            self.shared.remove_rx(self.id, out);
            out.push(LinkEvent::Down {
                conn: self.id,
                reason,
                reads_lost: true,
            });
        }
        0
    }
}
