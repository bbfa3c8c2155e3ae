//! Reading one `RDMX_*` value: yes/no, byte sizes, counts, and the error that names the
//! variable and what it expected.

use crate::error::{Error, Result};

/// A bad value of `var`, as [`Error::Config`]: what it was and what was expected.
pub(super) fn env_error(var: &'static str, value: &str, expected: &str) -> Error {
    Error::Config(format!(
        "invalid value {value:?} for {var}: expected {expected}"
    ))
}

/// A yes/no value: `1`, `y`, `yes`, `on`, `true` or their opposites, any case.
pub(super) fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "y" | "yes" | "on" | "true" => Some(true),
        "0" | "n" | "no" | "off" | "false" => Some(false),
        _ => None,
    }
}

/// A byte size (`rdmx_proto`'s syntax: digits with an optional `K`/`KiB`/`M`/`MiB` suffix) in
/// `min..=max`; a bad one is a configuration error naming the variable, like every other.
pub(super) fn parse_size(var: &'static str, value: &str, min: u64, max: u64) -> Result<u64> {
    rdmx_proto::config::parse_size(var, value, min, max).map_err(config_error)
}

/// A configuration the protocol engine refused, as [`Error::Config`].
pub(super) fn config_error(e: rdmx_proto::Error) -> Error {
    Error::Config(e.to_string())
}

/// A whole number in `min..=max`; anything else is a configuration error naming `var`.
pub(super) fn parse_count(var: &'static str, value: &str, min: u64, max: u64) -> Result<u64> {
    let n: u64 = value
        .trim()
        .parse()
        .map_err(|_| env_error(var, value, &format!("a whole number in {min}..={max}")))?;
    if n < min || n > max {
        return Err(env_error(
            var,
            value,
            &format!("a whole number in {min}..={max}"),
        ));
    }
    Ok(n)
}
