//! PNG plots for the reports (plotters, bitmap backend). Text needs a TTF font: DejaVu Sans from
//! Debian's fonts-dejavu-core (installed by scripts/setup.sh), or the file named by
//! `FERROCE_PLOT_FONT`.

use dataplane::sim::incast::IncastReport;
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

type Res = Result<(), Box<dyn std::error::Error>>;

const FONT_PATHS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Registers a font once as "sans-serif".
fn font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = std::env::var("FERROCE_PLOT_FONT")
            .ok()
            .into_iter()
            .chain(FONT_PATHS.iter().map(|s| s.to_string()))
            .find(|p| Path::new(p).exists())
            .ok_or("no TTF font found: install fonts-dejavu-core or set FERROCE_PLOT_FONT")?;
        let bytes = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
        // plotters keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{path}: not a usable TTF font"))
    })
    .clone()
}

/// One line per flow, Gb/s against ms.
fn gbps_chart(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    t_end: f64,
    gbps: f64,
    series: &[Vec<(f64, f64)>],
) -> Res {
    let mut c = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..t_end, 0f64..gbps * 1.05)?;
    c.configure_mesh()
        .x_desc("time (ms)")
        .y_desc("Gb/s")
        .draw()?;
    for (f, pts) in series.iter().enumerate() {
        c.draw_series(LineSeries::new(
            pts.iter().copied(),
            Palette99::pick(f).stroke_width(1),
        ))?;
    }
    Ok(())
}

/// Rate per flow (the receiver's 100 us throughput bins and each sender's DCQCN rate) and the
/// bottleneck queue, over time, in one PNG.
pub fn incast(path: &Path, r: &IncastReport, title: &str) -> Res {
    font()?;
    let root = BitMapBackend::new(path, (1400, 1050)).into_drawing_area();
    root.fill(&WHITE)?;
    let parts = root.split_evenly((3, 1));
    let t_end = r.duration_ns as f64 / 1e6;
    let gbps = r.link_bps as f64 / 1e9;
    let n = r.bins.first().map_or(0, |b| b.len());
    let title = if title.len() > 120 {
        &title[..120]
    } else {
        title
    };

    let bins: Vec<Vec<(f64, f64)>> = (0..n)
        .map(|f| {
            r.bins
                .iter()
                .enumerate()
                .map(|(k, b)| {
                    (
                        (k as f64 + 1.0) * r.bin_ns as f64 / 1e6,
                        b[f] as f64 * 8.0 / r.bin_ns as f64,
                    )
                })
                .collect()
        })
        .collect();
    let caption = format!("wire throughput per flow at the receiver (100 us bins) {title}");
    gbps_chart(&parts[0], &caption, t_end, gbps, &bins)?;
    let rates: Vec<Vec<(f64, f64)>> = (0..n)
        .map(|f| {
            r.rates
                .iter()
                .enumerate()
                .map(|(k, x)| (k as f64 * r.sample_ns as f64 / 1e6, x[f] / 1e9))
                .collect()
        })
        .collect();
    gbps_chart(
        &parts[1],
        "sender DCQCN rate Rc (10 us samples)",
        t_end,
        gbps,
        &rates,
    )?;

    let qmax = r.queue.iter().copied().max().unwrap_or(0) as f64 / 1e3;
    let mut c = ChartBuilder::on(&parts[2])
        .caption("bottleneck queue (10 us samples)", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_end, 0f64..(qmax * 1.1).max(1.0))?;
    c.configure_mesh().x_desc("time (ms)").y_desc("KB").draw()?;
    c.draw_series(LineSeries::new(
        r.queue
            .iter()
            .enumerate()
            .map(|(k, q)| (k as f64 * r.sample_ns as f64 / 1e6, *q as f64 / 1e3)),
        BLUE.stroke_width(1),
    ))?;
    root.present()?;
    Ok(())
}

/// Named series of (x, y) points with a colour each.
pub type Series<'a> = (&'a str, Vec<(f64, f64)>);

/// Bandwidth (Gb/s) against message size (bytes, log scale), one line per series, with
/// optional horizontal reference lines (a limit, a baseline).
pub fn bandwidth_vs_size(
    path: &Path,
    title: &str,
    series: &[Series<'_>],
    refs: &[(&str, f64)],
) -> Res {
    font()?;
    let root = BitMapBackend::new(path, (1100, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let xmax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(2.0f64, f64::max);
    let xmin = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(xmax, f64::min)
        .max(1.0);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .chain(refs.iter().map(|r| r.1))
        .fold(1.0f64, f64::max);
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((xmin / 1.5..xmax * 1.5).log_scale(), 0f64..ymax * 1.1)?;
    c.configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("Gb/s")
        .x_label_formatter(&|x| size_label(*x))
        .draw()?;
    for (k, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        c.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    for (k, (name, y)) in refs.iter().enumerate() {
        let color = Palette99::pick(series.len() + k).to_rgba();
        let y = *y;
        c.draw_series(LineSeries::new(
            [(xmin / 1.5, y), (xmax * 1.5, y)],
            color.stroke_width(1),
        ))?
        .label(*name)
        .legend(move |(x, yy)| {
            PathElement::new(vec![(x, yy), (x + 20, yy)], color.stroke_width(1))
        });
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// A size axis label: the log axis puts its ticks at powers of ten, so decimal prefixes.
fn size_label(x: f64) -> String {
    match x.round() as u64 {
        b if b >= 1_000_000 => format!("{}M", b / 1_000_000),
        b if b >= 1000 => format!("{}k", b / 1000),
        b => b.to_string(),
    }
}

/// Latency CDFs: for each series (latencies in microseconds) the fraction at or below each
/// value, on a log latency axis.
pub fn latency_cdf(path: &Path, title: &str, series: &[(&str, Vec<f64>)]) -> Res {
    font()?;
    let root = BitMapBackend::new(path, (1100, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let all = || series.iter().flat_map(|s| s.1.iter().copied());
    let lo = all().fold(f64::INFINITY, f64::min).max(0.01);
    let hi = all().fold(0.0f64, f64::max).max(lo * 2.0);
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo * 0.8..hi * 1.2).log_scale(), 0f64..1.0)?;
    c.configure_mesh()
        .x_desc("latency (us)")
        .y_desc("fraction at or below")
        .draw()?;
    for (k, (name, v)) in series.iter().enumerate() {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len().max(1) as f64;
        let color = Palette99::pick(k).to_rgba();
        c.draw_series(LineSeries::new(
            v.iter().enumerate().map(|(i, x)| (*x, (i + 1) as f64 / n)),
            color.stroke_width(2),
        ))?
        .label(*name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::sim::incast::{IncastConfig, run};

    #[test]
    fn an_incast_plot_is_a_png() {
        let r = run(&IncastConfig {
            duration: std::time::Duration::from_millis(1),
            ..IncastConfig::reference(2)
        });
        let path = std::env::temp_dir().join(format!("ferroce-plot-{}.png", std::process::id()));
        incast(&path, &r, "test").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(bytes.len() > 10_000, "{} bytes", bytes.len());
    }

    #[test]
    fn size_and_latency_plots_are_pngs() {
        let dir = std::env::temp_dir();
        let p = dir.join(format!("ferroce-bw-{}.png", std::process::id()));
        let pts: Vec<(f64, f64)> = (6..21).map(|k| ((1u64 << k) as f64, k as f64)).collect();
        bandwidth_vs_size(&p, "t", &[("write", pts)], &[("limit", 10.0)]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).ok();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let p = dir.join(format!("ferroce-cdf-{}.png", std::process::id()));
        let v: Vec<f64> = (1..1000).map(|k| k as f64 / 100.0).collect();
        latency_cdf(&p, "t", &[("a", v)]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).ok();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(size_label(100_000.0), "100k");
    }
}
