//! rdmx benchmark tools, behind the `rdmx-bench` binary, and what every benchmark of rdmx
//! shares (rdmx's `pingpong` example uses this library too):
//!
//! * [`sizes`] and [`plan`]: the size-list syntax (`1:16M`, `1,4K,64K`), the default
//!   iteration counts and the sweep options ([`plan::SweepArgs`]);
//! * [`schema`]: the pingpong JSON result, its statistics (hdrhistogram) and its table;
//! * [`socket`]: `rdmx-bench socket-pingpong`, the raw-socket TCP baseline;
//! * [`inputs`]: parsers of perftest, qperf and ucx_perftest outputs;
//! * `report` (feature `report`): `rdmx-bench report DIR`, BENCHMARKS.md and the SVG plots;
//! * [`atomics`]: atomic read-modify-write instructions per round trip, from callgrind;
//! * [`line_rtt`]: the host's core-to-core latency (a cache line's round trip);
//! * [`clock`]: the clock benchmarks read per message.
//!
//! Bad input never panics: every parse failure is an [`Error`] naming the file (and line) and
//! what was wrong.

pub mod atomics;
pub mod cli;
pub mod clock;
pub mod error;
pub mod inputs;
pub mod line_rtt;
pub mod plan;
#[cfg(feature = "report")]
pub mod report;
pub mod schema;
pub mod sizes;
pub mod socket;

pub use error::{Error, Result};
