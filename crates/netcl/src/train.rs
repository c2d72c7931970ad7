//! Helpers of training loops: a device-side loss/accuracy meter (no sync per step) and test-set evaluation.
use netcl_autograd::{Tape, Var};
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_data::{Batches, DeviceData};
use netcl_nn::{cross_entropy, Module};
use netcl_ops::{fused_into, Expr, Tensor};

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

/// The command-line settings the training examples share: `--epochs N --batch N --lr X
/// --seed N --out DIR` (each optional).
#[derive(Clone, Debug)]
pub struct TrainArgs {
    pub epochs: usize,
    pub batch: usize,
    pub lr: f64,
    pub seed: u64,
    pub out: std::path::PathBuf,
}

impl TrainArgs {
    /// Parse `std::env::args()` over `defaults`; an unknown flag or a bad value is an error.
    pub fn parse(defaults: TrainArgs) -> Result<TrainArgs> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut a = defaults;
        let bad =
            |flag: &str, v: &str| Error::invalid("arguments", format!("{flag} {v:?} is not valid"));
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let v = it
                .next()
                .ok_or_else(|| Error::invalid("arguments", format!("{flag} needs a value")))?;
            match flag.as_str() {
                "--epochs" => a.epochs = v.parse().map_err(|_| bad(flag, v))?,
                "--batch" => a.batch = v.parse().map_err(|_| bad(flag, v))?,
                "--lr" => a.lr = v.parse().map_err(|_| bad(flag, v))?,
                "--seed" => a.seed = v.parse().map_err(|_| bad(flag, v))?,
                "--out" => a.out = v.into(),
                _ => {
                    return Err(Error::invalid(
                        "arguments",
                        format!("unknown flag {flag}; use --epochs, --batch, --lr, --seed, --out"),
                    ))
                }
            }
        }
        Ok(a)
    }
}
