//! Parsers for the raw outputs a benchmark run leaves behind: perftest (`ib_send_lat`,
//! `ib_read_bw`), qperf, `ucx_perftest` client outputs and `meta.env`, and [`figure`], the one
//! number a script wants from such an output (`rdmx-bench figure`).
//!
//! perftest's rows and ucx_perftest's `Final:` line are tables of whitespace-separated
//! columns, each described by a [`Table`]; qperf prints `key = value` blocks. Every parser
//! takes the file's text plus its path (for error messages only). Syntax errors are
//! [`Error::Parse`] with the 1-based line; a file that parses but holds no usable result is
//! not an error (the report says "not measured" and why).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::schema::MB;
use crate::{Error, Result};

/// Rows of one tool's output by message size, plus the sizes whose only rows were unusable
/// (perftest's `inf`/`-nan` clock-correlation failures, qperf's `bw = 0`).
#[derive(Debug, Clone, PartialEq)]
pub struct BySize<T> {
    /// Usable rows by size in bytes (the first usable row when a size repeats).
    pub rows: BTreeMap<u64, T>,
    /// Sizes that appeared only in unusable rows.
    pub unusable: BTreeSet<u64>,
    /// Runs that failed without saying for which size (e.g. a qperf block holding only an
    /// error message), as `line N: message`.
    pub failures: Vec<String>,
}

impl<T> Default for BySize<T> {
    fn default() -> Self {
        BySize {
            rows: BTreeMap::new(),
            unusable: BTreeSet::new(),
            failures: Vec::new(),
        }
    }
}

impl<T> BySize<T> {
    /// Adds a usable row (`Some`) or an unusable one for `size`; the first usable row wins.
    pub fn add(&mut self, size: u64, row: Option<T>) {
        match row {
            Some(r) => {
                self.unusable.remove(&size);
                self.rows.entry(size).or_insert(r);
            }
            None if !self.rows.contains_key(&size) => {
                self.unusable.insert(size);
            }
            None => {}
        }
    }

    /// Whether the output held no row at all (usable or not) and no failure.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.unusable.is_empty() && self.failures.is_empty()
    }

    /// Merges `other` in (rows already present win).
    pub fn merge(&mut self, other: BySize<T>) {
        self.failures.extend(other.failures);
        other
            .rows
            .into_iter()
            .for_each(|(s, r)| self.add(s, Some(r)));
        other.unusable.into_iter().for_each(|s| self.add(s, None));
    }

    /// The same sizes with each row mapped by `f`.
    pub fn map<U>(self, f: impl Fn(T) -> U) -> BySize<U> {
        BySize {
            rows: self.rows.into_iter().map(|(s, r)| (s, f(r))).collect(),
            unusable: self.unusable,
            failures: self.failures,
        }
    }
}

/// One result row of a [`Table`]: its values by column name.
pub type Row = BTreeMap<&'static str, f64>;

/// A tool output whose results are lines of whitespace-separated columns.
#[derive(Debug)]
pub struct Table {
    /// What starts a result line (and is not a column); `None`: a whole number, the first
    /// column (perftest's `#bytes`).
    pub lead: Option<&'static str>,
    /// What a result line is called in errors.
    pub what: &'static str,
    /// The column names, in order; the first `whole` are whole numbers.
    pub columns: &'static [&'static str],
    /// How many leading columns are whole numbers.
    pub whole: usize,
    /// Whether a row holds a result (perftest prints `inf`/`-nan` rows when its clock
    /// correlation fails); `None`: every value must be a finite measurement ≥ 0, else the
    /// line is an error.
    pub usable: Option<fn(&Row) -> bool>,
}

fn finite(r: &Row, cols: &[&str], min_exclusive: bool) -> bool {
    cols.iter().all(|c| {
        let v = r[c];
        v.is_finite() && if min_exclusive { v > 0.0 } else { v >= 0.0 }
    })
}

/// `ib_send_lat` client output (times in µs, one-way). A row whose `t_min`, `t_typical` or
/// `t_avg` is `inf`/`nan` counts as missing; `t_stdev` may be NaN in a usable row.
pub const IB_SEND_LAT: Table = Table {
    lead: None,
    what: "data row",
    columns: &[
        "#bytes",
        "#iterations",
        "t_min",
        "t_max",
        "t_typical",
        "t_avg",
        "t_stdev",
        "99%",
        "99.9%",
    ],
    whole: 2,
    usable: Some(|r| finite(r, &["t_min", "t_typical", "t_avg"], false)),
};

/// `ib_read_bw` (or any perftest `_bw`) client output (MB = 2^20 bytes). A row whose average
/// is not a positive finite number counts as missing.
pub const IB_READ_BW: Table = Table {
    lead: None,
    what: "data row",
    columns: &[
        "#bytes",
        "#iterations",
        "BW peak[MB/sec]",
        "BW average[MB/sec]",
        "MsgRate[Mpps]",
    ],
    whole: 2,
    usable: Some(|r| finite(r, &["BW average[MB/sec]"], true)),
};

/// `ucx_perftest`'s `Final:` line: latency (tag_lat: one-way) or overhead (tag_bw) in µs,
/// bandwidth in MB/s (2^20), message rate in msg/s.
pub const UCX_PERFTEST: Table = Table {
    lead: Some("Final:"),
    what: "`Final:` line",
    columns: &[
        "iterations",
        "typical latency",
        "average latency",
        "overall latency",
        "average bandwidth",
        "overall bandwidth",
        "average message rate",
        "overall message rate",
    ],
    whole: 1,
    usable: None,
};

/// The result lines of `text` as `t` describes them, each with its 1-based line number and
/// whether it is usable.
pub fn parse_table(t: &Table, text: &str, file: &Path) -> Result<Vec<(usize, Row, bool)>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let no = i + 1;
        let rest = match t.lead {
            Some(lead) => match line.trim().strip_prefix(lead) {
                Some(rest) => rest,
                None => continue,
            },
            None => line,
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if t.lead.is_none() && !f.first().is_some_and(|v| v.parse::<u64>().is_ok()) {
            continue;
        }
        if f.len() < t.columns.len() {
            let msg = format!(
                "{} has {} fields, expected {} ({})",
                t.what,
                f.len(),
                t.columns.len(),
                t.columns.join(" ")
            );
            return Err(Error::parse(file, no, msg));
        }
        let mut row = Row::new();
        for (k, (&col, tok)) in t.columns.iter().zip(&f).enumerate() {
            let bad = |what: &str| Error::parse(file, no, format!("column {col}: `{tok}` {what}"));
            let v = if k < t.whole {
                tok.parse::<u64>()
                    .map_err(|_| bad("is not a whole number"))? as f64
            } else {
                tok.parse::<f64>().map_err(|_| bad("is not a number"))?
            };
            if t.usable.is_none() && !(v.is_finite() && v >= 0.0) {
                return Err(bad("is not a valid measurement"));
            }
            row.insert(col, v);
        }
        let usable = t.usable.map_or(true, |u| u(&row));
        out.push((no, row, usable));
    }
    Ok(out)
}

/// Parses perftest client output (one size, or `-a`) by `#bytes`.
pub fn parse_perftest(t: &Table, text: &str, file: &Path) -> Result<BySize<Row>> {
    let mut out = BySize::default();
    for (_, row, usable) in parse_table(t, text, file)? {
        out.add(row["#bytes"] as u64, usable.then_some(row));
    }
    Ok(out)
}

/// Parses `ucx_perftest` client output: the last `Final:` line, `None` if there is none (the
/// run did not finish).
pub fn parse_ucx(text: &str, file: &Path) -> Result<Option<Row>> {
    Ok(parse_table(&UCX_PERFTEST, text, file)?.pop().map(|r| r.1))
}

/// What a qperf file measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QperfKind {
    /// `latency = N ns|us|ms|sec`, converted to µs.
    Latency,
    /// `bw = N bytes/sec|KB/sec|MB/sec|GB/sec` (SI), converted to bytes/s.
    Bandwidth,
}

const LATENCY_US: &[(&str, f64)] = &[
    ("ns", 1e-3),
    ("us", 1.0),
    ("ms", 1e3),
    ("sec", 1e6),
    ("s", 1e6),
];
const BW_BYTES: &[(&str, f64)] = &[
    ("bytes/sec", 1.0),
    ("B/sec", 1.0),
    ("KB/sec", 1e3),
    ("MB/sec", 1e6),
    ("GB/sec", 1e9),
    ("TB/sec", 1e12),
];
const SIZE_BYTES: &[(&str, f64)] = &[
    ("", 1.0),
    ("byte", 1.0),
    ("bytes", 1.0),
    ("B", 1.0),
    ("KiB", 1024.0),
    ("MiB", 1048576.0),
    ("GiB", 1073741824.0),
    ("KB", 1e3),
    ("MB", 1e6),
    ("GB", 1e9),
];

/// `N UNIT` (N may have thousands commas) times UNIT's scale in `units`.
fn scaled(v: &str, units: &[(&str, f64)], what: &str) -> Result<f64, String> {
    let (num, unit) = v.split_once(char::is_whitespace).unwrap_or((v, ""));
    let unit = unit.trim();
    let n: f64 =
        (num.replace(',', "").parse()).map_err(|_| format!("`{v}`: `{num}` is not a number"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(format!("`{v}`: not a valid measurement"));
    }
    let scale = units.iter().find(|u| u.0 == unit).map(|u| u.1);
    Ok(n * scale.ok_or(format!("`{v}`: unknown {what} unit `{unit}`"))?)
}

/// qperf's `msg_size = 4 KiB (4,096)`: the exact count in brackets when there is one.
fn qperf_msg_size(v: &str) -> Result<u64, String> {
    if let Some((exact, _)) = v.split_once('(').and_then(|(_, t)| t.rsplit_once(')')) {
        let exact = exact.replace(',', "");
        return (exact.trim().parse())
            .map_err(|_| format!("msg_size `{v}`: `{exact}` is not a byte count"));
    }
    let bytes = scaled(v, SIZE_BYTES, "size").map_err(|e| format!("msg_size {e}"))?;
    if bytes.fract() != 0.0 || bytes > 1e18 {
        return Err(format!("msg_size `{v}` is not a whole byte count"));
    }
    Ok(bytes as u64)
}

/// Parses the output of `qperf -cm1 ADDR -vu -oo msg_size:... TEST` (or several
/// `qperf ... -vu -m SIZE TEST` runs appended): blocks of `TEST:` followed by `key = value`
/// lines. Values are µs ([`QperfKind::Latency`]) or bytes/s ([`QperfKind::Bandwidth`]) by
/// exact message size. `bw = 0` (the test did not complete) counts as missing; a block with
/// neither value nor size (qperf printed an error instead) is recorded in
/// [`BySize::failures`]; a value without `msg_size` (qperf run without `-vu`) is an error.
/// `test` is the expected block name (`rc_lat`, ...).
pub fn parse_qperf(text: &str, file: &Path, test: &str, kind: QperfKind) -> Result<BySize<f64>> {
    /// A block: its line, value, size and first other line (qperf's error message).
    type Block = (usize, Option<f64>, Option<u64>, Option<String>);
    let (metric, units) = match kind {
        QperfKind::Latency => ("latency", LATENCY_US),
        QperfKind::Bandwidth => ("bw", BW_BYTES),
    };
    let what = if metric == "bw" { "bandwidth" } else { metric };
    let mut out = BySize::default();
    let mut finish = |(line, value, size, message): Block| {
        match (value, size) {
            (Some(_), None) => {
                let msg = format!("`{test}:` block has no `msg_size =` line (run qperf with -vu)");
                return Err(Error::parse(file, line, msg));
            }
            (value, Some(size)) => out.add(size, value.filter(|&v| v > 0.0)),
            (None, None) => {
                let m = message.unwrap_or_else(|| format!("`{test}` printed no result"));
                out.failures.push(format!("line {line}: {m}"));
            }
        }
        Ok(())
    };
    let mut block: Option<Block> = None;
    for (i, raw) in text.lines().enumerate() {
        let (line, no) = (raw.trim(), i + 1);
        if let Some(name) = line.strip_suffix(':') {
            if !name.is_empty() && !name.contains(char::is_whitespace) && !name.contains('=') {
                if name != test {
                    let msg = format!("result of `{name}`, expected `{test}`");
                    return Err(Error::parse(file, no, msg));
                }
                if let Some(b) = block.replace((no, None, None, None)) {
                    finish(b)?;
                }
                continue;
            }
        }
        let Some(b) = block.as_mut() else { continue };
        match line.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
            Some((key, v)) if key == metric => {
                b.1 = Some(scaled(v, units, what).map_err(|m| Error::parse(file, no, m))?)
            }
            Some(("msg_size", v)) => {
                b.2 = Some(qperf_msg_size(v).map_err(|m| Error::parse(file, no, m))?)
            }
            Some(_) => {}
            None if b.3.is_none() && !line.is_empty() => b.3 = Some(line.to_string()),
            None => {}
        }
    }
    block.map_or(Ok(()), finish)?;
    Ok(out)
}

/// Parses `meta.env`: `KEY=VALUE` lines (an optional `export `, blank lines and `#`
/// comments allowed; a value in matching single or double quotes is unquoted). Keeps order.
pub fn parse_meta(text: &str, file: &Path) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            return Err(Error::parse(
                file,
                i + 1,
                format!("`{line}` is not KEY=VALUE"),
            ));
        };
        let key = key.trim();
        let key_char = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
        if key.is_empty() || !key.chars().all(key_char) {
            return Err(Error::parse(file, i + 1, format!("bad key `{key}`")));
        }
        let mut value = value.trim();
        for q in ['"', '\''] {
            if value.len() >= 2 && value.starts_with(q) && value.ends_with(q) {
                value = &value[1..value.len() - 1];
            }
        }
        match out.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value.to_string(),
            None => out.push((key.to_string(), value.to_string())),
        }
    }
    Ok(out)
}

/// The figures `rdmx-bench figure` extracts, for the scripts that compare one number per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Figure {
    /// `ib_send_lat`'s `t_avg` (one-way µs) at `--size`
    IbLat,
    /// `ib_read_bw`'s `BW average` (MB/s) at `--size`
    IbBw,
    /// qperf `rc_lat`'s latency (µs), at `--size` or the last
    RcLat,
    /// qperf `rc_rdma_read_bw`'s bandwidth (MB/s, 2^20, two decimals), at `--size` or the last
    RcRdmaReadBw,
    /// ucx_perftest's overall latency (µs)
    UcxLat,
    /// ucx_perftest's overall bandwidth (MB/s)
    UcxBw,
    /// ucx_perftest's overall message rate (msg/s)
    UcxRate,
}

/// The figure `which` in a tool output, `None` when the output holds no usable one (the run
/// failed, or not at `size`). A row at `size` (perftest) or, without `size`, the last row.
pub fn figure(which: Figure, text: &str, file: &Path, size: Option<u64>) -> Result<Option<f64>> {
    let pick = |rows: BySize<f64>| match size {
        Some(s) => rows.rows.get(&s).copied(),
        None => rows.rows.values().next_back().copied(),
    };
    let perftest = |t: &Table, col: &str| -> Result<Option<f64>> {
        Ok(pick(parse_perftest(t, text, file)?.map(|r| r[col])))
    };
    let qperf = |test: &str, kind, div: f64| -> Result<Option<f64>> {
        // MB/s to two decimals (qperf's SI figures have three digits or so).
        let round = |v: f64| {
            if div == MB {
                (v / div * 100.0).round() / 100.0
            } else {
                v
            }
        };
        Ok(pick(parse_qperf(text, file, test, kind)?.map(round)))
    };
    let ucx = |col: &str| Ok(parse_ucx(text, file)?.map(|r| r[col]));
    match which {
        Figure::IbLat => perftest(&IB_SEND_LAT, "t_avg"),
        Figure::IbBw => perftest(&IB_READ_BW, "BW average[MB/sec]"),
        Figure::RcLat => qperf("rc_lat", QperfKind::Latency, 1.0),
        Figure::RcRdmaReadBw => qperf("rc_rdma_read_bw", QperfKind::Bandwidth, MB),
        Figure::UcxLat => ucx("overall latency"),
        Figure::UcxBw => ucx("overall bandwidth"),
        Figure::UcxRate => ucx("overall message rate"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("t.txt")
    }

    #[test]
    fn perftest_lat_rows_and_failures() {
        let text = " #bytes #iterations t_min[usec] ...\n\
                    \x20 8  100  1.0  9.0  2.5  3.0  0.5  8.0  9.0\n\
                    Correlation coefficient r^2: 0.5 < 0.9\n\
                    \x20 16 100  inf  inf  inf  inf  -nan inf  inf\n\
                    \x20 32 100  1.0  9.0  2.5  3.0  -nan 8.0  9.0\n\
                    \x20 8  100  5.0  9.0  5.5  6.0  0.5  8.0  9.0\n";
        let r = parse_perftest(&IB_SEND_LAT, text, p()).unwrap();
        assert_eq!(r.rows.keys().copied().collect::<Vec<_>>(), vec![8, 32]);
        assert_eq!(r.rows[&8]["t_typical"], 2.5, "first usable row wins");
        assert!(r.rows[&32]["t_stdev"].is_nan());
        assert_eq!(r.unusable.iter().copied().collect::<Vec<_>>(), vec![16]);
        assert_eq!(
            figure(Figure::IbLat, text, p(), Some(8)).unwrap(),
            Some(3.0)
        );
        assert_eq!(figure(Figure::IbLat, text, p(), Some(16)).unwrap(), None);
    }

    #[test]
    fn perftest_errors_name_line() {
        let e = parse_perftest(&IB_SEND_LAT, "hdr\n 8 100 1.0 2.0\n", Path::new("d/x.txt"));
        assert_eq!(
            e.unwrap_err().to_string(),
            "d/x.txt:2: data row has 4 fields, expected 9 (#bytes #iterations t_min t_max \
             t_typical t_avg t_stdev 99% 99.9%)"
        );
        let e = parse_perftest(&IB_READ_BW, " 8 100 1.0 x 0.1\n", p()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.txt:1: column BW average[MB/sec]: `x` is not a number"
        );
        assert!(parse_perftest(&IB_READ_BW, "nothing here\n", p())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn qperf_units() {
        let lat = |v| scaled(v, LATENCY_US, "latency");
        let bw = |v| scaled(v, BW_BYTES, "bandwidth");
        assert_eq!(lat("294 us"), Ok(294.0));
        assert_eq!(lat("1.5 ms"), Ok(1500.0));
        assert_eq!(lat("900 ns"), Ok(0.9));
        assert_eq!(lat("2 sec"), Ok(2e6));
        assert!(lat("2 fortnights").is_err());
        assert_eq!(bw("446 KB/sec"), Ok(446e3));
        assert_eq!(bw("1.2 GB/sec"), Ok(1.2e9));
        assert_eq!(bw("0 bytes/sec"), Ok(0.0));
        assert!(bw("x MB/sec").is_err());
        assert_eq!(qperf_msg_size("1 bytes"), Ok(1));
        assert_eq!(qperf_msg_size("4 KiB (4,096)"), Ok(4096));
        assert_eq!(qperf_msg_size("1 MiB (1,048,576)"), Ok(1 << 20));
        assert_eq!(qperf_msg_size("64 KiB"), Ok(65536));
        assert_eq!(qperf_msg_size("2 KB"), Ok(2000));
        assert!(qperf_msg_size("1.5 bytes").is_err());
        assert!(qperf_msg_size("4 KiB (four)").is_err());
    }

    #[test]
    fn qperf_blocks() {
        let text = "rc_bw:\n    bw = 0 bytes/sec\n    msg_size = 1 KiB (1,024)\n\
                    rc_bw:\n    bw = 2 MB/sec\n    msg_size = 64 bytes\n";
        let r = parse_qperf(text, p(), "rc_bw", QperfKind::Bandwidth).unwrap();
        assert_eq!(r.rows.get(&64), Some(&2e6));
        assert!(r.unusable.contains(&1024));
        let e = parse_qperf(text, p(), "rc_lat", QperfKind::Latency).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.txt:1: result of `rc_bw`, expected `rc_lat`"
        );
        let lat = |text| parse_qperf(text, p(), "rc_lat", QperfKind::Latency);
        let e = lat("rc_lat:\n    latency  =  432 us\n").unwrap_err();
        assert!(e
            .to_string()
            .contains("t.txt:1: `rc_lat:` block has no `msg_size =`"));
        let e = lat("rc_lat:\n latency = 4 parsecs\n").unwrap_err();
        assert!(e.to_string().starts_with("t.txt:2: "), "{e}");
        // qperf's own failure report: no value, no size.
        let failed = "rc_lat:\nfailed to find any InfiniBand devices: Function not implemented\n\
                      rc_lat:\n    msg_size = 8 bytes\n";
        let r = lat(failed).unwrap();
        assert!(r.rows.is_empty());
        assert_eq!(r.unusable.iter().copied().collect::<Vec<_>>(), vec![8]);
        assert_eq!(
            r.failures,
            vec!["line 1: failed to find any InfiniBand devices: Function not implemented"]
        );
        let two = "rc_lat:\n latency = 2 us\n msg_size = 8 bytes\nrc_lat:\n latency = 1 ms\n \
                   msg_size = 4 KiB (4,096)\n";
        assert_eq!(figure(Figure::RcLat, two, p(), None).unwrap(), Some(1000.0));
        assert_eq!(figure(Figure::RcLat, two, p(), Some(8)).unwrap(), Some(2.0));
    }

    #[test]
    fn ucx_final() {
        let text =
            "| Stage | ...\nFinal:   1000  10.976  13.512  13.512  0.56  0.56  74008  74008\n";
        let f = parse_ucx(text, p()).unwrap().unwrap();
        assert_eq!(f["iterations"], 1000.0);
        assert_eq!(f["typical latency"], 10.976);
        assert_eq!(f["overall bandwidth"], 0.56);
        assert_eq!(
            figure(Figure::UcxRate, text, p(), None).unwrap(),
            Some(74008.0)
        );
        assert_eq!(parse_ucx("no result\n", p()).unwrap(), None);
        let e = parse_ucx("x\nFinal: 1000 1.0\n", p()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("t.txt:2: `Final:` line has 2 fields, expected 8"),
            "{e}"
        );
        let e = parse_ucx("Final: 1 2 3 nan 5 6 7 8\n", p()).unwrap_err();
        assert!(e.to_string().contains("overall latency"), "{e}");
    }

    #[test]
    fn meta_env() {
        let text = "# run\ndate=2025-01-02\nexport host=\"box 1\"\n\ncpu='x86 thing'\ndate=again\n";
        let m = parse_meta(text, p()).unwrap();
        assert_eq!(
            m,
            vec![
                ("date".into(), "again".into()),
                ("host".into(), "box 1".into()),
                ("cpu".into(), "x86 thing".into()),
            ]
        );
        let e = parse_meta("date=1\njunk\n", p()).unwrap_err();
        assert_eq!(e.to_string(), "t.txt:2: `junk` is not KEY=VALUE");
        assert!(parse_meta("=x\n", p()).is_err());
    }
}
