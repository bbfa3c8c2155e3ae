//! A shared-memory link's way out: its send ring, the peer's doorbell, and the records
//! waiting for room in the ring — within a bound that does not depend on the peer.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use rdmx_proto::ConnId;
use rdmx_shm::{Doorbell, Producer};

use super::copy::{Serving, GET_LEN, MAX_GETS};
use super::iface::Shared;
use crate::hot_lock::HotLock;

/// What a record waiting in an outbox is counted for beyond its bytes (its buffer and its
/// place in the queue), against the outbox's bound.
const ENTRY_COST: usize = 64;

/// The most bytes a link's outbox holds (see [`Outbox`]) with peers whose receive buffers
/// are `recv_buf_size` bytes, as this side's (`RDMX_RECV_BUF_SIZE`): every frame the
/// window lets out at once, each as large as the peer takes, and every GET and answer to
/// one that may wait beside them. A peer that takes frames out of its ring as it returns
/// their credits never makes an outbox hold more.
fn outbox_bound(recv_buf_size: u32) -> usize {
    usize::from(super::WINDOW) * (recv_buf_size as usize + ENTRY_COST)
        + 2 * MAX_GETS * (GET_LEN + ENTRY_COST)
}

/// A record waiting for room in the send ring.
enum Pending {
    /// A record of `kind` with these bytes.
    Record(u8, Vec<u8>),
    /// The answer to a GET, pushed a chunk at a time.
    Serve(Serving),
}

/// The records of an [`Outbox`] waiting for room, in order (nothing goes into the ring while
/// one waits), and what they hold.
#[derive(Default)]
struct Waiting {
    queue: VecDeque<Pending>,
    /// Bytes counted against the outbox's bound: each record's bytes and [`ENTRY_COST`] (an
    /// answer to a GET copies no bytes: its data is the exposed buffer).
    bytes: usize,
    /// Answers to the peer's GETs among them.
    serves: usize,
}

impl Waiting {
    fn cost(p: &Pending) -> usize {
        match p {
            Pending::Record(_, bytes) => bytes.len() + ENTRY_COST,
            Pending::Serve(_) => ENTRY_COST,
        }
    }

    /// Takes the first record out (it went into the ring); `total` counts the worker's.
    fn pop(&mut self, total: &AtomicUsize) {
        if let Some(p) = self.queue.pop_front() {
            let cost = Self::cost(&p);
            self.bytes -= cost;
            total.fetch_sub(cost, Ordering::Relaxed);
            self.serves -= usize::from(matches!(p, Pending::Serve(_)));
        }
    }

    /// Drops every record.
    fn clear(&mut self, total: &AtomicUsize) {
        total.fetch_sub(self.bytes, Ordering::Relaxed);
        *self = Waiting::default();
    }
}

/// A link's way out: its send ring and what waits for room in it — at most `bound` bytes
/// (see [`outbox_bound`]): the peer's credits keep an rdmx peer's frames below it, and
/// [`MAX_GETS`] its GETs. A peer that returns credits for frames it never took from its
/// ring makes a record find the outbox full: the connection fails.
pub(crate) struct Outbox {
    conn: ConnId,
    tx: HotLock<Producer>,
    waiting: Mutex<Waiting>,
    pub(super) has_waiting: AtomicBool,
    bound: usize,
    /// Bytes waiting in all the worker's outboxes, as counted against their bounds.
    total: Arc<AtomicUsize>,
    peer_bell: Doorbell,
    /// Why the send ring cannot be used any more (the peer corrupted it): the first reason
    /// found, set once (read on every send without a lock).
    pub(super) broken: OnceLock<String>,
    /// The peer is gone or the link dropped: what waits is dropped, nothing more is sent
    /// (the worker's retry list lets go of this outbox, and with it the segment).
    closed: AtomicBool,
}

impl Outbox {
    /// The way out of connection `conn` through `tx`, waking the peer with `peer_bell`; its
    /// bound is [`outbox_bound`] of `recv_buf_size`, and what it holds is counted in `total`
    /// as well.
    pub(super) fn new(
        conn: ConnId,
        tx: Producer,
        peer_bell: Doorbell,
        recv_buf_size: u32,
        total: Arc<AtomicUsize>,
    ) -> Outbox {
        Outbox {
            conn,
            tx: HotLock::new(tx),
            waiting: Mutex::new(Waiting::default()),
            has_waiting: AtomicBool::new(false),
            bound: outbox_bound(recv_buf_size),
            total,
            peer_bell,
            broken: OnceLock::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Rings the peer's doorbell if it said it may sleep.
    fn wake_peer(&self, tx: &mut Producer) {
        if tx.consumer_waiting() {
            if let Err(e) = self.peer_bell.ring() {
                log::warn!("{:?}: ringing the peer's doorbell: {e}", self.conn);
            }
        }
    }

    /// Drops what waits and sends nothing more.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let mut waiting = self.waiting.lock();
        waiting.clear(&self.total);
        self.has_waiting.store(false, Ordering::Release);
    }

    /// Pushes the waiting records the ring has room for; returns whether some still wait.
    pub(crate) fn push_waiting(&self) -> bool {
        let mut waiting = self.waiting.lock();
        if self.closed.load(Ordering::Acquire) {
            waiting.clear(&self.total);
            self.has_waiting.store(false, Ordering::Release);
            return false;
        }
        let mut tx = self.tx.lock();
        let mut pushed = false;
        while let Some(f) = waiting.queue.front_mut() {
            let done = match f {
                Pending::Record(kind, bytes) => tx.push_kind(*kind, &[bytes]),
                Pending::Serve(s) => {
                    let before = s.sent;
                    let done = s.push(&mut tx);
                    // (An answer to a GET may push part of itself.)
                    pushed |= s.sent != before;
                    done
                }
            };
            match done {
                Ok(true) => {
                    waiting.pop(&self.total);
                    pushed = true;
                }
                Ok(false) => break,
                Err(e) => {
                    self.broke(e.to_string());
                    waiting.clear(&self.total);
                    break;
                }
            }
        }
        // (Only for what went in: a retry that found the ring still full rings nobody.)
        if pushed {
            self.wake_peer(&mut tx);
        }
        let left = !waiting.queue.is_empty();
        self.has_waiting.store(left, Ordering::Release);
        left
    }

    /// Sends a record of `kind` made of `pieces`: into the ring now when nothing waits and
    /// it has room (`Ok(true)`), else queued behind what waits (`Ok(false)`; `shared` retries
    /// it on every progress call).
    // (Once per message: inlined, as the request table's operations are; see
    // `worker::requests`.)
    #[inline(always)]
    pub(super) fn send(
        self: &Arc<Self>,
        shared: &Shared,
        kind: u8,
        head: &[u64],
        pieces: &[&[u8]],
    ) -> Result<bool, String> {
        if let Some(why) = self.broken.get() {
            return Err(why.clone());
        }
        if self.closed.load(Ordering::Acquire) {
            return Err("the connection is closed".into());
        }
        if !self.has_waiting.load(Ordering::Acquire) {
            let mut tx = self.tx.lock();
            match tx.push_words_then(kind, head, pieces) {
                Ok(true) => {
                    self.wake_peer(&mut tx);
                    return Ok(true);
                }
                Ok(false) => {}
                Err(e @ rdmx_shm::Error::TooLong { .. }) => return Err(e.to_string()),
                Err(e) => {
                    self.broke(e.to_string());
                    return Err(e.to_string());
                }
            }
        }
        self.send_later(shared, kind, head, pieces)?;
        Ok(false)
    }

    /// [`Outbox::send`] of a record that waits for room: its bytes copied, and queued behind
    /// what waits. (Out of line, as a cold call: `send` is inlined into every send.)
    #[cold]
    #[inline(never)]
    fn send_later(
        self: &Arc<Self>,
        shared: &Shared,
        kind: u8,
        head: &[u64],
        pieces: &[&[u8]],
    ) -> Result<(), String> {
        let mut bytes: Vec<u8> = head.iter().flat_map(|w| w.to_ne_bytes()).collect();
        for p in pieces {
            bytes.extend_from_slice(p);
        }
        self.enqueue(shared, Pending::Record(kind, bytes))
    }

    /// Answers a GET: what the ring has room for now, the rest as room appears. `Err`: the
    /// peer has [`MAX_GETS`] answers waiting already, or the outbox is full.
    pub(super) fn serve(self: &Arc<Self>, shared: &Shared, mut s: Serving) -> Result<(), String> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        if !self.has_waiting.load(Ordering::Acquire) {
            let mut tx = self.tx.lock();
            let done = s.push(&mut tx);
            self.wake_peer(&mut tx);
            match done {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.broke(e.to_string());
                    return Ok(());
                }
            }
        }
        self.enqueue(shared, Pending::Serve(s))
    }

    /// Queues `p` behind what waits, for `shared` to retry; `Err` (the connection fails)
    /// when the outbox would hold more than its bound.
    fn enqueue(self: &Arc<Self>, shared: &Shared, p: Pending) -> Result<(), String> {
        {
            // (Flag and queue change together: a retry draining the queue clears the flag.)
            let mut waiting = self.waiting.lock();
            let serve = matches!(p, Pending::Serve(_));
            if serve && waiting.serves >= MAX_GETS {
                // (Each answer waiting is a GET of the peer's not yet answered in full.)
                return Err(too_many_gets());
            }
            let cost = Waiting::cost(&p);
            if waiting.bytes + cost > self.bound {
                drop(waiting);
                let why = outbox_full(self.bound);
                self.broke(why.clone());
                // (What waits is dropped at once, not when the link is.)
                self.close();
                return Err(why);
            }
            waiting.bytes += cost;
            waiting.serves += usize::from(serve);
            waiting.queue.push_back(p);
            self.total.fetch_add(cost, Ordering::Relaxed);
            self.has_waiting.store(true, Ordering::Release);
        }
        shared.blocked(self.clone());
        Ok(())
    }

    fn broke(&self, why: String) {
        log::warn!("{:?}: {why}", self.conn);
        // (The first reason stays.)
        let _ = self.broken.set(why);
    }
}

#[cold]
#[inline(never)]
fn too_many_gets() -> String {
    format!(
        "the peer asked for more than {MAX_GETS} GETs while their answers waited for room \
         in its ring"
    )
}

#[cold]
#[inline(never)]
fn outbox_full(bound: usize) -> String {
    format!(
        "the peer left its ring full while {bound} bytes waited to go to it (more than its \
         credits let out)"
    )
}
