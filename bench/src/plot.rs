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
}
