//! The plots: per transport, latency and bandwidth against message size, log-log, side by
//! side (plotters' SVG backend; text stays SVG `<text>`, so no font files are needed).

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::sizes::format_size;

/// One line on a chart.
pub struct Series {
    /// Legend text.
    pub label: String,
    /// `(size in bytes, value)`; points that are not positive and finite are skipped.
    pub points: Vec<(f64, f64)>,
}

/// One chart panel.
pub struct Panel {
    /// Title above the panel.
    pub title: String,
    /// Y axis label (unit included).
    pub y_label: String,
    /// Lines; series without a usable point are left out (and out of the legend).
    pub series: Vec<Series>,
}

/// Colours: rdmx first, then the references.
const COLORS: [RGBColor; 5] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
];

fn usable(p: &&(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite() && p.0 > 0.0 && p.1 > 0.0
}

/// The smallest `[base^lo, base^hi]` (at least one step wide) covering `values`.
fn range(values: impl Iterator<Item = f64>, base: f64, empty: (i32, i32)) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (mut e0, mut e1) = if hi > 0.0 {
        let log = |v: f64| v.ln() / base.ln();
        (log(lo).floor() as i32, log(hi).ceil() as i32)
    } else {
        empty
    };
    if e1 <= e0 {
        e1 = e0 + 1;
    }
    e0 = e0.min(e1 - 1);
    (base.powi(e0), base.powi(e1))
}

/// Renders the two panels side by side under `title` and returns the SVG text. `eager_limit`
/// (bytes) draws a dashed vertical "eager → rndv" line where it lies inside the size range.
pub fn render(
    title: &str,
    panels: [&Panel; 2],
    eager_limit: Option<u64>,
) -> Result<String, String> {
    let mut svg = String::new();
    let sizes = panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|s| s.points.iter().filter(usable)))
        .map(|p| p.0);
    let x = range(sizes, 2.0, (0, 24));
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(title, ("sans-serif", 20))
            .map_err(|e| e.to_string())?;
        for (area, panel) in root.split_evenly((1, 2)).iter().zip(panels) {
            draw_panel(area, panel, x, eager_limit).map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type DrawResult<'a> =
    Result<(), DrawingAreaErrorKind<<SVGBackend<'a> as DrawingBackend>::ErrorType>>;

fn draw_panel<'a>(
    area: &Area<'a>,
    panel: &Panel,
    x: (f64, f64),
    eager: Option<u64>,
) -> DrawResult<'a> {
    let series: Vec<(&Series, Vec<(f64, f64)>)> = panel
        .series
        .iter()
        .map(|s| {
            (
                s,
                s.points.iter().filter(usable).copied().collect::<Vec<_>>(),
            )
        })
        .filter(|(_, p)| !p.is_empty())
        .collect();
    let y = range(
        series.iter().flat_map(|(_, p)| p.iter().map(|p| p.1)),
        10.0,
        (0, 3),
    );
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x.0..x.1).log_scale().base(2.0), (y.0..y.1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes, log scale)")
        .y_desc(&panel.y_label)
        .x_labels(8)
        .x_label_formatter(&|v| format_size(v.round() as u64))
        .y_label_formatter(&|v| format!("{v}"))
        .draw()?;
    if series.is_empty() {
        let mid = ((x.0 * x.1).sqrt(), (y.0 * y.1).sqrt());
        let style = ("sans-serif", 18)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Center));
        chart.draw_series([Text::new("not measured", mid, style)])?;
        return Ok(());
    }
    if let Some(lim) = eager.map(|l| l as f64).filter(|l| (x.0..=x.1).contains(l)) {
        let dash = BLACK.mix(0.6).stroke_width(1);
        chart.draw_series(DashedLineSeries::new([(lim, y.0), (lim, y.1)], 6, 4, dash))?;
        chart.draw_series([Text::new("eager → rndv", (lim, y.1), ("sans-serif", 12))])?;
    }
    for (i, (s, points)) in series.into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
}
