//! Helpers of training loops: a device-side loss/accuracy meter (no sync per step), test-set evaluation, the examples' arguments, data loading and per-epoch record (history, plot, checkpoint).
use netcl_autograd::{Tape, Var};
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_data::{
    plot_history, BatchBuilder, Batches, DeviceData, FashionMnist, History, ImageLayout,
};
use netcl_nn::{cross_entropy, save_checkpoint, Module};
use netcl_ops::{fused_into, Expr, Tensor};
use netcl_optim::{CosineWithWarmup, Optimizer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Sums of per-sample loss and correct predictions, accumulated on the device; reading them is
/// the only synchronisation.
pub struct Meter {
    loss_sum: Tensor,
    correct: Tensor,
    samples: usize,
}

impl Meter {
    pub fn new(device: &Device) -> Result<Meter> {
        Ok(Meter {
            loss_sum: Tensor::zeros(&[], DType::F32, device)?,
            correct: Tensor::zeros(&[], DType::F32, device)?,
            samples: 0,
        })
    }

    /// Add a batch: its mean `loss`, the `logits` (B, C) and the I32 targets (B).
    pub fn add(&mut self, loss: &Var, logits: &Var, targets: &Tensor) -> Result<()> {
        let b = targets.numel();
        if logits.ndim() != 2 || logits.shape()[0] != b {
            return Err(Error::shape(
                "Meter::add",
                format!(
                    "logits {:?} and targets {:?}",
                    logits.shape(),
                    targets.shape()
                ),
            ));
        }
        let hits = logits.value().argmax(&[1], false)?.eq(targets)?.sum_all()?;
        let loss = loss.value().reshape(&[])?;
        let (i, scale) = (Expr::input, b as f64);
        fused_into(
            &[&self.loss_sum, &loss, &self.correct, &hits],
            &[
                (i(0) + i(1).cast(DType::F32) * scale, &self.loss_sum),
                (i(2) + i(3).cast(DType::F32), &self.correct),
            ],
        )?;
        self.samples += b;
        Ok(())
    }

    /// Mean loss and accuracy over the samples added (one device read).
    pub fn read(&self) -> Result<(f32, f32)> {
        let n = self.samples.max(1) as f32;
        let l = self.loss_sum.to_vec::<f32>()?[0];
        let c = self.correct.to_vec::<f32>()?[0];
        Ok((l / n, c / n))
    }

    pub fn samples(&self) -> usize {
        self.samples
    }
}

/// Mean cross-entropy and accuracy of `model` (in whatever mode it is) over `data`, in batches
/// of `batch`, without recording a tape.
pub fn evaluate(model: &dyn Module, data: &DeviceData, batch: usize) -> Result<(f32, f32)> {
    let device = data.x().device().clone();
    let mut meter = Meter::new(&device)?;
    let tape = Tape::no_grad();
    for b in data.batches(&Batches::new(data.len(), batch, None)?)? {
        let (x, y) = b?;
        let logits = model.forward(&tape, &Var::from(x))?;
        let loss = cross_entropy(&logits, &y)?;
        meter.add(&loss, &logits, &y)?;
    }
    meter.read()
}

/// The command-line settings the training examples share (each optional; the defaults are the
/// example's, shown by `--help`).
#[derive(Clone, Debug, clap::Parser)]
pub struct TrainArgs {
    /// Passes over the training set (0 trains nothing and saves nothing).
    #[arg(long)]
    pub epochs: usize,
    /// Rows per batch.
    #[arg(long)]
    pub batch: usize,
    /// Peak learning rate (cosine schedule after a 2% warmup).
    #[arg(long)]
    pub lr: f64,
    /// Seed of the initialisation, dropout and the shuffles.
    #[arg(long)]
    pub seed: u64,
    /// Directory for the checkpoint, the run log and the plot.
    #[arg(long)]
    pub out: std::path::PathBuf,
}

impl TrainArgs {
    /// Parse the process's arguments over `defaults`; an unknown flag, a bad value or an
    /// argument that is not UTF-8 is an error; `Ok(None)` after printing `--help`.
    pub fn parse(defaults: TrainArgs) -> Result<Option<TrainArgs>> {
        let program = std::env::args_os()
            .next()
            .map(PathBuf::from)
            .and_then(|p| Some(p.file_stem()?.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "train".into());
        let args = netcl_core_devices::utf8_args(&program)?;
        TrainArgs::parse_from(&program, args, defaults)
    }

    /// [`TrainArgs::parse`] over given arguments (the program name left out).
    pub fn parse_from(
        program: &str,
        args: Vec<String>,
        defaults: TrainArgs,
    ) -> Result<Option<TrainArgs>> {
        crate::cli::parse_with(program, args, |c| defaults.as_defaults(c))
    }

    /// `command` (of `TrainArgs` or of a parser that flattens it) with these values as the
    /// defaults of the shared flags.
    pub fn as_defaults(&self, mut command: clap::Command) -> clap::Command {
        let pairs = [
            ("epochs", self.epochs.to_string()),
            ("batch", self.batch.to_string()),
            ("lr", self.lr.to_string()),
            ("seed", self.seed.to_string()),
            ("out", self.out.display().to_string()),
        ];
        for (name, value) in pairs {
            command = command.mut_arg(name, |a| a.default_value(value).required(false));
        }
        command
    }

    /// Batches per epoch over `rows` training rows, and the examples' schedule: cosine from
    /// `lr` to 0 over every step of every epoch, after a linear warmup over the first 2%.
    pub fn schedule(&self, rows: usize) -> Result<(usize, CosineWithWarmup)> {
        let steps_per_epoch = Batches::new(rows, self.batch, None)?.len();
        let total = steps_per_epoch * self.epochs;
        let schedule = CosineWithWarmup {
            base: self.lr,
            warmup_steps: total / 50,
            total_steps: total,
            min_lr: 0.0,
        };
        Ok((steps_per_epoch, schedule))
    }
}

/// Fashion-MNIST's training and test sets (see [`FashionMnist::load`] for where it looks) in
/// `layout`, uploaded to `device` once, and where the data came from (printed by the caller, once
/// per run: data-parallel ranks each load it).
pub fn fashion_mnist_on(
    device: &Device,
    layout: ImageLayout,
) -> Result<(DeviceData, DeviceData, String)> {
    let data = FashionMnist::load()?;
    let builder = BatchBuilder::new(layout);
    let train = DeviceData::upload(&builder, &data.train_images, &data.train_labels, device)?;
    let test = DeviceData::upload(&builder, &data.test_images, &data.test_labels, device)?;
    Ok((train, test, data.source.to_string()))
}

/// What a run leaves in its folder `out` after every epoch: the metrics history drawn as
/// `history.png` and a checkpoint `checkpoint.json` (+ the npz it names) of the model and optimizer (its JSON
/// `extra` holds the epoch, its test accuracy and the run's `info`). The checkpoint is replaced
/// atomically each epoch, so an interrupted run keeps the last finished epoch.
pub struct RunLog {
    out: PathBuf,
    title: String,
    info: Value,
    history: History,
}

impl RunLog {
    /// A log writing into `out` (created when needed); `title` heads the plot.
    pub fn new(out: &Path, title: &str, info: Value) -> RunLog {
        RunLog {
            out: out.to_path_buf(),
            title: title.to_string(),
            info,
            history: History::new(),
        }
    }

    /// Records epoch `epoch`'s `(loss, accuracy)` on the training and test sets, redraws the plot
    /// and saves the checkpoint at optimizer step `step`.
    pub fn epoch(
        &mut self,
        epoch: usize,
        train: (f32, f32),
        test: (f32, f32),
        model: &dyn Module,
        optimizer: &dyn Optimizer,
        step: usize,
    ) -> Result<()> {
        self.history.push(train.0, train.1, test.1);
        self.history.test_loss.push(test.0);
        plot_history(self.out.join("history.png"), &self.title, &self.history)?;
        let extra = json!({"epoch": epoch, "test_accuracy": test.1, "run": self.info});
        save_checkpoint(
            self.out.join("checkpoint"),
            model,
            Some(optimizer),
            step as u64,
            extra,
        )?;
        Ok(())
    }

    /// The metrics recorded so far.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Prints where the checkpoint and plot are (or, when no epoch ran, that nothing was saved)
    /// and, as the last line, `final test_accuracy=0.XXXX` (the last epoch's).
    pub fn finish(&self) {
        if self.history.test_acc.is_empty() {
            println!("no epoch ran: no checkpoint or plot saved");
        } else {
            println!(
                "saved {} and {}",
                self.out.join("checkpoint.json").display(),
                self.out.join("history.png").display()
            );
        }
        let acc = self.history.test_acc.last().copied().unwrap_or(0.0);
        println!("final test_accuracy={acc:.4}");
    }
}
