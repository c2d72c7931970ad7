//! PNG plots of a training run: per-epoch loss (left panel) and train/test accuracy (right panel; the loss fills the image when there are no accuracies).
//!
//! Drawn with plotters into an RGB buffer, text with an embedded DejaVu Sans subset (ab_glyph,
//! no system font libraries), encoded with the png crate.
use crate::text_backend::TextBackend;
use ab_glyph::FontRef;
use netcl_core_devices::{Error, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;
use std::sync::OnceLock;

/// Default image size in pixels (width, height).
pub const PLOT_SIZE: (u32, u32) = (1000, 420);
/// Colour of training curves (tab10 blue).
pub const TRAIN_COLOR: RGBColor = RGBColor(31, 119, 180);
/// Colour of test curves (tab10 orange).
pub const TEST_COLOR: RGBColor = RGBColor(255, 127, 14);

/// DejaVu Sans cut to ASCII (see assets/fonts/README.md).
static FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans-ascii.ttf");
const FAMILY: &str = "sans-serif";

/// Per-epoch metrics; entry `i` is epoch `i + 1`. Accuracies are fractions (plotted in %).
/// Series may have different lengths (an empty one is not drawn); non-finite values are skipped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    pub train_loss: Vec<f32>,
    pub test_loss: Vec<f32>,
    pub train_acc: Vec<f32>,
    pub test_acc: Vec<f32>,
}

impl History {
    pub fn new() -> History {
        History::default()
    }

    /// Record one epoch's training loss, training accuracy and test accuracy.
    pub fn push(&mut self, train_loss: f32, train_acc: f32, test_acc: f32) {
        self.train_loss.push(train_loss);
        self.train_acc.push(train_acc);
        self.test_acc.push(test_acc);
    }

    /// Number of epochs recorded (the longest series).
    pub fn epochs(&self) -> usize {
        [
            &self.train_loss,
            &self.test_loss,
            &self.train_acc,
            &self.test_acc,
        ]
        .iter()
        .map(|s| s.len())
        .max()
        .unwrap_or(0)
    }
}

/// Write `history` as a [`PLOT_SIZE`] PNG to `path`, titled `title`.
pub fn plot_history(path: impl AsRef<Path>, title: &str, history: &History) -> Result<()> {
    plot_history_sized(path, title, history, PLOT_SIZE)
}

/// [`plot_history`] with another `(width, height)` (at least 400 × 250).
pub fn plot_history_sized(
    path: impl AsRef<Path>,
    title: &str,
    history: &History,
    size: (u32, u32),
) -> Result<()> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let (w, h) = size;
    if w < 400 || h < 250 || w > 8192 || h > 8192 {
        return Err(Error::invalid(
            "plot_history",
            format!("{name}: image size {w}x{h} outside 400x250 ..= 8192x8192"),
        ));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
    }
    let epochs = history.epochs();
    if epochs == 0 {
        return Err(Error::invalid(
            "plot_history",
            format!("{name}: the history holds no epochs"),
        ));
    }
    let font = font()?;
    let mut rgb = vec![255u8; w as usize * h as usize * 3];
    draw(&mut rgb, size, font, title, history, epochs)
        .map_err(|e| Error::format(&name, format!("drawing the plot failed: {e}")))?;
    let file = std::fs::File::create(path).map_err(|e| Error::io(&name, e))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let png_err = |e: png::EncodingError| match e {
        png::EncodingError::IoError(io) => Error::io(&name, io),
        other => Error::format(&name, format!("PNG encoding failed: {other}")),
    };
    let mut writer = enc.write_header().map_err(png_err)?;
    writer.write_image_data(&rgb).map_err(png_err)?;
    writer.finish().map_err(png_err)
}

/// The embedded font, registered as plotters' "sans-serif" (for text sizes) once per process.
pub(crate) fn font() -> Result<FontRef<'static>> {
    static FONT_REF: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    FONT_REF
        .get_or_init(|| {
            let f = FontRef::try_from_slice(FONT).ok()?;
            register_font(FAMILY, FontStyle::Normal, FONT).ok()?;
            Some(f)
        })
        .clone()
        .ok_or_else(|| {
            Error::format(
                "netcl-data/assets/fonts/DejaVuSans-ascii.ttf",
                "the embedded font does not parse",
            )
        })
}

type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// A labelled series: (name, colour, values).
type Series<'a> = (&'a str, RGBColor, &'a [f32]);

fn draw(
    rgb: &mut [u8],
    size: (u32, u32),
    font: FontRef<'static>,
    title: &str,
    h: &History,
    epochs: usize,
) -> DrawResult {
    let root = TextBackend::new(BitMapBackend::with_buffer(rgb, size), font).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, (FAMILY, 22))?;
    // Without accuracies (a language model's run) the loss panel takes the whole width.
    let has_acc = !(h.train_acc.is_empty() && h.test_acc.is_empty());
    let (left, right) = root.split_horizontally(if has_acc { size.0 / 2 } else { size.0 });
    panel(
        &left,
        "loss",
        "loss",
        epochs,
        &[
            ("train loss", TRAIN_COLOR, &h.train_loss),
            ("test loss", TEST_COLOR, &h.test_loss),
        ],
        1.0,
        SeriesLabelPosition::UpperRight,
    )?;
    if !has_acc {
        root.present()?;
        return Ok(());
    }
    panel(
        &right,
        "accuracy",
        "accuracy (%)",
        epochs,
        &[
            ("train accuracy", TRAIN_COLOR, &h.train_acc),
            ("test accuracy", TEST_COLOR, &h.test_acc),
        ],
        100.0,
        SeriesLabelPosition::LowerRight,
    )?;
    root.present()?;
    Ok(())
}

/// One chart: the finite values of each series times `scale` against epochs 1, 2, ...
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    epochs: usize,
    series: &[Series<'_>],
    scale: f64,
    legend: SeriesLabelPosition,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let points: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|(_, _, v)| {
            v.iter()
                .enumerate()
                .filter(|(_, y)| y.is_finite())
                .map(|(i, &y)| ((i + 1) as f64, y as f64 * scale))
                .collect()
        })
        .collect();
    let (lo, hi) = points
        .iter()
        .flatten()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &(_, y)| {
            (lo.min(y), hi.max(y))
        });
    let (lo, hi) = if lo > hi {
        (0.0, 1.0) // nothing finite: an empty frame
    } else {
        let pad = ((hi - lo) * 0.08).max(hi.abs().max(1e-3) * 0.02);
        (lo - pad, hi + pad)
    };
    let xpad = if epochs <= 1 {
        0.5
    } else {
        (epochs - 1) as f64 * 0.03
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FAMILY, 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1.0 - xpad..epochs as f64 + xpad, lo..hi)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc(y_desc)
        .x_labels(epochs.clamp(2, 10))
        .x_label_formatter(&|x| trim(*x))
        .y_label_formatter(&|y| {
            format!("{y:.3}")
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_string()
        })
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()?;
    let mut labelled = false;
    for ((label, color, _), pts) in series.iter().zip(&points) {
        if pts.is_empty() {
            continue;
        }
        let color = *color;
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(*label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        labelled = true;
    }
    if labelled {
        chart
            .configure_series_labels()
            .position(legend)
            .label_font((FAMILY, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()?;
    }
    Ok(())
}

/// Tick label for an epoch axis: whole numbers without decimals.
fn trim(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}
