//! The SVG figure of `weir compare`, three panels: visibility latency by
//! percentile per row (log-log, as HdrHistogram plots them), processing
//! latency by percentile per row with the platform's curve beside
//! them, and visibility p50 and p99 against the checkpoint interval.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// One curve of a percentile panel.
pub struct Curve {
    /// Legend.
    pub name: String,
    /// Colour index (the row's, the same in every panel); `None`: black.
    pub color: Option<usize>,
    /// Latency, nanoseconds.
    pub latency_ns: Histogram<u64>,
}

/// One exactly-once row's visibility across the interval sweep.
pub struct Sweep {
    /// Legend (the row).
    pub name: String,
    /// Colour index (the row's).
    pub color: usize,
    /// (interval ms, visible p50 µs, visible p99 µs), by interval.
    pub points: Vec<(f64, f64, f64)>,
}

/// Everything the figure shows.
pub struct Figure {
    /// Title prefix (pipeline and scenario).
    pub title: String,
    /// The interval of the percentile panels, ms.
    pub base_interval_ms: u64,
    /// Panel 1: visibility latency per row.
    pub visible: Vec<Curve>,
    /// Panel 2: processing latency per row, and the platform's.
    pub processing: Vec<Curve>,
    /// Panel 3: visibility against the interval.
    pub sweep: Vec<Sweep>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn color(i: Option<usize>) -> RGBColor {
    i.map_or(BLACK, |i| COLORS[i % COLORS.len()])
}

/// Percentiles plotted: x = 1 / (1 - q), from p0 (1) to p99.99 (10^4);
/// y in microseconds.
fn curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let mut pts = Vec::new();
    let mut x = 1.0f64;
    while x <= 10_000.0 {
        let q = 1.0 - 1.0 / x;
        pts.push((x, (h.value_at_quantile(q).max(1)) as f64 / 1e3));
        x *= 1.2;
    }
    pts
}

/// `950 ns`, `12 µs`, `3.5 ms`, `1.2 s` for an axis label in microseconds.
fn duration_label(us: f64) -> String {
    let short = |v: f64| {
        if v >= 10.0 || v == v.trunc() {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    };
    if us < 1.0 {
        format!("{} ns", short(us * 1e3))
    } else if us < 1e3 {
        format!("{} µs", short(us))
    } else if us < 1e6 {
        format!("{} ms", short(us / 1e3))
    } else {
        format!("{} s", short(us / 1e6))
    }
}

/// `p0`, `p90`, `p99`, `p99.9` for x = 1/(1-q).
fn percentile_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 1.0 / x);
    let s = format!("{p:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("p{s}")
}

/// The y range covering `values` (µs) on a log axis.
fn y_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| *v > 0.0)
        .fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi == 0.0 {
        return 0.1..10.0;
    }
    lo / 2.0..hi * 2.0
}

fn legend<'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
) -> Result<(), Box<dyn std::error::Error>> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .label_font(("sans-serif", 12))
        .draw()?;
    Ok(())
}

fn percentile_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    curves: &[Curve],
) -> Result<(), Box<dyn std::error::Error>> {
    let curves: Vec<(&Curve, Vec<(f64, f64)>)> = curves
        .iter()
        .filter(|c| !c.latency_ns.is_empty())
        .map(|c| (c, curve(&c.latency_ns)))
        .collect();
    let y = y_range(curves.iter().flat_map(|(_, pts)| pts.iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((1.0f64..10_000.0f64).log_scale(), y.log_scale())?;
    chart
        .configure_mesh()
        .x_desc("percentile (log of 1/(1-q))")
        .y_desc(y_desc)
        .x_label_formatter(&|x| percentile_label(*x))
        .y_label_formatter(&|v| duration_label(*v))
        .draw()?;
    for (c, pts) in curves {
        let style = color(c.color).stroke_width(if c.color.is_none() { 3 } else { 2 });
        chart
            .draw_series(LineSeries::new(pts, style))?
            .label(c.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], style));
    }
    legend(&mut chart)
}

fn sweep_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    sweep: &[Sweep],
) -> Result<(), Box<dyn std::error::Error>> {
    let (lo, hi) = sweep
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let x = if hi == 0.0 { 1.0..1000.0 } else { lo / 2.0..hi * 2.0 };
    let y = y_range(sweep.iter().flat_map(|s| s.points.iter().flat_map(|p| [p.1, p.2])));
    let mut chart = ChartBuilder::on(area)
        .caption("visibility against the checkpoint interval", ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x.log_scale(), y.log_scale())?;
    chart
        .configure_mesh()
        .x_desc("checkpoint interval, ms")
        .y_desc("visibility latency (open loop)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| duration_label(*v))
        .draw()?;
    for s in sweep {
        let c = color(Some(s.color));
        let p50: Vec<(f64, f64)> = s.points.iter().map(|p| (p.0, p.1.max(1e-3))).collect();
        let p99: Vec<(f64, f64)> = s.points.iter().map(|p| (p.0, p.2.max(1e-3))).collect();
        chart
            .draw_series(LineSeries::new(p50.clone(), c.stroke_width(2)))?
            .label(format!("{} p50", s.name))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], c.stroke_width(2)));
        chart.draw_series(p50.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
        chart
            .draw_series(DashedLineSeries::new(p99.clone(), 6, 4, c.stroke_width(2)))?
            .label(format!("{} p99", s.name))
            .legend(move |(x, y)| DashedPathElement::new(vec![(x, y), (x + 15, y)], 4, 3, c.stroke_width(2)));
        chart.draw_series(p99.iter().map(|&p| TriangleMarker::new(p, 4, c.filled())))?;
    }
    legend(&mut chart)
}

/// Writes the figure to `path`.
pub fn write_svg(path: &Path, fig: &Figure) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1680, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, 3));
    percentile_panel(
        &panels[0],
        &format!(
            "{}: visibility by percentile, {} ms interval",
            fig.title, fig.base_interval_ms
        ),
        "emission to visible in the target",
        &fig.visible,
    )?;
    percentile_panel(
        &panels[1],
        &format!("processing latency by percentile, {} ms interval", fig.base_interval_ms),
        "emission to sink; platform: the machine's own delay",
        &fig.processing,
    )?;
    sweep_panel(&panels[2], &fig.sweep)?;
    root.present()?;
    Ok(())
}

/// One mode's timeline through a failure: records per sink subtask per
/// millisecond, `(ms from the failure, [per subtask])`.
pub struct FailureTimeline {
    /// The mode, and how it recovers.
    pub name: String,
    /// The timeline.
    pub points: Vec<(i64, Vec<u64>)>,
    /// Visible output around the failure, per ms: `(ms from the failure,
    /// records made visible, their largest visible latency in ms)`; empty
    /// without a sink that makes records visible.
    pub visible: Vec<(i64, u64, f64)>,
}

/// Writes `failure.svg`: one column per mode; on top, each sink subtask's
/// records per second through the failure (1 ms buckets, smoothed over
/// 5 ms); below, when any mode has visible output, the largest visible
/// latency of the records made visible in each millisecond.
pub fn write_failure_svg(
    path: &Path,
    title: &str,
    modes: &[FailureTimeline],
) -> Result<(), Box<dyn std::error::Error>> {
    let n = modes.len().max(1);
    let visible = modes.iter().any(|m| !m.visible.is_empty());
    let rows = if visible { 2 } else { 1 };
    let root = SVGBackend::new(path, (560 * n as u32, 420 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let grid = root.split_evenly((rows, n));
    let (panels, below) = grid.split_at(n);
    // Records per second over the 5 ms ending at each point.
    let smooth = |points: &[(i64, Vec<u64>)], s: usize| -> Vec<(f64, f64)> {
        (0..points.len())
            .map(|i| {
                let from = i.saturating_sub(4);
                let sum: u64 = points[from..=i]
                    .iter()
                    .map(|(_, v)| v.get(s).copied().unwrap_or(0))
                    .sum();
                (points[i].0 as f64, sum as f64 * 1e3 / (i - from + 1) as f64)
            })
            .collect()
    };
    let top = modes
        .iter()
        .flat_map(|m| {
            let subtasks = m.points.first().map_or(0, |p| p.1.len());
            (0..subtasks).flat_map(move |s| smooth(&m.points, s).into_iter().map(|p| p.1))
        })
        .fold(1.0f64, f64::max);
    // A panel over the mode's timeline, from 0 to `top` (+10%), with the
    // failure's instant drawn at 0.
    let panel = |area, caption: String, m: &FailureTimeline, top: f64| {
        let x0 = m.points.first().map_or(-50, |p| p.0) as f64;
        let x1 = m.points.last().map_or(150, |p| p.0) as f64;
        ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, 0.0..top * 1.1)
    };
    for (area, m) in panels.iter().zip(modes) {
        let mut chart = panel(area, format!("{title}: {}", m.name), m, top)?;
        chart
            .configure_mesh()
            .x_desc("ms from the failure")
            .y_desc("records/s into each sink subtask")
            .y_label_formatter(&|v| format!("{:.0} k", v / 1e3))
            .draw()?;
        let subtasks = m.points.first().map_or(0, |p| p.1.len());
        for s in 0..subtasks {
            let c = color(Some(s));
            chart
                .draw_series(LineSeries::new(smooth(&m.points, s), c.stroke_width(2)))?
                .label(format!("sink subtask {s}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], c.stroke_width(2)));
        }
        chart.draw_series(LineSeries::new(
            vec![(0.0, 0.0), (0.0, top * 1.1)],
            BLACK.stroke_width(1),
        ))?;
        legend(&mut chart)?;
    }
    let highest = modes
        .iter()
        .flat_map(|m| m.visible.iter().map(|v| v.2))
        .fold(1.0f64, f64::max);
    for (area, m) in below.iter().zip(modes) {
        let mut chart = panel(area, format!("visible output: {}", m.name), m, highest)?;
        chart
            .configure_mesh()
            .x_desc("ms from the failure")
            .y_desc("largest visible latency (ms)")
            .draw()?;
        let c = color(Some(0));
        chart.draw_series(
            m.visible
                .iter()
                .filter(|v| v.1 > 0)
                .map(|&(ms, _, lat)| Circle::new((ms as f64, lat), 2, c.filled())),
        )?;
        chart.draw_series(LineSeries::new(
            vec![(0.0, 0.0), (0.0, highest * 1.1)],
            BLACK.stroke_width(1),
        ))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_timeline_plots() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("failure.svg");
        let points: Vec<(i64, Vec<u64>)> = (-50..150)
            .map(|ms| (ms, vec![100, if ms < 0 { 100 } else { 50 }]))
            .collect();
        let modes = vec![FailureTimeline {
            name: "dedup".into(),
            points,
            visible: (-50..150)
                .map(|ms| (ms, 10, if ms < 0 { 12.0 } else { 25.0 }))
                .collect(),
        }];
        write_failure_svg(&path, "keyed", &modes).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("sink subtask 1") && svg.contains("dedup"));
        assert!(
            svg.contains("visible output: dedup") && svg.contains("<circle"),
            "the visible panel"
        );
    }

    #[test]
    fn labels() {
        assert_eq!(percentile_label(1.0), "p0");
        assert_eq!(percentile_label(10.0), "p90");
        assert_eq!(percentile_label(1000.0), "p99.9");
        assert_eq!(duration_label(0.5), "500 ns");
        assert_eq!(duration_label(12.0), "12 µs");
        assert_eq!(duration_label(2500.0), "2.5 ms");
        assert_eq!(duration_label(1.2e6), "1.2 s");
    }
}
