//! An in-memory transport for deterministic tests: two links of one process joined by
//! queues, so that the worker's real driver, executor and protocol engine run with no
//! socket and no device, and a test that steps both workers' progress from one thread sees
//! the same thing on every run.
//!
//! It does what TCP does natively and no more (see [`Transport::Memory`]'s capabilities):
//! frames arrive as owned buffers on the link's event fd (an eventfd rung by the peer's
//! flush), and a rendezvous READ is a request the sender's link answers, as its input is
//! read, from the worker's exposure table — the table the TCP transport uses. The connection
//! can be cut ([`Cable::cut`]) to test what a lost peer does.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rdmx_proto::{ConnId, RemoteBuf, UserBufId};
use rustix::event::{eventfd, EventfdFlags};

use super::tcp::{Answer, Exposures};
use super::{
    LinkEvent, LockedIfaces, PollScratch, Queued, ReadOp, RecvFrame, Transport, TransportLink,
};
use crate::usermem::UserMem;

/// What travels between the two links.
enum Message {
    /// A frame: header and payload.
    Frame(Vec<u8>),
    /// A READ of `len` bytes at `addr` under `rkey`, answered under `read_id`.
    ReadRequest {
        read_id: u64,
        addr: u64,
        rkey: u32,
        len: u64,
    },
    /// The answer to a READ request: its bytes, or `None` when it was refused.
    ReadData { read_id: u64, data: Option<Vec<u8>> },
    /// The sending side closed the connection.
    Closed,
}

/// The queues between the two sides, and each side's doorbell.
struct Wire {
    inbox: [Mutex<VecDeque<Message>>; 2],
    bell: [OwnedFd; 2],
    /// Cut: nothing more is delivered either way, and both sides see the link down.
    cut: AtomicBool,
}

/// Where a READ this side asked for lands: the buffer lent under `key`, at `offset`.
struct Expected {
    key: u64,
    offset: usize,
    len: usize,
}

/// The READ destinations lent to the link, and the READs expected into them.
#[derive(Default)]
struct Reads {
    lent: HashMap<u64, Vec<u8>>,
    expected: HashMap<u64, Expected>,
}

/// One side of an in-memory connection.
pub(crate) struct MemoryLink {
    id: ConnId,
    side: usize,
    wire: Arc<Wire>,
    /// The worker's exposure table (the one its TCP links use).
    exposures: Arc<Mutex<Exposures>>,
    /// Queued by the worker, sent by the next flush.
    outgoing: Mutex<Vec<Message>>,
    reads: Mutex<Reads>,
    peer_data: Vec<u8>,
    /// The link reported itself down.
    down_reported: AtomicBool,
}

/// A test's hold on an in-memory connection.
pub(crate) struct Cable {
    wire: Arc<Wire>,
}

impl Cable {
    /// Delivers `bytes` as a frame to side `to` (0: the worker that connected, 1: its peer),
    /// as if the other side had sent it: what a buggy or hostile peer could send.
    pub(crate) fn inject(&self, to: usize, bytes: Vec<u8>) {
        self.wire.inbox[to].lock().push_back(Message::Frame(bytes));
        ring(&self.wire.bell[to]);
    }

    /// Cuts the connection as a pulled cable would: queued and later messages are lost, and
    /// both sides report the link down at their next progress.
    pub(crate) fn cut(&self) {
        self.wire.cut.store(true, Ordering::Release);
        for side in 0..2 {
            self.wire.inbox[side].lock().clear();
            ring(&self.wire.bell[side]);
        }
    }
}

/// Two connected links: the first for connection `ids.0` of one worker (which receives the
/// handshake `handshakes.0` from its peer), the second for `ids.1` of the other; and the
/// cable between them.
pub(crate) fn pair(
    ids: (ConnId, ConnId),
    handshakes: (Vec<u8>, Vec<u8>),
    exposures: (Arc<Mutex<Exposures>>, Arc<Mutex<Exposures>>),
) -> std::io::Result<(MemoryLink, MemoryLink, Cable)> {
    let bell = || eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC);
    let wire = Arc::new(Wire {
        inbox: [Mutex::default(), Mutex::default()],
        bell: [bell()?, bell()?],
        cut: AtomicBool::new(false),
    });
    let side = |side, id, peer_data, exposures| MemoryLink {
        id,
        side,
        wire: wire.clone(),
        exposures,
        outgoing: Mutex::default(),
        reads: Mutex::default(),
        peer_data,
        down_reported: AtomicBool::new(false),
    };
    Ok((
        side(0, ids.0, handshakes.0, exposures.0),
        side(1, ids.1, handshakes.1, exposures.1),
        Cable { wire: wire.clone() },
    ))
}

impl MemoryLink {
    /// Answers the peer's READ request from the exposure table (queued, sent by the next
    /// flush). A request for a buffer exposed to another connection takes the link down.
    fn answer_read(&self, read_id: u64, (addr, rkey, len): (u64, u32, u64)) -> Option<LinkEvent> {
        let answer = self.exposures.lock().answer(self.id, addr, rkey, len);
        let (data, down) = match answer {
            Answer::Data { data, offset, len } => (Some(data[offset..offset + len].to_vec()), None),
            Answer::Refused => (None, None),
            Answer::OtherEndpoint => (None, Some(super::tcp::foreign_read_down(self.id))),
        };
        self.outgoing
            .lock()
            .push(Message::ReadData { read_id, data });
        down
    }

    /// The READ `read_id` was answered: its data lands in the lent buffer.
    fn read_answered(&self, read_id: u64, data: Option<Vec<u8>>) -> Option<LinkEvent> {
        let mut reads = self.reads.lock();
        let reads = &mut *reads;
        let e = reads.expected.remove(&read_id)?;
        let landed = match (data, reads.lent.get_mut(&e.key)) {
            (Some(data), Some(buf)) if data.len() == e.len => buf
                .get_mut(e.offset..e.offset + e.len)
                .map(|dst| dst.copy_from_slice(&data))
                .is_some(),
            _ => false,
        };
        Some(LinkEvent::ReadDone {
            key: read_id,
            piece: None,
            ok: landed,
            refused: false,
            value: 0,
            posted: true,
        })
    }

    fn down(&self, reason: &str) -> Option<LinkEvent> {
        (!self.down_reported.swap(true, Ordering::AcqRel)).then(|| LinkEvent::Down {
            conn: self.id,
            reason: reason.to_string(),
            reads_lost: true,
        })
    }
}

fn ring(bell: &OwnedFd) {
    let _ = rustix::io::write(bell, &1u64.to_ne_bytes());
}

impl TransportLink for MemoryLink {
    fn transport(&self) -> Transport {
        Transport::Memory
    }

    fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        None
    }

    fn local_addr(&self) -> Option<std::net::SocketAddr> {
        None
    }

    fn peer_private_data(&self) -> &[u8] {
        &self.peer_data
    }

    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.wire.bell[self.side].as_fd())
    }

    fn queue_frame(
        &self,
        _: &mut LockedIfaces,
        frame: &rdmx_proto::wire::FrameBuf,
        payload: &[u8],
    ) -> Result<Queued, String> {
        let frame = frame.as_bytes();
        let mut bytes = Vec::with_capacity(frame.len() + payload.len());
        bytes.extend_from_slice(frame);
        bytes.extend_from_slice(payload);
        self.outgoing.lock().push(Message::Frame(bytes));
        Ok(Queued::ForFlush)
    }

    fn start_read(
        &self,
        _: &mut LockedIfaces,
        read: ReadOp,
        mem: &mut UserMem,
    ) -> Result<(), String> {
        let key = read.buf.0;
        let mut reads = self.reads.lock();
        if let UserMem::Plain(vec) = std::mem::replace(mem, UserMem::Lent) {
            reads.lent.insert(key, vec);
        }
        let (offset, len) = (read.offset as usize, read.len as usize);
        let fits = reads
            .lent
            .get(&key)
            .is_some_and(|b| offset.checked_add(len).is_some_and(|end| end <= b.len()));
        if !fits {
            if !reads.expected.values().any(|e| e.key == key) {
                if let Some(vec) = reads.lent.remove(&key) {
                    *mem = UserMem::Plain(vec);
                }
            }
            return Err(format!(
                "{len} bytes at {offset} lie outside the receive buffer"
            ));
        }
        reads
            .expected
            .insert(read.key, Expected { key, offset, len });
        self.outgoing.lock().push(Message::ReadRequest {
            read_id: read.key,
            addr: read.remote.addr,
            rkey: read.remote.rkey,
            len: read.len,
        });
        Ok(())
    }

    fn expose(
        &self,
        _: &mut LockedIfaces,
        _: UserBufId,
        mem: &mut UserMem,
        _: u64,
    ) -> Result<RemoteBuf, String> {
        self.exposures.lock().expose(self.id, mem)
    }

    fn read_finished(&self, buf: UserBufId, mem: Option<&mut UserMem>) {
        let mut reads = self.reads.lock();
        if reads.expected.values().any(|e| e.key == buf.0) {
            return;
        }
        if let (Some(vec), Some(mem)) = (reads.lent.remove(&buf.0), mem) {
            *mem = UserMem::Plain(vec);
        }
    }

    fn reclaim_lent(&self) -> Vec<(UserBufId, Vec<u8>)> {
        let mut reads = self.reads.lock();
        reads.expected.clear();
        reads
            .lent
            .drain()
            .map(|(key, vec)| (UserBufId(key), vec))
            .collect()
    }

    fn close(&self) {
        self.outgoing.lock().push(Message::Closed);
    }

    fn flush(&self, _closing: bool) -> bool {
        let mut out = self.outgoing.lock();
        if out.is_empty() {
            return false;
        }
        if self.wire.cut.load(Ordering::Acquire) {
            out.clear();
            return false;
        }
        let peer = 1 - self.side;
        self.wire.inbox[peer].lock().extend(out.drain(..));
        ring(&self.wire.bell[peer]);
        false
    }

    fn idle(&self) -> bool {
        self.outgoing.lock().is_empty()
    }

    fn poll(&self, _: bool, _: &mut PollScratch, out: &mut Vec<LinkEvent>) -> usize {
        let mut count = [0u8; 8];
        let _ = rustix::io::read(&self.wire.bell[self.side], &mut count);
        if self.wire.cut.load(Ordering::Acquire) {
            out.extend(self.down("connection lost: the in-memory link was cut"));
            return 0;
        }
        let messages: Vec<Message> = self.wire.inbox[self.side].lock().drain(..).collect();
        let mut answered = 0;
        for m in messages {
            match m {
                Message::Frame(bytes) => out.push(LinkEvent::Frame {
                    conn: self.id,
                    len: bytes.len(),
                    frame: RecvFrame::Owned(bytes),
                }),
                Message::ReadRequest {
                    read_id,
                    addr,
                    rkey,
                    len,
                } => {
                    out.extend(self.answer_read(read_id, (addr, rkey, len)));
                    answered += 1;
                }
                Message::ReadData { read_id, data } => {
                    out.extend(self.read_answered(read_id, data))
                }
                Message::Closed => out.extend(self.down("connection lost: the peer closed it")),
            }
        }
        answered
    }
}
