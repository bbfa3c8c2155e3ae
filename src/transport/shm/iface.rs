//! The shared-memory transport's worker-wide part: the receive rings of all the worker's
//! shared-memory connections, polled together on every progress call; the worker's doorbell;
//! READs finished by its links; the Unix socket peers hand segments over on (see
//! [`super::handover`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use rdmx_proto::ConnId;
use rdmx_shm::{Consumer, Doorbell, HostIdentity, RecordBuf};

use super::copy::{KIND_DATA, KIND_FRAME, KIND_GET};
use super::handover::HandOvers;
use super::link::RecordSink;
use super::outbox::Outbox;
use crate::error::{Error, Result};
use crate::readiness::{Interest, Registry};
use crate::transport::{LinkEvent, RecvFrame};

/// The readiness token of the worker's doorbell.
const TOKEN_DOORBELL: u64 = 2;
/// Bytes of frames a progress call takes from the rings at most (it takes the rest on its
/// next call): how long it delivers under the protocol lock stays bounded however many
/// rings there are.
const FRAME_BUDGET: usize = 256 << 10;
/// Records a progress call takes from one ring at most: one busy peer does not starve the
/// others. (A receiver that falls behind its sender finds more than this waiting, and each
/// progress call has a cost of its own: at 16, that came to 22 of the shared-memory
/// receiver's 925 instructions per 8 B message at window 64, callgrind.)
const PER_RING: usize = 64;

/// A connection's receive ring, and where its records that are not frames go.
struct Rx {
    conn: ConnId,
    ring: Consumer,
    sink: RecordSink,
}

/// The receive rings a progress call polls, in its scratch: whoever holds the worker's
/// progress lock has them, so a poll takes no lock of its own (an idle busy poll makes no
/// read-modify-write for them). Rings come and go through [`Shared`]'s queue of changes,
/// which the next poll takes in. Also the ring a poll starts with (calls take turns, so that
/// rings late in the list are not left for later whenever the frame budget runs out).
#[derive(Default)]
pub(crate) struct ShmRings {
    rings: Vec<Rx>,
    first: usize,
    /// Rings the last poll found records waiting in, for [`ShmIface::deliver`].
    ready: usize,
    /// The words of the record being taken, reused record after record.
    record: RecordBuf,
}

/// Rings added and removed since the last poll took the changes in.
#[derive(Default)]
struct RingChanges {
    added: Vec<Rx>,
    /// Connections whose rings go (their links were dropped): what is left in them is
    /// dropped.
    removed: Vec<ConnId>,
}

/// What the worker's shared-memory connections share (see the module docs).
pub(crate) struct Shared {
    /// This process's identity, offered to peers.
    pub(crate) identity: HostIdentity,
    /// The word peers read to learn whether CMA works, and its value.
    probe: Box<u64>,
    /// The worker's doorbell (peers hold its fd).
    pub(crate) bell: Doorbell,
    /// Rings to take in or drop at the next poll (see [`ShmRings`]); `changed` says some wait.
    changes: Mutex<RingChanges>,
    changed: AtomicBool,
    /// Set while the worker may sleep: the rings' `waiting` flags are up. (Changed under
    /// `changes`' lock, so that a ring added meanwhile gets the flag.)
    armed: AtomicBool,
    /// The worker busy-polls (never sleeps, never arms): its rings say so to their producers
    /// once, which then neither fence nor look at `waiting` after a push.
    busy: bool,
    /// READs the links finished: (key, whether the data landed).
    done: Mutex<Vec<(u64, bool)>>,
    done_count: AtomicUsize,
    /// Links whose frames wait for room in their ring.
    blocked: Mutex<Vec<Arc<Outbox>>>,
    blocked_count: AtomicUsize,
    /// Bytes waiting in the links' outboxes, as counted against their bounds.
    queued: Arc<AtomicUsize>,
    /// Where peers that accepted our offer hand the segment over: a Unix socket only this
    /// user can reach, made on the first offer, and the streams taken from it.
    pub(crate) hand_overs: HandOvers,
}

/// The worker-wide part, made on first use.
#[derive(Default)]
pub(crate) struct ShmIface {
    shared: OnceLock<Arc<Shared>>,
    init: Mutex<()>,
}

impl ShmIface {
    /// The shared part, if it was made.
    pub(crate) fn get(&self) -> Option<&Arc<Shared>> {
        self.shared.get()
    }

    /// Whether arming wakes the worker for what its peers send: not if its rings told their
    /// producers that it never sleeps ([`Shared::busy`]).
    pub(crate) fn can_sleep(&self) -> bool {
        self.shared.get().map_or(true, |s| !s.busy)
    }

    /// The shared part, made (its doorbell registered with `registry`) if it was not, for a
    /// worker that busy-polls (`busy`: see [`Shared::busy`]) or sleeps.
    pub(crate) fn on(&self, registry: &Registry, busy: bool) -> Result<&Arc<Shared>> {
        if let Some(s) = self.shared.get() {
            return Ok(s);
        }
        let _guard = self.init.lock();
        if let Some(s) = self.shared.get() {
            return Ok(s);
        }
        let identity = HostIdentity::this()?;
        let bell = Doorbell::new()?;
        registry
            .add(bell.fd(), TOKEN_DOORBELL, Interest::Read)
            .map_err(|e| Error::os("epoll_ctl", e))?;
        let probe = Box::new(rand::random::<u64>() | 1);
        let shared = Arc::new(Shared {
            identity,
            probe,
            bell,
            changes: Mutex::new(RingChanges::default()),
            changed: AtomicBool::new(false),
            armed: AtomicBool::new(false),
            busy,
            done: Mutex::new(Vec::new()),
            done_count: AtomicUsize::new(0),
            blocked: Mutex::new(Vec::new()),
            blocked_count: AtomicUsize::new(0),
            queued: Arc::default(),
            hand_overs: HandOvers::new(identity.uid),
        });
        Ok(self.shared.get_or_init(|| shared))
    }

    /// Looks at every receive ring (one load each) and puts the other events (finished
    /// READs) into `out`, in order; returns how many rings have records waiting, for
    /// [`ShmIface::deliver`], and events it found. Also retries frames waiting for room.
    #[inline]
    pub(crate) fn poll(&self, rings: &mut ShmRings, out: &mut Vec<LinkEvent>) -> usize {
        match self.shared.get() {
            Some(s) => s.poll(rings, out),
            None => 0,
        }
    }

    /// Whether [`ShmIface::poll`] would find nothing now: no ring changed, no frame waits
    /// for room, no READ finished, and every receive ring is empty (one load each).
    #[inline]
    pub(crate) fn quiet(&self, rings: &ShmRings) -> bool {
        self.shared.get().map_or(true, |s| {
            !s.changed.load(Ordering::Relaxed)
                && s.blocked_count.load(Ordering::Relaxed) == 0
                && s.done_count.load(Ordering::Relaxed) == 0
                && rings.rings.iter().all(|r| r.ring.is_empty())
        })
    }

    /// Takes the records waiting in the rings [`ShmIface::poll`] found ready, in order,
    /// each as it is taken: a frame to `frame` (its connection and bytes, which are this
    /// call's, copied out of the ring), a GET or DATA to its link, a ring found corrupt as
    /// its connection going down into `out`, after its frames. Under the protocol lock
    /// (`frame` delivers into the engine): no frame waits in a buffer of its own between
    /// its ring and its delivery.
    #[inline]
    pub(crate) fn deliver(
        &self,
        rings: &mut ShmRings,
        out: &mut Vec<LinkEvent>,
        frame: impl FnMut(ConnId, &[u8]),
    ) {
        if let (true, Some(s)) = (rings.ready > 0, self.shared.get()) {
            s.deliver(rings, out, frame);
        }
    }

    /// Before sleeping: asks peers to ring the doorbell for what they send next.
    pub(crate) fn arm(&self, rings: &mut ShmRings) {
        if let Some(s) = self.shared.get() {
            s.set_waiting(rings, true);
        }
    }

    /// Awake again: peers need not ring the doorbell.
    pub(crate) fn disarm(&self, rings: &mut ShmRings) {
        if let Some(s) = self.shared.get() {
            s.set_waiting(rings, false);
        }
    }

    /// The doorbell rang (its token): takes the rings.
    pub(crate) fn ready(&self, token: u64) -> Result<()> {
        if let (TOKEN_DOORBELL, Some(s)) = (token, self.shared.get()) {
            s.bell.drain()?;
        }
        Ok(())
    }
}

impl Shared {
    /// The probe word's address and value, for an offer.
    pub(crate) fn probe(&self) -> (u64, u64) {
        (&*self.probe as *const u64 as u64, *self.probe)
    }

    /// Takes `ring` in as the receive ring of `sink`'s connection (polled from the next
    /// progress call on).
    pub(crate) fn add_rx(&self, ring: Consumer, sink: RecordSink) {
        let mut changes = self.changes.lock();
        if self.busy {
            ring.never_sleeps();
        } else if self.armed.load(Ordering::Acquire) {
            ring.may_sleep(true);
        }
        changes.added.push(Rx {
            conn: sink.conn,
            ring,
            sink,
        });
        self.changed.store(true, Ordering::Release);
    }

    /// Connection `conn`'s link is gone: its receive ring is dropped at the next poll, with
    /// whatever is left in it.
    pub(crate) fn drop_rx(&self, conn: ConnId) {
        let mut changes = self.changes.lock();
        changes.removed.push(conn);
        self.changed.store(true, Ordering::Release);
    }

    /// Takes in the rings added and drops those removed since the last call.
    #[cold]
    fn take_changes(&self, rings: &mut ShmRings) {
        let mut changes = self.changes.lock();
        self.changed.store(false, Ordering::Release);
        rings.rings.append(&mut changes.added);
        for conn in changes.removed.drain(..) {
            rings.rings.retain(|r| r.conn != conn);
        }
        rings.first = 0;
    }

    /// Forgets connection `conn`'s receive ring now, returning what still waited in it (the
    /// peer sent it before it went).
    pub(crate) fn remove_rx(&self, rings: &mut ShmRings, conn: ConnId, out: &mut Vec<LinkEvent>) {
        if self.changed.load(Ordering::Acquire) {
            self.take_changes(rings);
        }
        if let Some(i) = rings.rings.iter().position(|r| r.conn == conn) {
            let mut r = rings.rings.swap_remove(i);
            rings.first = 0;
            let mut frames = Vec::new();
            let mut record = RecordBuf::default();
            while !r.ring.is_empty() {
                // (Rare: a frame buffer each.)
                let taken = self.take_record(&mut r, &mut record, |conn, frame| {
                    frames.push(LinkEvent::Frame {
                        conn,
                        len: frame.len(),
                        frame: RecvFrame::Owned(frame.to_vec()),
                    })
                });
                match taken {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        broken_ring(conn, e, &mut frames);
                        break;
                    }
                }
            }
            r.ring.free();
            out.append(&mut frames);
        }
    }

    /// The count of bytes waiting in the links' outboxes, for a new link's to add to.
    pub(crate) fn queued_total(&self) -> Arc<AtomicUsize> {
        self.queued.clone()
    }

    /// Bytes waiting in the links' outboxes for room in their rings, as counted against
    /// their bounds.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// A READ finished.
    pub(crate) fn read_done(&self, key: u64, ok: bool) {
        let mut done = self.done.lock();
        done.push((key, ok));
        self.done_count.store(done.len(), Ordering::Release);
    }

    /// `out` has frames waiting for room in its ring: progress retries it.
    pub(crate) fn blocked(&self, out: Arc<Outbox>) {
        let mut b = self.blocked.lock();
        if !b.iter().any(|o| Arc::ptr_eq(o, &out)) {
            b.push(out);
            self.blocked_count.store(b.len(), Ordering::Release);
        }
    }

    fn set_waiting(&self, rings: &mut ShmRings, on: bool) {
        let changes = self.changes.lock();
        if self.armed.swap(on, Ordering::AcqRel) != on {
            for r in rings.rings.iter().chain(&changes.added) {
                r.ring.may_sleep(on);
            }
        }
    }

    fn poll(&self, rings: &mut ShmRings, out: &mut Vec<LinkEvent>) -> usize {
        let before = out.len();
        if self.changed.load(Ordering::Acquire) {
            self.take_changes(rings);
        }
        if self.blocked_count.load(Ordering::Acquire) > 0 {
            let blocked = {
                // (Taken and counted together: an outbox blocked meanwhile is counted.)
                let mut b = self.blocked.lock();
                self.blocked_count.store(0, Ordering::Release);
                std::mem::take(&mut *b)
            };
            for o in blocked {
                if o.push_waiting() {
                    self.blocked(o);
                }
            }
        }
        // (An empty ring, what an idle poll finds, is one load.)
        rings.ready = rings.rings.iter().filter(|r| !r.ring.is_empty()).count();
        if self.done_count.load(Ordering::Acquire) > 0 {
            let mut done = self.done.lock();
            for (key, ok) in done.drain(..) {
                out.push(LinkEvent::ReadDone {
                    key,
                    piece: None,
                    ok,
                    refused: false,
                    value: 0,
                    posted: true,
                });
            }
            self.done_count.store(0, Ordering::Release);
        }
        rings.ready + out.len() - before
    }

    /// [`ShmIface::deliver`], with the rings ready.
    #[inline]
    fn deliver(
        &self,
        rings: &mut ShmRings,
        out: &mut Vec<LinkEvent>,
        mut frame: impl FnMut(ConnId, &[u8]),
    ) {
        let ShmRings {
            rings,
            first,
            ready,
            record,
        } = rings;
        *ready = 0;
        let n = rings.len();
        let mut broken = Vec::new();
        let mut budget = FRAME_BUDGET;
        // (Counted round from `first` without a division per ring.)
        let mut i = if *first < n { *first } else { 0 };
        for _ in 0..n {
            if budget == 0 {
                // The rest wait for the next call, which starts with them.
                *first = i;
                break;
            }
            let r = &mut rings[i];
            for _ in 0..PER_RING {
                match self.take_record(r, record, &mut frame) {
                    Ok(Some(len)) => budget = budget.saturating_sub(len),
                    Ok(None) => break,
                    Err(e) => {
                        broken_ring(r.conn, e, out);
                        // Nothing more goes to that peer: what waits for it is dropped.
                        r.sink.close();
                        broken.push(i);
                        break;
                    }
                }
            }
            // (One store frees all this call took from the ring.)
            r.ring.free();
            i += 1;
            if i == n {
                i = 0;
            }
        }
        if !broken.is_empty() {
            broken.sort_unstable();
            for i in broken.into_iter().rev() {
                rings.swap_remove(i);
            }
            *first = 0;
        }
    }

    /// Takes the record waiting in `r`, if any, into `record`: a frame to `frame`, a GET or
    /// DATA to the link; `Ok(Some(its length))`, or `Ok(None)` when none waits. `Err` when
    /// the peer corrupted the ring or broke the protocol.
    #[inline(always)]
    fn take_record(
        &self,
        r: &mut Rx,
        record: &mut RecordBuf,
        mut frame: impl FnMut(ConnId, &[u8]),
    ) -> std::result::Result<Option<usize>, String> {
        match r.ring.take_words(record) {
            Ok(Some((KIND_FRAME, len))) => {
                frame(r.conn, record.bytes(len));
                Ok(Some(len))
            }
            Ok(None) => Ok(None),
            Ok(Some((KIND_GET, len))) => r.sink.get(self, record.bytes(len)).map(|()| Some(len)),
            Ok(Some((KIND_DATA, len))) => r.sink.data(self, record.bytes(len)).map(|()| Some(len)),
            Ok(Some((kind, _))) => Err(unknown_kind(kind)),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The doorbell's fd, to hand to a peer.
    pub(crate) fn bell_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.bell.fd()
    }
}

/// Reports the ring of `conn` broken for `e`: the connection goes down. (Out of line, as a
/// cold call: the pop of every record inlines none of its formatting.)
#[cold]
#[inline(never)]
fn broken_ring(conn: ConnId, e: String, out: &mut Vec<LinkEvent>) {
    log::warn!("{conn:?}: {e}");
    out.push(ring_down(conn, &e));
}

/// The event of `conn` going down because the peer broke a ring of it (its receive ring
/// here, its send ring in the link's `take_failures`) for the reason `why`.
#[cold]
pub(super) fn ring_down(conn: ConnId, why: &str) -> LinkEvent {
    LinkEvent::Down {
        conn,
        reason: format!("protocol error: {why}"),
        reads_lost: true,
    }
}

#[cold]
#[inline(never)]
fn unknown_kind(kind: u8) -> String {
    format!("a record of unknown kind {kind}")
}
