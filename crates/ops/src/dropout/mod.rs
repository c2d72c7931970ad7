//! Bernoulli masks and dropout from the Philox stream of a `Generator`: the same seed gives bit-identical masks on the host and every device.
//!
//! Element `i` (row-major) takes word `i` of the draw, exactly as `Tensor::rand` does (the draw
//! advances the generator by `ceil(n / 4)` counter blocks), and is 1 when the word is below
//! `round(prob * 2^32)`: an integer compare, so the mask is the same everywhere.
use crate::base::acc::arg_acc;
use crate::base::checks::{check_float, u32_arg};
use crate::base::element::{Element, HostData};
use crate::base::generator::{philox_words, Generator};
use crate::base::launch::program_for;
use crate::base::layout::{checked_numel, contiguous_strides, KernelLayout};
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::sources::RANDOM;
use netcl_kernels::{Kernel, GROUP_1D};

/// The word threshold of a keep probability `prob` in [0, 1].
fn threshold(prob: f64) -> u64 {
    (prob * 4_294_967_296.0).round() as u64
}

fn check_p(op: &str, p: f64, shape: &[usize]) -> Result<()> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid(
            op,
            format!("probability {p} is not in [0, 1] (shape {shape:?})"),
        ));
    }
    Ok(())
}

/// Sets the stream arguments shared by the kernels: key, base counter, threshold.
fn stream_args(k: &mut Kernel, key: [u32; 2], base: u128, thr: u64) -> Result<()> {
    k.arg(&key[0])?
        .arg(&key[1])?
        .arg(&(base as u64))?
        .arg(&((base >> 64) as u64))?
        .arg(&thr)?;
    Ok(())
}

/// y = keep ? x * scale : 0 with the kernels' arithmetic (f16/bf16 through f32).
fn host_dropout<T: Element>(x: &[T], keep: &[bool], scale: f64, dtype: DType) -> HostData {
    let f = |i: usize| -> f64 {
        if !keep[i] {
            return 0.0;
        }
        match dtype {
            DType::F64 => x[i].to_f64() * scale,
            _ => (x[i].to_f64() as f32 * scale as f32) as f64,
        }
    };
    HostData::from_fn(dtype, x.len(), f)
}

impl Tensor {
    /// A mask of `shape`: 1 with probability `p`, else 0 (any dtype). One kernel.
    pub fn bernoulli(
        p: f64,
        shape: &[usize],
        dtype: DType,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Tensor> {
        let op = "bernoulli";
        netcl_core_memory::capture::forbid_random(device, op)?;
        check_p(op, p, shape)?;
        let n = checked_numel(op, shape, dtype.size())?;
        let count = u32_arg(op, "elements", n)?;
        let thr = threshold(p);
        let (key, base) = (gen.key_words(), gen.take_blocks(n));
        if device.is_host() {
            let w = philox_words(key, base, n);
            let data = HostData::from_fn(dtype, n, |i| ((w[i] as u64) < thr) as u8 as f64);
            return Ok(Tensor::from_host_data(data, shape));
        }
        let out = Tensor::alloc(shape, dtype, device)?;
        // random.cl only builds for float dtypes; integer masks come from its f32 program.
        let (program, name) = if dtype.is_float() {
            (program_for(device, &RANDOM, dtype)?, op)
        } else {
            (program_for(device, &RANDOM, DType::F32)?, "bernoulli_int")
        };
        let mut k = Kernel::new(&program, name)?;
        k.arg_mem(out.mem()?)?;
        stream_args(&mut k, key, base, thr)?;
        k.arg(&count)?;
        let group = GROUP_1D.min(k.max_work_group_size());
        k.launch(&[n.div_ceil(4)], &[group])?;
        Ok(out)
    }

    /// Dropout with drop probability `p` (float dtypes): returns `(y, mask)` with `mask` (of this
    /// dtype) 1 for kept elements (probability `1 - p`) and `y = x * mask / (1 - p)` (`p = 1`
    /// drops everything). The result is contiguous; this tensor may be any view. The backward is
    /// `grad * mask / (1 - p)`. One kernel for both outputs.
    pub fn dropout(&self, p: f64, gen: &mut Generator) -> Result<(Tensor, Tensor)> {
        let op = "dropout";
        netcl_core_memory::capture::forbid_random(&self.device, op)?;
        check_p(op, p, &self.shape)?;
        check_float(op, self, "input")?;
        let n = self.numel();
        let count = u32_arg(op, "elements", n)?;
        let thr = threshold(1.0 - p);
        let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
        let (key, base) = (gen.key_words(), gen.take_blocks(n));
        if let Some(x) = self.host_view(&self.shape, &self.strides) {
            let w = philox_words(key, base, n);
            let keep: Vec<bool> = w.iter().take(n).map(|&w| (w as u64) < thr).collect();
            let y = with_host!(&x, v => host_dropout(v, &keep, scale, self.dtype));
            let mask = HostData::from_fn(self.dtype, n, |i| keep[i] as u8 as f64);
            return Ok((
                Tensor::from_host_data(y, &self.shape),
                Tensor::from_host_data(mask, &self.shape),
            ));
        }
        let y = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        let mask = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        if n == 0 {
            return Ok((y, mask));
        }
        let layout = KernelLayout::new(
            op,
            &self.shape,
            &[
                (&contiguous_strides(&self.shape), 0),
                (&self.strides, self.offset),
            ],
        )?;
        let program = program_for(&self.device, &RANDOM, self.dtype)?;
        let mut k = Kernel::new(&program, op)?;
        k.arg_mem(y.mem()?)?
            .arg_mem(mask.mem()?)?
            .arg_mem(self.mem()?)?;
        stream_args(&mut k, key, base, thr)?;
        arg_acc(&mut k, self.dtype, scale)?;
        k.arg(&layout)?.arg(&count)?;
        let group = GROUP_1D.min(k.max_work_group_size());
        k.launch(&[n.div_ceil(4)], &[group])?;
        Ok((y, mask))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_cover_the_ends() {
        assert_eq!(threshold(0.0), 0);
        assert_eq!(threshold(1.0), 1 << 32);
        assert_eq!(threshold(0.5), 1 << 31);
    }
}
