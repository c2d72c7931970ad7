//! Bernoulli masks and dropout from the Philox stream of a `Generator`: the same seed gives bit-identical masks on the host and every device.
//!
//! Element `i` (row-major) takes word `i` of the draw, exactly as `Tensor::rand` does (the draw
//! advances the generator by `ceil(n / 4)` counter blocks), and is 1 when the word is below
//! `round(prob * 2^32)`: an integer compare, so the mask is the same everywhere.
mod opencl;
mod reference;
use crate::base::checks::{check_float, u32_arg};
use crate::base::dispatch::dispatch;
use crate::base::generator::Generator;
use crate::base::layout::checked_numel;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Error, Result};

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

/// A draw taken from a generator: its Philox key, first counter block, and the word threshold
/// below which an element is kept.
#[derive(Clone, Debug)]
struct Stream {
    key: [u32; 2],
    base: u128,
    thr: u64,
}

impl Stream {
    /// Reserves the draw of `n` words from `gen`, keeping words below `thr`.
    fn take(gen: &mut Generator, n: usize, thr: u64) -> Result<Stream> {
        let (key, base) = gen.draw(n)?;
        Ok(Stream { key, base, thr })
    }
}

/// A checked mask of `shape` (`n` elements, at most `u32::MAX`) in `dtype`.
#[derive(Clone, Debug)]
struct Bernoulli {
    shape: Vec<usize>,
    dtype: DType,
    n: usize,
    stream: Stream,
}

impl_op!(Bernoulli, Tensor, "bernoulli", bernoulli);

/// A checked dropout of float `x` (any view, at most `u32::MAX` elements): kept elements are
/// scaled by `scale`; the outputs (y, mask) are contiguous, of x's shape and dtype.
#[derive(Clone, Debug)]
struct Dropout {
    x: Tensor,
    scale: f64,
    stream: Stream,
}

impl_op!(Dropout, (Tensor, Tensor), "dropout", dropout);

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
        u32_arg(op, "elements", n)?;
        let stream = Stream::take(gen, n, threshold(p))?;
        let desc = Bernoulli {
            shape: shape.to_vec(),
            dtype,
            n,
            stream,
        };
        dispatch(device, &desc)
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
        u32_arg(op, "elements", n)?;
        let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
        let stream = Stream::take(gen, n, threshold(1.0 - p))?;
        let desc = Dropout {
            x: self.clone(),
            scale,
            stream,
        };
        dispatch(&self.device, &desc)
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
