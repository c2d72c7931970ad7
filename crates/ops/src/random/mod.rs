//! Random tensors from Philox4x32-10: the same seed gives the same numbers on the host and every device.
//!
//! Stream convention: key = splitmix64(seed) (as `rand_philox::Philox::from_u64_seed`); element
//! `i` of a draw takes word `i % 4` of counter block `base + i / 4`, and each draw advances the
//! generator by `ceil(n / 4)` blocks. Uniform values use `rand_philox::u32_to_unit_f32`
//! (`_f64` for f64) and are bit-identical everywhere. Normal values use Box-Muller on word pairs;
//! they match across devices to within the devices' `log`/`cos` accuracy (a few ulp), not bit for bit.
use crate::base::acc::arg_acc;
use crate::base::checks::u32_arg;
use crate::base::element::HostData;
use crate::base::generator::philox_words;
use crate::base::generator::Generator;
use crate::base::launch::program_for;
use crate::base::layout::numel;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::sources::RANDOM;
use netcl_kernels::{Kernel, GROUP_1D};
use rand_philox::{u32_to_unit_f32, u32_to_unit_f64};

#[derive(Clone, Copy)]
enum Dist {
    Uniform { low: f64, high: f64 },
    Normal { mean: f64, std: f64 },
}

/// Host values, computed in f32 for every dtype but f64, as the kernels do.
fn host_values(dtype: DType, dist: Dist, w: &[u32], n: usize) -> HostData {
    if dtype == DType::F64 {
        let u = |i: usize| u32_to_unit_f64(w[i]);
        return HostData::from_fn(dtype, n, |i| match dist {
            Dist::Uniform { low, high } => low + (high - low) * u(i),
            Dist::Normal { mean, std } => {
                let p = i & !1;
                let (r, t) = ((-2.0 * u(p).ln()).sqrt(), std::f64::consts::TAU * u(p + 1));
                mean + std * if i % 2 == 0 { r * t.cos() } else { r * t.sin() }
            }
        });
    }
    let u = |i: usize| u32_to_unit_f32(w[i]);
    HostData::from_fn(dtype, n, |i| match dist {
        Dist::Uniform { low, high } => (low as f32 + (high as f32 - low as f32) * u(i)) as f64,
        Dist::Normal { mean, std } => {
            let p = i & !1;
            let (r, t) = ((-2.0f32 * u(p).ln()).sqrt(), 6.283_185_5_f32 * u(p + 1));
            (mean as f32 + std as f32 * if i % 2 == 0 { r * t.cos() } else { r * t.sin() }) as f64
        }
    })
}

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
        let n = numel(shape);
        let base = gen.take_blocks(n);
        if device.is_host() {
            return Ok(Tensor::from_host_data(
                host_values(dtype, dist, &philox_words(gen.key_words(), base, n), n),
                shape,
            ));
        }
        let out = Tensor::alloc(shape, dtype, device)?;
        let (name, a, b) = match dist {
            Dist::Uniform { low, high } => ("uniform", low, high),
            Dist::Normal { mean, std } => ("normal", mean, std),
        };
        let n32 = u32_arg(name, "elements", n)?;
        let program = program_for(device, &RANDOM, dtype)?;
        let mut k = Kernel::new(&program, name)?;
        k.arg_mem(out.mem()?)?
            .arg(&gen.key_words()[0])?
            .arg(&gen.key_words()[1])?
            .arg(&(base as u64))?
            .arg(&((base >> 64) as u64))?;
        arg_acc(&mut k, dtype, a)?;
        arg_acc(&mut k, dtype, b)?;
        k.arg(&n32)?;
        let group = GROUP_1D.min(k.max_work_group_size());
        k.launch(&[n.div_ceil(4)], &[group])?;
        Ok(out)
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
