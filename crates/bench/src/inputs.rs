//! Parsers for the raw outputs a benchmark run leaves behind: perftest (`ib_send_lat`,
//! `ib_read_bw`), qperf, `ucx_perftest` client outputs and `meta.env`.
//!
//! Every parser takes the file's text plus its path (for error messages only). Syntax errors
//! are [`Error::Parse`] with the 1-based line; a file that parses but holds no usable result
//! is not an error (the report says "not measured" and why).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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
    fn add(&mut self, size: u64, row: Option<T>) {
        match row {
            Some(r) => {
                self.unusable.remove(&size);
                self.rows.entry(size).or_insert(r);
            }
            None => {
                if !self.rows.contains_key(&size) {
                    self.unusable.insert(size);
                }
            }
        }
    }

    /// Whether the output held no row at all (usable or not) and no failure.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.unusable.is_empty() && self.failures.is_empty()
    }

    /// Merges `other` in (rows already present win).
    pub fn merge(&mut self, other: BySize<T>) {
        self.failures.extend(other.failures);
        for (s, r) in other.rows {
            self.add(s, Some(r));
        }
        for s in other.unusable {
            self.add(s, None);
        }
    }
}

fn number(tok: &str, file: &Path, line: usize, column: &str) -> Result<f64> {
    tok.parse::<f64>().map_err(|_| {
        Error::parse(
            file,
            line,
            format!("column {column}: `{tok}` is not a number"),
        )
    })
}

fn integer(tok: &str, file: &Path, line: usize, column: &str) -> Result<u64> {
    tok.parse::<u64>().map_err(|_| {
        Error::parse(
            file,
            line,
            format!("column {column}: `{tok}` is not a whole number"),
        )
    })
}

/// perftest data rows: lines whose first field is a whole number, with at least `columns`
/// fields. Calls `f(line_no, fields)` for each.
fn perftest_rows<'a>(
    text: &'a str,
    file: &Path,
    columns: &[&str],
    mut f: impl FnMut(usize, &[&'a str]) -> Result<()>,
) -> Result<()> {
    for (i, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(first) = fields.first() else {
            continue;
        };
        if first.parse::<u64>().is_err() {
            continue;
        }
        if fields.len() < columns.len() {
            return Err(Error::parse(
                file,
                i + 1,
                format!(
                    "data row has {} fields, expected {} ({})",
                    fields.len(),
                    columns.len(),
                    columns.join(" ")
                ),
            ));
        }
        f(i + 1, &fields)?;
    }
    Ok(())
}

/// One `ib_send_lat` result row (all times in µs, one-way as perftest reports them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerftestLat {
    /// `#bytes`.
    pub bytes: u64,
    /// `#iterations`.
    pub iterations: u64,
    /// `t_min`.
    pub t_min: f64,
    /// `t_max`.
    pub t_max: f64,
    /// `t_typical` (perftest's median).
    pub t_typical: f64,
    /// `t_avg`.
    pub t_avg: f64,
    /// `t_stdev` (may be NaN even in a usable row: perftest overflows it for large sizes).
    pub t_stdev: f64,
    /// 99% percentile.
    pub p99: f64,
    /// 99.9% percentile.
    pub p999: f64,
}

const LAT_COLUMNS: [&str; 9] = [
    "#bytes",
    "#iterations",
    "t_min",
    "t_max",
    "t_typical",
    "t_avg",
    "t_stdev",
    "99%",
    "99.9%",
];

/// Parses `ib_send_lat` client output (one size, or `-a`). A row whose `t_min`, `t_typical`
/// or `t_avg` is `inf`/`nan` (clock-correlation failure) counts as missing.
pub fn parse_perftest_lat(text: &str, file: &Path) -> Result<BySize<PerftestLat>> {
    let mut out = BySize::default();
    perftest_rows(text, file, &LAT_COLUMNS, |line, f| {
        let n = |i: usize| number(f[i], file, line, LAT_COLUMNS[i]);
        let row = PerftestLat {
            bytes: integer(f[0], file, line, LAT_COLUMNS[0])?,
            iterations: integer(f[1], file, line, LAT_COLUMNS[1])?,
            t_min: n(2)?,
            t_max: n(3)?,
            t_typical: n(4)?,
            t_avg: n(5)?,
            t_stdev: n(6)?,
            p99: n(7)?,
            p999: n(8)?,
        };
        let usable = [row.t_min, row.t_typical, row.t_avg]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0);
        out.add(row.bytes, usable.then_some(row));
        Ok(())
    })?;
    Ok(out)
}

/// One `ib_read_bw` result row (MB = 2^20 bytes, as perftest counts).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerftestBw {
    /// `#bytes`.
    pub bytes: u64,
    /// `#iterations`.
    pub iterations: u64,
    /// `BW peak[MB/sec]`.
    pub bw_peak_mbs: f64,
    /// `BW average[MB/sec]`.
    pub bw_avg_mbs: f64,
    /// `MsgRate[Mpps]`.
    pub msg_rate_mpps: f64,
}

const BW_COLUMNS: [&str; 5] = [
    "#bytes",
    "#iterations",
    "BW peak[MB/sec]",
    "BW average[MB/sec]",
    "MsgRate[Mpps]",
];

/// Parses `ib_read_bw` (or any perftest `_bw`) client output. A row whose average is not a
/// positive finite number counts as missing.
pub fn parse_perftest_bw(text: &str, file: &Path) -> Result<BySize<PerftestBw>> {
    let mut out = BySize::default();
    perftest_rows(text, file, &BW_COLUMNS, |line, f| {
        let n = |i: usize| number(f[i], file, line, BW_COLUMNS[i]);
        let row = PerftestBw {
            bytes: integer(f[0], file, line, BW_COLUMNS[0])?,
            iterations: integer(f[1], file, line, BW_COLUMNS[1])?,
            bw_peak_mbs: n(2)?,
            bw_avg_mbs: n(3)?,
            msg_rate_mpps: n(4)?,
        };
        let usable = row.bw_avg_mbs.is_finite() && row.bw_avg_mbs > 0.0;
        out.add(row.bytes, usable.then_some(row));
        Ok(())
    })?;
    Ok(out)
}

/// What a qperf file measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QperfKind {
    /// `latency = N ns|us|ms|sec`, converted to µs.
    Latency,
    /// `bw = N bytes/sec|KB/sec|MB/sec|GB/sec` (SI), converted to bytes/s.
    Bandwidth,
}

/// Parses the output of `qperf -cm1 ADDR -vu -oo msg_size:... TEST` (or several
/// `qperf ... -vu -m SIZE TEST` runs appended): blocks of `TEST:` followed by `key = value`
/// lines. Values are µs ([`QperfKind::Latency`]) or bytes/s ([`QperfKind::Bandwidth`]) by
/// exact message size. `bw = 0` (the test did not complete) counts as missing; a block with
/// neither value nor size (qperf printed an error instead) is recorded in
/// [`BySize::failures`]; a value without `msg_size` (qperf run without `-vu`) is an error.
/// `test` is the expected block name (`rc_lat`, ...).
pub fn parse_qperf(text: &str, file: &Path, test: &str, kind: QperfKind) -> Result<BySize<f64>> {
    struct Block {
        line: usize,
        value: Option<f64>,
        size: Option<u64>,
        message: Option<String>,
    }
    let metric = match kind {
        QperfKind::Latency => "latency",
        QperfKind::Bandwidth => "bw",
    };
    let mut out = BySize::default();
    let mut finish = |b: Block| -> Result<()> {
        match (b.value, b.size) {
            (Some(value), Some(size)) => out.add(size, (value > 0.0).then_some(value)),
            (Some(_), None) => {
                return Err(Error::parse(
                    file,
                    b.line,
                    format!("`{test}:` block has no `msg_size =` line (run qperf with -vu)"),
                ))
            }
            (None, Some(size)) => out.add(size, None),
            (None, None) => out.failures.push(format!(
                "line {}: {}",
                b.line,
                b.message
                    .unwrap_or_else(|| format!("`{test}` printed no result"))
            )),
        }
        Ok(())
    };
    let mut block: Option<Block> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let no = i + 1;
        if let Some(name) = line.strip_suffix(':') {
            if !name.is_empty() && !name.contains(char::is_whitespace) && !name.contains('=') {
                if name != test {
                    return Err(Error::parse(
                        file,
                        no,
                        format!("result of `{name}`, expected `{test}`"),
                    ));
                }
                if let Some(b) = block.take() {
                    finish(b)?;
                }
                block = Some(Block {
                    line: no,
                    value: None,
                    size: None,
                    message: None,
                });
                continue;
            }
        }
        let Some(b) = block.as_mut() else {
            continue;
        };
        let Some((key, value)) = line.split_once('=') else {
            if b.message.is_none() && !line.is_empty() {
                b.message = Some(line.to_string());
            }
            continue;
        };
        let key = key.trim();
        let value = value.trim();
        if key == metric {
            b.value = Some(
                match kind {
                    QperfKind::Latency => qperf_latency_us(value),
                    QperfKind::Bandwidth => qperf_bw_bytes(value),
                }
                .map_err(|m| Error::parse(file, no, m))?,
            );
        } else if key == "msg_size" {
            b.size = Some(qperf_msg_size(value).map_err(|m| Error::parse(file, no, m))?);
        }
    }
    if let Some(b) = block.take() {
        finish(b)?;
    }
    Ok(out)
}

fn split_value(v: &str) -> Result<(f64, &str), String> {
    let mut it = v.splitn(2, char::is_whitespace);
    let num = it.next().unwrap_or("");
    let unit = it.next().unwrap_or("").trim();
    let n: f64 = num
        .replace(',', "")
        .parse()
        .map_err(|_| format!("`{v}`: `{num}` is not a number"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(format!("`{v}`: not a valid measurement"));
    }
    Ok((n, unit))
}

fn qperf_latency_us(v: &str) -> Result<f64, String> {
    let (n, unit) = split_value(v)?;
    let scale = match unit {
        "ns" => 1e-3,
        "us" => 1.0,
        "ms" => 1e3,
        "sec" | "s" => 1e6,
        _ => return Err(format!("`{v}`: unknown latency unit `{unit}`")),
    };
    Ok(n * scale)
}

fn qperf_bw_bytes(v: &str) -> Result<f64, String> {
    let (n, unit) = split_value(v)?;
    let scale = match unit {
        "bytes/sec" | "B/sec" => 1.0,
        "KB/sec" => 1e3,
        "MB/sec" => 1e6,
        "GB/sec" => 1e9,
        "TB/sec" => 1e12,
        _ => return Err(format!("`{v}`: unknown bandwidth unit `{unit}`")),
    };
    Ok(n * scale)
}

fn qperf_msg_size(v: &str) -> Result<u64, String> {
    if let (Some(open), Some(close)) = (v.find('('), v.rfind(')')) {
        if open < close {
            let exact = v[open + 1..close].replace(',', "");
            return exact
                .trim()
                .parse()
                .map_err(|_| format!("msg_size `{v}`: `{exact}` is not a byte count"));
        }
    }
    let (n, unit) = split_value(v)?;
    let scale: f64 = match unit {
        "" | "byte" | "bytes" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        _ => return Err(format!("msg_size `{v}`: unknown unit `{unit}`")),
    };
    let bytes = n * scale;
    if bytes.fract() != 0.0 || bytes > 1e18 {
        return Err(format!("msg_size `{v}` is not a whole byte count"));
    }
    Ok(bytes as u64)
}

/// The `Final:` line of `ucx_perftest` client output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UcxFinal {
    /// Iterations.
    pub iterations: u64,
    /// Latency (tag_lat: one-way) or overhead (tag_bw), 50th percentile ("typical"), µs.
    pub typical_us: f64,
    /// Average latency/overhead, µs.
    pub average_us: f64,
    /// Overall latency/overhead, µs.
    pub overall_us: f64,
    /// Average bandwidth, MB/s (MB = 2^20).
    pub bw_average_mbs: f64,
    /// Overall bandwidth, MB/s (MB = 2^20).
    pub bw_overall_mbs: f64,
    /// Average message rate, msg/s.
    pub rate_average: f64,
    /// Overall message rate, msg/s.
    pub rate_overall: f64,
}

/// Parses `ucx_perftest` client output: the last `Final:` line. `None` if there is none
/// (the run did not finish).
pub fn parse_ucx(text: &str, file: &Path) -> Result<Option<UcxFinal>> {
    const COLS: [&str; 8] = [
        "iterations",
        "typical latency",
        "average latency",
        "overall latency",
        "average bandwidth",
        "overall bandwidth",
        "average message rate",
        "overall message rate",
    ];
    let mut last = None;
    for (i, line) in text.lines().enumerate() {
        let Some(rest) = line.trim().strip_prefix("Final:") else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() < COLS.len() {
            return Err(Error::parse(
                file,
                i + 1,
                format!(
                    "`Final:` line has {} values, expected {}",
                    f.len(),
                    COLS.len()
                ),
            ));
        }
        let n = |k: usize| -> Result<f64> {
            let v = number(f[k], file, i + 1, COLS[k])?;
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(Error::parse(
                    file,
                    i + 1,
                    format!("{}: `{}` is not a valid measurement", COLS[k], f[k]),
                ))
            }
        };
        last = Some(UcxFinal {
            iterations: integer(f[0], file, i + 1, COLS[0])?,
            typical_us: n(1)?,
            average_us: n(2)?,
            overall_us: n(3)?,
            bw_average_mbs: n(4)?,
            bw_overall_mbs: n(5)?,
            rate_average: n(6)?,
            rate_overall: n(7)?,
        });
    }
    Ok(last)
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
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        {
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
        let r = parse_perftest_lat(text, p()).unwrap();
        assert_eq!(r.rows.keys().copied().collect::<Vec<_>>(), vec![8, 32]);
        assert_eq!(r.rows[&8].t_typical, 2.5, "first usable row wins");
        assert!(r.rows[&32].t_stdev.is_nan());
        assert_eq!(r.unusable.iter().copied().collect::<Vec<_>>(), vec![16]);
    }

    #[test]
    fn perftest_errors_name_line() {
        let e = parse_perftest_lat("hdr\n 8 100 1.0 2.0\n", Path::new("d/x.txt")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "d/x.txt:2: data row has 4 fields, expected 9 (#bytes #iterations t_min t_max \
             t_typical t_avg t_stdev 99% 99.9%)"
        );
        let e = parse_perftest_bw(" 8 100 1.0 x 0.1\n", p()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.txt:1: column BW average[MB/sec]: `x` is not a number"
        );
        assert!(parse_perftest_bw("nothing here\n", p()).unwrap().is_empty());
    }

    #[test]
    fn qperf_units() {
        assert_eq!(qperf_latency_us("294 us"), Ok(294.0));
        assert_eq!(qperf_latency_us("1.5 ms"), Ok(1500.0));
        assert_eq!(qperf_latency_us("900 ns"), Ok(0.9));
        assert_eq!(qperf_latency_us("2 sec"), Ok(2e6));
        assert!(qperf_latency_us("2 fortnights").is_err());
        assert_eq!(qperf_bw_bytes("446 KB/sec"), Ok(446e3));
        assert_eq!(qperf_bw_bytes("1.2 GB/sec"), Ok(1.2e9));
        assert_eq!(qperf_bw_bytes("0 bytes/sec"), Ok(0.0));
        assert!(qperf_bw_bytes("x MB/sec").is_err());
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
        let e = parse_qperf(
            "rc_lat:\n    latency  =  432 us\n",
            p(),
            "rc_lat",
            QperfKind::Latency,
        )
        .unwrap_err();
        assert!(e
            .to_string()
            .contains("t.txt:1: `rc_lat:` block has no `msg_size =`"));
        let e = parse_qperf(
            "rc_lat:\n latency = 4 parsecs\n",
            p(),
            "rc_lat",
            QperfKind::Latency,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("t.txt:2: "), "{e}");
        // qperf's own failure report: no value, no size.
        let failed = "rc_lat:\nfailed to find any InfiniBand devices: Function not implemented\n\
                      rc_lat:\n    msg_size = 8 bytes\n";
        let r = parse_qperf(failed, p(), "rc_lat", QperfKind::Latency).unwrap();
        assert!(r.rows.is_empty());
        assert_eq!(r.unusable.iter().copied().collect::<Vec<_>>(), vec![8]);
        assert_eq!(
            r.failures,
            vec!["line 1: failed to find any InfiniBand devices: Function not implemented"]
        );
    }

    #[test]
    fn ucx_final() {
        let text =
            "| Stage | ...\nFinal:   1000  10.976  13.512  13.512  0.56  0.56  74008  74008\n";
        let f = parse_ucx(text, p()).unwrap().unwrap();
        assert_eq!(f.iterations, 1000);
        assert_eq!(f.typical_us, 10.976);
        assert_eq!(f.bw_overall_mbs, 0.56);
        assert_eq!(parse_ucx("no result\n", p()).unwrap(), None);
        let e = parse_ucx("x\nFinal: 1000 1.0\n", p()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.txt:2: `Final:` line has 2 values, expected 8"
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
