//! Engine configuration, with `RDMX_EAGER_THRESHOLD` parsing.

use crate::error::Unit;
use crate::wire::{HEADER_LEN, MAX_CTRL_FRAME, MAX_RECV_BUF_SIZE};
use crate::Error;

/// Environment variable holding the eager/rendezvous threshold in bytes.
pub const EAGER_THRESHOLD_VAR: &str = "RDMX_EAGER_THRESHOLD";
/// Largest accepted eager threshold (1 MiB).
pub const MAX_EAGER_THRESHOLD: u64 = 1 << 20;
/// Default receive (SRQ) buffer size: 8 KiB.
pub const DEFAULT_RECV_BUF_SIZE: u32 = 8192;
/// Default eager threshold: the largest payload that fits a default receive buffer
/// together with the header (8192 − 40 = 8152 bytes).
pub const DEFAULT_EAGER_THRESHOLD: u64 = DEFAULT_RECV_BUF_SIZE as u64 - HEADER_LEN as u64;
/// Smallest allowed per-connection credit count (the flow-control scheme needs ≥ 4).
pub const MIN_CREDITS: u16 = 4;
/// Default initial grant per connection: small, so that 1024 connections take no more
/// than the default 4096-buffer pool up front.
pub const DEFAULT_INITIAL_CREDITS: u16 = MIN_CREDITS;

/// Engine configuration. Build with [`Config::builder`] or [`ConfigBuilder::from_env`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Largest payload (bytes) sent eagerly; larger messages use rendezvous. The value
    /// actually used per connection is also capped by the peer's receive buffer size.
    pub eager_threshold: u64,
    /// Size of each local SRQ receive buffer (advertised to peers in the handshake).
    pub recv_buf_size: u32,
    /// Number of receive buffers in the local SRQ, shared by all connections: the pool
    /// that connections' credit windows are granted from.
    pub srq_depth: u32,
    /// The largest window (frames in flight) one peer is granted: a connection starts
    /// with `initial_credits` and grows on demand, while the pool has buffers to spare.
    pub credits: u16,
    /// Credits granted to each peer at connect. No connection is refused: past
    /// `srq_depth / initial_credits` connections, initial grants overcommit the pool and
    /// RC's RNR retry (TCP: the socket's own flow control) is the backstop.
    pub initial_credits: u16,
    /// Largest single RDMA READ issued by the rendezvous receiver.
    pub rndv_chunk_size: u64,
    /// Maximum RDMA READs outstanding per rendezvous receive.
    pub max_reads_in_flight: u32,
    /// How long (ns) a failed connection's in-flight READs may take to be reported before
    /// the requests that issued them are completed anyway.
    pub drain_timeout_ns: u64,
    /// The unexpected-message budget: bytes the engine holds for messages no receive
    /// matched yet (an eager message's payload, plus [`UNEXPECTED_ENTRY_COST`] for each
    /// message, rendezvous ones included). Past it, the credit of each frame that arrives
    /// unexpected is withheld, so that its sender waits on credit instead of the queue
    /// growing; the withheld credits go back once receives bring the total back within it
    /// (see the `Engine` docs, "Flow control").
    pub max_unexpected: u64,
    /// How long (ns) a rendezvous send waits for the receiver's ATS after its RTS went
    /// out before it completes with [`Status::TimedOut`](crate::Status::TimedOut) and its
    /// exposure is released; 0: for ever (the default, as in UCP).
    pub rndv_timeout_ns: u64,
}

/// What one unexpected message costs against [`Config::max_unexpected`] besides its
/// payload: about the size of its queue entry, so that a flood of empty messages or RTS
/// frames is bounded too.
pub const UNEXPECTED_ENTRY_COST: u64 = 64;
/// Default unexpected-message budget: 64 MiB.
pub const DEFAULT_MAX_UNEXPECTED: u64 = 64 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            eager_threshold: DEFAULT_EAGER_THRESHOLD,
            recv_buf_size: DEFAULT_RECV_BUF_SIZE,
            srq_depth: 4096,
            credits: 64,
            initial_credits: DEFAULT_INITIAL_CREDITS,
            rndv_chunk_size: 256 * 1024,
            max_reads_in_flight: 4,
            drain_timeout_ns: 1_000_000_000,
            max_unexpected: DEFAULT_MAX_UNEXPECTED,
            rndv_timeout_ns: 0,
        }
    }
}

impl Config {
    /// A builder starting from the defaults (the environment is not read).
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder {
            cfg: Config::default(),
        }
    }
}

/// Builder for [`Config`]; programmatic setters override values read from the environment.
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    cfg: Config,
}

fn invalid(var: &'static str, value: &str, reason: impl Into<String>, min: u64, max: u64) -> Error {
    Error::InvalidConfig {
        var,
        value: value.to_string(),
        reason: reason.into(),
        min,
        max,
        unit: Unit::Bytes,
    }
}

/// Parses a byte size: a decimal integer with an optional `k`, `K`, `KiB`, `m`, `M` or
/// `MiB` suffix (binary multiples), checked against `min..=max`.
pub fn parse_size(var: &'static str, value: &str, min: u64, max: u64) -> Result<u64, Error> {
    let t = value.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return Err(invalid(var, value, "not a number", min, max));
    }
    let mult: u64 = match suffix {
        "" => 1,
        "k" | "K" | "KiB" => 1024,
        "m" | "M" | "MiB" => 1024 * 1024,
        _ => {
            return Err(invalid(
                var,
                value,
                format!("unknown suffix {suffix:?}"),
                min,
                max,
            ))
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| invalid(var, value, "number too large", min, max))?;
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| invalid(var, value, "number too large", min, max))?;
    if v < min || v > max {
        return Err(invalid(var, value, "out of range", min, max));
    }
    Ok(v)
}

impl ConfigBuilder {
    /// Defaults overridden by the process environment (`RDMX_EAGER_THRESHOLD`).
    pub fn from_env() -> Result<Self, Error> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Defaults overridden by variables found through `lookup` (testable without touching
    /// the process environment). An unset variable keeps the default; a set but invalid
    /// one is an error naming the variable, the value and the allowed range.
    pub fn from_lookup<F: Fn(&str) -> Option<String>>(lookup: F) -> Result<Self, Error> {
        let mut b = Config::builder();
        if let Some(v) = lookup(EAGER_THRESHOLD_VAR) {
            b.cfg.eager_threshold = parse_size(EAGER_THRESHOLD_VAR, &v, 0, MAX_EAGER_THRESHOLD)?;
        }
        Ok(b)
    }

    /// Overrides the eager threshold (bytes).
    pub fn eager_threshold(mut self, bytes: u64) -> Self {
        self.cfg.eager_threshold = bytes;
        self
    }
    /// Overrides the receive buffer size.
    pub fn recv_buf_size(mut self, bytes: u32) -> Self {
        self.cfg.recv_buf_size = bytes;
        self
    }
    /// Overrides the SRQ depth.
    pub fn srq_depth(mut self, n: u32) -> Self {
        self.cfg.srq_depth = n;
        self
    }
    /// Overrides the largest per-connection window. The initial grant is lowered to it
    /// if it was larger.
    pub fn credits(mut self, n: u16) -> Self {
        self.cfg.credits = n;
        self.cfg.initial_credits = self.cfg.initial_credits.min(n);
        self
    }
    /// Overrides the initial per-connection grant.
    pub fn initial_credits(mut self, n: u16) -> Self {
        self.cfg.initial_credits = n;
        self
    }
    /// Overrides the rendezvous READ chunk size.
    pub fn rndv_chunk_size(mut self, bytes: u64) -> Self {
        self.cfg.rndv_chunk_size = bytes;
        self
    }
    /// Overrides the number of READs in flight per rendezvous receive.
    pub fn max_reads_in_flight(mut self, n: u32) -> Self {
        self.cfg.max_reads_in_flight = n;
        self
    }
    /// Overrides the drain timeout (nanoseconds).
    pub fn drain_timeout_ns(mut self, ns: u64) -> Self {
        self.cfg.drain_timeout_ns = ns;
        self
    }
    /// Overrides the unexpected-message budget (bytes; see [`Config::max_unexpected`]).
    pub fn max_unexpected(mut self, bytes: u64) -> Self {
        self.cfg.max_unexpected = bytes;
        self
    }
    /// Overrides the rendezvous timeout (nanoseconds, 0: none; see
    /// [`Config::rndv_timeout_ns`]).
    pub fn rndv_timeout_ns(mut self, ns: u64) -> Self {
        self.cfg.rndv_timeout_ns = ns;
        self
    }

    /// Validates and returns the configuration.
    pub fn build(self) -> Result<Config, Error> {
        let c = self.cfg;
        let check = |unit: Unit, var: &'static str, v: u64, min: u64, max: u64| {
            if v < min || v > max {
                Err(Error::InvalidConfig {
                    var,
                    value: v.to_string(),
                    reason: "out of range".into(),
                    min,
                    max,
                    unit,
                })
            } else {
                Ok(())
            }
        };
        let chk = |var, v, min, max| check(Unit::Bytes, var, v, min, max);
        let count = |var, v, min, max| check(Unit::Count, var, v, min, max);
        chk("eager_threshold", c.eager_threshold, 0, MAX_EAGER_THRESHOLD)?;
        chk(
            "recv_buf_size",
            c.recv_buf_size.into(),
            MAX_CTRL_FRAME as u64,
            MAX_RECV_BUF_SIZE.into(),
        )?;
        count(
            "credits",
            c.credits.into(),
            MIN_CREDITS.into(),
            u16::MAX.into(),
        )?;
        count(
            "initial_credits",
            c.initial_credits.into(),
            MIN_CREDITS.into(),
            c.credits.into(),
        )?;
        count(
            "srq_depth",
            c.srq_depth.into(),
            c.credits.into(),
            u32::MAX.into(),
        )?;
        chk("rndv_chunk_size", c.rndv_chunk_size, 1, u32::MAX as u64)?;
        count(
            "max_reads_in_flight",
            c.max_reads_in_flight.into(),
            1,
            1 << 16,
        )?;
        Ok(c)
    }
}
