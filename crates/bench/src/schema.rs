//! The pingpong JSON schema, written by rdmx's `examples/pingpong` and by
//! `rdmx-bench socket-pingpong --json`, and read by `rdmx-bench report`.
//!
//! Latency mode: the `*_us` fields are half round trips (one-way latency),
//! `bytes_per_s = size / mean one-way time`, `msgs_per_s = 1 / mean one-way time`.
//! Bandwidth mode: `*_us` are per-message intervals (rdmx: between successive waits for the
//! oldest outstanding send of the sliding window; the socket baseline: between successive
//! writes); `bytes_per_s` and `msgs_per_s` are totals over the elapsed time, which ends when
//! the receiver has acknowledged the last message.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// `"latency"`.
pub const MODE_LATENCY: &str = "latency";
/// `"bandwidth"`.
pub const MODE_BANDWIDTH: &str = "bandwidth";

/// One pingpong result document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingpongDoc {
    /// `"rdmx-pingpong"` or `"socket-pingpong"`.
    pub tool: String,
    /// `"rdma"` or `"tcp"`.
    pub transport: String,
    /// RDMA device name, or null.
    pub device: Option<String>,
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

impl PingpongDoc {
    /// Decodes and checks a document; errors name `file` (and line/column for JSON errors).
    pub fn from_json(text: &str, file: &Path) -> Result<Self> {
        let doc: PingpongDoc = serde_json::from_str(text).map_err(|source| Error::Json {
            file: file.to_path_buf(),
            source,
        })?;
        let bad = |msg: String| Error::File {
            file: file.to_path_buf(),
            msg,
        };
        if doc.mode != MODE_LATENCY && doc.mode != MODE_BANDWIDTH {
            return Err(bad(format!(
                "mode is `{}`, expected `latency` or `bandwidth`",
                doc.mode
            )));
        }
        for (i, r) in doc.results.iter().enumerate() {
            if r.size == 0 {
                return Err(bad(format!("results[{i}]: size is 0")));
            }
            if !matches!(r.protocol.as_str(), "eager" | "rndv" | "stream") {
                return Err(bad(format!(
                    "results[{i}] (size {}): protocol is `{}`, expected eager, rndv or stream",
                    r.size, r.protocol
                )));
            }
            let fields = [
                ("p50_us", r.p50_us),
                ("p99_us", r.p99_us),
                ("mean_us", r.mean_us),
                ("min_us", r.min_us),
                ("bytes_per_s", r.bytes_per_s),
                ("msgs_per_s", r.msgs_per_s),
            ];
            for (name, v) in fields {
                if !v.is_finite() || v < 0.0 {
                    return Err(bad(format!(
                        "results[{i}] (size {}): {name} is {v}",
                        r.size
                    )));
                }
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
        let again = serde_json::to_string(&doc).unwrap();
        assert_eq!(PingpongDoc::from_json(&again, Path::new("y")).unwrap(), doc);
    }

    #[test]
    fn errors_name_the_file_and_position() {
        let e = PingpongDoc::from_json("{\n  \"tool\": 1", Path::new("d/rdmx-lat.json"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("d/rdmx-lat.json: "), "{e}");
        assert!(e.contains("line 2"), "{e}");
        let e = PingpongDoc::from_json(&DOC.replace("\"latency\"", "\"fast\""), Path::new("f"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("mode is `fast`"), "{e}");
        let e = PingpongDoc::from_json(&DOC.replace("\"eager\"", "\"rdv\""), Path::new("f"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("protocol is `rdv`"), "{e}");
        let e = PingpongDoc::from_json(&DOC.replace("12.3", "null"), Path::new("f"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f: "), "{e}");
    }
}
