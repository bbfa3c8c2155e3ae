//! Reading a run's raw results (`RunData::load`): every input file, tolerating missing ones.
//! The references each transport is compared with are data ([`RDMA_REFS`], [`TCP_REFS`],
//! [`SHM_REFS`]).

use super::*;
use crate::inputs::{IB_READ_BW, IB_SEND_LAT};

/// Where a reference's values come from.
enum Source {
    /// perftest outputs, one per size (`<SIZE>` in the input pattern); the column.
    Perftest(&'static Table, &'static str),
    /// One qperf output; its test.
    Qperf(&'static str, QperfKind),
    /// ucx_perftest outputs, the size in the file name; the `Final:` column.
    Ucx(&'static str),
    /// A socket-pingpong document: its mode and the value of a row.
    Socket(&'static str, fn(&PingpongRow) -> f64),
}

/// One reference column of the report: its column header, legend, input (pattern relative
/// to DIR), why a size can be unusable, whether it is a bandwidth, and where it comes from.
struct Spec(
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    Source,
);

const INF_WHY: &str = "reported inf/-nan (clock-correlation failure)";
const ZERO_WHY: &str = "reported no bandwidth (did not complete)";
const UCX_WHY: &str = "has no valid `Final:` line";

/// The RDMA (guest) references, in the order they are read.
const RDMA_REFS: [Spec; 5] = [
    Spec(
        "ib_send_lat typical",
        "ib_send_lat",
        "guest/ib_send_lat-<SIZE>.txt",
        INF_WHY,
        false,
        Source::Perftest(&IB_SEND_LAT, "t_typical"),
    ),
    Spec(
        "qperf rc_lat",
        "qperf rc_lat",
        "guest/qperf-rc_lat.txt",
        ZERO_WHY,
        false,
        Source::Qperf("rc_lat", QperfKind::Latency),
    ),
    Spec(
        "ib_read_bw avg",
        "ib_read_bw",
        "guest/ib_read_bw-<SIZE>.txt",
        ZERO_WHY,
        true,
        Source::Perftest(&IB_READ_BW, "BW average[MB/sec]"),
    ),
    Spec(
        "qperf rc_bw",
        "qperf rc_bw",
        "guest/qperf-rc_bw.txt",
        ZERO_WHY,
        true,
        Source::Qperf("rc_bw", QperfKind::Bandwidth),
    ),
    Spec(
        "qperf rc_rdma_read_bw",
        "qperf rc_rdma_read_bw",
        "guest/qperf-rc_rdma_read_bw.txt",
        ZERO_WHY,
        true,
        Source::Qperf("rc_rdma_read_bw", QperfKind::Bandwidth),
    ),
];

/// The TCP (host) references, in the order they are read.
const TCP_REFS: [Spec; 4] = [
    Spec(
        "ucx tag_lat typical",
        "ucx_perftest tag_lat",
        "host/ucx-tag_lat-<SIZE>.txt",
        UCX_WHY,
        false,
        Source::Ucx("typical latency"),
    ),
    Spec(
        "ucx tag_bw",
        "ucx_perftest tag_bw",
        "host/ucx-tag_bw-<SIZE>.txt",
        UCX_WHY,
        true,
        Source::Ucx("overall bandwidth"),
    ),
    Spec(
        "socket p50",
        "socket-pingpong",
        "host/socket-lat.json",
        ZERO_WHY,
        false,
        Source::Socket("latency", p50),
    ),
    Spec(
        "socket",
        "socket-pingpong",
        "host/socket-bw.json",
        ZERO_WHY,
        true,
        Source::Socket("bandwidth", mbs),
    ),
];

/// The shared-memory (host, one machine) references: `ucx_perftest` with
/// `UCX_TLS=posix,cma,self`.
const SHM_REFS: [Spec; 2] = [
    Spec(
        "ucx tag_lat typical",
        "ucx_perftest tag_lat (posix,cma)",
        "shm/ucx-tag_lat-<SIZE>.txt",
        UCX_WHY,
        false,
        Source::Ucx("typical latency"),
    ),
    Spec(
        "ucx tag_bw",
        "ucx_perftest tag_bw (posix,cma)",
        "shm/ucx-tag_bw-<SIZE>.txt",
        UCX_WHY,
        true,
        Source::Ucx("overall bandwidth"),
    ),
];

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
        Err(e) => Err(Error::io(path, e)),
    }
}

impl Loader<'_> {
    fn pingpong(&mut self, rel: &str, mode: &str) -> Result<Pingpong> {
        let path = self.dir.join(rel);
        let input = rel.to_string();
        let Some(text) = read_text(&path)? else {
            self.missing.push(input.clone());
            return Ok(Pingpong { input, doc: None });
        };
        let doc = PingpongDoc::from_json(&text, &path)?;
        if doc.mode != mode {
            let msg = format!("mode is `{}`, expected `{mode}` for this file", doc.mode);
            return Err(Error::File { file: path, msg });
        }
        self.note_empty(rel, doc.results.is_empty(), "no results");
        Ok(Pingpong {
            input,
            doc: Some(doc),
        })
    }

    /// The files of `pattern` (`SUB/PREFIX<SIZE>SUFFIX` or `SUB/PREFIX<T>SUFFIX`), sorted by
    /// name; the size parsed when `sized`. Records the pattern as missing when there are none.
    fn family(&mut self, pattern: &str, sized: bool) -> Result<Vec<FamilyFile>> {
        let (sub, name) = pattern.split_once('/').unwrap_or(("", pattern));
        let (prefix, suffix) =
            (name.split_once("<SIZE>").or_else(|| name.split_once("<T>"))).unwrap_or((name, ""));
        let dir = self.dir.join(sub);
        let mut names = Vec::new();
        match fs::read_dir(&dir) {
            Ok(entries) => {
                for entry in entries {
                    let name = entry.map_err(|e| Error::io(&dir, e))?.file_name();
                    names.extend(name.into_string().ok().filter(|n| {
                        n.len() > prefix.len() + suffix.len()
                            && n.starts_with(prefix)
                            && n.ends_with(suffix)
                    }));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&dir, e)),
        }
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let path = dir.join(&name);
            let size = match sized {
                true => Some(
                    parse_size(&name[prefix.len()..name.len() - suffix.len()]).map_err(|e| {
                        Error::File {
                            file: path.clone(),
                            msg: format!("cannot read the size from the file name: {e}"),
                        }
                    })?,
                ),
                false => None,
            };
            if let Some(text) = read_text(&path)? {
                out.push((format!("{sub}/{name}"), size, path, text));
            }
        }
        if out.is_empty() {
            self.missing.push(pattern.to_string());
        }
        Ok(out)
    }

    fn note_empty(&mut self, rel: &str, empty: bool, what: &str) {
        if empty {
            self.empty.push(format!("{rel}: {what}"));
        }
    }

    /// Reads one reference's inputs; `None`: not measured (no input).
    fn values(&mut self, input: &str, source: &Source) -> Result<Option<BySize<f64>>> {
        let mut all = BySize::default();
        match *source {
            Source::Perftest(table, column) => {
                let files = self.family(input, false)?;
                if files.is_empty() {
                    return Ok(None);
                }
                for (rel, _, path, text) in files {
                    let rows = parse_perftest(table, &text, &path)?;
                    self.note_empty(&rel, rows.is_empty(), "no result rows");
                    all.merge(rows.map(|r| r[column]));
                }
            }
            Source::Qperf(test, kind) => {
                let path = self.dir.join(input);
                let Some(text) = read_text(&path)? else {
                    self.missing.push(input.to_string());
                    return Ok(None);
                };
                let rows = parse_qperf(&text, &path, test, kind)?;
                self.note_empty(input, rows.is_empty(), "no result blocks");
                for f in &rows.failures {
                    self.empty.push(format!("{input}: {f}"));
                }
                let div = if kind == QperfKind::Bandwidth {
                    MB
                } else {
                    1.0
                };
                all = rows.map(|v| v / div);
            }
            Source::Ucx(column) => {
                let files = self.family(input, true)?;
                if files.is_empty() {
                    return Ok(None);
                }
                for (rel, size, path, text) in files {
                    let v = parse_ucx(&text, &path)?.map(|r| r[column]);
                    self.note_empty(&rel, v.is_none(), "no `Final:` line");
                    all.add(size.unwrap_or(0), v.filter(|v| *v > 0.0 && v.is_finite()));
                }
            }
            Source::Socket(mode, f) => {
                let Some(doc) = self.pingpong(input, mode)?.doc else {
                    return Ok(None);
                };
                all.rows = doc.results.iter().map(|r| (r.size, f(r))).collect();
            }
        }
        Ok(Some(all))
    }

    fn transport(
        &mut self,
        name: &'static str,
        title: &'static str,
        specs: &[Spec],
    ) -> Result<Transport> {
        let sub = match name {
            "rdma" => "guest",
            "shm" => "shm",
            _ => "host",
        };
        let lat = self.pingpong(&format!("{sub}/rdmx-lat.json"), "latency")?;
        let bw = self.pingpong(&format!("{sub}/rdmx-bw.json"), "bandwidth")?;
        let (mut lat_refs, mut bw_refs) = (Vec::new(), Vec::new());
        for Spec(label, legend, input, unusable_why, is_bw, source) in specs {
            let values = self.values(input, source)?;
            let r = Reference {
                label,
                legend,
                input,
                unusable_why,
                unusable: values
                    .as_ref()
                    .map(|v| v.unusable.clone())
                    .unwrap_or_default(),
                values: values.map(|v| v.rows),
            };
            if *is_bw {
                bw_refs.push(r)
            } else {
                lat_refs.push(r)
            }
        }
        let mut thresholds = BTreeMap::new();
        for (rel, t, path, text) in self.family(&format!("{sub}/threshold-<T>.json"), true)? {
            let doc = PingpongDoc::from_json(&text, &path)?;
            if doc.is_bandwidth() {
                let msg = "a threshold run must be a latency-mode document".into();
                return Err(Error::File { file: path, msg });
            }
            self.note_empty(&rel, doc.results.is_empty(), "no results");
            thresholds.insert(t.unwrap_or(0), doc);
        }
        Ok(Transport {
            name,
            sub,
            title,
            lat,
            bw,
            lat_refs,
            bw_refs,
            thresholds,
        })
    }
}

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
        let rdma = l.transport("rdma", "RDMA (Soft-RoCE)", &RDMA_REFS)?;
        let tcp = l.transport("tcp", "TCP (loopback)", &TCP_REFS)?;
        let shm = l.transport("shm", "shared memory (two processes, one host)", &SHM_REFS)?;
        // The sections scripts/bench-hotpath, bench-endpoints, bench-rma, bench-async and
        // bench-twonode wrote.
        let mut sections = Vec::new();
        for name in [
            "hotpath.md",
            "endpoints.md",
            "rma.md",
            "async.md",
            "twonode.md",
        ] {
            sections.extend(read_text(&dir.join(name))?);
        }
        Ok(RunData {
            meta,
            missing: l.missing,
            empty: l.empty,
            rdma,
            tcp,
            shm,
            sections,
        })
    }
}
