//! Progress in plain-line mode (what CI logs get): the lines' fields, their rate limit, and the final line.
use netcl_data::Progress;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A writer into a shared buffer.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink {
    fn lines(&self) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[test]
fn plain_lines_show_every_field() {
    let sink = Sink::default();
    let mut p = Progress::plain(2, 5, 100, Box::new(sink.clone()), Duration::ZERO);
    std::thread::sleep(Duration::from_millis(20));
    p.update(10, 0.5, 0.75);
    p.advance(20);
    p.println("a note");
    p.update(100, 0.25, 0.875);
    p.finish("test acc 80.00%");
    p.finish("twice"); // ignored
    let lines = sink.lines();
    assert_eq!(lines.len(), 5, "{lines:?}");
    let first = &lines[0];
    assert!(
        first.starts_with("epoch 2/5 10/100 loss 0.5000 acc 75.00% "),
        "{first}"
    );
    assert!(first.contains(" it/s ETA "), "{first}");
    // The rate: 10 steps in at least 20 ms is at most 500 it/s.
    let rate: f64 = first
        .split(" it/s")
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rate > 0.0 && rate <= 500.0, "{first}");
    // advance keeps the last metrics.
    assert!(
        lines[1].starts_with("epoch 2/5 20/100 loss 0.5000 acc 75.00%"),
        "{}",
        lines[1]
    );
    assert_eq!(lines[2], "a note");
    let last = &lines[4];
    assert!(
        last.starts_with("epoch 2/5 100/100 loss 0.2500 acc 87.50% "),
        "{last}"
    );
    assert!(
        last.contains(" in ") && last.ends_with("s test acc 80.00%"),
        "{last}"
    );
    assert!(!last.contains("ETA"), "{last}");
}

#[test]
fn plain_lines_are_rate_limited() {
    let sink = Sink::default();
    let mut p = Progress::plain(
        1,
        1,
        1000,
        Box::new(sink.clone()),
        Duration::from_secs(3600),
    );
    for step in 1..=1000 {
        p.update(step, 1.0 / step as f32, 0.5);
    }
    p.finish("");
    let lines = sink.lines();
    // The first update, then nothing until the final line.
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("epoch 1/1 1/1000 loss 1.0000"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("epoch 1/1 1000/1000 loss 0.0010 acc 50.00%"),
        "{}",
        lines[1]
    );
    // A step past the end is clamped.
    let sink = Sink::default();
    let mut p = Progress::plain(1, 1, 10, Box::new(sink.clone()), Duration::ZERO);
    p.advance(15);
    assert!(sink.lines()[0].starts_with("epoch 1/1 10/10 "));
}

#[test]
fn terminal_or_not_new_works() {
    // Under the test harness stderr is usually no terminal: plain lines there, a bar otherwise.
    let mut p = Progress::new(1, 1, 3);
    p.update(1, 0.1, 0.2);
    p.finish("done");
    assert!(p.elapsed() < Duration::from_secs(60));
}
