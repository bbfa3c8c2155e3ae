//! The worker's modes a configuration picks: how it waits ([`WaitMode`]) and how a
//! rendezvous's memory is registered ([`RndvRegistration`]).

use std::fmt;

/// How a worker waits for work when a caller blocks (in [`crate::Request::wait`],
/// [`crate::Worker::wait`] or a blocking helper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitMode {
    /// Spin on the completion queue: lowest latency, one core busy while waiting.
    BusyPoll,
    /// Sleep on the completion channel (`ibv_req_notify_cq` / `ibv_get_cq_event` /
    /// `ibv_ack_cq_events`), the worker's rdmacm event channel and its connections' sockets:
    /// ~0 % CPU while idle.
    Event,
}

impl WaitMode {
    pub(super) fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "poll" | "busy" | "busy-poll" | "busypoll" | "spin" => Some(WaitMode::BusyPoll),
            "event" | "events" | "sleep" => Some(WaitMode::Event),
            _ => None,
        }
    }
}

impl fmt::Display for WaitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            WaitMode::BusyPoll => "poll",
            WaitMode::Event => "event",
        })
    }
}

/// How the memory of a rendezvous message (above the eager threshold) is made accessible to
/// the NIC. Chosen by measurement; see the crate documentation, "Memory registration".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RndvRegistration {
    /// Register the user's own buffer for this one operation (`ibv_reg_mr` when the
    /// rendezvous starts, `ibv_dereg_mr` when it ends): zero-copy, and the peer's rkey
    /// stops working the moment the operation is over.
    PerOperation,
    /// Copy through regions taken from a registration cache owned by the worker (registered
    /// once, reused): no registration on the data path, one memcpy per side. Sends are
    /// exposed through a memory window over the staged message, dead once the operation is
    /// over; on a device without windows, sends are registered per operation instead.
    Cache,
    /// The cache below [`RndvRegistration::AUTO_CACHE_BELOW`] bytes, per-operation
    /// registration from there up: where two copies cost less than a registration and a
    /// deregistration, and where they cost more (measured with `examples/rndv_reg.rs`).
    Auto,
}

impl RndvRegistration {
    /// Under [`RndvRegistration::Auto`], buffers smaller than this go through the cache.
    pub const AUTO_CACHE_BELOW: usize = 64 * 1024;

    /// The mode used for a buffer of `len` bytes.
    pub(crate) fn for_len(self, len: usize) -> RndvRegistration {
        match self {
            RndvRegistration::Auto if len < Self::AUTO_CACHE_BELOW => RndvRegistration::Cache,
            RndvRegistration::Auto => RndvRegistration::PerOperation,
            other => other,
        }
    }
}

impl RndvRegistration {
    pub(super) fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "per-op" | "perop" | "per-operation" | "direct" => Some(RndvRegistration::PerOperation),
            "cache" | "rcache" => Some(RndvRegistration::Cache),
            "auto" => Some(RndvRegistration::Auto),
            _ => None,
        }
    }
}

impl fmt::Display for RndvRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            RndvRegistration::PerOperation => "per-op",
            RndvRegistration::Cache => "cache",
            RndvRegistration::Auto => "auto",
        })
    }
}
