//! Plots of a report, as SVG and PNG, drawn by plotters with a bundled font (DejaVu Sans Mono,
//! `fonts/DejaVu-LICENSE`), so no system font is needed.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::report::Report;

/// A plot that could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {file}: {message}")]
pub struct PlotError {
    /// The file being written.
    pub file: String,
    /// What went wrong.
    pub message: String,
}

/// One color per policy of `ALL_POLICIES`, in its order.
const COLORS: [RGBColor; 8] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(23, 190, 207),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(127, 127, 127),
    RGBColor(140, 86, 75),
];

fn color(policy: &str) -> RGBColor {
    let i = crate::policy::ALL_POLICIES
        .iter()
        .position(|p| *p == policy)
        .unwrap_or(0);
    COLORS[i % COLORS.len()]
}

type Series = (String, RGBColor, Vec<(f64, f64)>);

struct Chart<'a> {
    title: String,
    x_label: &'a str,
    y_label: &'a str,
    series: Vec<Series>,
    /// A dashed horizontal reference line.
    reference: Option<(String, f64)>,
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart<'_>) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let points = chart.series.iter().flat_map(|(_, _, p)| p.iter());
    let x_max = points.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_max = points
        .map(|p| p.1)
        .chain(chart.reference.iter().map(|r| r.1))
        .fold(1.0, f64::max)
        * 1.15;
    let mut ctx = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(e)?;
    ctx.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    if let Some((name, y)) = &chart.reference {
        ctx.draw_series(DashedLineSeries::new(
            [(0.0, *y), (x_max, *y)],
            6,
            4,
            BLACK.stroke_width(1),
        ))
        .map_err(e)?
        .label(name.as_str())
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK));
    }
    for (name, color, points) in &chart.series {
        let color = *color;
        ctx.draw_series(LineSeries::new(
            points.iter().copied(),
            color.stroke_width(2),
        ))
        .map_err(e)?
        .label(name.as_str())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    ctx.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

const SIZE: (u32, u32) = (960, 540);

fn write_both(
    dir: &Path,
    name: &str,
    chart: &Chart<'_>,
    out: &mut Vec<PathBuf>,
) -> Result<(), PlotError> {
    let svg = dir.join(format!("{name}.svg"));
    let fail = |file: &Path, message: String| PlotError {
        file: file.display().to_string(),
        message,
    };
    draw(&SVGBackend::new(&svg, SIZE).into_drawing_area(), chart).map_err(|m| fail(&svg, m))?;
    out.push(svg);
    let png = dir.join(format!("{name}.png"));
    draw(&BitMapBackend::new(&png, SIZE).into_drawing_area(), chart).map_err(|m| fail(&png, m))?;
    out.push(png);
    Ok(())
}

/// Draws the report's plots into `dir` (which must exist) and returns the files written:
/// `admitted` (the busiest key's admitted count per window against the limit, per policy),
/// `over_admission` (the largest over-admission of any key per window, per policy) and
/// `estimates` (the observer node's estimate of the global count for the busiest key, per
/// synced policy) and `instances` (the live instances it saw, and the seed's node estimate),
/// each as `.svg` and `.png`.
pub fn write_plots(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    register_bundled_font();
    let mut out = Vec::new();
    for (name, chart) in window_charts(report)
        .into_iter()
        .chain(estimate_charts(report))
    {
        write_both(dir, name, &chart, &mut out)?;
    }
    Ok(out)
}

/// The bundled font, registered once for every plot.
fn register_bundled_font() {
    static FONT: Once = Once::new();
    FONT.call_once(|| {
        // The bundled font is a valid TrueType file; if it were not, text would be missing
        // from the PNGs and the SVGs would still name the family.
        let _ = register_font(
            "sans-serif",
            FontStyle::Normal,
            include_bytes!("../fonts/DejaVuSansMono.ttf"),
        );
    });
}

/// `admitted` and `over_admission`: a value per window and policy.
fn window_charts(report: &Report) -> [(&'static str, Chart<'static>); 2] {
    let limit = report.limit as f64;
    let window_min = report.window_s as f64 / 60.0;
    let per_window = |values: &dyn Fn(&crate::PolicyReport) -> Vec<f64>| {
        report
            .policies
            .iter()
            .map(|p| {
                let points = values(p)
                    .into_iter()
                    .enumerate()
                    .map(|(w, v)| ((w as f64 + 0.5) * window_min, v))
                    .collect();
                (p.policy.clone(), color(&p.policy), points)
            })
            .collect::<Vec<_>>()
    };
    let title_tail = format!(
        "{} per {} s, {} nodes, {} spans",
        report.limit, report.window_s, report.nodes, report.spans
    );
    let admitted = Chart {
        title: format!(
            "admitted per window, key {} ({title_tail})",
            report.busiest_key
        ),
        x_label: "minutes",
        y_label: "admitted in the window",
        series: per_window(&|p| p.busiest_key_admitted.iter().map(|&a| a as f64).collect()),
        reference: Some(("limit".to_owned(), limit)),
    };
    let over = Chart {
        title: format!("largest over-admission per window ({title_tail})"),
        x_label: "minutes",
        y_label: "% of the limit",
        series: per_window(&|p| p.over_by_window_pct.clone()),
        reference: None,
    };
    [("admitted", admitted), ("over_admission", over)]
}

/// `estimates` and `instances`: what the observer node knew over time, per synced policy.
fn estimate_charts(report: &Report) -> [(&'static str, Chart<'static>); 2] {
    let synced: Vec<_> = report
        .policies
        .iter()
        .filter(|p| !p.estimates.is_empty())
        .collect();
    let over_time = |f: &dyn Fn(&crate::EstimateSample) -> f64| {
        synced
            .iter()
            .map(|p| {
                let points = p.estimates.iter().map(|e| (e.t_s / 60.0, f(e))).collect();
                (p.policy.clone(), color(&p.policy), points)
            })
            .collect::<Vec<_>>()
    };
    let estimates = Chart {
        title: format!(
            "node 0's estimate of the global count, key {}",
            report.busiest_key
        ),
        x_label: "minutes",
        y_label: "requests in the window",
        series: over_time(&|e| e.estimate),
        reference: Some(("limit".to_owned(), report.limit as f64)),
    };
    let mut live = over_time(&|e| e.live_instances as f64);
    // The reactive policy writes no per-instance entries: only its node estimate means anything.
    live.retain(|(n, _, _)| !n.starts_with("reactive"));
    for (name, _, _) in &mut live {
        name.push_str(" live");
    }
    let mut nodes = over_time(&|e| e.node_estimate as f64);
    for (name, _, _) in &mut nodes {
        name.push_str(" node estimate");
    }
    live.extend(
        nodes
            .into_iter()
            .filter(|(n, _, _)| n.starts_with("reactive")),
    );
    let instances = Chart {
        title: format!(
            "instances seen by node {}, key {}",
            report.observer_node, report.busiest_key
        ),
        x_label: "minutes",
        y_label: "instances",
        series: live,
        reference: Some(("nodes".to_owned(), report.nodes as f64)),
    };
    [("estimates", estimates), ("instances", instances)]
}
