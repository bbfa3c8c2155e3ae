//! What pingpong prints: the header, one row per size (table or JSON), and the progress line.

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use serde::Serialize;

/// What the run is: printed above the table, and the top of the JSON document.
pub struct Header {
    /// `rdma` or `tcp`.
    pub transport: String,
    /// The RDMA device, if any.
    pub device: Option<String>,
    /// The server's address.
    pub peer: Option<String>,
    /// The configured `RDMX_EAGER_THRESHOLD`.
    pub eager_threshold: u64,
    /// Where that value came from (default / environment / builder).
    pub threshold_source: String,
    /// The largest message this endpoint sends eagerly (threshold capped by the peer's buffers).
    pub eager_limit: u64,
    /// Bandwidth mode's window; `None` in latency mode.
    pub window: Option<usize>,
    /// Number of sizes in the sweep.
    pub sizes: usize,
}

/// The figures for one size.
#[derive(Serialize, Clone, Debug)]
pub struct Row {
    /// Message size in bytes.
    pub size: usize,
    /// `eager` or `rndv`.
    pub protocol: &'static str,
    /// Timed messages (latency: round trips).
    pub iterations: usize,
    /// Untimed messages before them.
    pub warmup: usize,
    /// Median, µs (latency: one-way; bandwidth: per message).
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Fastest sample, µs.
    pub min_us: f64,
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// Messages per second.
    pub msgs_per_s: f64,
}

impl Row {
    /// Summarises `samples` (µs); `rates(mean_us)` gives (bytes/s, messages/s).
    pub fn from_samples(
        size: usize,
        iterations: usize,
        warmup: usize,
        samples: &mut [f64],
        rates: impl Fn(f64) -> (f64, f64),
    ) -> Row {
        samples.sort_by(|a, b| a.total_cmp(b));
        let n = samples.len();
        let pct = |p: f64| {
            if n == 0 {
                return 0.0;
            }
            // Nearest rank.
            let rank = (p * n as f64).ceil() as usize;
            samples[rank.clamp(1, n) - 1]
        };
        let mean = if n == 0 {
            0.0
        } else {
            samples.iter().sum::<f64>() / n as f64
        };
        let (bytes_per_s, msgs_per_s) = if mean > 0.0 { rates(mean) } else { (0.0, 0.0) };
        Row {
            size,
            protocol: "",
            iterations,
            warmup,
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            mean_us: mean,
            min_us: samples.first().copied().unwrap_or(0.0),
            bytes_per_s,
            msgs_per_s,
        }
    }
}

#[derive(Serialize)]
struct Document<'a> {
    tool: &'static str,
    transport: &'a str,
    device: Option<&'a str>,
    peer: Option<&'a str>,
    eager_threshold: u64,
    eager_limit: u64,
    mode: &'static str,
    window: Option<usize>,
    results: &'a [Row],
}

/// Writes the table as rows arrive, or the JSON document at the end.
pub struct Output {
    json: bool,
    header: Header,
    rows: Vec<Row>,
}

/// `1 B`, `8 KiB`, `16 MiB`, or plain bytes for sizes that are not whole KiB.
pub fn human_size(n: usize) -> String {
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

fn us(v: f64) -> String {
    if v < 100.0 {
        format!("{v:.2}")
    } else if v < 10_000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

impl Output {
    /// A new output; `json` selects the JSON document.
    pub fn new(json: bool, header: Header) -> Self {
        Output {
            json,
            header,
            rows: Vec::new(),
        }
    }

    /// Prints the header (table mode).
    pub fn header(&self) -> io::Result<()> {
        if self.json {
            return Ok(());
        }
        let h = &self.header;
        let mut o = io::stdout().lock();
        match h.window {
            None => writeln!(
                o,
                "# rdmx pingpong: latency, one-way (half the round trip), {} sizes",
                h.sizes
            )?,
            Some(w) => writeln!(
                o,
                "# rdmx pingpong: bandwidth, sliding window of {w} sends, {} sizes",
                h.sizes
            )?,
        }
        writeln!(
            o,
            "# transport {}{}{}",
            h.transport,
            h.device
                .as_deref()
                .map(|d| format!(", device {d}"))
                .unwrap_or_default(),
            h.peer
                .as_deref()
                .map(|p| format!(", server {p}"))
                .unwrap_or_default()
        )?;
        writeln!(
            o,
            "# RDMX_EAGER_THRESHOLD {} B ({}); eager up to {} B on this endpoint, rendezvous above",
            h.eager_threshold, h.threshold_source, h.eager_limit
        )?;
        let time = if h.window.is_some() {
            "per message"
        } else {
            "one-way"
        };
        writeln!(o, "# times in µs {time}; MB = 2^20 bytes")?;
        writeln!(
            o,
            "{:>10} {:>6} {:>8} {:>9} {:>9} {:>9} {:>10} {:>10}",
            "size", "proto", "iters", "p50", "p99", "mean", "MB/s", "msg/s"
        )?;
        o.flush()
    }

    /// One size's figures.
    pub fn row(&mut self, r: Row) -> io::Result<()> {
        if !self.json {
            let mut o = io::stdout().lock();
            writeln!(
                o,
                "{:>10} {:>6} {:>8} {:>9} {:>9} {:>9} {:>10.2} {:>10.0}",
                human_size(r.size),
                r.protocol,
                r.iterations,
                us(r.p50_us),
                us(r.p99_us),
                us(r.mean_us),
                r.bytes_per_s / f64::from(1u32 << 20),
                r.msgs_per_s
            )?;
            o.flush()?;
        }
        self.rows.push(r);
        Ok(())
    }

    /// Ends the output: the JSON document, if that is what was asked for.
    pub fn finish(&self) -> io::Result<()> {
        if !self.json {
            return Ok(());
        }
        let h = &self.header;
        let doc = Document {
            tool: "rdmx-pingpong",
            transport: &h.transport,
            device: h.device.as_deref(),
            peer: h.peer.as_deref(),
            eager_threshold: h.eager_threshold,
            eager_limit: h.eager_limit,
            mode: if h.window.is_some() {
                "bandwidth"
            } else {
                "latency"
            },
            window: h.window,
            results: &self.rows,
        };
        let mut o = io::stdout().lock();
        serde_json::to_writer_pretty(&mut o, &doc).map_err(io::Error::other)?;
        writeln!(o)?;
        o.flush()
    }
}

/// The progress line on stderr: rewritten in place on a terminal, a line a second otherwise.
pub struct Progress {
    on: bool,
    tty: bool,
    sizes: usize,
    index: usize,
    size: usize,
    started: Instant,
    last: Option<Instant>,
    shown: bool,
}

impl Progress {
    /// `on`: whether to show anything.
    pub fn new(on: bool, sizes: usize) -> Self {
        Progress {
            on,
            tty: io::stderr().is_terminal(),
            sizes,
            index: 0,
            size: 0,
            started: Instant::now(),
            last: None,
            shown: false,
        }
    }

    /// A new size begins.
    pub fn start(&mut self, index: usize, size: usize) {
        self.index = index;
        self.size = size;
        self.started = Instant::now();
        self.last = None;
    }

    /// `done` of `total` iterations of the current size are over.
    pub fn tick(&mut self, done: usize, total: usize) {
        if !self.on {
            return;
        }
        // Quiet for sizes that finish quickly; then at most 5 updates a second on a terminal,
        // one a second in a log.
        let every = if self.tty {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(1)
        };
        let since = self.last.unwrap_or(self.started);
        if since.elapsed() < every {
            return;
        }
        self.last = Some(Instant::now());
        let line = format!(
            "pingpong: size {}/{} ({}): {done}/{total} iterations, {:.0} s",
            self.index + 1,
            self.sizes,
            human_size(self.size),
            self.started.elapsed().as_secs_f64()
        );
        let mut e = io::stderr().lock();
        let _ = if self.tty {
            write!(e, "\r\x1b[K{line}")
        } else {
            writeln!(e, "{line}")
        };
        let _ = e.flush();
        self.shown = true;
    }

    /// Removes the line (before a table row is printed).
    pub fn clear(&mut self) {
        if self.shown && self.tty {
            let mut e = io::stderr().lock();
            let _ = write!(e, "\r\x1b[K");
            let _ = e.flush();
        }
        self.shown = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut s: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let r = Row::from_samples(8, 100, 0, &mut s, |m| (8.0 / m, 1.0 / m));
        assert_eq!(r.p50_us, 50.0);
        assert_eq!(r.p99_us, 99.0);
        assert_eq!(r.min_us, 1.0);
        assert_eq!(r.mean_us, 50.5);
        assert!((r.msgs_per_s - 1.0 / 50.5).abs() < 1e-12);
        let mut one = vec![7.0];
        let r = Row::from_samples(1, 1, 0, &mut one, |_| (0.0, 0.0));
        assert_eq!((r.p50_us, r.p99_us), (7.0, 7.0));
        let r = Row::from_samples(1, 0, 0, &mut [], |_| (1.0, 1.0));
        assert_eq!((r.p50_us, r.bytes_per_s), (0.0, 0.0));
    }

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(human_size(1), "1 B");
        assert_eq!(human_size(8152), "8152 B");
        assert_eq!(human_size(8192), "8 KiB");
        assert_eq!(human_size(16 << 20), "16 MiB");
        assert_eq!(human_size(1536 << 10), "1536 KiB");
    }
}
