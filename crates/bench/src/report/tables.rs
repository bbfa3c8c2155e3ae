//! Markdown formatting: numbers, ratios, tables, and the per-transport comparison section.

use super::*;

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

pub(super) fn fmt_bytes(b: u64) -> String {
    let s = format_size(b);
    if b >= 1 << 20 && !s.ends_with(" MiB") && !s.ends_with(" GiB") {
        format!("{:.2} MiB", b as f64 / MB)
    } else {
        s
    }
}

pub(super) const NOT_MEASURED: &str = "not measured";
pub(super) const DASH: &str = "–";

pub(super) fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A Markdown table; columns named in `left` are left-aligned, the others right-aligned.
pub(super) fn md_table(out: &mut String, header: &[String], rows: &[Vec<String>], left: &[&str]) {
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

/// An rdmx column: its header and how a row gives its value.
pub(super) type RdmxCol = (&'static str, fn(&PingpongRow) -> f64);

/// rdmx's latency columns (TCP shows the first two).
const LAT_COLS: [RdmxCol; 3] = [
    ("rdmx p50", p50),
    ("rdmx p99", |r| r.p99_us),
    ("rdmx mean", |r| r.mean_us),
];

/// One comparison table: rdmx columns, then each reference with its ratio against `base`.
pub(super) fn compare_table(
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
        sizes.extend(r.values.iter().flat_map(|v| v.keys()).chain(&r.unusable));
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
    header.extend(cols.iter().map(|c| c.0.to_string()));
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
            cells.push(rdmx_cell(&|r| fmt_num((c.1)(r))));
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

pub(super) fn p50(r: &PingpongRow) -> f64 {
    r.p50_us
}
pub(super) fn mbs(r: &PingpongRow) -> f64 {
    r.bytes_per_s / MB
}

pub(super) fn transport_section(out: &mut String, t: &Transport) {
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
    let lat_cols = &LAT_COLS[..if t.name == "rdma" { 3 } else { 2 }];
    compare_table(out, &t.lat, true, lat_cols, p50, &t.lat_refs);
    let window =
        t.bw.doc
            .as_ref()
            .and_then(|d| d.window)
            .map_or(String::new(), |w| format!(", rdmx window {w}"));
    let _ = writeln!(out, "### Bandwidth (MB/s{window})\n");
    let bw_cols = [("rdmx MB/s", mbs as fn(&PingpongRow) -> f64)];
    compare_table(out, &t.bw, t.name == "rdma", &bw_cols, mbs, &t.bw_refs);
}
