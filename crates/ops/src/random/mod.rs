//! Random tensors from Philox4x32-10: the same seed gives the same numbers on the host and every device.
//!
//! Stream convention: key = splitmix64(seed) (as `rand_philox::Philox::from_u64_seed`); element
//! `i` of a draw takes word `i % 4` of counter block `base + i / 4`, and each draw advances the
//! generator by `ceil(n / 4)` blocks. Uniform values use `rand_philox::u32_to_unit_f32`
//! (`_f64` for f64) and are bit-identical everywhere. Normal values use Box-Muller on word pairs;
//! they match across devices to within the devices' `log`/`cos` accuracy (a few ulp), not bit for bit.
mod opencl;
mod reference;
use crate::base::dispatch::dispatch;
use crate::base::generator::Generator;
use crate::base::layout::numel;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Error, Result};

/// The distribution of a draw.
#[derive(Clone, Copy, Debug)]
enum Dist {
    Uniform { low: f64, high: f64 },
    Normal { mean: f64, std: f64 },
}

/// A checked draw of a float tensor of `shape`: element `i` from word `i % 4` of Philox block
/// `base + i / 4` under `key` (the generator already advanced past it).
#[derive(Clone, Debug)]
struct Random {
    shape: Vec<usize>,
    dist: Dist,
    dtype: DType,
    key: [u32; 2],
    base: u128,
}

impl Random {
    fn numel(&self) -> usize {
        numel(&self.shape)
    }
}

impl_op!(Random, Tensor, "random", random, |d| match d.dist {
    Dist::Uniform { .. } => "uniform",
    Dist::Normal { .. } => "normal",
});

impl Tensor {
    fn random(
        shape: &[usize],
        dist: Dist,
        dtype: DType,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(Error::dtype(
                "random",
                format!("random values need a float dtype, not {dtype}"),
            ));
        }
        netcl_core_memory::capture::forbid_random(device, "random")?;
        // Checked before the generator moves: a count past memory is an error, never a wrap.
        let n = crate::base::layout::checked_numel("random", shape, dtype.size())?;
        let (key, base) = gen.draw(n)?;
        let op = Random {
            shape: shape.to_vec(),
            dist,
            dtype,
            key,
            base,
        };
        dispatch(device, &op)
    }

    /// Uniform values on (low, high).
    pub fn uniform(
        shape: &[usize],
        low: f64,
        high: f64,
        dtype: DType,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Tensor> {
        Tensor::random(shape, Dist::Uniform { low, high }, dtype, device, gen)
    }

    /// Normal values with the given mean and standard deviation.
    pub fn normal(
        shape: &[usize],
        mean: f64,
        std: f64,
        dtype: DType,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Tensor> {
        Tensor::random(shape, Dist::Normal { mean, std }, dtype, device, gen)
    }

    /// Uniform values on (0, 1).
    pub fn rand(
        shape: &[usize],
        dtype: DType,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Tensor> {
        Tensor::uniform(shape, 0.0, 1.0, dtype, device, gen)
    }

    /// Standard normal values.
    pub fn randn(
        shape: &[usize],
        dtype: DType,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Tensor> {
        Tensor::normal(shape, 0.0, 1.0, dtype, device, gen)
    }
}
