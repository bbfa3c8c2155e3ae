//! What a ping-pong sweep measures ([`Plan`]), its defaults and its command-line options
//! ([`SweepArgs`]): one definition for rdmx's `pingpong`, `rdmx-bench socket-pingpong` and,
//! through `rdmx-bench sizes` / `rdmx-bench iters`, the benchmark scripts.

use serde::{Deserialize, Serialize};

use crate::sizes::{parse_sizes, MAX_SIZE};

/// The default size list: powers of two from 1 B to 16 MiB.
pub const DEFAULT_SIZES: &str = "1:16M";
/// The default bandwidth window (messages outstanding).
pub const DEFAULT_WINDOW: u32 = 16;
/// Most sizes one sweep may have.
pub const MAX_SIZES: usize = 4096;
/// Most iterations (or warm-up iterations) per size.
pub const MAX_ITERS: u64 = 100_000_000;
/// Largest bandwidth window.
pub const MAX_WINDOW: u32 = 4096;
/// Most bytes one window may hold.
pub const MAX_WINDOW_BYTES: u64 = 1 << 30;

/// Default measured iterations for `size`: about 32 MiB, `clamp(32 MiB / size, 5, 1000)`.
pub fn default_iterations(size: u64) -> u64 {
    ((32u64 << 20) / size.max(1)).clamp(5, 1000)
}

/// Measured iterations for `size` in a run on one host (TCP loopback, shared memory):
/// about 256 MiB, `clamp(256 MiB / size, 100, 100 000)`. Such a run takes microseconds or
/// less per message, and on a noisy host one as short as [`default_iterations`] is decided
/// by its outliers (`ucx_perftest tag_bw` at 1 B over 1000 messages: a mean of 4.1 µs per
/// message, a median of 0.06); a guest's emulated RDMA cannot afford these counts.
pub fn host_iterations(size: u64) -> u64 {
    ((256u64 << 20) / size.max(1)).clamp(100, 100_000)
}

/// Measured iterations for `size`: [`host_iterations`] for a run on one host, else
/// [`default_iterations`].
pub fn iterations(size: u64, host: bool) -> u64 {
    match host {
        true => host_iterations(size),
        false => default_iterations(size),
    }
}

/// Default warm-up for `iterations`: a tenth, at least 1.
pub fn default_warmup(iterations: u64) -> u64 {
    (iterations / 10).max(1)
}

/// A sweep, as a client tells its server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Message sizes in bytes, in order.
    pub sizes: Vec<u64>,
    /// Measured iterations per size (`None`: [`default_iterations`]).
    pub iters: Option<u64>,
    /// Warm-up iterations per size (`None`: [`default_warmup`]).
    pub warmup: Option<u64>,
    /// Bandwidth mode's window; `None` in latency mode.
    pub window: Option<u32>,
    /// Bandwidth mode: receives the server keeps posted, at most the window (`None`: as many
    /// as the window). Only rdmx's `pingpong` posts receives; see its `--recv-window`.
    #[serde(default)]
    pub recv_window: Option<u32>,
    /// Without `iters`: [`host_iterations`] instead of [`default_iterations`].
    #[serde(default)]
    pub host_iters: bool,
}

impl Plan {
    /// Measured iterations for `size`.
    pub fn iters_for(&self, size: u64) -> u64 {
        self.iters
            .unwrap_or_else(|| iterations(size, self.host_iters))
    }

    /// Warm-up iterations for `size`.
    pub fn warmup_for(&self, size: u64) -> u64 {
        self.warmup
            .unwrap_or_else(|| default_warmup(self.iters_for(size)))
    }

    /// Messages for `size` as (warm-up, measured): the iteration counts, rounded up to whole
    /// windows in bandwidth mode.
    pub fn counts_for(&self, size: u64) -> (u64, u64) {
        let w = u64::from(self.window.unwrap_or(1).max(1));
        let round = |n: u64| n.div_ceil(w) * w;
        (round(self.warmup_for(size)), round(self.iters_for(size)))
    }

    /// Checks the limits (a server checks what its client sent the same way).
    pub fn validate(&self) -> Result<(), String> {
        if self.sizes.is_empty() || self.sizes.len() > MAX_SIZES {
            return Err(format!(
                "{} message sizes; 1 to {MAX_SIZES} allowed",
                self.sizes.len()
            ));
        }
        if let Some(&s) = self.sizes.iter().find(|&&s| s > MAX_SIZE) {
            return Err(format!(
                "message size {s} is larger than the limit of 1 GiB"
            ));
        }
        if self.iters.is_some_and(|n| n == 0 || n > MAX_ITERS) {
            return Err(format!("iterations must be 1 to {MAX_ITERS}"));
        }
        if self.warmup.is_some_and(|n| n > MAX_ITERS) {
            return Err(format!("warm-up must be at most {MAX_ITERS}"));
        }
        if let Some(w) = self.window {
            if w == 0 || w > MAX_WINDOW {
                return Err(format!("window {w}; it must be 1 to {MAX_WINDOW}"));
            }
            let max = self.sizes.iter().max().copied().unwrap_or(0);
            if max.saturating_mul(u64::from(w)) > MAX_WINDOW_BYTES {
                return Err(format!(
                    "a window of {w} messages of {max} bytes needs more than {} MiB",
                    MAX_WINDOW_BYTES >> 20
                ));
            }
        }
        match (self.recv_window, self.window) {
            (None, _) => {}
            (Some(_), None) => return Err("a receive window needs bandwidth mode".into()),
            (Some(r), Some(w)) if r == 0 || r > w => {
                return Err(format!(
                    "receive window {r}; it must be 1 to the window ({w})"
                ))
            }
            (Some(_), Some(_)) => {}
        }
        Ok(())
    }
}

/// A whole number for a count option (`-n`, `--warmup`, ...).
pub fn parse_count(s: &str) -> Result<u64, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number"))
}

/// The sweep options every ping-pong tool takes.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct SweepArgs {
    /// Message sizes: a comma list of byte counts (K, KiB, M, MiB, G, GiB suffixes,
    /// 1024-based) and ranges MIN:MAX (MIN, its doublings below MAX, then MAX)
    #[arg(short, long, value_name = "LIST", default_value = DEFAULT_SIZES, value_parser = parse_sizes)]
    pub sizes: SizeList,
    /// Measured iterations per size [default: about 32 MiB per size, 5 to 1000]
    #[arg(short = 'n', long = "iters", visible_alias = "iterations", value_name = "N",
          allow_hyphen_values = true, value_parser = parse_count)]
    pub iters: Option<u64>,
    /// Unmeasured iterations first [default: a tenth of the iterations, at least 1]
    #[arg(short, long, value_name = "N", allow_hyphen_values = true, value_parser = parse_count)]
    pub warmup: Option<u64>,
    /// Iterations for a run on one host (TCP loopback, shared memory) instead of the default:
    /// about 256 MiB per size, 100 to 100 000 (a run as short as the default is decided by
    /// its outliers on a noisy host)
    #[arg(long, conflicts_with = "iters")]
    pub host_iters: bool,
    /// Bandwidth mode: a sliding window of outstanding sends, one acknowledgement at the end
    /// of the warm-up and of the measured messages
    #[arg(long)]
    pub bw: bool,
    /// Sends outstanding in bandwidth mode (counts are rounded up to whole windows)
    /// [default: 16]
    #[arg(long, value_name = "N", requires = "bw")]
    pub window: Option<u32>,
    /// One JSON document (the pingpong schema) on stdout instead of the table
    #[arg(long)]
    pub json: bool,
}

/// A parsed `--sizes` list (an alias: clap's derive does not see the `Vec` through it, so it
/// takes the whole list as one value).
pub type SizeList = Vec<u64>;

impl SweepArgs {
    /// The plan these options describe, checked.
    pub fn plan(&self) -> Result<Plan, String> {
        let plan = Plan {
            sizes: self.sizes.clone(),
            iters: self.iters,
            warmup: self.warmup,
            window: self.bw.then(|| self.window.unwrap_or(DEFAULT_WINDOW)),
            recv_window: None,
            host_iters: self.host_iters,
        };
        plan.validate()?;
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_runs_are_longer_and_the_flag_travels_with_the_plan() {
        assert_eq!(host_iterations(1), 100_000);
        assert_eq!(host_iterations(4096), 65_536);
        assert_eq!(host_iterations(1 << 20), 256);
        assert_eq!(host_iterations(16 << 20), 100);
        let plan = Plan {
            sizes: vec![8, 1 << 20],
            iters: None,
            warmup: None,
            window: Some(16),
            recv_window: None,
            host_iters: true,
        };
        assert_eq!(plan.counts_for(8), (10_000, 100_000));
        assert_eq!(plan.counts_for(1 << 20), (32, 256));
        // A server reads what its client sent; an older client's plan has no flag.
        let json = serde_json::to_string(&plan).unwrap();
        assert_eq!(serde_json::from_str::<Plan>(&json).unwrap(), plan);
        let old: Plan =
            serde_json::from_str(r#"{"sizes":[8],"iters":null,"warmup":null,"window":null}"#)
                .unwrap();
        assert!(!old.host_iters);
        assert_eq!(old.iters_for(8), 1000);
    }

    #[test]
    fn defaults() {
        assert_eq!(default_iterations(1), 1000);
        assert_eq!(default_iterations(64 << 10), 512);
        assert_eq!(default_iterations(16 << 20), 5);
        assert_eq!(default_warmup(1000), 100);
        assert_eq!(default_warmup(5), 1);
        let mut p = Plan {
            sizes: vec![8],
            iters: Some(10),
            warmup: Some(3),
            window: None,
            recv_window: None,
            host_iters: false,
        };
        assert_eq!(p.counts_for(8), (3, 10));
        p.window = Some(4);
        assert_eq!(p.counts_for(8), (4, 12));
        p.warmup = Some(0);
        assert_eq!(p.counts_for(8), (0, 12));
    }

    #[test]
    fn limits() {
        let ok = Plan {
            sizes: vec![1 << 20],
            iters: None,
            warmup: None,
            window: Some(16),
            recv_window: None,
            host_iters: false,
        };
        assert_eq!(ok.validate(), Ok(()));
        let bad = |f: fn(&mut Plan)| {
            let mut p = ok.clone();
            f(&mut p);
            p.validate().unwrap_err()
        };
        assert!(bad(|p| p.sizes.clear()).contains("0 message sizes"));
        assert!(bad(|p| p.iters = Some(0)).contains("iterations"));
        assert!(bad(|p| p.window = Some(0)).contains("window 0"));
        assert!(bad(|p| p.window = Some(4096)).contains("needs more than"));
        assert!(bad(|p| p.sizes = vec![2 << 30]).contains("1 GiB"));
        assert!(bad(|p| p.recv_window = Some(0)).contains("receive window 0"));
        assert!(bad(|p| p.recv_window = Some(17)).contains("receive window 17"));
        assert!(bad(|p| {
            p.window = None;
            p.recv_window = Some(1)
        })
        .contains("needs bandwidth mode"));
        let mut two = ok.clone();
        two.recv_window = Some(2);
        assert_eq!(two.validate(), Ok(()));
    }
}
