//! The crate's single error type.

use crate::wire::DecodeError;
use crate::ConnId;

/// What a configuration value counts, for [`Error::InvalidConfig`]'s message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes, written with an optional size suffix ([`crate::config::parse_size`]).
    Bytes,
    /// Things (buffers, credits, READs): a whole number.
    Count,
}

impl Unit {
    fn describe(self) -> &'static str {
        match self {
            Unit::Bytes => " bytes (integer with optional suffix k, K, KiB, m, M or MiB)",
            Unit::Count => " (a whole number)",
        }
    }
}

/// Every error returned by `rdmx-proto`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A configuration variable (environment or programmatic) has an invalid value.
    #[error(
        "invalid value {value:?} for {var}: {reason}; allowed range is {min}..={max}{}",
        unit.describe()
    )]
    InvalidConfig {
        /// Name of the variable, e.g. `RDMX_EAGER_THRESHOLD`.
        var: &'static str,
        /// The offending value as given.
        value: String,
        /// Why it was rejected.
        reason: String,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
        /// What the value counts.
        unit: Unit,
    },
    /// A frame or handshake could not be decoded.
    #[error("malformed input: {0}")]
    Decode(#[from] DecodeError),
    /// The peer's handshake is incompatible with this engine.
    #[error("incompatible peer handshake: {0}")]
    Handshake(String),
    /// The connection id is not known to the engine (never up, or already down).
    #[error("unknown or closed connection {0:?}")]
    UnknownConnection(ConnId),
    /// The connection id is already in use.
    #[error("connection {0:?} is already up")]
    DuplicateConnection(ConnId),
    /// A one-sided operation the remote key does not allow (checked before anything is
    /// sent: the target would refuse it).
    #[error("{0}")]
    Refused(crate::rma::Refusal),
    /// The connection cannot carry the operation (e.g. receive buffers too small for its
    /// frames).
    #[error("unsupported on this connection: {0}")]
    Unsupported(String),
}
