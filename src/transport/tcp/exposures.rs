//! The TCP transport's rendezvous: what stands in for RDMA READ over a byte stream.
//!
//! A sender exposes a rendezvous buffer under a fresh random key (from a CSPRNG seeded by the
//! OS, so one key tells nothing about another), bound to the one connection its RTS went out
//! on; addresses are offsets into the buffer. The receiver's READ request names the key, and
//! the sender's link answers it as progress reads it, by streaming straight from the buffer
//! (the link holds clones of its `Arc` while writing, no staging copy). A request naming a key
//! exposed to another connection is a protocol error for the connection that sent it; an
//! unknown key (e.g. of a send cancelled meanwhile) or a range past the buffer is answered
//! with a failure. The receiver's side — a destination buffer lent to its link, READ data
//! written straight into it — lives in `rdmx-tcp`'s link (see [`super::TcpLink`]).

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;
use rdmx_proto::{ConnId, RemoteBuf};
use rustc_hash::FxHashMap as HashMap;

use crate::usermem::UserMem;

/// The buffers exposed to READ requests, by key.
pub(crate) struct Exposures {
    by_key: HashMap<u32, Exposure>,
    keys: StdRng,
}

struct Exposure {
    conn: ConnId,
    data: Arc<Vec<u8>>,
}

/// How to answer a READ request.
pub(crate) enum Answer {
    /// Stream `len` bytes of `data` from `offset`.
    Data {
        data: Arc<Vec<u8>>,
        offset: usize,
        len: usize,
    },
    /// Nothing exposed under the key, or not that range: answer with a failure.
    Refused,
    /// The key is exposed to another connection: a protocol error for the asking one.
    OtherEndpoint,
}

impl Exposures {
    pub(crate) fn new() -> Self {
        Exposures {
            by_key: HashMap::default(),
            keys: rand::make_rng(),
        }
    }

    /// Exposes the plain or shared buffer `mem` to READ requests arriving on `conn`; `mem` becomes
    /// [`UserMem::Exposed`] under a fresh key until [`Exposures::withdraw`].
    pub(crate) fn expose(&mut self, conn: ConnId, mem: &mut UserMem) -> Result<RemoteBuf, String> {
        let (data, shared) = match std::mem::replace(mem, UserMem::Lost) {
            UserMem::Plain(vec) => (Arc::new(vec), false),
            UserMem::Shared(data) => (data, true),
            other => {
                *mem = other;
                return Err("the send buffer is already exposed".into());
            }
        };
        let key = loop {
            let k = self.keys.next_u32();
            if k != 0 && !self.by_key.contains_key(&k) {
                break k;
            }
        };
        *mem = UserMem::Exposed {
            data: data.clone(),
            key,
            shared,
        };
        self.by_key.insert(key, Exposure { conn, data });
        Ok(RemoteBuf { addr: 0, rkey: key })
    }

    /// Ends the exposure under `key`: later READ requests for it are refused.
    pub(crate) fn withdraw(&mut self, key: u32) {
        self.by_key.remove(&key);
    }

    /// [`Exposures::answer`] for a request naming an address of the buffer in this process
    /// rather than an offset into it (shared memory's, whose READs are by CMA where allowed).
    pub(crate) fn answer_at_address(&self, conn: ConnId, addr: u64, key: u32, len: u64) -> Answer {
        let Some(e) = self.by_key.get(&key) else {
            return Answer::Refused;
        };
        match addr.checked_sub(e.data.as_ptr() as u64) {
            Some(offset) => self.answer(conn, offset, key, len),
            None => Answer::Refused,
        }
    }

    /// How to answer a READ request that arrived on `conn` for `len` bytes at `addr` under
    /// `key`.
    pub(crate) fn answer(&self, conn: ConnId, addr: u64, key: u32, len: u64) -> Answer {
        let Some(e) = self.by_key.get(&key) else {
            return Answer::Refused;
        };
        if e.conn != conn {
            return Answer::OtherEndpoint;
        }
        match addr.checked_add(len) {
            Some(end) if end <= e.data.len() as u64 => Answer::Data {
                data: e.data.clone(),
                offset: addr as usize,
                len: len as usize,
            },
            _ => Answer::Refused,
        }
    }
}
