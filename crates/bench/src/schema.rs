//! The pingpong result: the JSON document rdmx's `pingpong` and `rdmx-bench socket-pingpong`
//! write and `rdmx-bench report` reads, the statistics behind its rows (hdrhistogram), and
//! the table both tools print.
//!
//! Latency mode: the `*_us` fields are half round trips (one-way latency),
//! `bytes_per_s = size / mean one-way time`, `msgs_per_s = 1 / mean one-way time`.
//! Bandwidth mode: `*_us` are per-message intervals (rdmx: between successive waits for the
//! oldest outstanding send of the sliding window; the socket baseline: between successive
//! writes); `bytes_per_s` and `msgs_per_s` are totals over the elapsed time, which ends when
//! the receiver has acknowledged the last message.

use std::path::Path;
use std::time::Duration;

pub use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::sizes::format_size;
use crate::{Error, Result};

/// `"latency"`.
pub const MODE_LATENCY: &str = "latency";
/// `"bandwidth"`.
pub const MODE_BANDWIDTH: &str = "bandwidth";
/// MB as every tool here counts it (2^20 bytes).
pub const MB: f64 = 1048576.0;

/// One pingpong result document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingpongDoc {
    /// `"rdmx-pingpong"` or `"socket-pingpong"`.
    pub tool: String,
    /// `"rdma"` or `"tcp"`.
    pub transport: String,
    /// RDMA device name, or null.
    pub device: Option<String>,
    /// The server's address, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// Configured `RDMX_EAGER_THRESHOLD` in bytes, or null.
    pub eager_threshold: Option<u64>,
    /// Effective per-endpoint eager limit in bytes (size <= limit => eager), or null.
    pub eager_limit: Option<u64>,
    /// `"latency"` or `"bandwidth"`.
    pub mode: String,
    /// Bandwidth mode: messages outstanding per window; null in latency mode.
    pub window: Option<u64>,
    /// One row per message size.
    pub results: Vec<PingpongRow>,
}

/// One message size's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingpongRow {
    /// Message size in bytes.
    pub size: u64,
    /// `"eager"`, `"rndv"` or `"stream"`.
    pub protocol: String,
    /// Measured messages (latency: round trips).
    pub iterations: u64,
    /// Unmeasured warm-up messages before them.
    pub warmup: u64,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Minimum, µs.
    pub min_us: f64,
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// Messages per second.
    pub msgs_per_s: f64,
}

/// A histogram of nanoseconds (3 significant digits, growing as needed).
pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is a valid precision")
}

/// Records `d` in `h` in nanoseconds (at least 1).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    record_n(h, d, 1);
}

/// Records `d` in `h` `count` times, in nanoseconds (at least 1).
pub fn record_n(h: &mut Histogram<u64>, d: Duration, count: u64) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
    // `record_n` grows the histogram; only a value beyond any range is clamped.
    if h.record_n(ns, count).is_err() {
        h.saturating_record_n(ns, count);
    }
}

/// `amount / secs`, 0 when no time elapsed (a clock that did not tick must not give inf).
fn rate(amount: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        amount / secs
    } else {
        0.0
    }
}

impl PingpongRow {
    /// A row from `h` (ns per sample) divided by `div`: p50, p99, mean, min in µs; rates
    /// zero.
    fn summary(
        size: u64,
        protocol: &str,
        counts: (u64, u64),
        h: &Histogram<u64>,
        div: f64,
    ) -> Self {
        let us = |ns: f64| ns / 1e3 / div;
        PingpongRow {
            size,
            protocol: protocol.into(),
            warmup: counts.0,
            iterations: counts.1,
            p50_us: us(h.value_at_quantile(0.5) as f64),
            p99_us: us(h.value_at_quantile(0.99) as f64),
            mean_us: us(h.mean()),
            min_us: us(h.min() as f64),
            bytes_per_s: 0.0,
            msgs_per_s: 0.0,
        }
    }

    /// A latency row from round-trip times `rtt` (ns): one-way is half.
    pub fn latency(size: u64, protocol: &str, counts: (u64, u64), rtt: &Histogram<u64>) -> Self {
        let mut r = Self::summary(size, protocol, counts, rtt, 2.0);
        let mean_s = r.mean_us / 1e6;
        r.bytes_per_s = rate(size as f64, mean_s);
        r.msgs_per_s = rate(1.0, mean_s);
        r
    }

    /// A bandwidth row: per-message intervals `gaps` (ns) and `counts.1` messages in
    /// `elapsed`.
    pub fn bandwidth(
        size: u64,
        protocol: &str,
        counts: (u64, u64),
        gaps: &Histogram<u64>,
        elapsed: Duration,
    ) -> Self {
        let mut r = Self::summary(size, protocol, counts, gaps, 1.0);
        let secs = elapsed.as_secs_f64();
        r.bytes_per_s = rate((counts.1 * size) as f64, secs);
        r.msgs_per_s = rate(counts.1 as f64, secs);
        r
    }
}

impl PingpongDoc {
    /// Decodes and checks a document; errors name `file` (and line/column for JSON errors).
    pub fn from_json(text: &str, file: &Path) -> Result<Self> {
        let doc: PingpongDoc = serde_json::from_str(text).map_err(|source| Error::Json {
            file: file.to_path_buf(),
            source,
        })?;
        let bad = |msg: String| {
            Err(Error::File {
                file: file.to_path_buf(),
                msg,
            })
        };
        if doc.mode != MODE_LATENCY && doc.mode != MODE_BANDWIDTH {
            return bad(format!(
                "mode is `{}`, expected `latency` or `bandwidth`",
                doc.mode
            ));
        }
        for (i, r) in doc.results.iter().enumerate() {
            if !matches!(r.protocol.as_str(), "eager" | "rndv" | "stream") {
                return bad(format!(
                    "results[{i}] (size {}): protocol is `{}`, expected eager, rndv or stream",
                    r.size, r.protocol
                ));
            }
            let fields = [
                ("p50_us", r.p50_us),
                ("p99_us", r.p99_us),
                ("mean_us", r.mean_us),
                ("min_us", r.min_us),
                ("bytes_per_s", r.bytes_per_s),
                ("msgs_per_s", r.msgs_per_s),
            ];
            if let Some((name, v)) = fields.iter().find(|(_, v)| !v.is_finite() || *v < 0.0) {
                return bad(format!("results[{i}] (size {}): {name} is {v}", r.size));
            }
        }
        Ok(doc)
    }

    /// The row for `size`, if measured.
    pub fn row(&self, size: u64) -> Option<&PingpongRow> {
        self.results.iter().find(|r| r.size == size)
    }

    /// Whether this is a bandwidth-mode document.
    pub fn is_bandwidth(&self) -> bool {
        self.mode == MODE_BANDWIDTH
    }

    /// The JSON text (pretty, with a final newline).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("plain data always serialises");
        s.push('\n');
        s
    }
}

/// The table's column header line.
pub fn table_columns() -> String {
    format!(
        "{:>10} {:>6} {:>8} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "size", "proto", "iters", "p50", "p99", "mean", "MB/s", "msg/s"
    )
}

/// The title line of the table: what was measured and how the times read.
pub fn table_title(tool: &str, window: Option<u64>, sizes: usize) -> String {
    match window {
        None => format!("# {tool}: latency, one-way (half the round trip), {sizes} sizes"),
        Some(w) => format!("# {tool}: bandwidth, window {w}, times per message, {sizes} sizes"),
    }
}

/// One table row: size, protocol, iterations, p50, p99, mean (µs), MB/s, messages/s.
pub fn table_row(r: &PingpongRow) -> String {
    let us = |v: f64| match v {
        v if v < 100.0 => format!("{v:.2}"),
        v if v < 10_000.0 => format!("{v:.1}"),
        v => format!("{v:.0}"),
    };
    format!(
        "{:>10} {:>6} {:>8} {:>9} {:>9} {:>9} {:>10.2} {:>10.0}",
        format_size(r.size),
        r.protocol,
        r.iterations,
        us(r.p50_us),
        us(r.p99_us),
        us(r.mean_us),
        r.bytes_per_s / MB,
        r.msgs_per_s
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{
      "tool": "rdmx-pingpong", "transport": "rdma", "device": "rxe0",
      "eager_threshold": 8152, "eager_limit": 8152, "mode": "latency", "window": null,
      "results": [
        {"size": 1, "protocol": "eager", "iterations": 1000, "warmup": 100,
         "p50_us": 12.3, "p99_us": 20.1, "mean_us": 13.0, "min_us": 11.0,
         "bytes_per_s": 76923.0, "msgs_per_s": 76923.0}
      ]
    }"#;

    #[test]
    fn spec_example_decodes_and_round_trips() {
        let doc = PingpongDoc::from_json(DOC, Path::new("x.json")).unwrap();
        assert_eq!(doc.eager_limit, Some(8152));
        assert_eq!(doc.row(1).unwrap().p50_us, 12.3);
        assert!(doc.row(2).is_none());
        assert_eq!(
            PingpongDoc::from_json(&doc.to_json(), Path::new("y")).unwrap(),
            doc
        );
    }

    #[test]
    fn errors_name_the_file_and_position() {
        let e = |text: &str| {
            PingpongDoc::from_json(text, Path::new("f"))
                .unwrap_err()
                .to_string()
        };
        let j = PingpongDoc::from_json("{\n  \"tool\": 1", Path::new("d/rdmx-lat.json"));
        let j = j.unwrap_err().to_string();
        assert!(
            j.starts_with("d/rdmx-lat.json: ") && j.contains("line 2"),
            "{j}"
        );
        assert!(e(&DOC.replace("\"latency\"", "\"fast\"")).contains("mode is `fast`"));
        assert!(e(&DOC.replace("\"eager\"", "\"rdv\"")).contains("protocol is `rdv`"));
        assert!(e(&DOC.replace("12.3", "null")).starts_with("f: "));
        assert!(e(&DOC.replace("12.3", "-1")).contains("p50_us is -1"));
    }

    #[test]
    fn rows_from_histograms() {
        let mut h = histogram();
        for us in 1..=100u64 {
            record(&mut h, Duration::from_micros(2 * us));
        }
        let r = PingpongRow::latency(8, "eager", (10, 100), &h);
        // One-way: half of each round trip; 3 significant digits.
        assert!(
            (r.p50_us - 50.0).abs() < 0.1 && (r.p99_us - 99.0).abs() < 0.1,
            "{r:?}"
        );
        assert!(
            (r.min_us - 1.0).abs() < 0.01 && (r.mean_us - 50.5).abs() < 0.1,
            "{r:?}"
        );
        assert!((r.msgs_per_s * r.mean_us / 1e6 - 1.0).abs() < 1e-9);
        let b = PingpongRow::bandwidth(1024, "rndv", (16, 64), &h, Duration::from_secs(2));
        assert_eq!((b.bytes_per_s, b.msgs_per_s), (32768.0, 32.0));
        let z = PingpongRow::bandwidth(1, "rndv", (0, 1), &h, Duration::ZERO);
        assert_eq!(z.bytes_per_s, 0.0);
        assert_eq!(
            table_row(&r).split_whitespace().collect::<Vec<_>>()[..4],
            ["8", "B", "eager", "100"]
        );
    }
}
