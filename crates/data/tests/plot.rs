//! Training plots: a PNG of the requested size whose curves land where the data says, text drawn, and errors for bad input.
mod common;
use common::TempDir;
use netcl_data::plot::{
    plot_history, plot_history_sized, History, PLOT_SIZE, TEST_COLOR, TRAIN_COLOR,
};

struct Image {
    w: usize,
    h: usize,
    rgb: Vec<u8>,
}

impl Image {
    fn read(path: &std::path::Path) -> Image {
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
        let mut reader = dec.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        buf.truncate(info.buffer_size());
        Image {
            w: info.width as usize,
            h: info.height as usize,
            rgb: buf,
        }
    }
    fn px(&self, x: usize, y: usize) -> (u8, u8, u8) {
        let i = (y * self.w + x) * 3;
        (self.rgb[i], self.rgb[i + 1], self.rgb[i + 2])
    }
    /// Pixels of exactly `c` in columns `x0..x1`, as (x, y).
    fn find(&self, c: (u8, u8, u8), x0: usize, x1: usize) -> Vec<(usize, usize)> {
        let mut out = vec![];
        for y in 0..self.h {
            for x in x0..x1 {
                if self.px(x, y) == c {
                    out.push((x, y));
                }
            }
        }
        out
    }
}

fn rgb(c: plotters::style::RGBColor) -> (u8, u8, u8) {
    (c.0, c.1, c.2)
}

/// Mean row of the pixels within the leftmost / rightmost tenth of their x extent.
fn ends(pts: &[(usize, usize)]) -> (f64, f64) {
    let xmin = pts.iter().map(|p| p.0).min().unwrap();
    let xmax = pts.iter().map(|p| p.0).max().unwrap();
    let cut = (xmax - xmin) / 10;
    let mean = |f: &dyn Fn(usize) -> bool| {
        let ys: Vec<f64> = pts.iter().filter(|p| f(p.0)).map(|p| p.1 as f64).collect();
        ys.iter().sum::<f64>() / ys.len() as f64
    };
    (mean(&|x| x <= xmin + cut), mean(&|x| x >= xmax - cut))
}

#[test]
fn plot_curves_where_the_data_says() {
    let dir = TempDir::new("curves");
    let mut h = History::new();
    for e in 0..12 {
        let t = e as f32 / 11.0;
        h.push(2.3 - 1.9 * t, 0.4 + 0.5 * t, 0.38 + 0.45 * t);
    }
    let path = dir.join("history.png");
    plot_history(&path, "MLP on Fashion-MNIST", &h).unwrap();
    let img = Image::read(&path);
    assert_eq!((img.w as u32, img.h as u32), PLOT_SIZE);
    let half = img.w / 2;

    // Loss panel (left): train colour only; the curve falls from left to right (y grows downward).
    let loss = img.find(rgb(TRAIN_COLOR), 0, half);
    assert!(loss.len() > 300, "{} loss pixels", loss.len());
    assert!(
        img.find(rgb(TEST_COLOR), 0, half).is_empty(),
        "no test loss was given"
    );
    let (l, r) = ends(&loss);
    assert!(
        r - l > 150.0,
        "loss curve rows {l:.0} -> {r:.0} should fall across the panel"
    );

    // Accuracy panel (right): both curves rise; test below train (larger row) at the end.
    let train = img.find(rgb(TRAIN_COLOR), half, img.w);
    let test = img.find(rgb(TEST_COLOR), half, img.w);
    assert!(
        train.len() > 300 && test.len() > 300,
        "{} / {} accuracy pixels",
        train.len(),
        test.len()
    );
    let (tl, tr) = ends(&train);
    let (sl, sr) = ends(&test);
    assert!(
        tl - tr > 150.0 && sl - sr > 150.0,
        "accuracy should rise: {tl}->{tr}, {sl}->{sr}"
    );
    assert!(
        sr > tr,
        "test accuracy ends below train accuracy: {sr} vs {tr}"
    );

    // Text: the title band holds dark antialiased glyph pixels, the background is white.
    let dark = (0..28)
        .flat_map(|y| (0..img.w).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let (r, g, b) = img.px(x, y);
            (r as u32 + g as u32 + b as u32) < 300
        })
        .count();
    assert!(dark > 100, "{dark} dark pixels in the title band");
    assert_eq!(img.px(2, img.h - 2), (255, 255, 255));
}

#[test]
fn short_and_partial_histories() {
    let dir = TempDir::new("partial");
    // One epoch, a NaN loss, a custom size.
    let h = History {
        train_loss: vec![f32::NAN, 1.0],
        test_loss: vec![1.2, 0.9],
        train_acc: vec![0.5],
        test_acc: vec![],
    };
    let path = dir.join("p.png");
    plot_history_sized(&path, "partial", &h, (640, 300)).unwrap();
    let img = Image::read(&path);
    assert_eq!((img.w, img.h), (640, 300));
    assert!(
        !img.find(rgb(TEST_COLOR), 0, 320).is_empty(),
        "test loss drawn"
    );
    assert!(
        !img.find(rgb(TRAIN_COLOR), 320, 640).is_empty(),
        "single accuracy point drawn"
    );

    let one = History {
        train_loss: vec![0.7],
        ..History::default()
    };
    plot_history(dir.join("one.png"), "one", &one).unwrap();

    // Losses only (a language model): the loss curves span the whole width, no empty panel.
    let lm = History {
        train_loss: vec![3.0, 2.5, 2.2, 2.0],
        test_loss: vec![3.1, 2.7, 2.4, 2.3],
        ..History::default()
    };
    let path = dir.join("lm.png");
    plot_history(&path, "lm", &lm).unwrap();
    let img = Image::read(&path);
    let pts = img.find(rgb(TRAIN_COLOR), 0, img.w);
    let xmax = pts.iter().map(|p| p.0).max().unwrap();
    assert!(
        xmax > img.w * 3 / 4,
        "loss curve ends at x = {xmax} of {}",
        img.w
    );
}

#[test]
fn plot_errors() {
    let dir = TempDir::new("errors");
    let msg = plot_history(dir.join("e.png"), "t", &History::new())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("no epochs") && msg.contains("e.png"), "{msg}");
    let mut h = History::new();
    h.push(1.0, 0.5, 0.5);
    assert!(plot_history_sized(dir.join("s.png"), "t", &h, (100, 100)).is_err());
    // A missing directory is created; a parent that is a file is an error naming it.
    let nested = dir.join("new-dir").join("x.png");
    plot_history(&nested, "t", &h).unwrap();
    assert!(nested.is_file());
    std::fs::write(dir.join("a-file"), b"x").unwrap();
    let bad = dir.join("a-file").join("x.png");
    let msg = plot_history(&bad, "t", &h).unwrap_err().to_string();
    assert!(msg.contains("a-file"), "{msg}");
}
