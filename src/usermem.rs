//! User buffers held by a worker while a request runs, and the registration cache.
//!
//! A user buffer (`Vec<u8>`) is moved into the worker by `tag_send` / `tag_recv` and moved
//! back out by the request's completion. While it is inside, it may be registered for the NIC
//! — in place ([`RndvRegistration::PerOperation`]) or staged through a cached region
//! ([`RndvRegistration::Cache`]) — and split into pieces so that several RDMA READs can write
//! disjoint ranges at once: each posted READ owns its piece until its completion returns it.

#[cfg(feature = "rdma")]
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::transport::ReadPiece;

#[cfg(feature = "rdma")]
use rdmx_conn::{Access, ProtectionDomain, RegisteredBuf, SharedBuf};

#[cfg(feature = "rdma")]
use crate::config::RndvRegistration;
#[cfg(feature = "rdma")]
use crate::transport::rdma::RegCache;

/// Pieces of one registered region, keyed by their offset in the user's buffer.
#[cfg(feature = "rdma")]
#[derive(Default)]
pub(crate) struct Pieces {
    map: BTreeMap<u64, RegisteredBuf>,
    in_flight: usize,
    /// Pieces that went with a destroyed connection: the buffer can never be whole again.
    lost: usize,
}

#[cfg(feature = "rdma")]
impl Pieces {
    fn whole(buf: RegisteredBuf) -> Self {
        let mut map = BTreeMap::new();
        map.insert(0, buf);
        Pieces {
            map,
            in_flight: 0,
            lost: 0,
        }
    }

    /// Takes `[off, off + len)` out, splitting the piece that holds it.
    fn take(&mut self, off: u64, len: u64) -> Option<RegisteredBuf> {
        let (&start, _) = self.map.range(..=off).next_back()?;
        let piece_len = self.map[&start].len() as u64;
        if off + len > start + piece_len || len == 0 {
            return None;
        }
        let mut head = self.map.remove(&start)?;
        let mut mid = head.split_off((off - start) as usize);
        if off > start {
            self.map.insert(start, head);
        }
        if (mid.len() as u64) > len {
            let tail = mid.split_off(len as usize);
            self.map.insert(off + len, tail);
        }
        self.in_flight += 1;
        Some(mid)
    }

    fn put_back(&mut self, off: u64, buf: RegisteredBuf) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.map.insert(off, buf);
    }

    /// Joins every piece back into one buffer; `None` while a piece is still out or lost.
    fn merge(mut self) -> Result<RegisteredBuf, Self> {
        if self.in_flight > 0 || self.lost > 0 || self.map.is_empty() {
            return Err(self);
        }
        let mut iter = std::mem::take(&mut self.map).into_iter();
        let (_, mut first) = iter.next().expect("not empty");
        for (off, next) in iter {
            if let Err(next) = first.unsplit(next) {
                // Not adjacent: cannot happen for pieces of one region; keep them apart.
                self.map.insert(0, first);
                self.map.insert(off, next);
                return Err(self);
            }
        }
        Ok(first)
    }

    fn write_at(&mut self, off: u64, data: &[u8]) -> bool {
        let Some((&start, piece)) = self.map.range_mut(..=off).next_back() else {
            return false;
        };
        let at = (off - start) as usize;
        match piece.get_mut(at..at + data.len()) {
            Some(dst) => {
                dst.copy_from_slice(data);
                true
            }
            None => false,
        }
    }

    fn read(&self, len: usize) -> Option<&[u8]> {
        self.map.get(&0).and_then(|p| p.get(..len))
    }
}

/// What a send sends: the user's own buffer, given back by the completion, or a shared one,
/// of which the user keeps clones (the completion's buffer is then empty).
pub(crate) enum SendData {
    Owned(Vec<u8>),
    Shared(Arc<Vec<u8>>),
}

impl SendData {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            SendData::Owned(v) => v,
            SendData::Shared(d) => d,
        }
    }

    /// The buffer as the worker holds it while the send runs.
    pub(crate) fn into_mem(self) -> UserMem {
        match self {
            SendData::Owned(v) => UserMem::Plain(v),
            SendData::Shared(d) => UserMem::Shared(d),
        }
    }

    /// What the completion gives back.
    pub(crate) fn into_returned(self) -> Vec<u8> {
        match self {
            SendData::Owned(v) => v,
            SendData::Shared(_) => Vec::new(),
        }
    }
}

/// A user buffer staged through a region of the registration cache; `copy_back` for
/// receives (whose buffer is always owned).
#[cfg(feature = "rdma")]
pub(crate) struct Staged {
    held: SendData,
    region: Pieces,
    copy_back: bool,
}

/// A user buffer inside the worker.
pub(crate) enum UserMem {
    /// Not registered: eager messages are copied in and out.
    Plain(Vec<u8>),
    /// A send's shared buffer (`Ep::tag_send_shared`), not registered: only ever read.
    Shared(Arc<Vec<u8>>),
    /// A shared send buffer registered in place for the NIC to read.
    #[cfg(feature = "rdma")]
    SharedDirect(SharedBuf),
    /// Registered in place for this operation. (Boxed, as is `Staged`: rendezvous buffers
    /// are few, and every buffer's slot in the worker's table is as large as the largest
    /// kind.)
    #[cfg(feature = "rdma")]
    Direct(Box<Pieces>),
    /// Staged through a region of the registration cache.
    #[cfg(feature = "rdma")]
    Staged(Box<Staged>),
    /// The memory could not be taken back from the NIC (a READ never reported); the worker
    /// keeps it until the connection is destroyed.
    Lost,
    /// TCP: a send buffer exposed for READ requests under exposure `key`; the link streams
    /// from it without copying (it holds clones of the `Arc` while writing). `shared`: it was
    /// [`UserMem::Shared`] (and goes back to that), not plain.
    Exposed {
        data: Arc<Vec<u8>>,
        key: u32,
        shared: bool,
    },
    /// TCP: lent to a link as the destination of READ data; it comes back when no READ
    /// into it is left.
    Lent,
}

impl UserMem {
    /// Copies `data` into the buffer at `off` (eager receive). False when out of range.
    pub(crate) fn write_at(&mut self, off: u64, data: &[u8]) -> bool {
        match self {
            UserMem::Plain(v) => write_into(v, off, data),
            #[cfg(feature = "rdma")]
            UserMem::Staged(s) => match &mut s.held {
                SendData::Owned(v) => write_into(v, off, data),
                SendData::Shared(_) => false,
            },
            #[cfg(feature = "rdma")]
            UserMem::Direct(p) => p.write_at(off, data),
            #[cfg(feature = "rdma")]
            UserMem::SharedDirect(_) => false,
            UserMem::Shared(_) | UserMem::Lost | UserMem::Lent | UserMem::Exposed { .. } => false,
        }
    }
}

/// Copies `data` into `v` at `off`; false when out of range.
fn write_into(v: &mut [u8], off: u64, data: &[u8]) -> bool {
    let off = off as usize;
    match v.get_mut(off..off.saturating_add(data.len())) {
        Some(dst) => {
            dst.copy_from_slice(data);
            true
        }
        None => false,
    }
}

impl UserMem {
    /// The first `len` bytes (eager send payload).
    pub(crate) fn head(&self, len: usize) -> Option<&[u8]> {
        match self {
            UserMem::Plain(v) => v.get(..len),
            #[cfg(feature = "rdma")]
            UserMem::Staged(s) => s.held.bytes().get(..len),
            #[cfg(feature = "rdma")]
            UserMem::Direct(p) => p.read(len),
            #[cfg(feature = "rdma")]
            UserMem::SharedDirect(b) => b.get(..len),
            UserMem::Shared(data) | UserMem::Exposed { data, .. } => data.get(..len),
            UserMem::Lost | UserMem::Lent => None,
        }
    }

    #[cfg(feature = "rdma")]
    /// Makes the buffer NIC-accessible with `access` (a no-op when it already is).
    /// `min_len` is how much of it the NIC needs (the message length for sends, the
    /// capacity for receives).
    pub(crate) fn register(
        &mut self,
        mode: RndvRegistration,
        pd: &ProtectionDomain,
        cache: &mut RegCache,
        access: Access,
        copy_back: bool,
    ) -> Result<(), String> {
        let held = match std::mem::replace(self, UserMem::Lost) {
            UserMem::Plain(v) => SendData::Owned(v),
            UserMem::Shared(d) => SendData::Shared(d),
            other => {
                *self = other;
                return Ok(());
            }
        };
        let len = held.bytes().len();
        match (mode.for_len(len), held) {
            (RndvRegistration::PerOperation | RndvRegistration::Auto, SendData::Owned(vec)) => {
                match pd.register_vec(vec, access) {
                    Ok(buf) => {
                        *self = UserMem::Direct(Box::new(Pieces::whole(buf)));
                        Ok(())
                    }
                    Err((e, vec)) => {
                        *self = UserMem::Plain(vec);
                        Err(e.to_string())
                    }
                }
            }
            (RndvRegistration::PerOperation | RndvRegistration::Auto, SendData::Shared(d)) => {
                match pd.register_shared(d, access) {
                    Ok(buf) => {
                        *self = UserMem::SharedDirect(buf);
                        Ok(())
                    }
                    Err((e, d)) => {
                        *self = UserMem::Shared(d);
                        Err(e.to_string())
                    }
                }
            }
            (RndvRegistration::Cache, held) => match cache.take(pd, len, access) {
                Ok(mut region) => {
                    if !copy_back {
                        region[..len].copy_from_slice(held.bytes());
                    }
                    *self = UserMem::Staged(Box::new(Staged {
                        held,
                        region: Pieces::whole(region),
                        copy_back,
                    }));
                    Ok(())
                }
                Err(e) => {
                    *self = held.into_mem();
                    Err(e.to_string())
                }
            },
        }
    }

    #[cfg(feature = "rdma")]
    /// The registered buffer's address and rkey, for an RTS.
    pub(crate) fn remote(&self) -> Option<rdmx_conn::RemoteBuf> {
        match self {
            UserMem::SharedDirect(b) => b.remote(),
            _ => self.registered().and_then(|b| b.remote()),
        }
    }

    #[cfg(feature = "rdma")]
    /// The registered shared buffer, for a memory window over it.
    pub(crate) fn registered_shared(&self) -> Option<&SharedBuf> {
        match self {
            UserMem::SharedDirect(b) => Some(b),
            _ => None,
        }
    }

    #[cfg(feature = "rdma")]
    /// The registered memory (its first piece, the whole of it unless READs split it).
    pub(crate) fn registered(&self) -> Option<&RegisteredBuf> {
        self.pieces()?.map.get(&0)
    }

    #[cfg(feature = "rdma")]
    /// Takes the registered range `[off, off + len)` out for a READ into it.
    pub(crate) fn take_range(&mut self, off: u64, len: u64) -> Option<RegisteredBuf> {
        self.pieces_mut()?.take(off, len)
    }

    /// Writes off a range taken by [`UserMem::take_range`] that will never come back (its
    /// connection was destroyed with the READ posted): the buffer is no longer in flight for
    /// it, and can only be dropped.
    pub(crate) fn lose_piece(&mut self) {
        #[cfg(feature = "rdma")]
        if let Some(p) = self.pieces_mut() {
            if p.in_flight > 0 {
                p.in_flight -= 1;
                p.lost += 1;
            }
        }
    }

    /// Gives back a range taken by [`UserMem::take_range`].
    pub(crate) fn put_back(&mut self, off: u64, piece: ReadPiece) {
        #[cfg(feature = "rdma")]
        match self.pieces_mut() {
            Some(p) => p.put_back(off, piece),
            None => drop(piece),
        }
        #[cfg(not(feature = "rdma"))]
        match piece {}
    }

    /// Ends the registration (deregisters, or returns the region to the cache), keeping the
    /// buffer as plain memory. `length` bytes are copied back from a staged receive.
    #[cfg(feature = "rdma")]
    pub(crate) fn unregister(&mut self, cache: &mut RegCache, length: u64) {
        if let UserMem::Plain(_) | UserMem::Shared(_) = self {
            return;
        }
        match std::mem::replace(self, UserMem::Lost) {
            UserMem::SharedDirect(b) => match b.into_shared() {
                Ok(data) => *self = UserMem::Shared(data),
                Err(b) => {
                    log::error!("a registered shared send buffer is still in use; keeping it");
                    *self = UserMem::SharedDirect(b);
                }
            },
            UserMem::Direct(p) => match p.merge() {
                Ok(buf) => match buf.into_vec() {
                    Ok(v) => *self = UserMem::Plain(v),
                    Err(buf) => {
                        log::error!("a registered user buffer is still shared; keeping it");
                        *self = UserMem::Direct(Box::new(Pieces::whole(buf)));
                    }
                },
                Err(p) => *self = UserMem::Direct(Box::new(p)),
            },
            UserMem::Staged(staged) => {
                let Staged {
                    mut held,
                    region,
                    copy_back,
                } = *staged;
                match region.merge() {
                    Ok(mut region) => {
                        match &mut held {
                            SendData::Owned(vec) if copy_back => {
                                let n = (length as usize).min(vec.len());
                                vec[..n].copy_from_slice(&region[..n]);
                            }
                            // A send-staging region goes back wiped: what a peer may later read
                            // through it (a window exposes its message, and on some providers
                            // the region around it) never includes a message sent to someone
                            // else.
                            held => region[..held.bytes().len()].fill(0),
                        }
                        cache.give(region);
                        *self = held.into_mem();
                    }
                    Err(region) => {
                        *self = UserMem::Staged(Box::new(Staged {
                            held,
                            region,
                            copy_back,
                        }))
                    }
                }
            }
            other => {
                *self = other;
                self.unexpose();
            }
        }
    }

    /// Takes a TCP-exposed send buffer back as plain memory.
    pub(crate) fn unexpose(&mut self) {
        if let UserMem::Exposed { .. } = self {
            if let UserMem::Exposed { data, shared, .. } = std::mem::replace(self, UserMem::Lost) {
                *self = if shared {
                    UserMem::Shared(data)
                } else {
                    // A READ answer still being written holds a clone: the user gets a copy.
                    UserMem::Plain(Arc::try_unwrap(data).unwrap_or_else(|d| (*d).clone()))
                };
            }
        }
    }

    /// The exposure key of a TCP-exposed send buffer.
    pub(crate) fn exposure_key(&self) -> Option<u32> {
        match self {
            UserMem::Exposed { key, .. } => Some(*key),
            _ => None,
        }
    }

    /// The buffer for the user, if it is free of the NIC (call [`UserMem::unregister`] first):
    /// an empty one for a shared buffer (the user holds it already).
    pub(crate) fn into_vec(self) -> Option<Vec<u8>> {
        match self {
            UserMem::Plain(v) => Some(v),
            UserMem::Shared(_) => Some(Vec::new()),
            _ => None,
        }
    }

    /// The registered pieces, if the buffer is registered (in place or staged).
    #[cfg(feature = "rdma")]
    fn pieces(&self) -> Option<&Pieces> {
        match self {
            UserMem::Direct(p) => Some(p),
            UserMem::Staged(s) => Some(&s.region),
            _ => None,
        }
    }

    /// [`UserMem::pieces`], to change them.
    #[cfg(feature = "rdma")]
    fn pieces_mut(&mut self) -> Option<&mut Pieces> {
        match self {
            UserMem::Direct(p) => Some(p),
            UserMem::Staged(s) => Some(&mut s.region),
            _ => None,
        }
    }

    /// Whether pieces are still posted.
    pub(crate) fn in_flight(&self) -> bool {
        #[cfg(feature = "rdma")]
        if let Some(p) = self.pieces() {
            return p.in_flight > 0;
        }
        matches!(self, UserMem::Lent)
    }
}
