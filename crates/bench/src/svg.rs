//! Hand-written SVG: two log-log line charts side by side (latency and bandwidth vs size).

use std::fmt::Write as _;

use crate::sizes::format_size;

/// One line on a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Stroke/fill colour (any SVG colour).
    pub color: &'static str,
    /// `(size in bytes, value)`; points that are not positive and finite are skipped.
    pub points: Vec<(f64, f64)>,
}

/// One chart panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Title above the panel.
    pub title: String,
    /// Y axis label (unit included).
    pub y_label: String,
    /// Lines; empty series are skipped.
    pub series: Vec<Series>,
}

/// Colours: rdmx first, then the references.
pub const COLORS: [&str; 5] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"];

const W: f64 = 1000.0;
const H: f64 = 440.0;
const PANEL_W: f64 = W / 2.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 60.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;

/// Escapes text for XML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c => o.push(c),
        }
    }
    o
}

fn usable(p: &(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite() && p.0 > 0.0 && p.1 > 0.0
}

/// A log10 axis mapping.
#[derive(Debug, Clone, Copy)]
struct LogAxis {
    lo: f64,
    hi: f64,
    px0: f64,
    px1: f64,
}

impl LogAxis {
    fn map(&self, v: f64) -> f64 {
        let t = (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10());
        self.px0 + t * (self.px1 - self.px0)
    }
    fn contains(&self, v: f64) -> bool {
        v >= self.lo && v <= self.hi
    }
}

/// The size range (powers of two) covering every point of both panels.
fn size_range(panels: &[&Panel]) -> (i32, i32) {
    let xs = panels
        .iter()
        .flat_map(|p| p.series.iter())
        .flat_map(|s| s.points.iter())
        .filter(|p| usable(p))
        .map(|p| p.0);
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for x in xs {
        lo = lo.min(x);
        hi = hi.max(x);
    }
    if hi == 0.0 {
        return (0, 24);
    }
    let (e0, mut e1) = (lo.log2().floor() as i32, hi.log2().ceil() as i32);
    if e1 <= e0 {
        e1 = e0 + 1;
    }
    (e0, e1)
}

/// Decade range covering a panel's values.
fn value_range(panel: &Panel) -> (i32, i32) {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for p in panel
        .series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| usable(p))
    {
        lo = lo.min(p.1);
        hi = hi.max(p.1);
    }
    if hi == 0.0 {
        return (0, 3);
    }
    let (d0, mut d1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    if d1 <= d0 {
        d1 = d0 + 1;
    }
    (d0, d1)
}

fn decade_label(e: i32) -> String {
    if (0..=6).contains(&e) {
        format!("{}", 10u64.pow(e as u32))
    } else if (-4..0).contains(&e) {
        format!("{:.*}", (-e) as usize, 10f64.powi(e))
    } else {
        format!("1e{e}")
    }
}

/// Which powers of two get a size label: every 2^(10k) plus the range ends, unless an end is
/// within 3 octaves of a label already there.
fn size_labels(e0: i32, e1: i32) -> Vec<i32> {
    let mut v: Vec<i32> = (e0..=e1).filter(|e| e % 10 == 0).collect();
    for end in [e0, e1] {
        if !v.iter().any(|&e| (e - end).abs() < 3) {
            v.push(end);
        }
    }
    v.sort_unstable();
    v
}

/// Renders the two panels side by side. `eager_limit` (bytes) draws a dashed vertical
/// "eager → rndv" line in both panels when it lies inside the size range.
pub fn render(title: &str, left: &Panel, right: &Panel, eager_limit: Option<u64>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    let (e0, e1) = size_range(&[left, right]);
    for (i, panel) in [left, right].into_iter().enumerate() {
        panel_svg(&mut s, panel, i as f64 * PANEL_W, (e0, e1), eager_limit);
    }
    s.push_str("</svg>\n");
    s
}

fn panel_svg(s: &mut String, panel: &Panel, x0: f64, (e0, e1): (i32, i32), eager: Option<u64>) {
    let (px0, px1) = (x0 + LEFT, x0 + PANEL_W - RIGHT);
    let (py0, py1) = (H - BOTTOM, TOP);
    let x = LogAxis {
        lo: 2f64.powi(e0),
        hi: 2f64.powi(e1),
        px0,
        px1,
    };
    let (d0, d1) = value_range(panel);
    let y = LogAxis {
        lo: 10f64.powi(d0),
        hi: 10f64.powi(d1),
        px0: py0,
        px1: py1,
    };
    let _ = writeln!(s, "<g>");
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="45" text-anchor="middle" font-size="13">{}</text>"#,
        (px0 + px1) / 2.0,
        escape(&panel.title)
    );
    // Grid and ticks: sizes (every 4x, labelled at 1 B, 1 KiB, 1 MiB, ... and the ends).
    let labels = size_labels(e0, e1);
    for e in e0..=e1 {
        let labelled = labels.contains(&e);
        if e % 2 != 0 && !labelled && e != e0 && e != e1 {
            continue;
        }
        let px = x.map(2f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{py0}" x2="{px:.1}" y2="{py1}" stroke="#e0e0e0" stroke-width="1"/>"##
        );
        if labelled {
            let _ = writeln!(
                s,
                r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                py0 + 16.0,
                escape(&format_size(1u64 << e.clamp(0, 62)))
            );
        }
    }
    let step = if d1 - d0 > 8 { 2 } else { 1 };
    for d in d0..=d1 {
        let py = y.map(10f64.powi(d));
        let _ = writeln!(
            s,
            r##"<line x1="{px0}" y1="{py:.1}" x2="{px1}" y2="{py:.1}" stroke="#e0e0e0" stroke-width="1"/>"##
        );
        if (d - d0) % step == 0 {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                px0 - 6.0,
                py + 4.0,
                decade_label(d)
            );
        }
    }
    // Frame and axis titles.
    let _ = writeln!(
        s,
        r#"<rect x="{px0}" y="{py1}" width="{:.1}" height="{:.1}" fill="none" stroke="black" stroke-width="1"/>"#,
        px1 - px0,
        py0 - py1
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">message size (bytes, log scale)</text>"#,
        (px0 + px1) / 2.0,
        H - 18.0
    );
    let (ly, lx) = ((py0 + py1) / 2.0, x0 + 16.0);
    let _ = writeln!(
        s,
        r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="middle" transform="rotate(-90 {lx:.1} {ly:.1})">{}</text>"#,
        escape(&panel.y_label)
    );
    // Eager limit.
    if let Some(limit) = eager
        .map(|l| l as f64)
        .filter(|&l| l > 0.0 && x.contains(l))
    {
        let px = x.map(limit);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{py0}" x2="{px:.1}" y2="{py1}" stroke="#555555" stroke-width="1.5" stroke-dasharray="6,4"/>"##
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#555555">eager → rndv</text>"##,
            px + 4.0,
            py1 + 14.0
        );
    }
    // Series.
    let drawn: Vec<&Series> = panel
        .series
        .iter()
        .filter(|sr| sr.points.iter().any(usable))
        .collect();
    if drawn.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14" fill="#888888">not measured</text>"##,
            (px0 + px1) / 2.0,
            (py0 + py1) / 2.0
        );
    }
    for sr in &drawn {
        let mut pts: Vec<(f64, f64)> = sr.points.iter().copied().filter(usable).collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let coords: Vec<String> = pts
            .iter()
            .map(|&(a, b)| format!("{:.1},{:.1}", x.map(a), y.map(b)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
            coords.join(" "),
            sr.color
        );
        for &(a, b) in &pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                x.map(a),
                y.map(b),
                sr.color
            );
        }
    }
    // Legend, top left inside the plot.
    if !drawn.is_empty() {
        let longest = drawn
            .iter()
            .map(|sr| sr.label.chars().count())
            .max()
            .unwrap_or(0);
        let (lx, ly) = (px0 + 8.0, py1 + 8.0);
        let _ = writeln!(
            s,
            r##"<rect x="{lx:.1}" y="{ly:.1}" width="{:.1}" height="{:.1}" fill="white" fill-opacity="0.85" stroke="#999999" stroke-width="0.5"/>"##,
            34.0 + 6.6 * longest as f64,
            8.0 + 16.0 * drawn.len() as f64
        );
        for (i, sr) in drawn.iter().enumerate() {
            let yy = ly + 14.0 + 16.0 * i as f64;
            let _ = writeln!(
                s,
                r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="2"/>"#,
                lx + 6.0,
                yy - 4.0,
                lx + 24.0,
                yy - 4.0,
                sr.color
            );
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                lx + 15.0,
                yy - 4.0,
                sr.color
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{yy:.1}">{}</text>"#,
                lx + 30.0,
                escape(&sr.label)
            );
        }
    }
    let _ = writeln!(s, "</g>");
}

/// A rough XML well-formedness check (balanced tags, quoted attributes, known entities):
/// enough to catch a broken writer. Returns the first problem found.
pub fn check_well_formed(xml: &str) -> Result<(), String> {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml;
    let mut roots = 0;
    while let Some(lt) = rest.find('<') {
        check_text(&rest[..lt])?;
        rest = &rest[lt..];
        if let Some(r) = rest.strip_prefix("<?") {
            let end = r.find("?>").ok_or("unterminated <?")?;
            rest = &r[end + 2..];
            continue;
        }
        if let Some(r) = rest.strip_prefix("<!--") {
            let end = r.find("-->").ok_or("unterminated comment")?;
            rest = &r[end + 3..];
            continue;
        }
        let gt = rest.find('>').ok_or("unterminated tag")?;
        let tag = &rest[1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().ok_or(format!("`</{name}>` closes nothing"))?;
            if open != name.trim() {
                return Err(format!("`<{open}>` closed by `</{name}>`"));
            }
            continue;
        }
        let self_closing = tag.ends_with('/');
        let body = tag.trim_end_matches('/');
        let name: String = body.chars().take_while(|c| !c.is_whitespace()).collect();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ":-_".contains(c))
        {
            return Err(format!("bad tag name in `<{tag}>`"));
        }
        check_attributes(&body[name.len()..])?;
        if stack.is_empty() {
            roots += 1;
        }
        if !self_closing {
            stack.push(name);
        }
    }
    check_text(rest)?;
    if let Some(open) = stack.pop() {
        return Err(format!("`<{open}>` never closed"));
    }
    if roots != 1 {
        return Err(format!("{roots} root elements"));
    }
    Ok(())
}

fn check_text(t: &str) -> Result<(), String> {
    if t.contains('>') {
        return Err(format!("stray `>` in text `{t}`"));
    }
    let mut rest = t;
    while let Some(amp) = rest.find('&') {
        let r = &rest[amp + 1..];
        let semi = r.find(';').ok_or(format!("bare `&` in `{t}`"))?;
        let ent = &r[..semi];
        let ok = matches!(ent, "amp" | "lt" | "gt" | "quot" | "apos")
            || (ent.starts_with('#') && ent.len() > 1);
        if !ok {
            return Err(format!("unknown entity `&{ent};`"));
        }
        rest = &r[semi + 1..];
    }
    Ok(())
}

fn check_attributes(mut a: &str) -> Result<(), String> {
    loop {
        a = a.trim_start();
        if a.is_empty() {
            return Ok(());
        }
        let eq = a
            .find('=')
            .ok_or(format!("attribute without value: `{a}`"))?;
        let name = a[..eq].trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(format!("bad attribute name `{name}`"));
        }
        let v = &a[eq + 1..];
        let q = v.chars().next().ok_or("missing attribute value")?;
        if q != '"' && q != '\'' {
            return Err(format!("unquoted value for `{name}`"));
        }
        let end = v[1..]
            .find(q)
            .ok_or(format!("unterminated value for `{name}`"))?;
        let value = &v[1..1 + end];
        if value.contains('<') {
            return Err(format!("`<` in value of `{name}`"));
        }
        check_text(value)?;
        a = &v[end + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panel(series: Vec<Series>) -> Panel {
        Panel {
            title: "latency <p50> & co".into(),
            y_label: "µs".into(),
            series,
        }
    }

    #[test]
    fn renders_well_formed_svg_with_marker_and_legend() {
        let rdmx = Series {
            label: "rdmx".into(),
            color: COLORS[0],
            points: vec![
                (1.0, 10.0),
                (1024.0, 20.0),
                (16.0 * 1048576.0, 9000.0),
                (8.0, 0.0),
            ],
        };
        let other = Series {
            label: "ib_send_lat".into(),
            color: COLORS[1],
            points: vec![(8.0, 5.0)],
        };
        let empty = Series {
            label: "qperf".into(),
            color: COLORS[2],
            points: vec![],
        };
        let svg = render(
            "RDMA & more",
            &panel(vec![rdmx, other, empty]),
            &panel(vec![]),
            Some(8152),
        );
        check_well_formed(&svg).unwrap();
        assert!(svg.contains("eager → rndv"));
        assert!(svg.contains(">rdmx</text>") && svg.contains(">ib_send_lat</text>"));
        assert!(!svg.contains(">qperf</text>"), "empty series are skipped");
        assert!(svg.contains("not measured"), "the empty panel says so");
        for label in [">1 B<", ">1 KiB<", ">1 MiB<", ">16 MiB<"] {
            assert!(svg.contains(label), "{label}");
        }
        assert!(svg.contains("RDMA &amp; more"));
        assert_eq!(svg.matches("<polyline").count(), 2);
    }

    #[test]
    fn eager_line_only_inside_the_range() {
        let s = Series {
            label: "x".into(),
            color: COLORS[0],
            points: vec![(1.0, 1.0), (64.0, 2.0)],
        };
        let svg = render("t", &panel(vec![s.clone()]), &panel(vec![s]), Some(1 << 20));
        check_well_formed(&svg).unwrap();
        assert!(!svg.contains("eager → rndv"));
    }

    #[test]
    fn checker_catches_breakage() {
        assert!(check_well_formed("<a><b></a>").is_err());
        assert!(check_well_formed("<a x=1/>").is_err());
        assert!(check_well_formed("<a>&</a>").is_err());
        assert!(check_well_formed("<a/><b/>").is_err());
        assert!(check_well_formed("<a>").is_err());
        assert!(check_well_formed("<?xml version=\"1.0\"?><a t='&amp;'>x &lt; y</a>").is_ok());
    }

    #[test]
    fn axis_labels() {
        assert_eq!(size_labels(0, 24), vec![0, 10, 20, 24]);
        assert_eq!(size_labels(3, 20), vec![3, 10, 20]);
        assert_eq!(size_labels(3, 6), vec![3, 6]);
        assert_eq!(decade_label(0), "1");
        assert_eq!(decade_label(3), "1000");
        assert_eq!(decade_label(-2), "0.01");
        assert_eq!(decade_label(9), "1e9");
    }
}
