//! `--plot FILE.svg`: bandwidth (top) and latency (bottom) against block
//! size, one line per batch size, on a log2 block-size axis; a value axis
//! is logarithmic when its values span two decades or more (a latency
//! sweep to large blocks), so small sizes are not flattened onto zero.

use crate::bench::error::BenchError;
use plotters::prelude::*;
use std::path::Path;

/// One line of a chart: a label and (block size, value) points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (block size in bytes, value).
    pub points: Vec<(u64, f64)>,
}

fn size_label(log2: &u32) -> String {
    let v = 1u64 << log2;
    match v {
        _ if v >= 1 << 30 => format!("{}G", v >> 30),
        _ if v >= 1 << 20 => format!("{}M", v >> 20),
        _ if v >= 1 << 10 => format!("{}K", v >> 10),
        _ => v.to_string(),
    }
}

/// The y range to draw on a logarithmic axis, if the values span two
/// decades or more (latencies from 8 B to 64 MiB do): every value is
/// positive and the largest is at least 100 times the smallest.
fn log_range(series: &[Series]) -> Option<(f64, f64)> {
    let values = || series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let lo = values().fold(f64::INFINITY, f64::min);
    let hi = values().fold(0.0f64, f64::max);
    (lo > 0.0 && hi >= 100.0 * lo).then(|| (lo / 1.5, hi * 1.5))
}

fn chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0.trailing_zeros()));
    let (lo, hi) = xs.fold((u32::MAX, 0), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let (lo, hi) = if lo > hi {
        (0, 1)
    } else {
        (lo, hi.max(lo + 1))
    };
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60);
    if let Some((bottom, top)) = log_range(series) {
        let mut c = builder
            .build_cartesian_2d(lo..hi, (bottom..top).log_scale())
            .map_err(|e| e.to_string())?;
        let y_desc = format!("{y_desc} (log scale)");
        draw(&mut c, (lo, hi), &y_desc, series)
    } else {
        let top = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            .max(1e-9)
            * 1.1;
        let mut c = builder
            .build_cartesian_2d(lo..hi, 0.0..top)
            .map_err(|e| e.to_string())?;
        draw(&mut c, (lo, hi), y_desc, series)
    }
}

/// The mesh, the lines and the legend of a chart whose x axis is log2 of
/// the block size from `lo` to `hi`.
fn draw<'a, DB, Y>(
    c: &mut ChartContext<'a, DB, Cartesian2d<plotters::coord::types::RangedCoordu32, Y>>,
    (lo, hi): (u32, u32),
    y_desc: &str,
    series: &[Series],
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    c.configure_mesh()
        .x_desc("block size (B)")
        .y_desc(y_desc)
        .x_labels((hi - lo + 1) as usize)
        .x_label_formatter(&size_label)
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        c.draw_series(LineSeries::new(
            s.points.iter().map(|&(x, y)| (x.trailing_zeros(), y)),
            color.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?
        .label(s.label.clone())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

/// Writes the two charts to `path`.
///
/// # Errors
/// [`BenchError::Plot`] if drawing or writing fails.
pub fn write(
    path: &Path,
    title: &str,
    bandwidth: &[Series],
    latency: &[Series],
    latency_desc: &str,
) -> Result<(), BenchError> {
    let root = SVGBackend::new(path, (1000, 900)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| BenchError::Plot(e.to_string()))?;
    let (upper, lower) = root.split_vertically(450);
    chart(&upper, &format!("{title}: bandwidth"), "GB/s", bandwidth).map_err(BenchError::Plot)?;
    chart(&lower, &format!("{title}: latency"), latency_desc, latency).map_err(BenchError::Plot)?;
    root.present()
        .map_err(|e| BenchError::Plot(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        let s = vec![Series {
            label: "batch 1".into(),
            points: vec![(8, 0.1), (16, 0.2), (1024, 1.5)],
        }];
        write(&path, "t", &s, &s, "us").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("batch 1"),
            "{}",
            &svg[..200]
        );
        assert!(svg.contains("1K"));
        assert!(!svg.contains("log scale"), "15x is not two decades");
        // Values over decades go on a logarithmic axis.
        let wide = vec![Series {
            label: "batch 1".into(),
            points: vec![(8, 0.1), (1 << 20, 100.0)],
        }];
        write(&path, "t", &s, &wide, "us").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("us (log scale)"));
    }
}
