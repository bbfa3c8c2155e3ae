//! rdmx benchmark tools, behind the `rdmx-bench` binary.
//!
//! * [`socket`]: `rdmx-bench socket-pingpong`, a raw-socket TCP ping-pong, polled (std::net,
//!   `TCP_NODELAY`) — the baseline of what the kernel gives without any middleware. Its JSON
//!   output uses the same schema as rdmx's `pingpong` example ([`schema`]).
//! * [`report`]: `rdmx-bench report DIR`, which reads the raw results a `scripts/bench` run
//!   left in `DIR` (rdmx pingpong JSON, perftest, qperf and ucx_perftest client outputs, see
//!   [`inputs`]) and writes `BENCHMARKS.md` plus one hand-written SVG chart per transport
//!   ([`svg`]).
//! * [`atomics`]: `rdmx-bench atomics`, atomic read-modify-write instructions per round trip
//!   from two callgrind runs (what the locks and reference counts of a thread-safe worker
//!   cost, deterministically).
//!
//! Bad input never panics: every parse failure is an [`Error`] naming the file (and line) and
//! what was wrong.

pub mod atomics;
pub mod cli;
pub mod error;
pub mod inputs;
pub mod report;
pub mod schema;
pub mod sizes;
pub mod socket;
pub mod stats;
pub mod svg;

pub use error::{Error, Result};
