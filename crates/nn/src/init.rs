//! Seeded parameter initialisation: uniform/normal, Xavier (Glorot), Kaiming (He), and PyTorch's layer defaults.
use netcl_ops::{DType, Device, Error, Generator, Result, Tensor};

/// How to fill a weight, given its fan-in and fan-out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// PyTorch's default for Linear/Conv weights and biases: U(−1/√fan_in, 1/√fan_in).
    Default,
    Uniform(f64, f64),
    Normal {
        mean: f64,
        std: f64,
    },
    /// U(−b, b) with b = gain·√(6 / (fan_in + fan_out)).
    XavierUniform {
        gain: f64,
    },
    /// N(0, gain·√(2 / (fan_in + fan_out))).
    XavierNormal {
        gain: f64,
    },
    /// U(−b, b) with b = √(6 / fan_in) (ReLU gain).
    KaimingUniform,
    /// N(0, √(2 / fan_in)) (ReLU gain).
    KaimingNormal,
    Constant(f64),
}

impl Init {
    /// A tensor of `shape` filled by this rule.
    pub fn tensor(
        self,
        shape: &[usize],
        fan_in: usize,
        fan_out: usize,
        dtype: DType,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Tensor> {
        let (fi, fo) = (fan_in.max(1) as f64, fan_out.max(1) as f64);
        let uniform =
            |b: f64, gen: &mut Generator| Tensor::uniform(shape, -b, b, dtype, device, gen);
        let normal =
            |std: f64, gen: &mut Generator| Tensor::normal(shape, 0.0, std, dtype, device, gen);
        match self {
            Init::Default => uniform(1.0 / fi.sqrt(), gen),
            Init::Uniform(lo, hi) => {
                if lo.partial_cmp(&hi) != Some(std::cmp::Ordering::Less) {
                    return Err(Error::invalid(
                        "init",
                        format!("Uniform({lo}, {hi}) needs lo < hi"),
                    ));
                }
                Tensor::uniform(shape, lo, hi, dtype, device, gen)
            }
            Init::Normal { mean, std } => Tensor::normal(shape, mean, std, dtype, device, gen),
            Init::XavierUniform { gain } => uniform(gain * (6.0 / (fi + fo)).sqrt(), gen),
            Init::XavierNormal { gain } => normal(gain * (2.0 / (fi + fo)).sqrt(), gen),
            Init::KaimingUniform => uniform((6.0 / fi).sqrt(), gen),
            Init::KaimingNormal => normal((2.0 / fi).sqrt(), gen),
            Init::Constant(v) => Tensor::full(shape, v, dtype, device),
        }
    }
}
