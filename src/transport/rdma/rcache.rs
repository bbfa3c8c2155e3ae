//! The registration cache: registered regions that stage rendezvous buffers, kept for reuse.

use std::collections::BTreeMap;

use rdmx_conn::{Access, ProtectionDomain, RegisteredBuf};

/// Registered regions kept for reuse, by power-of-two size class (64 KiB and up).
///
/// Regions are allocated and registered by the worker (never user memory), with local write
/// and remote read, and stay registered while cached. At most `limit` bytes are kept; a
/// region given back beyond that is deregistered.
pub(crate) struct RegCache {
    /// Free regions by access and size class.
    classes: BTreeMap<(Access, usize), Vec<RegisteredBuf>>,
    cached: u64,
    limit: u64,
    /// Regions registered over the cache's life (for statistics).
    pub(crate) registrations: u64,
}

const MIN_CLASS: usize = 64 * 1024;

impl RegCache {
    pub(crate) fn new(limit: u64) -> Self {
        RegCache {
            classes: BTreeMap::new(),
            cached: 0,
            limit,
            registrations: 0,
        }
    }

    fn class(len: usize) -> usize {
        len.max(MIN_CLASS).next_power_of_two()
    }

    /// A region of at least `len` bytes with exactly `access`: send staging regions are
    /// remotely readable and never written by the NIC, receive staging regions are written
    /// by the NIC and never remotely readable, so the two are never mixed.
    pub(crate) fn take(
        &mut self,
        pd: &ProtectionDomain,
        len: usize,
        access: Access,
    ) -> Result<RegisteredBuf, rdmx_conn::Error> {
        let class = Self::class(len);
        let key = (access, class);
        if let Some(buf) = self.classes.get_mut(&key).and_then(Vec::pop) {
            self.cached -= class as u64;
            return Ok(buf);
        }
        self.registrations += 1;
        pd.register(class, access)
    }

    pub(crate) fn give(&mut self, buf: RegisteredBuf) {
        let class = buf.len();
        if !class.is_power_of_two() || self.cached + class as u64 > self.limit {
            return; // dropped: deregistered
        }
        let access = buf.access();
        self.cached += class as u64;
        self.classes.entry((access, class)).or_default().push(buf);
    }

    /// Bytes currently cached.
    pub(crate) fn cached_bytes(&self) -> u64 {
        self.cached
    }
}
