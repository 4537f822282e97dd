//! The SVG figure of `weir compare`: latency percentile curves per mode on
//! a log scale (p0 to p99.99), and checkpoint durations over time.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;

/// One mode's data for the figure.
pub struct Series {
    /// Mode name (legend).
    pub name: String,
    /// End-to-end latency, nanoseconds.
    pub latency_ns: Histogram<u64>,
    /// (trigger time ms, duration ms) per completed checkpoint.
    pub checkpoints: Vec<(f64, f64)>,
}

/// Percentiles plotted: x = 1 / (1 - q), from p0 (1) to p99.99 (10^4).
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

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// Writes the figure to `path`.
pub fn write_svg(path: &Path, title: &str, series: &[Series]) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1100, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(560);
    let max_us = series
        .iter()
        .flat_map(|s| curve(&s.latency_ns))
        .map(|p| p.1)
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&left)
        .caption(format!("{title}: latency by percentile"), ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((1.0f64..10_000.0f64).log_scale(), (0.1f64..max_us * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("percentile (x = 1/(1-q): 10 = p90, 100 = p99, 1000 = p99.9)")
        .y_desc("latency µs")
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(curve(&s.latency_ns), c.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;

    let max_t = series
        .iter()
        .flat_map(|s| s.checkpoints.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let max_d = series
        .iter()
        .flat_map(|s| s.checkpoints.iter().map(|p| p.1))
        .fold(0.1f64, f64::max);
    let mut chart = ChartBuilder::on(&right)
        .caption("checkpoint duration over time", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0f64..max_t * 1.05, (0.01f64..max_d * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("time since start, ms")
        .y_desc("duration ms")
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        if s.checkpoints.is_empty() {
            continue;
        }
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(
                s.checkpoints
                    .iter()
                    .map(|&(t, d)| Circle::new((t, d.max(0.01)), 3, c.filled())),
            )?
            .label(s.name.clone())
            .legend(move |(x, y)| Circle::new((x + 7, y), 3, c.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}
