//! Credits: the worker-wide pool of receive buffers that every connection's window is
//! granted from. A connection starts with a window offered from what the pool has free (a
//! 128th of it, between `Config::initial_credits` and `Config::credits`); a
//! sender that ran out of credits says so on its next frame ([`FLAG_CREDIT_WANTED`]), and
//! the receiver doubles that peer's window (up to `Config::credits`) while the pool has
//! buffers to spare. When a request finds the pool empty, windows above the initial grant
//! are halved as their credits come back, so the buffers go where the traffic is. Nothing
//! is reserved per connection beyond the initial grant, and no connection is refused.
//!
//! [`FLAG_CREDIT_WANTED`]: crate::wire::FLAG_CREDIT_WANTED

/// What the credit pool did so far, for inspection ([`super::Engine::credit_stats`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CreditStats {
    /// Receive buffers in the pool (the SRQ depth).
    pub pool: u64,
    /// Credits granted to peers now, over all connections (may exceed `pool` once initial
    /// grants overcommit it: past `pool / initial_credits` connections).
    pub granted: u64,
    /// Credits granted on demand, beyond initial grants, so far.
    pub grown: u64,
    /// Requests for credits the pool could not serve.
    pub refused: u64,
    /// Credits taken back from windows so far, to serve other connections.
    pub reclaimed: u64,
}

/// The pool and its bookkeeping.
#[derive(Debug)]
pub(super) struct CreditPool {
    initial: u32,
    max: u32,
    /// Set when a request was refused; cleared once a window gave credits back.
    wanted: bool,
    stats: CreditStats,
}

impl CreditPool {
    pub(super) fn new(pool: u32, initial: u16, max: u16) -> Self {
        CreditPool {
            initial: initial.into(),
            max: max.into(),
            wanted: false,
            stats: CreditStats {
                pool: pool.into(),
                ..CreditStats::default()
            },
        }
    }

    pub(super) fn stats(&self) -> CreditStats {
        self.stats
    }

    /// What to grant a new connection now: a 128th of the free pool, within
    /// `initial..=max` — the first connections get large windows, later ones less, down to
    /// the initial grant once the pool is short (with the defaults, 4096 buffers, windows
    /// of 4..=64: 32 credits for the first connection, and the initial grants of about 390
    /// connections fit the pool).
    pub(super) fn offer(&self) -> u16 {
        let free = self.stats.pool.saturating_sub(self.stats.granted);
        (free / 128).clamp(self.initial.into(), self.max.into()) as u16
    }

    /// A new connection's window: `grant` (what its handshake offered; never refused).
    pub(super) fn admit(&mut self, grant: u16) -> u32 {
        let grant = u32::from(grant).clamp(self.initial, self.max);
        self.stats.granted += u64::from(grant);
        if self.stats.granted > self.stats.pool {
            log::debug!(
                "{} credits granted over a pool of {}: RNR retry is the backstop",
                self.stats.granted,
                self.stats.pool
            );
        }
        grant
    }

    /// Receive buffers run low: shrink windows as if a request had been refused.
    pub(super) fn pressure(&mut self) {
        self.wanted = true;
    }

    /// A connection is gone: its window returns to the pool.
    pub(super) fn release(&mut self, window: u32) {
        self.stats.granted = self.stats.granted.saturating_sub(window.into());
    }

    /// A peer asked for more credits: how many to add to its `window` (doubling it, up to
    /// the largest window, as far as the pool allows; 0 if it cannot).
    pub(super) fn grow(&mut self, window: u32) -> u32 {
        if window >= self.max {
            return 0;
        }
        let free = self.stats.pool.saturating_sub(self.stats.granted);
        let add = u64::from(window.min(self.max - window)).min(free) as u32;
        if add == 0 {
            self.wanted = true;
            self.stats.refused += 1;
        } else {
            self.stats.granted += u64::from(add);
            self.stats.grown += u64::from(add);
        }
        add
    }

    /// Credits `owed` to a peer are about to be returned: how many of them to keep back
    /// instead, shrinking its `window` — while another connection's request went unserved
    /// or the pool is overcommitted, a window above the initial grant is halved.
    #[inline]
    pub(super) fn reclaim(&mut self, window: u32, owed: u32) -> u32 {
        if window <= self.initial || !(self.wanted || self.stats.granted > self.stats.pool) {
            return 0;
        }
        let target = self.initial.max(window / 2);
        let take = owed.min(window - target);
        if take > 0 {
            self.stats.granted -= u64::from(take);
            self.stats.reclaimed += u64::from(take);
            self.wanted = false;
        }
        take
    }
}
