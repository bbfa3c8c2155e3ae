//! `rdmx-bench report DIR`: BENCHMARKS.md and the SVG plots from a benchmark run's raw results.
//!
//! [`RunData::load`] reads the run (`load`), [`render_markdown`] writes the comparison
//! tables (`tables`) and the eager-threshold sweep (`sweep`), `plot` draws the SVGs.
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
//! shm/rdmx-lat.json  shm/rdmx-bw.json        pingpong JSON over shared memory (two processes)
//! shm/ucx-tag_lat-<SIZE>.txt  shm/ucx-tag_bw-<SIZE>.txt     ucx_perftest, UCX_TLS=posix,cma,self
//! guest/threshold-<T>.json  host/threshold-<T>.json         latency runs, RDMX_EAGER_THRESHOLD=T
//! shm/threshold-<T>.json                     the same over shared memory
//! ```

mod load;
mod plot;
mod sweep;
mod tables;

pub use sweep::{crossover, verdict, Crossover, Verdict};
pub use tables::{fmt_num, fmt_ratio};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::inputs::{parse_meta, parse_perftest, parse_qperf, parse_ucx, BySize, QperfKind, Table};
use crate::schema::{PingpongDoc, PingpongRow, MB};
use crate::sizes::{format_size, parse_size};
use crate::{Error, Result};
use plot::{Panel, Series};

use sweep::*;
use tables::*;

/// rdmx's default SRQ depth (receive buffers per worker); a test checks it against rdmx-proto.
pub const SRQ_DEPTH: u64 = 4096;
/// rdmx's message header, which shares the receive buffer with an eager payload.
pub const HEADER_BYTES: u64 = rdmx_proto::HEADER_LEN as u64;
/// rdmx's default eager threshold: the 8 KiB receive buffer minus the header.
pub const DEFAULT_EAGER_THRESHOLD: u64 = rdmx_proto::config::DEFAULT_EAGER_THRESHOLD;
/// rdmx's default eager threshold over TCP (`rdmx::TCP_EAGER_THRESHOLD`).
pub const TCP_EAGER_THRESHOLD: u64 = 64 * 1024 - HEADER_BYTES;

/// Where `report` reads and writes.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct ReportOptions {
    /// The run's raw results
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// The Markdown file to write
    #[arg(short, long, value_name = "FILE", default_value = "BENCHMARKS.md")]
    pub out: PathBuf,
    /// Directory for bench-rdma.svg, bench-tcp.svg and bench-shm.svg
    #[arg(long, value_name = "DIR2", default_value = "docs")]
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
    pub input: &'static str,
    /// `None`: not measured (no input file).
    pub values: Option<BTreeMap<u64, f64>>,
    /// Sizes where the tool ran but gave no valid value.
    pub unusable: BTreeSet<u64>,
    /// Why such sizes are unusable.
    pub unusable_why: &'static str,
}

/// Everything measured over one transport.
#[derive(Debug, Clone, PartialEq)]
pub struct Transport {
    /// `rdma` or `tcp`.
    pub name: &'static str,
    /// Its subdirectory of DIR: `guest` or `host`.
    pub sub: &'static str,
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
    /// Shared-memory results between two processes of this host (shm/).
    pub shm: Transport,
    /// The Markdown sections `scripts/bench-hotpath` (`hotpath.md`), `scripts/bench-endpoints`
    /// (`endpoints.md`), `scripts/bench-rma` (`rma.md`), `scripts/bench-async` (`async.md`)
    /// and `scripts/bench-twonode` (`twonode.md`) wrote, those present.
    pub sections: Vec<String>,
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
    let rank = |k: &str| ORDER.iter().position(|o| *o == k).unwrap_or(ORDER.len());
    let mut meta: Vec<&(String, String)> = data.meta.iter().collect();
    meta.sort_by_key(|(k, _)| rank(k));
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
    let absent: Vec<&str> = (ORDER.iter().copied())
        .filter(|k| !data.meta.iter().any(|(key, _)| key == k))
        .collect();
    if !absent.is_empty() {
        let _ = writeln!(out, "Not recorded in `meta.env`: {}.\n", absent.join(", "));
    }
    let quoted = |files: &[String], sep| {
        files
            .iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(sep)
    };
    if !data.missing.is_empty() {
        let files = quoted(&data.missing, ", ");
        let _ = writeln!(
            out,
            "Inputs not found (shown as \"not measured\"): {files}.\n"
        );
    }
    if !data.empty.is_empty() {
        let _ = writeln!(
            out,
            "Inputs with failed or no results: {}.\n",
            quoted(&data.empty, "; ")
        );
    }
    // The scripts' own sections (each a level-2 heading first), before the sweeps.
    for section in &data.sections {
        out.push_str(section.trim_end());
        out.push_str("\n\n");
    }
    if !data.sections.is_empty() {
        out.push_str("## Sweeps\n\n");
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
    transport_section(&mut out, &data.shm);
    sweep_section(&mut out, data);
    out.push_str("## Plots\n\n");
    for (title, link) in plots {
        let _ = writeln!(out, "[{title}]({link})\n\n![{title}]({link})\n");
    }
    out
}

fn transport_svg(t: &Transport) -> std::result::Result<String, String> {
    let series = |refs: &[Reference], rdmx: &Pingpong, f: fn(&PingpongRow) -> f64| {
        let rdmx = rdmx.doc.as_ref().map(|d| Series {
            label: "rdmx".into(),
            points: d.results.iter().map(|r| (r.size as f64, f(r))).collect(),
        });
        let refs = refs.iter().filter_map(|r| {
            r.values.as_ref().map(|v| Series {
                label: r.legend.into(),
                points: v.iter().map(|(&s, &y)| (s as f64, y)).collect(),
            })
        });
        rdmx.into_iter().chain(refs).collect()
    };
    let left = Panel {
        title: "Latency (p50, one-way)".into(),
        y_label: "p50 one-way latency (µs)".into(),
        series: series(&t.lat_refs, &t.lat, p50),
    };
    let right = Panel {
        title: "Bandwidth".into(),
        y_label: "bandwidth (MB/s, MB = 2^20 B)".into(),
        series: series(&t.bw_refs, &t.bw, mbs),
    };
    plot::render(
        &format!("rdmx over {}", t.title),
        [&left, &right],
        t.eager_limit(),
    )
}

/// Lexically normalised absolute form of `p` (relative paths are taken from the current
/// directory; nothing needs to exist).
fn absolute(p: &Path) -> Result<PathBuf> {
    let base = if p.is_absolute() {
        PathBuf::new()
    } else {
        std::env::current_dir().map_err(|e| Error::io(".", e))?
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
    fs::write(path, text).map_err(|e| Error::io(path, e))
}

fn mkdir(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|e| Error::io(path, e))
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
    for t in [&data.rdma, &data.tcp, &data.shm] {
        let file = opts.svg_dir.join(format!("bench-{}.svg", t.name));
        let svg = transport_svg(t).map_err(|msg| Error::Plot {
            file: file.clone(),
            msg,
        })?;
        write(&file, &svg)?;
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
            peer: None,
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
