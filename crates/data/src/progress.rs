//! A training-loop progress bar (epoch, step/total, loss, accuracy, it/s, ETA) with plain periodic lines when stderr is no terminal.
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// The environment variable that forces plain lines (`NETCL_PROGRESS=plain`) on a terminal.
pub const ENV_VAR: &str = "NETCL_PROGRESS";
/// How often plain lines are written by default.
pub const PLAIN_INTERVAL: Duration = Duration::from_secs(10);

enum Output {
    Bar(ProgressBar),
    Lines {
        out: Box<dyn Write + Send>,
        every: Duration,
        last: Instant,
    },
}

/// Progress of one epoch. `update` is cheap (the bar redraws at most 20 times a second; plain
/// lines are written every [`PLAIN_INTERVAL`]), but its loss and accuracy are host numbers:
/// reading them from a device waits for the queue, so pass them every few steps, not every step.
pub struct Progress {
    output: Output,
    epoch: usize,
    epochs: usize,
    steps: usize,
    step: usize,
    loss: Option<f32>,
    acc: Option<f32>,
    start: Instant,
    finished: bool,
}

impl Progress {
    /// Epoch `epoch` (counted from 1) of `epochs`, with `steps` steps: a bar on a terminal,
    /// plain lines on stderr otherwise (CI logs) or when `NETCL_PROGRESS=plain`.
    pub fn new(epoch: usize, epochs: usize, steps: usize) -> Progress {
        let plain = netcl_core_devices::Config::get().progress_plain;
        if plain || !std::io::stderr().is_terminal() {
            return Progress::plain(
                epoch,
                epochs,
                steps,
                Box::new(std::io::stderr()),
                PLAIN_INTERVAL,
            );
        }
        let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_prefix(format!("epoch {epoch}/{epochs}"));
        Progress::with_output(Output::Bar(bar), epoch, epochs, steps)
    }

    /// Plain lines written to `out`: one at the first update, then one every `every`, and the
    /// last at [`Progress::finish`].
    pub fn plain(
        epoch: usize,
        epochs: usize,
        steps: usize,
        out: Box<dyn Write + Send>,
        every: Duration,
    ) -> Progress {
        let last = Instant::now();
        Progress::with_output(
            Output::Lines {
                out,
                every,
                // Due at the first update.
                last: last.checked_sub(every).unwrap_or(last),
            },
            epoch,
            epochs,
            steps,
        )
    }

    fn with_output(output: Output, epoch: usize, epochs: usize, steps: usize) -> Progress {
        Progress {
            output,
            epoch,
            epochs,
            steps,
            step: 0,
            loss: None,
            acc: None,
            start: Instant::now(),
            finished: false,
        }
    }

    /// `step` steps of the epoch are done; `loss` and `acc` (a fraction, shown in %) are the
    /// latest (or running) values.
    pub fn update(&mut self, step: usize, loss: f32, acc: f32) {
        self.loss = Some(loss);
        self.acc = Some(acc);
        self.advance(step);
    }

    /// `step` steps are done; the loss and accuracy shown stay the last ones given.
    pub fn advance(&mut self, step: usize) {
        self.step = step.min(self.steps);
        let msg = self.metrics(false);
        let line = self.line_with(&msg);
        match &mut self.output {
            Output::Bar(bar) => {
                bar.set_position(self.step as u64);
                bar.set_message(msg);
            }
            Output::Lines { out, every, last } => {
                if last.elapsed() >= *every {
                    *last = Instant::now();
                    let _ = writeln!(out, "{line}");
                }
            }
        }
    }

    /// Print a line (an epoch summary, say) without garbling the bar.
    pub fn println(&mut self, text: &str) {
        match &mut self.output {
            Output::Bar(bar) => bar.println(text),
            Output::Lines { out, .. } => {
                let _ = writeln!(out, "{text}");
            }
        }
    }

    /// End the epoch: the final line (or bar) shows the totals, the time taken and `msg`.
    pub fn finish(&mut self, msg: &str) {
        if self.finished {
            return;
        }
        self.finished = true;
        let mut text = self.metrics(true);
        if !msg.is_empty() {
            text = format!("{text} {msg}");
        }
        let line = self.line_with(&text);
        match &mut self.output {
            Output::Bar(bar) => {
                bar.set_position(self.step as u64);
                bar.finish_with_message(text);
            }
            Output::Lines { out, .. } => {
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
        }
    }

    /// Seconds since this epoch's progress started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn line_with(&self, msg: &str) -> String {
        format!(
            "epoch {}/{} {}/{} {msg}",
            self.epoch, self.epochs, self.step, self.steps
        )
    }

    /// "loss 0.4123 acc 85.20% 1520.3 it/s ETA 0:03" (or "... in 1.52s" when done).
    fn metrics(&self, done: bool) -> String {
        let secs = self.start.elapsed().as_secs_f64();
        let mut parts = Vec::with_capacity(4);
        if let Some(loss) = self.loss {
            parts.push(format!("loss {loss:.4}"));
        }
        if let Some(acc) = self.acc {
            parts.push(format!("acc {:.2}%", acc * 100.0));
        }
        let rate = if secs > 0.0 {
            self.step as f64 / secs
        } else {
            0.0
        };
        parts.push(format!("{rate:.1} it/s"));
        if done {
            parts.push(format!("in {secs:.2}s"));
        } else if rate > 0.0 {
            let left = (self.steps - self.step) as f64 / rate;
            parts.push(format!("ETA {}", clock(left)));
        }
        parts.join(" ")
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Output::Bar(bar) = &self.output {
            if !self.finished {
                bar.abandon();
            }
        }
    }
}

/// `m:ss`, or `h:mm:ss` from an hour on.
fn clock(secs: f64) -> String {
    let s = secs.round() as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::clock;

    #[test]
    fn clock_formats() {
        assert_eq!(clock(0.0), "0:00");
        assert_eq!(clock(59.4), "0:59");
        assert_eq!(clock(61.0), "1:01");
        assert_eq!(clock(3599.0), "59:59");
        assert_eq!(clock(3723.0), "1:02:03");
    }
}
