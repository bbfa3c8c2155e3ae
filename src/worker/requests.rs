//! The request table: every request a worker's handles name, in a slab, and the one table
//! the worker keeps per request. A request's slot holds its engine id, its user buffer (the
//! engine names it by the slot: [`UserBufId`] is the slot's index and generation), a send's
//! connection and, once it completes, its outcome, under the protocol lock; its *done* flag
//! lives in the worker's [`DoneFlags`], which the request's handle reads through its worker
//! without any lock. What the engine hands back names the buffer (a delivery's `dst`, a
//! completion's `buf`), so the request is found by indexing, with no second table by
//! request id or by buffer id. Slots and flags are reused, so a request in steady state
//! allocates nothing of its own, and its handle holds no reference of its own (no `Arc`,
//! whose count two atomic read-modify-writes would keep, or mutex per request).
//!
//! Its operations run once or twice per message and are `#[inline(always)]`, as is the
//! engine's slab: as calls (the compiler's choice even with `#[inline]`), their register
//! saves and argument moves cost 269 of 5015 user-space instructions per shared-memory
//! round trip (callgrind, `roundtrip_cost`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rdmx_proto::{RequestId, UserBufId};

use crate::request::Outcome;
use crate::transport::Conn;
use crate::usermem::UserMem;

/// Slots of the first chunk of done flags; chunk `k` has `FIRST_CHUNK << k`.
const FIRST_CHUNK: usize = 64;
/// Chunks: enough for every `u32` slot index (`FIRST_CHUNK << CHUNKS` is past `2^32`).
const CHUNKS: usize = 27;

/// The done flags of every slot of a worker's request table, `(generation << 1) | done`,
/// readable without a lock: chunks that double in size, each made once (under the protocol
/// lock, when the table first grows into it) and never moved or freed while the worker
/// lives, so a flag's place never changes.
pub(crate) struct DoneFlags([OnceLock<Arc<[AtomicU64]>>; CHUNKS]);

impl Default for DoneFlags {
    fn default() -> Self {
        DoneFlags(std::array::from_fn(|_| OnceLock::new()))
    }
}

impl DoneFlags {
    /// Slot `index`'s chunk and place in it.
    #[inline]
    fn place(index: u32) -> (usize, usize) {
        // Chunk k holds the indices from FIRST_CHUNK * (2^k - 1) on.
        let i = u64::from(index) + FIRST_CHUNK as u64;
        let k = (u64::BITS - 1 - i.leading_zeros() - FIRST_CHUNK.trailing_zeros()) as usize;
        (k, (i - ((FIRST_CHUNK as u64) << k)) as usize)
    }

    /// The flag at `at` in chunk `k`, if the chunk was made.
    #[inline]
    fn get(&self, (k, at): (usize, usize)) -> Option<&AtomicU64> {
        self.0.get(k)?.get()?.get(at)
    }

    /// Chunk `k`, made if it was not.
    fn chunk(&self, k: usize) -> Arc<[AtomicU64]> {
        self.0[k]
            .get_or_init(|| (0..FIRST_CHUNK << k).map(|_| AtomicU64::new(0)).collect())
            .clone()
    }
}

/// What a request's handle holds to find its entry in the table: its index, the generation
/// it was opened in, and where its done flag is ([`DoneFlags::place`] of the index, worked
/// out once).
pub(crate) struct RequestKey {
    pub(crate) index: u32,
    chunk: u32,
    at: u32,
    pub(crate) generation: u64,
}

impl RequestKey {
    /// The key of no request: held by a handle whose outcome was taken (its worker gone
    /// from it, it names nothing).
    pub(crate) const NONE: RequestKey = RequestKey {
        index: u32::MAX,
        chunk: 0,
        at: 0,
        generation: 0,
    };

    /// Whether the request completed (no lock taken), by its worker's `flags`.
    #[inline]
    pub(crate) fn is_done(&self, flags: &DoneFlags) -> bool {
        flags
            .get((self.chunk as usize, self.at as usize))
            .is_some_and(|f| f.load(Ordering::SeqCst) == (self.generation << 1) | 1)
    }
}

struct Entry {
    generation: u64,
    /// The engine's id of the request, until it completes.
    id: Option<RequestId>,
    /// Whether it completed and its outcome waits in `outcome` to be taken. (A flag beside
    /// the outcome, not an `Option<Outcome>`: taking the `Option` wrote the whole `None`
    /// back, 64 bytes copied from wherever the compiler had them, 30 instructions per
    /// message; taking the outcome leaves it in place but for its buffer.)
    finished: bool,
    /// The completed request's outcome (valid while `finished`; its buffer is empty
    /// otherwise).
    outcome: Outcome,
    /// The handle was dropped before completion: the slot is freed when it completes.
    abandoned: bool,
    /// A request handle names it, until it takes the outcome or is dropped.
    open: bool,
    /// The user buffer the worker holds: from the request's start until it completes, or
    /// longer while a READ still targets it (an orphan); or, without a request, for the
    /// moment a request the engine completed as it was made takes.
    mem: Option<UserMem>,
    /// A send's connection.
    conn: Option<Arc<Conn>>,
    /// Its done flag: chunk `flag.0` of the [`DoneFlags`], held (the flags never move), at
    /// `flag.1` ([`DoneFlags::place`] of its index, worked out once, when the slot was
    /// made).
    flag: (u32, u32),
    chunk: Arc<[AtomicU64]>,
}

impl Entry {
    /// The outcome waiting in the slot, taken out (the slot no longer `finished`).
    #[inline(always)]
    fn take_outcome(&mut self) -> Option<Outcome> {
        if !self.finished {
            return None;
        }
        self.finished = false;
        // (Its other fields are copied; the slot keeps them, and an empty buffer.)
        Some(Outcome {
            buf: std::mem::take(&mut self.outcome.buf),
            ..self.outcome
        })
    }

    /// Whether neither a handle nor a buffer holds it: its slot can be reused.
    #[inline(always)]
    fn unused(&self) -> bool {
        !self.open && self.mem.is_none()
    }
}

/// The worker's one table of requests (see the module docs). Lives in the protocol state,
/// under its lock; its done flags are shared with the worker's handles.
pub(crate) struct RequestTable {
    flags: Arc<DoneFlags>,
    entries: Vec<Entry>,
    free: Vec<u32>,
    /// Entries holding a buffer.
    buffers: usize,
}

/// The id under which the engine names the buffer in slot `index` of `generation`: the
/// index in the low half, the generation's low bits in the high half (a stale id finds
/// nothing once its slot was reused).
#[inline(always)]
fn buf_id(index: u32, generation: u64) -> UserBufId {
    UserBufId((generation << 32) | u64::from(index))
}

impl RequestTable {
    /// A table whose done flags are `flags`.
    pub(crate) fn new(flags: Arc<DoneFlags>) -> Self {
        RequestTable {
            flags,
            entries: Vec::new(),
            free: Vec::new(),
            buffers: 0,
        }
    }

    /// Takes `mem` in, in a slot of its own, for a request about to be made: the engine
    /// names it by the id returned. No handle names the slot until [`RequestTable::open`].
    #[inline(always)]
    pub(crate) fn insert_buf(&mut self, mem: UserMem) -> UserBufId {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.entries.len() as u32;
                let (k, at) = DoneFlags::place(i);
                self.entries.push(Entry {
                    generation: 0,
                    id: None,
                    finished: false,
                    outcome: Outcome {
                        status: rdmx_proto::Status::Ok,
                        kind: rdmx_proto::RequestKind::Recv,
                        length: 0,
                        tag: 0,
                        buf: Vec::new(),
                        conn: None,
                    },
                    abandoned: false,
                    open: false,
                    mem: None,
                    conn: None,
                    // (Under 27 and 2^32: see `place`.)
                    flag: (k as u32, at as u32),
                    chunk: self.flags.chunk(k),
                });
                i
            }
        };
        let e = &mut self.entries[index as usize];
        e.generation += 1;
        e.id = None;
        // (`finished` is false and the outcome's buffer empty in a free slot: taking or
        // dropping the outcome cleared them.)
        debug_assert!(!e.finished && e.outcome.buf.capacity() == 0);
        e.abandoned = false;
        e.open = false;
        e.mem = Some(mem);
        self.buffers += 1;
        buf_id(index, e.generation)
    }

    /// [`RequestTable::insert_buf`] and [`RequestTable::open`] in one: takes `mem` in for
    /// the request `make` makes with its buffer id (a receive; no connection), and opens
    /// its handle. (The slot is touched once, not once by each.)
    #[inline(always)]
    pub(crate) fn insert_open(
        &mut self,
        mem: UserMem,
        make: impl FnOnce(UserBufId) -> RequestId,
    ) -> RequestKey {
        let buf = self.insert_buf(mem);
        let id = make(buf);
        // (A receive has no connection: `free_if_unused` cleared it when the slot was freed.)
        self.opened(buf.0 as u32, id)
    }

    /// The slot of `buf`, if it is in use under that id.
    #[inline(always)]
    pub(crate) fn slot(&self, buf: UserBufId) -> Option<u32> {
        let index = buf.0 as u32;
        let e = self.entries.get(index as usize)?;
        (!e.unused() && buf_id(index, e.generation) == buf).then_some(index)
    }

    /// A handle for the request `id` the engine made with `buf` (just taken in by
    /// [`RequestTable::insert_buf`]), not done; `conn` is a send's connection.
    #[inline(always)]
    pub(crate) fn open(
        &mut self,
        buf: UserBufId,
        id: RequestId,
        conn: Option<&Arc<Conn>>,
    ) -> RequestKey {
        // (Its buffer is in the slot from `insert_buf` until the request completes, which
        // the caller's locked section has not let happen yet.)
        let index = buf.0 as u32;
        self.entries[index as usize].conn = conn.cloned();
        self.opened(index, id)
    }

    /// Opens the handle of the request `id` in slot `index`, not done.
    #[inline(always)]
    fn opened(&mut self, index: u32, id: RequestId) -> RequestKey {
        let e = &mut self.entries[index as usize];
        e.open = true;
        e.id = Some(id);
        // (No order to keep with the sleepers here, unlike `finish`: a handle that looks at
        // this flag gets its generation from this call, after the store. A plain store, not
        // the `xchg` a sequentially consistent one costs.)
        if let Some(flag) = e.chunk.get(e.flag.1 as usize) {
            flag.store(e.generation << 1, Ordering::Release);
        }
        RequestKey {
            index,
            chunk: e.flag.0,
            at: e.flag.1,
            generation: e.generation,
        }
    }

    /// The entry of `slot`, while its handle names it.
    fn entry(&mut self, index: u32, generation: u64) -> Option<&mut Entry> {
        self.entries
            .get_mut(index as usize)
            .filter(|e| e.open && e.generation == generation)
    }

    /// Frees slot `index` if nothing holds it any more.
    #[inline(always)]
    fn free_if_unused(&mut self, index: u32) {
        let e = &mut self.entries[index as usize];
        if e.unused() {
            e.conn = None;
            self.free.push(index);
        }
    }

    /// The engine's id of a request not yet done.
    pub(crate) fn pending_id(&mut self, slot: &RequestKey) -> Option<RequestId> {
        self.entry(slot.index, slot.generation)
            .filter(|e| !e.finished)
            .and_then(|e| e.id)
    }

    /// The request the engine completes as `id` with `buf`, claimed for completion: its slot
    /// (once: the request is no longer pending, and a second claim finds nothing).
    #[inline(always)]
    pub(crate) fn claim(&mut self, buf: UserBufId, id: RequestId) -> Option<u32> {
        let index = self.slot(buf)?;
        let e = &mut self.entries[index as usize];
        if e.id != Some(id) {
            return None;
        }
        e.id = None;
        Some(index)
    }

    /// The buffer of the claimed request in slot `index` when it is plain memory, taken out
    /// (`None`: no buffer, or another kind, left where it is).
    #[inline(always)]
    pub(crate) fn take_plain(&mut self, index: u32) -> Option<Vec<u8>> {
        let e = &mut self.entries[index as usize];
        if !matches!(e.mem, Some(UserMem::Plain(_))) {
            return None;
        }
        let Some(UserMem::Plain(v)) = e.mem.take() else {
            return None;
        };
        self.buffers -= 1;
        Some(v)
    }

    /// The buffer `buf`.
    pub(crate) fn mem(&self, buf: UserBufId) -> Option<&UserMem> {
        self.entries[self.slot(buf)? as usize].mem.as_ref()
    }

    /// The buffer `buf`, to change.
    pub(crate) fn mem_mut(&mut self, buf: UserBufId) -> Option<&mut UserMem> {
        let index = self.slot(buf)?;
        self.entries[index as usize].mem.as_mut()
    }

    /// The buffer `buf` of a send, with the send's connection.
    pub(crate) fn send_mem(&mut self, buf: UserBufId) -> Option<(&Arc<Conn>, &mut UserMem)> {
        let index = self.slot(buf)?;
        let e = &mut self.entries[index as usize];
        Some((e.conn.as_ref()?, e.mem.as_mut()?))
    }

    /// Takes the buffer `buf` out (its slot is freed unless a handle still names it).
    #[inline(always)]
    pub(crate) fn take_mem(&mut self, buf: UserBufId) -> Option<UserMem> {
        let index = self.slot(buf)?;
        let mem = self.entries[index as usize].mem.take()?;
        self.buffers -= 1;
        self.free_if_unused(index);
        Some(mem)
    }

    /// Takes the connection of the send in slot `index` (`None` for a receive).
    #[inline(always)]
    pub(crate) fn take_conn(&mut self, index: u32) -> Option<Arc<Conn>> {
        self.entries.get_mut(index as usize)?.conn.take()
    }

    /// Completes the request in `index` with `outcome`. Returns the outcome back when the
    /// request's handle is gone (the caller drops it, outside the lock if it likes).
    #[inline(always)]
    pub(crate) fn finish(&mut self, index: u32, outcome: Outcome) -> Option<Outcome> {
        let e = self.entries.get_mut(index as usize)?;
        e.id = None;
        if !e.open {
            return Some(outcome);
        }
        if e.abandoned {
            e.open = false;
            self.free_if_unused(index);
            return Some(outcome);
        }
        e.outcome = outcome;
        e.finished = true;
        // (A release store, not the `xchg` of a sequentially consistent one, per
        // completion: under the state lock, which a sleeper registers under, so one of the
        // two sees the other (see `super::sleepers`). Callgrind, shared-memory receiver at
        // window 64: 7.2 -> 6.3 locked instructions per message.)
        if let Some(flag) = e.chunk.get(e.flag.1 as usize) {
            flag.store((e.generation << 1) | 1, Ordering::Release);
        }
        None
    }

    /// Takes a completed request's outcome and frees its slot (unless a READ still
    /// targets its buffer).
    #[inline(always)]
    pub(crate) fn take(&mut self, slot: &RequestKey) -> Option<Outcome> {
        let e = self.entry(slot.index, slot.generation)?;
        let outcome = e.take_outcome()?;
        e.open = false;
        self.free_if_unused(slot.index);
        Some(outcome)
    }

    /// Slots in use (requests whose handles or outcomes are still held, and buffers).
    #[cfg(test)]
    pub(crate) fn open_slots(&self) -> usize {
        self.entries.iter().filter(|e| !e.unused()).count()
    }

    /// Buffers the table holds.
    pub(crate) fn buffers(&self) -> usize {
        self.buffers
    }

    /// The handle of `slot` is gone: a completed request's slot is freed (its outcome
    /// returned to be dropped); a pending one is freed when it completes.
    pub(crate) fn abandon(&mut self, slot: &RequestKey) -> Option<Outcome> {
        let index = slot.index;
        let e = self.entry(index, slot.generation)?;
        match e.take_outcome() {
            Some(outcome) => {
                e.open = false;
                self.free_if_unused(index);
                Some(outcome)
            }
            None => {
                e.abandoned = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmx_proto::Status;

    fn outcome(len: u64) -> Outcome {
        Outcome {
            status: Status::Ok,
            kind: rdmx_proto::RequestKind::Recv,
            length: len,
            tag: 1,
            buf: vec![0; len as usize],
            conn: None,
        }
    }

    fn table() -> (RequestTable, Arc<DoneFlags>) {
        let flags = Arc::new(DoneFlags::default());
        (RequestTable::new(flags.clone()), flags)
    }

    /// A request made with a plain buffer of `len` bytes, as the worker makes one.
    fn open(t: &mut RequestTable, len: usize, id: u64) -> (RequestKey, UserBufId) {
        let buf = t.insert_buf(UserMem::Plain(vec![0; len]));
        (t.open(buf, RequestId(id), None), buf)
    }

    #[test]
    fn slots_complete_are_taken_and_reused_without_confusing_generations() {
        let (mut t, flags) = table();
        let done = |k: &RequestKey| k.is_done(&flags);
        let (a, abuf) = open(&mut t, 3, 10);
        let (b, _) = open(&mut t, 1, 11);
        assert_eq!(t.pending_id(&a), Some(RequestId(10)));
        assert_eq!(t.buffers(), 2);
        assert!(!done(&a));
        // Completed as the engine says: claimed once, by its buffer and id.
        assert_eq!(t.claim(abuf, RequestId(99)), None, "another request's id");
        let slot = t.claim(abuf, RequestId(10)).unwrap();
        assert_eq!(t.claim(abuf, RequestId(10)), None, "claimed once");
        assert_eq!(t.pending_id(&a), None);
        assert_eq!(t.take_plain(slot).unwrap().len(), 3);
        assert!(t.finish(slot, outcome(3)).is_none());
        assert!(done(&a) && !done(&b));
        assert_eq!(t.take(&a).unwrap().length, 3);
        assert!(t.take(&a).is_none());
        assert_eq!(t.buffers(), 1);
        // The slot is reused under a new generation: the old handle's view is not done,
        // and the old buffer id names nothing.
        let (c, cbuf) = open(&mut t, 2, 12);
        assert_eq!(c.index, a.index);
        assert_ne!(cbuf, abuf);
        assert!(t.mem(abuf).is_none() && t.mem(cbuf).is_some());
        assert!(!done(&c) && !done(&a));
        assert!(t.take(&a).is_none());
        // An abandoned pending request frees its slot when it completes.
        assert!(t.abandon(&b).is_none());
        assert!(t.finish(b.index, outcome(1)).is_some());
        // (Its buffer is still held: the slot waits for it.)
        assert_eq!(t.open_slots(), 2);
        assert!(t.take_mem(buf_id(b.index, b.generation)).is_some());
        assert_eq!(t.open_slots(), 1);
        let (d, _) = open(&mut t, 0, 13);
        assert_eq!(d.index, b.index);
        // An abandoned completed one at once.
        t.take_plain(d.index);
        t.finish(d.index, outcome(2));
        assert_eq!(t.abandon(&d).unwrap().length, 2);
        assert_eq!(t.free, vec![d.index]);
    }

    #[test]
    fn a_buffer_outlives_its_request_and_a_bare_buffer_frees_its_slot() {
        let (mut t, _) = table();
        // A buffer no request names (one the engine completed as it was made).
        let bare = t.insert_buf(UserMem::Plain(vec![7]));
        assert_eq!(t.open_slots(), 1);
        assert!(matches!(t.take_mem(bare), Some(UserMem::Plain(v)) if v == [7]));
        assert_eq!(t.open_slots(), 0);
        assert!(t.take_mem(bare).is_none());
        // A completed request whose buffer a READ still targets (an orphan): taking the
        // outcome keeps the slot until the buffer is taken.
        let (k, buf) = open(&mut t, 4, 20);
        let slot = t.claim(buf, RequestId(20)).unwrap();
        assert!(t.finish(slot, outcome(0)).is_none());
        assert!(t.take(&k).is_some());
        assert_eq!(t.open_slots(), 1);
        assert!(t.mem(buf).is_some());
        let reused = t.insert_buf(UserMem::Plain(Vec::new()));
        assert_ne!(reused.0 as u32, slot, "a held buffer's slot is not reused");
        assert!(t.take_mem(buf).is_some());
        assert_eq!(t.buffers(), 1);
    }

    #[test]
    fn many_slots_span_chunks() {
        let (mut t, flags) = table();
        let slots: Vec<RequestKey> = (0..1000).map(|i| open(&mut t, 0, i + 1).0).collect();
        for s in slots.iter().step_by(3) {
            t.finish(s.index, outcome(0));
        }
        for (i, s) in slots.iter().enumerate() {
            assert_eq!(s.is_done(&flags), i % 3 == 0);
        }
    }

    #[test]
    fn every_slot_index_has_one_place() {
        // Chunk k starts at 64 * (2^k - 1) and holds 64 << k flags.
        assert_eq!(DoneFlags::place(0), (0, 0));
        assert_eq!(DoneFlags::place(63), (0, 63));
        assert_eq!(DoneFlags::place(64), (1, 0));
        assert_eq!(DoneFlags::place(191), (1, 127));
        assert_eq!(DoneFlags::place(192), (2, 0));
        let (k, at) = DoneFlags::place(u32::MAX);
        assert!(k < CHUNKS && at < FIRST_CHUNK << k);
        for i in (0..100_000u32).chain(u32::MAX - 1000..=u32::MAX) {
            let (k, at) = DoneFlags::place(i);
            assert_eq!(FIRST_CHUNK * ((1 << k) - 1) + at, i as usize);
            assert!(at < FIRST_CHUNK << k);
        }
        // A slot whose chunk was never made is not done (and has no flag).
        assert!(DoneFlags::default().get(DoneFlags::place(5000)).is_none());
    }
}
