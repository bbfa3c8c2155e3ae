//! `rdmx-bench report DIR`: BENCHMARKS.md and the SVG plots from a benchmark run's raw results.
//!
//! Layout of `DIR` (everything but `meta.env` optional; a missing input makes its column or
//! section say "not measured" and is listed in the report):
//!
//! ```text
//! meta.env                                   KEY=VALUE: date, host, cpu, cores, kernel, ...
//! guest/rdmx-lat.json  guest/rdmx-bw.json    pingpong JSON over RDMA (Soft-RoCE rxe)
//! guest/ib_send_lat-<SIZE>.txt               perftest client outputs
//! guest/ib_read_bw-<SIZE>.txt
//! guest/qperf-rc_lat.txt  guest/qperf-rc_bw.txt  guest/qperf-rc_rdma_read_bw.txt
//! host/rdmx-lat.json  host/rdmx-bw.json      pingpong JSON over TCP (loopback)
//! host/socket-lat.json  host/socket-bw.json  socket-pingpong JSON
//! host/ucx-tag_lat-<SIZE>.txt  host/ucx-tag_bw-<SIZE>.txt   ucx_perftest client outputs
//! guest/threshold-<T>.json  host/threshold-<T>.json         latency runs, RDMX_EAGER_THRESHOLD=T
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::inputs::{
    parse_meta, parse_perftest_bw, parse_perftest_lat, parse_qperf, parse_ucx, BySize, QperfKind,
};
use crate::schema::{PingpongDoc, PingpongRow};
use crate::sizes::{format_size, parse_size};
use crate::svg::{self, Panel, COLORS};
use crate::{Error, Result};

/// MB as every tool here counts it.
const MB: f64 = 1048576.0;
/// rdmx's default SRQ depth (receive buffers per worker); a test checks it against rdmx-proto.
pub const SRQ_DEPTH: u64 = 4096;
/// rdmx's message header, which shares the receive buffer with an eager payload.
pub const HEADER_BYTES: u64 = rdmx_proto::HEADER_LEN as u64;
/// rdmx's default eager threshold: the 8 KiB receive buffer minus the header.
pub const DEFAULT_EAGER_THRESHOLD: u64 = rdmx_proto::config::DEFAULT_EAGER_THRESHOLD;
/// rdmx's default eager threshold over TCP (`rdmx::TCP_EAGER_THRESHOLD`).
pub const TCP_EAGER_THRESHOLD: u64 = 64 * 1024 - HEADER_BYTES;

/// Where `report` reads and writes.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportOptions {
    /// The run's raw results.
    pub dir: PathBuf,
    /// The Markdown file to write.
    pub out: PathBuf,
    /// Directory for `bench-rdma.svg` and `bench-tcp.svg`.
    pub svg_dir: PathBuf,
}

/// An rdmx (or socket-pingpong) pingpong document and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Pingpong {
    /// Path relative to DIR.
    pub input: String,
    /// `None`: the file was not there.
    pub doc: Option<PingpongDoc>,
}

/// A reference tool's results normalised to one value per size (µs or MB/s).
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// Column header, e.g. `ib_send_lat typical`.
    pub label: &'static str,
    /// Legend text in the plots.
    pub legend: &'static str,
    /// Input file (pattern) relative to DIR.
    pub input: String,
    /// `None`: not measured (no input file).
    pub values: Option<BTreeMap<u64, f64>>,
    /// Sizes where the tool ran but gave no valid value.
    pub unusable: BTreeSet<u64>,
    /// Why such sizes are unusable.
    pub unusable_why: &'static str,
}

impl Reference {
    fn new(label: &'static str, legend: &'static str, input: &str, why: &'static str) -> Self {
        Reference {
            label,
            legend,
            input: input.to_string(),
            values: None,
            unusable: BTreeSet::new(),
            unusable_why: why,
        }
    }

    fn set(&mut self, rows: BySize<f64>) {
        self.values = Some(rows.rows);
        self.unusable = rows.unusable;
    }

    fn with_doc(mut self, doc: &Option<PingpongDoc>, f: fn(&PingpongRow) -> f64) -> Self {
        if let Some(d) = doc {
            self.values = Some(d.results.iter().map(|r| (r.size, f(r))).collect());
        }
        self
    }

    fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.values
            .iter()
            .flat_map(|v| v.keys().copied())
            .chain(self.unusable.iter().copied())
    }
}

/// Everything measured over one transport.
#[derive(Debug, Clone, PartialEq)]
pub struct Transport {
    /// `rdma` or `tcp`.
    pub name: &'static str,
    /// Section title.
    pub title: &'static str,
    /// rdmx latency run.
    pub lat: Pingpong,
    /// rdmx bandwidth run.
    pub bw: Pingpong,
    /// Latency references (µs, one-way).
    pub lat_refs: Vec<Reference>,
    /// Bandwidth references (MB/s).
    pub bw_refs: Vec<Reference>,
    /// Threshold sweep: latency runs by `RDMX_EAGER_THRESHOLD`.
    pub thresholds: BTreeMap<u64, PingpongDoc>,
}

impl Transport {
    fn eager_limit(&self) -> Option<u64> {
        let lim = |p: &Pingpong| p.doc.as_ref().and_then(|d| d.eager_limit);
        lim(&self.lat).or_else(|| lim(&self.bw))
    }
}

/// A run's results, loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct RunData {
    /// `meta.env`, in file order.
    pub meta: Vec<(String, String)>,
    /// Inputs (relative to DIR) that were not found.
    pub missing: Vec<String>,
    /// Inputs that were found but held no result, with the reason.
    pub empty: Vec<String>,
    /// Soft-RoCE results (guest/).
    pub rdma: Transport,
    /// Loopback TCP results (host/).
    pub tcp: Transport,
    /// The hot-path tables `scripts/bench-hotpath` wrote (`hotpath.md`), as Markdown.
    pub hotpath: Option<String>,
}

/// One file of a `PREFIX<SIZE>SUFFIX` family: relative name, size from the name (when
/// asked for), path and text.
type FamilyFile = (String, Option<u64>, PathBuf, String);

struct Loader<'a> {
    dir: &'a Path,
    missing: Vec<String>,
    empty: Vec<String>,
}

fn read_text(path: &Path) -> Result<Option<String>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            file: path.to_path_buf(),
            source,
        }),
    }
}

impl Loader<'_> {
    fn pingpong(&mut self, rel: &str, mode: &str) -> Result<Pingpong> {
        let path = self.dir.join(rel);
        let Some(text) = read_text(&path)? else {
            self.missing.push(rel.to_string());
            return Ok(Pingpong {
                input: rel.into(),
                doc: None,
            });
        };
        let doc = PingpongDoc::from_json(&text, &path)?;
        if doc.mode != mode {
            return Err(Error::File {
                file: path,
                msg: format!("mode is `{}`, expected `{mode}` for this file", doc.mode),
            });
        }
        if doc.results.is_empty() {
            self.empty.push(format!("{rel}: no results"));
        }
        Ok(Pingpong {
            input: rel.into(),
            doc: Some(doc),
        })
    }

    /// Files `sub/PREFIX<SIZE>SUFFIX`, sorted by name; `SIZE` parsed when `sized`.
    /// Records the pattern as missing when there are none.
    fn family(
        &mut self,
        sub: &str,
        prefix: &str,
        suffix: &str,
        sized: bool,
    ) -> Result<Vec<FamilyFile>> {
        let what = if prefix.starts_with("threshold") {
            "<T>"
        } else {
            "<SIZE>"
        };
        let pattern = format!("{sub}/{prefix}{what}{suffix}");
        let dir = self.dir.join(sub);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.missing.push(pattern);
                return Ok(Vec::new());
            }
            Err(source) => return Err(Error::Io { file: dir, source }),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| Error::Io {
                file: dir.clone(),
                source,
            })?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.len() > prefix.len() + suffix.len()
                && name.starts_with(prefix)
                && name.ends_with(suffix)
            {
                names.push(name);
            }
        }
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let path = dir.join(&name);
            let size = if sized {
                let mid = &name[prefix.len()..name.len() - suffix.len()];
                Some(parse_size(mid).map_err(|e| Error::File {
                    file: path.clone(),
                    msg: format!("cannot read the size from the file name: {e}"),
                })?)
            } else {
                None
            };
            let Some(text) = read_text(&path)? else {
                continue;
            };
            out.push((format!("{sub}/{name}"), size, path, text));
        }
        if out.is_empty() {
            self.missing.push(pattern);
        }
        Ok(out)
    }

    fn note_empty<T>(&mut self, rel: &str, rows: &BySize<T>, what: &str) {
        if rows.is_empty() {
            self.empty.push(format!("{rel}: {what}"));
        }
    }

    fn perftest_lat(&mut self, r: &mut Reference, prefix: &str) -> Result<()> {
        let files = self.family("guest", prefix, ".txt", false)?;
        if files.is_empty() {
            return Ok(());
        }
        let mut all = BySize::default();
        for (rel, _, path, text) in files {
            let rows = parse_perftest_lat(&text, &path)?;
            self.note_empty(&rel, &rows, "no result rows");
            all.merge(rows);
        }
        r.set(BySize {
            rows: all
                .rows
                .into_iter()
                .map(|(s, v)| (s, v.t_typical))
                .collect(),
            unusable: all.unusable,
            failures: all.failures,
        });
        Ok(())
    }

    fn perftest_bw(&mut self, r: &mut Reference, prefix: &str) -> Result<()> {
        let files = self.family("guest", prefix, ".txt", false)?;
        if files.is_empty() {
            return Ok(());
        }
        let mut all = BySize::default();
        for (rel, _, path, text) in files {
            let rows = parse_perftest_bw(&text, &path)?;
            self.note_empty(&rel, &rows, "no result rows");
            all.merge(rows);
        }
        r.set(BySize {
            rows: all
                .rows
                .into_iter()
                .map(|(s, v)| (s, v.bw_avg_mbs))
                .collect(),
            unusable: all.unusable,
            failures: all.failures,
        });
        Ok(())
    }

    fn qperf(&mut self, r: &mut Reference, test: &str, kind: QperfKind) -> Result<()> {
        let rel = format!("guest/qperf-{test}.txt");
        let path = self.dir.join(&rel);
        let Some(text) = read_text(&path)? else {
            self.missing.push(rel);
            return Ok(());
        };
        let mut rows = parse_qperf(&text, &path, test, kind)?;
        self.note_empty(&rel, &rows, "no result blocks");
        for f in &rows.failures {
            self.empty.push(format!("{rel}: {f}"));
        }
        if kind == QperfKind::Bandwidth {
            for v in rows.rows.values_mut() {
                *v /= MB;
            }
        }
        r.set(rows);
        Ok(())
    }

    fn ucx(
        &mut self,
        r: &mut Reference,
        test: &str,
        f: fn(&crate::inputs::UcxFinal) -> f64,
    ) -> Result<()> {
        let files = self.family("host", &format!("ucx-{test}-"), ".txt", true)?;
        if files.is_empty() {
            return Ok(());
        }
        let mut all = BySize::default();
        for (rel, size, path, text) in files {
            let size = size.unwrap_or(0);
            match parse_ucx(&text, &path)? {
                Some(fin) => all.add_value(size, f(&fin)),
                None => {
                    self.empty.push(format!("{rel}: no `Final:` line"));
                    all.unusable.insert(size);
                }
            }
        }
        r.set(all);
        Ok(())
    }

    fn thresholds(&mut self, sub: &str) -> Result<BTreeMap<u64, PingpongDoc>> {
        let mut out = BTreeMap::new();
        for (rel, t, path, text) in self.family(sub, "threshold-", ".json", true)? {
            let doc = PingpongDoc::from_json(&text, &path)?;
            if doc.is_bandwidth() {
                return Err(Error::File {
                    file: path,
                    msg: "a threshold run must be a latency-mode document".into(),
                });
            }
            if doc.results.is_empty() {
                self.empty.push(format!("{rel}: no results"));
            }
            out.insert(t.unwrap_or(0), doc);
        }
        Ok(out)
    }
}

impl BySize<f64> {
    fn add_value(&mut self, size: u64, v: f64) {
        if v > 0.0 && v.is_finite() {
            self.rows.entry(size).or_insert(v);
            self.unusable.remove(&size);
        } else if !self.rows.contains_key(&size) {
            self.unusable.insert(size);
        }
    }
}

const INF_WHY: &str = "reported inf/-nan (clock-correlation failure)";
const ZERO_WHY: &str = "reported no bandwidth (did not complete)";
const UCX_WHY: &str = "has no valid `Final:` line";

impl RunData {
    /// Loads everything in `dir`. `meta.env` must exist; everything else is optional.
    pub fn load(dir: &Path) -> Result<RunData> {
        let meta_path = dir.join("meta.env");
        let meta_text = read_text(&meta_path)?.ok_or_else(|| Error::File {
            file: meta_path.clone(),
            msg: "not found (every run directory needs meta.env)".into(),
        })?;
        let meta = parse_meta(&meta_text, &meta_path)?;
        let mut l = Loader {
            dir,
            missing: Vec::new(),
            empty: Vec::new(),
        };

        // RDMA (guest).
        let lat = l.pingpong("guest/rdmx-lat.json", "latency")?;
        let bw = l.pingpong("guest/rdmx-bw.json", "bandwidth")?;
        let mut ib_lat = Reference::new(
            "ib_send_lat typical",
            "ib_send_lat",
            "guest/ib_send_lat-<SIZE>.txt",
            INF_WHY,
        );
        l.perftest_lat(&mut ib_lat, "ib_send_lat-")?;
        let mut q_lat = Reference::new(
            "qperf rc_lat",
            "qperf rc_lat",
            "guest/qperf-rc_lat.txt",
            ZERO_WHY,
        );
        l.qperf(&mut q_lat, "rc_lat", QperfKind::Latency)?;
        let mut ib_bw = Reference::new(
            "ib_read_bw avg",
            "ib_read_bw",
            "guest/ib_read_bw-<SIZE>.txt",
            ZERO_WHY,
        );
        l.perftest_bw(&mut ib_bw, "ib_read_bw-")?;
        let mut q_bw = Reference::new(
            "qperf rc_bw",
            "qperf rc_bw",
            "guest/qperf-rc_bw.txt",
            ZERO_WHY,
        );
        l.qperf(&mut q_bw, "rc_bw", QperfKind::Bandwidth)?;
        let mut q_rd = Reference::new(
            "qperf rc_rdma_read_bw",
            "qperf rc_rdma_read_bw",
            "guest/qperf-rc_rdma_read_bw.txt",
            ZERO_WHY,
        );
        l.qperf(&mut q_rd, "rc_rdma_read_bw", QperfKind::Bandwidth)?;
        let rdma_thresholds = l.thresholds("guest")?;
        let rdma = Transport {
            name: "rdma",
            title: "RDMA (Soft-RoCE)",
            lat,
            bw,
            lat_refs: vec![ib_lat, q_lat],
            bw_refs: vec![ib_bw, q_bw, q_rd],
            thresholds: rdma_thresholds,
        };

        // TCP (host).
        let lat = l.pingpong("host/rdmx-lat.json", "latency")?;
        let bw = l.pingpong("host/rdmx-bw.json", "bandwidth")?;
        let mut u_lat = Reference::new(
            "ucx tag_lat typical",
            "ucx_perftest tag_lat",
            "host/ucx-tag_lat-<SIZE>.txt",
            UCX_WHY,
        );
        l.ucx(&mut u_lat, "tag_lat", |f| f.typical_us)?;
        let mut u_bw = Reference::new(
            "ucx tag_bw",
            "ucx_perftest tag_bw",
            "host/ucx-tag_bw-<SIZE>.txt",
            UCX_WHY,
        );
        l.ucx(&mut u_bw, "tag_bw", |f| f.bw_overall_mbs)?;
        let sock_lat = l.pingpong("host/socket-lat.json", "latency")?;
        let sock_bw = l.pingpong("host/socket-bw.json", "bandwidth")?;
        let s_lat = Reference::new("socket p50", "socket-pingpong", &sock_lat.input, ZERO_WHY)
            .with_doc(&sock_lat.doc, |r| r.p50_us);
        let s_bw = Reference::new("socket", "socket-pingpong", &sock_bw.input, ZERO_WHY)
            .with_doc(&sock_bw.doc, |r| r.bytes_per_s / MB);
        let tcp_thresholds = l.thresholds("host")?;
        let tcp = Transport {
            name: "tcp",
            title: "TCP (loopback)",
            lat,
            bw,
            lat_refs: vec![u_lat, s_lat],
            bw_refs: vec![u_bw, s_bw],
            thresholds: tcp_thresholds,
        };
        let hotpath = read_text(&dir.join("hotpath.md"))?;
        Ok(RunData {
            meta,
            missing: l.missing,
            empty: l.empty,
            rdma,
            tcp,
            hotpath,
        })
    }
}

/// Formats a latency or bandwidth value with 3-ish significant digits.
pub fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Formats a ratio.
pub fn fmt_ratio(v: f64) -> String {
    format!("{v:.2}")
}

fn fmt_bytes(b: u64) -> String {
    let s = format_size(b);
    if b >= 1 << 20 && !s.ends_with(" MiB") && !s.ends_with(" GiB") {
        format!("{:.2} MiB", b as f64 / MB)
    } else {
        s
    }
}

const NOT_MEASURED: &str = "not measured";
const DASH: &str = "–";

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A Markdown table; columns named in `left` are left-aligned, the others right-aligned.
fn md_table(out: &mut String, header: &[String], rows: &[Vec<String>], left: &[&str]) {
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(
        out,
        "|{}",
        header
            .iter()
            .map(|h| if left.contains(&h.as_str()) {
                ":---|"
            } else {
                "---:|"
            })
            .collect::<String>()
    );
    for r in rows {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out.push('\n');
}

/// How an rdmx column is computed.
struct RdmxCol {
    header: &'static str,
    value: fn(&PingpongRow) -> f64,
}

/// One comparison table: rdmx columns, then each reference with its ratio against `base`.
fn compare_table(
    out: &mut String,
    rdmx: &Pingpong,
    protocol: bool,
    cols: &[RdmxCol],
    base: fn(&PingpongRow) -> f64,
    refs: &[Reference],
) {
    let doc = rdmx.doc.as_ref();
    let mut sizes: BTreeSet<u64> = doc
        .iter()
        .flat_map(|d| d.results.iter().map(|r| r.size))
        .collect();
    for r in refs {
        sizes.extend(r.sizes());
    }
    if doc.is_none() && refs.iter().all(|r| r.values.is_none()) {
        let mut files = vec![format!("`{}`", rdmx.input)];
        files.extend(refs.iter().map(|r| format!("`{}`", r.input)));
        let _ = writeln!(
            out,
            "Not measured: none of {} were found.\n",
            files.join(", ")
        );
        return;
    }
    let mut header = vec!["size".to_string()];
    if protocol {
        header.push("protocol".into());
    }
    header.extend(cols.iter().map(|c| c.header.to_string()));
    for r in refs {
        header.push(r.label.to_string());
        header.push("ratio".into());
    }
    let mut rows = Vec::new();
    for &size in &sizes {
        let row = doc.and_then(|d| d.row(size));
        let mut cells = vec![format_size(size)];
        let rdmx_cell = |f: &dyn Fn(&PingpongRow) -> String| match (doc, row) {
            (None, _) => NOT_MEASURED.to_string(),
            (Some(_), None) => DASH.to_string(),
            (Some(_), Some(r)) => f(r),
        };
        if protocol {
            cells.push(rdmx_cell(&|r| r.protocol.clone()));
        }
        for c in cols {
            cells.push(rdmx_cell(&|r| fmt_num((c.value)(r))));
        }
        for r in refs {
            let v = r.values.as_ref().and_then(|m| m.get(&size)).copied();
            cells.push(match (&r.values, v) {
                (None, _) => NOT_MEASURED.to_string(),
                (Some(_), Some(v)) => fmt_num(v),
                (Some(_), None) if r.unusable.contains(&size) => "failed".to_string(),
                (Some(_), None) => DASH.to_string(),
            });
            cells.push(match (row, v) {
                (Some(row), Some(v)) if v > 0.0 => fmt_ratio(base(row) / v),
                _ => DASH.to_string(),
            });
        }
        rows.push(cells);
    }
    md_table(out, &header, &rows, &["protocol"]);
    let mut notes = Vec::new();
    if doc.is_none() {
        notes.push(format!("rdmx: not measured (`{}` not found).", rdmx.input));
    }
    for r in refs {
        if r.values.is_none() {
            notes.push(format!(
                "{}: not measured (`{}` not found).",
                r.label, r.input
            ));
        } else if !r.unusable.is_empty() {
            let at: Vec<String> = r.unusable.iter().map(|&s| format_size(s)).collect();
            notes.push(format!(
                "{}: \"failed\" — `{}` {} at {}.",
                r.label,
                r.input,
                r.unusable_why,
                at.join(", ")
            ));
        }
    }
    for n in notes {
        let _ = writeln!(out, "- {n}");
    }
    if !out.ends_with("\n\n") {
        out.push('\n');
    }
}

fn p50(r: &PingpongRow) -> f64 {
    r.p50_us
}
fn mbs(r: &PingpongRow) -> f64 {
    r.bytes_per_s / MB
}

fn transport_section(out: &mut String, t: &Transport) {
    let _ = writeln!(out, "## {}\n", t.title);
    let doc = t.lat.doc.as_ref().or(t.bw.doc.as_ref());
    if let Some(d) = doc {
        let opt = |v: Option<u64>| v.map_or("not set".to_string(), |b| format!("{b} B"));
        let _ = writeln!(
            out,
            "Transport `{}`, device {}, eager threshold {}, effective eager limit {} \
             (size ≤ limit ⇒ eager).\n",
            d.transport,
            d.device
                .as_deref()
                .map_or("–".to_string(), |s| format!("`{s}`")),
            opt(d.eager_threshold),
            opt(d.eager_limit)
        );
    }
    let _ = writeln!(out, "### Latency (one-way, µs)\n");
    let lat_cols: &[RdmxCol] = if t.name == "rdma" {
        &[
            RdmxCol {
                header: "rdmx p50",
                value: p50,
            },
            RdmxCol {
                header: "rdmx p99",
                value: |r| r.p99_us,
            },
            RdmxCol {
                header: "rdmx mean",
                value: |r| r.mean_us,
            },
        ]
    } else {
        &[
            RdmxCol {
                header: "rdmx p50",
                value: p50,
            },
            RdmxCol {
                header: "rdmx p99",
                value: |r| r.p99_us,
            },
        ]
    };
    compare_table(out, &t.lat, true, lat_cols, p50, &t.lat_refs);
    let window =
        t.bw.doc
            .as_ref()
            .and_then(|d| d.window)
            .map_or(String::new(), |w| format!(", rdmx window {w}"));
    let _ = writeln!(out, "### Bandwidth (MB/s{window})\n");
    compare_table(
        out,
        &t.bw,
        t.name == "rdma",
        &[RdmxCol {
            header: "rdmx MB/s",
            value: mbs,
        }],
        mbs,
        &t.bw_refs,
    );
}

/// The crossover between the rendezvous-only run (threshold 0) and the largest-threshold run.
#[derive(Debug, Clone, PartialEq)]
pub enum Crossover {
    /// Rendezvous has the lower p50 from this size on (and at the next measured size).
    At {
        /// The crossover size.
        size: u64,
        /// The next measured size, where rendezvous also wins.
        next: u64,
        /// Largest compared size below the crossover, if any.
        below: Option<u64>,
    },
    /// Rendezvous never wins (confirmed) at any compared size up to `up_to`.
    NoneBelow {
        /// Largest compared size (the largest-threshold run still eager there).
        up_to: u64,
        /// Rendezvous won at this last size alone, with no larger eager size to confirm it.
        unconfirmed: Option<u64>,
    },
    /// Cannot be computed from the data.
    Unknown(String),
}

/// Computes the crossover from a threshold sweep (threshold → latency document).
pub fn crossover(sweep: &BTreeMap<u64, PingpongDoc>) -> Crossover {
    let Some(rndv) = sweep.get(&0) else {
        return Crossover::Unknown("no threshold-0 (all rendezvous) run".into());
    };
    let Some((&tmax, eager)) = sweep.iter().next_back().filter(|(&t, _)| t > 0) else {
        return Crossover::Unknown("no run with a threshold above 0".into());
    };
    let sizes: Vec<(u64, f64, f64)> = eager
        .results
        .iter()
        .filter(|r| r.protocol == "eager")
        .filter_map(|e| rndv.row(e.size).map(|r| (e.size, (r.p50_us, e.p50_us))))
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .map(|(s, (r, e))| (s, r, e))
        .collect();
    let Some(&(last, r_last, e_last)) = sizes.last() else {
        return Crossover::Unknown(format!(
            "the threshold-{tmax} run has no eager size that the threshold-0 run also measured"
        ));
    };
    for (i, w) in sizes.windows(2).enumerate() {
        let ((s, r, e), (n, rn, en)) = (w[0], w[1]);
        if r < e && rn < en {
            return Crossover::At {
                size: s,
                next: n,
                below: i.checked_sub(1).map(|j| sizes[j].0),
            };
        }
    }
    Crossover::NoneBelow {
        up_to: last,
        unconfirmed: (r_last < e_last).then_some(last),
    }
}

/// What a crossover says about the default threshold.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The data supports the default.
    Supports,
    /// The data suggests a higher threshold (at least this many bytes).
    Raise(u64),
    /// The data suggests a lower threshold (below this size).
    Lower(u64),
    /// The data does not decide.
    Inconclusive,
}

/// Judges `default` (bytes) against a crossover.
pub fn verdict(c: &Crossover, default: u64) -> Verdict {
    match *c {
        Crossover::At { size, below, .. } => {
            if size <= default {
                Verdict::Lower(size)
            } else {
                match below {
                    Some(b) if b > default => Verdict::Raise(b),
                    _ => Verdict::Supports,
                }
            }
        }
        Crossover::NoneBelow { up_to, .. } => {
            if up_to > default {
                Verdict::Raise(up_to)
            } else {
                Verdict::Inconclusive
            }
        }
        Crossover::Unknown(_) => Verdict::Inconclusive,
    }
}

fn mem(threshold: u64) -> String {
    fmt_bytes(SRQ_DEPTH * (threshold + HEADER_BYTES))
}

fn sweep_section(out: &mut String, data: &RunData) {
    let _ = writeln!(out, "## Eager threshold sweep\n");
    let _ = writeln!(
        out,
        "rdmx p50 one-way latency (µs) with `RDMX_EAGER_THRESHOLD=T`; the letter is the \
         protocol each message used (e = eager, r = rendezvous, s = stream). T = 0 sends \
         everything by rendezvous.\n"
    );
    let mut results = Vec::new();
    for t in [&data.rdma, &data.tcp] {
        let sub = if t.name == "rdma" { "guest" } else { "host" };
        let _ = writeln!(out, "### {}\n", t.title);
        if t.thresholds.is_empty() {
            let _ = writeln!(out, "Not measured (no `{sub}/threshold-<T>.json`).\n");
            continue;
        }
        let sizes: BTreeSet<u64> = t
            .thresholds
            .values()
            .flat_map(|d| d.results.iter().map(|r| r.size))
            .collect();
        let mut header = vec!["size".to_string()];
        header.extend(
            t.thresholds
                .keys()
                .map(|&th| format!("T = {}", fmt_bytes(th))),
        );
        let rows: Vec<Vec<String>> = sizes
            .iter()
            .map(|&s| {
                let mut cells = vec![format_size(s)];
                for d in t.thresholds.values() {
                    cells.push(d.row(s).map_or(DASH.to_string(), |r| {
                        let p = r.protocol.chars().next().unwrap_or('?');
                        format!("{} {p}", fmt_num(r.p50_us))
                    }));
                }
                cells
            })
            .collect();
        md_table(out, &header, &rows, &[]);
        let c = crossover(&t.thresholds);
        let tmax = t.thresholds.keys().next_back().copied().unwrap_or(0);
        let line = match &c {
            Crossover::At { size, next, .. } => {
                let (r, e) = (&t.thresholds[&0], &t.thresholds[&tmax]);
                let at = |d: &PingpongDoc, s: u64| d.row(s).map_or(0.0, |x| x.p50_us);
                format!(
                    "crossover at **{}**: rendezvous (T = 0) p50 {} µs vs eager (T = {}) {} µs, \
                     and rendezvous stays faster at {} ({} vs {} µs).",
                    format_size(*size),
                    fmt_num(at(r, *size)),
                    fmt_bytes(tmax),
                    fmt_num(at(e, *size)),
                    format_size(*next),
                    fmt_num(at(r, *next)),
                    fmt_num(at(e, *next)),
                )
            }
            Crossover::NoneBelow { up_to, unconfirmed } => {
                let mut s = format!(
                    "no crossover below {}: eager (T = {}) is as fast as or faster than \
                     rendezvous at every compared size.",
                    format_size(*up_to),
                    fmt_bytes(tmax)
                );
                if let Some(u) = unconfirmed {
                    let _ = write!(
                        s,
                        " (Rendezvous was faster at {} alone, the largest eager size measured, \
                         so no larger size confirms it.)",
                        format_size(*u)
                    );
                }
                s
            }
            Crossover::Unknown(why) => format!("crossover not computable: {why}."),
        };
        let _ = writeln!(out, "{}: {line}\n", t.title);
        results.push((t.title, c));
    }
    if results.is_empty() {
        return;
    }

    // The defaults and the memory argument, per transport.
    let default_of = |tcp: bool| {
        let (doc, file) = if tcp {
            (data.tcp.lat.doc.as_ref(), "host/rdmx-lat.json")
        } else {
            (data.rdma.lat.doc.as_ref(), "guest/rdmx-lat.json")
        };
        match doc.and_then(|d| d.eager_threshold.or(d.eager_limit)) {
            Some(d) => (d, format!("as `{file}` reports it")),
            None if tcp => (
                TCP_EAGER_THRESHOLD,
                format!("rdmx's built-in TCP default; `{file}` does not report one"),
            ),
            None => (
                DEFAULT_EAGER_THRESHOLD,
                format!("rdmx's built-in default; `{file}` does not report one"),
            ),
        }
    };
    let mut p = String::from("**Default vs data.** ");
    let mut verdicts = Vec::new();
    for (title, c) in &results {
        let tcp = title.starts_with("TCP");
        let (default, source) = default_of(tcp);
        let mut intro = format!("{title}: the eager threshold was {default} B ({source})");
        if tcp {
            intro.push_str(
                ". A TCP receiver allocates each frame as it arrives, so a larger threshold \
                 costs no pre-posted memory (at most credits × frame size per connection while \
                 messages are in flight), and rdmx's TCP default is 64 KiB − 40 B = \
                 65496 B. ",
            );
        } else {
            if default == DEFAULT_EAGER_THRESHOLD {
                intro.push_str(": the 8 KiB receive buffer minus the 40 B message header");
            }
            let _ = write!(
                intro,
                ". Eager messages land in buffers pre-posted on the SRQ, so receive memory per \
                 worker is SRQ depth × buffer size = {SRQ_DEPTH} × {} = {}; a threshold T \
                 needs buffers of T + {HEADER_BYTES} B, i.e. {SRQ_DEPTH} × (T + {HEADER_BYTES}) \
                 B per worker. ",
                fmt_bytes(default + HEADER_BYTES),
                mem(default)
            );
        }
        let v = verdict(c, default);
        let s = match (&v, c) {
            (Verdict::Lower(s), _) => format!(
                "Rendezvous already wins at {} ≤ {default} B, so the data suggests a \
                 threshold below {} (which would also shrink receive buffers).",
                format_size(*s),
                format_size(*s)
            ),
            (Verdict::Raise(t), Crossover::At { size, .. }) => format!(
                "Eager stays faster up to {} and loses from {}, so the data suggests \
                 raising the threshold to about {}, at {} of receive memory per worker instead \
                 of {}.",
                format_size(*t),
                format_size(*size),
                format_size(*t),
                mem(*t),
                mem(default)
            ),
            (Verdict::Raise(t), _) if tcp => format!(
                "Eager is not slower than rendezvous up to {} (above that threshold), and over \
                 TCP that costs no memory up front: the data supports a threshold of at least {}.",
                format_size(*t),
                format_size(*t),
            ),
            (Verdict::Raise(t), _) => format!(
                "Eager is not slower than rendezvous up to {} (above that threshold), so a \
                 threshold of at least {} would not cost latency; it would cost {} of receive \
                 memory per worker instead of {} — the data suggests raising it only where that \
                 memory is affordable.",
                format_size(*t),
                format_size(*t),
                mem(*t),
                mem(default)
            ),
            (Verdict::Supports, Crossover::At { size, below, .. }) => format!(
                "The crossover lies between {} and {}, bracketing the default: the \
                 data supports it.",
                below.map_or("the smallest size".to_string(), format_size),
                format_size(*size)
            ),
            (Verdict::Supports, _) => "The data supports that threshold.".to_string(),
            (Verdict::Inconclusive, _) => "The sweep does not reach past the default or lacks \
                                           the runs needed, so it neither supports nor \
                                           contradicts it."
                .to_string(),
        };
        verdicts.push(format!("{intro}{s}"));
    }
    p.push_str(&verdicts.join("\n\n"));
    let _ = writeln!(out, "{p}\n");
}

/// The whole Markdown report. `plots` are `(title, relative link)` pairs.
pub fn render_markdown(data: &RunData, plots: &[(String, String)]) -> String {
    let mut out = String::new();
    out.push_str(
        "_Generated by `scripts/bench` (`rdmx-bench report`); do not edit by hand — rerun \
         `scripts/bench` to regenerate._\n\n",
    );
    out.push_str("# rdmx benchmarks\n\n## Run\n\n");
    const ORDER: [&str; 10] = [
        "date",
        "host",
        "cpu",
        "cores",
        "kernel",
        "guest_kernel",
        "rdmx_commit",
        "perftest",
        "qperf",
        "ucx",
    ];
    let mut meta: Vec<&(String, String)> = Vec::new();
    for k in ORDER {
        meta.extend(data.meta.iter().filter(|(key, _)| key == k));
    }
    meta.extend(
        data.meta
            .iter()
            .filter(|(k, _)| !ORDER.contains(&k.as_str())),
    );
    let rows: Vec<Vec<String>> = meta
        .iter()
        .map(|(k, v)| vec![md_cell(k), md_cell(v)])
        .collect();
    md_table(
        &mut out,
        &["key".into(), "value".into()],
        &rows,
        &["key", "value"],
    );
    let absent: Vec<&str> = ORDER
        .iter()
        .copied()
        .filter(|k| !data.meta.iter().any(|(key, _)| key == k))
        .collect();
    if !absent.is_empty() {
        let _ = writeln!(out, "Not recorded in `meta.env`: {}.\n", absent.join(", "));
    }
    if !data.missing.is_empty() {
        let files: Vec<String> = data.missing.iter().map(|m| format!("`{m}`")).collect();
        let _ = writeln!(
            out,
            "Inputs not found (shown as \"not measured\"): {}.\n",
            files.join(", ")
        );
    }
    if !data.empty.is_empty() {
        let files: Vec<String> = data.empty.iter().map(|m| format!("`{m}`")).collect();
        let _ = writeln!(
            out,
            "Inputs with failed or no results: {}.\n",
            files.join("; ")
        );
    }
    if let Some(hotpath) = &data.hotpath {
        // Its own section, as scripts/bench-hotpath wrote it (a level-2 heading first).
        out.push_str(hotpath.trim_end());
        out.push_str("\n\n## Sweeps\n\n");
    }
    out.push_str(
        "### How to read\n\n\
         - RDMA numbers come from Soft-RoCE (rxe) in a QEMU guest under TCG emulation: absolute \
         timings are far from hardware, so compare ratios measured within one run, never \
         numbers across runs.\n\
         - MB = 2^20 bytes everywhere (qperf's SI rates are converted).\n\
         - Latency is one-way: half a round trip, as every tool here reports it.\n\
         - ratio = rdmx / reference. Latency ratios use rdmx p50: below 1 means rdmx is faster. \
         Bandwidth: above 1 means rdmx moves more data.\n\
         - protocol: eager, rndv (rendezvous), stream (plain socket).\n\
         - – : no result at that size; \"failed\": the tool ran but gave no valid value (see \
         the notes under the table); \"not measured\": its input file is missing.\n\n",
    );
    transport_section(&mut out, &data.rdma);
    transport_section(&mut out, &data.tcp);
    sweep_section(&mut out, data);
    out.push_str("## Plots\n\n");
    for (title, link) in plots {
        let _ = writeln!(out, "[{title}]({link})\n\n![{title}]({link})\n");
    }
    out
}

fn transport_svg(t: &Transport) -> String {
    let mk = |refs: &[Reference], rdmx: Option<Vec<(f64, f64)>>| -> Vec<svg::Series> {
        let mut v = Vec::new();
        if let Some(points) = rdmx {
            v.push(svg::Series {
                label: "rdmx".into(),
                color: COLORS[0],
                points,
            });
        }
        for (i, r) in refs.iter().enumerate() {
            if let Some(vals) = &r.values {
                v.push(svg::Series {
                    label: r.legend.into(),
                    color: COLORS[(i + 1) % COLORS.len()],
                    points: vals.iter().map(|(&s, &y)| (s as f64, y)).collect(),
                });
            }
        }
        v
    };
    let points = |p: &Pingpong, f: fn(&PingpongRow) -> f64| {
        p.doc
            .as_ref()
            .map(|d| d.results.iter().map(|r| (r.size as f64, f(r))).collect())
    };
    let left = Panel {
        title: "Latency (p50, one-way)".into(),
        y_label: "p50 one-way latency (µs)".into(),
        series: mk(&t.lat_refs, points(&t.lat, p50)),
    };
    let right = Panel {
        title: "Bandwidth".into(),
        y_label: "bandwidth (MB/s, MB = 2^20 B)".into(),
        series: mk(&t.bw_refs, points(&t.bw, mbs)),
    };
    svg::render(
        &format!("rdmx over {}", t.title),
        &left,
        &right,
        t.eager_limit(),
    )
}

/// Lexically normalised absolute form of `p` (relative paths are taken from the current
/// directory; nothing needs to exist).
fn absolute(p: &Path) -> Result<PathBuf> {
    let base = if p.is_absolute() {
        PathBuf::new()
    } else {
        std::env::current_dir().map_err(|source| Error::Io {
            file: PathBuf::from("."),
            source,
        })?
    };
    let mut out = PathBuf::new();
    for c in base.join(p).components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    Ok(out)
}

/// The path of `target` relative to directory `from`, with `/` separators (both absolute).
pub fn relative_link(target: &Path, from: &Path) -> String {
    let t: Vec<_> = target.components().collect();
    let f: Vec<_> = from.components().collect();
    let common = t.iter().zip(&f).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_string(); f.len() - common];
    parts.extend(
        t[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).map_err(|source| Error::Io {
        file: path.to_path_buf(),
        source,
    })
}

fn mkdir(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|source| Error::Io {
        file: path.to_path_buf(),
        source,
    })
}

/// Loads `opts.dir`, writes the SVGs and the Markdown; returns the files written.
pub fn generate(opts: &ReportOptions) -> Result<Vec<PathBuf>> {
    let data = RunData::load(&opts.dir)?;
    let out_abs = absolute(&opts.out)?;
    let out_dir = out_abs.parent().map(Path::to_path_buf).unwrap_or_default();
    let svg_abs = absolute(&opts.svg_dir)?;
    mkdir(&svg_abs)?;
    mkdir(&out_dir)?;
    let mut written = Vec::new();
    let mut plots = Vec::new();
    for t in [&data.rdma, &data.tcp] {
        let file = opts.svg_dir.join(format!("bench-{}.svg", t.name));
        write(&file, &transport_svg(t))?;
        let link = relative_link(&svg_abs.join(format!("bench-{}.svg", t.name)), &out_dir);
        plots.push((
            format!("{}: latency and bandwidth vs message size", t.title),
            link,
        ));
        written.push(file);
    }
    write(&opts.out, &render_markdown(&data, &plots))?;
    written.push(opts.out.clone());
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(rows: &[(u64, &str, f64)]) -> PingpongDoc {
        PingpongDoc {
            tool: "rdmx-pingpong".into(),
            transport: "rdma".into(),
            device: None,
            eager_threshold: None,
            eager_limit: None,
            mode: "latency".into(),
            window: None,
            results: rows
                .iter()
                .map(|&(size, protocol, p50)| PingpongRow {
                    size,
                    protocol: protocol.into(),
                    iterations: 10,
                    warmup: 1,
                    p50_us: p50,
                    p99_us: p50,
                    mean_us: p50,
                    min_us: p50,
                    bytes_per_s: 1.0,
                    msgs_per_s: 1.0,
                })
                .collect(),
        }
    }

    #[test]
    fn crossover_needs_two_sizes_in_a_row() {
        let mut sweep = BTreeMap::new();
        sweep.insert(
            0,
            doc(&[
                (1024, "rndv", 50.0),
                (4096, "rndv", 60.0),
                (16384, "rndv", 70.0),
                (65536, "rndv", 90.0),
            ]),
        );
        // Rendezvous wins at 4 KiB, loses at 16 KiB, wins from 64 KiB on (no next size).
        sweep.insert(
            65536,
            doc(&[
                (1024, "eager", 40.0),
                (4096, "eager", 65.0),
                (16384, "eager", 69.0),
                (65536, "eager", 95.0),
            ]),
        );
        assert_eq!(
            crossover(&sweep),
            Crossover::NoneBelow {
                up_to: 65536,
                unconfirmed: Some(65536)
            }
        );
        sweep.get_mut(&65536).unwrap().results[2].p50_us = 75.0;
        assert_eq!(
            crossover(&sweep),
            Crossover::At {
                size: 4096,
                next: 16384,
                below: Some(1024)
            }
        );
        assert_eq!(verdict(&crossover(&sweep), 8152), Verdict::Lower(4096));
        assert_eq!(verdict(&crossover(&sweep), 2048), Verdict::Supports);
        assert_eq!(verdict(&crossover(&sweep), 512), Verdict::Raise(1024));
        // Sizes where the largest-threshold run is not eager are not compared.
        sweep.get_mut(&65536).unwrap().results[1].protocol = "rndv".into();
        assert_eq!(
            crossover(&sweep),
            Crossover::At {
                size: 16384,
                next: 65536,
                below: Some(1024)
            }
        );
        let only0: BTreeMap<u64, PingpongDoc> = [(0, doc(&[]))].into_iter().collect();
        assert!(matches!(crossover(&only0), Crossover::Unknown(_)));
        let no0: BTreeMap<u64, PingpongDoc> = [(8152, doc(&[]))].into_iter().collect();
        assert!(matches!(crossover(&no0), Crossover::Unknown(_)));
        assert_eq!(
            verdict(
                &Crossover::NoneBelow {
                    up_to: 4096,
                    unconfirmed: None
                },
                8152
            ),
            Verdict::Inconclusive
        );
        assert_eq!(
            verdict(
                &Crossover::NoneBelow {
                    up_to: 65536,
                    unconfirmed: None
                },
                8152
            ),
            Verdict::Raise(65536)
        );
    }

    #[test]
    fn links_and_formats() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(relative_link(&p("/a/docs/x.svg"), &p("/a")), "docs/x.svg");
        assert_eq!(
            relative_link(&p("/a/docs/x.svg"), &p("/a/out")),
            "../docs/x.svg"
        );
        assert_eq!(relative_link(&p("/x.svg"), &p("/")), "x.svg");
        assert_eq!(absolute(&p("/a/./b/../c")).unwrap(), p("/a/c"));
        assert_eq!(fmt_num(294.4), "294");
        assert_eq!(fmt_num(12.34), "12.3");
        assert_eq!(fmt_num(1.234), "1.23");
        assert_eq!(mem(8152), "32 MiB");
        assert_eq!(
            u64::from(rdmx_proto::Config::default().srq_depth),
            SRQ_DEPTH,
            "the report's SRQ depth follows rdmx's default"
        );
        assert_eq!(mem(65536), "256.16 MiB");
    }
}
