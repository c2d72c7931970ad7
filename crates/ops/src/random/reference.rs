//! The host draws: the Philox words of the draw's blocks turned into values as the kernels do (f32 arithmetic for every dtype but f64), a block at a time into the output.
use super::{Dist, Random};
use crate::base::element::HostData;
use crate::base::generator::Words;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Result};
use rand_philox::{u32_to_unit_f32, u32_to_unit_f64};

/// The draw into a new host tensor.
pub(super) fn random(desc: &Random) -> Result<Tensor> {
    let n = desc.numel();
    let words = Words::new(desc.key, desc.base);
    Ok(Tensor::from_host_data(
        host_values(desc.dtype, desc.dist, words, n)?,
        &desc.shape,
    ))
}

/// Host values, computed in f32 for every dtype but f64, as the kernels do. A normal pair's
/// words (i & !1, i | 1) lie in one block, so the reader recomputes nothing.
fn host_values(dtype: DType, dist: Dist, mut w: Words, n: usize) -> Result<HostData> {
    if dtype == DType::F64 {
        let mut u = |i: usize| u32_to_unit_f64(w.get(i));
        return HostData::try_from_fn(dtype, n, |i| match dist {
            Dist::Uniform { low, high } => low + (high - low) * u(i),
            Dist::Normal { mean, std } => {
                let p = i & !1;
                let (r, t) = ((-2.0 * u(p).ln()).sqrt(), std::f64::consts::TAU * u(p + 1));
                mean + std * if i % 2 == 0 { r * t.cos() } else { r * t.sin() }
            }
        });
    }
    let mut u = |i: usize| u32_to_unit_f32(w.get(i));
    HostData::try_from_fn(dtype, n, |i| match dist {
        Dist::Uniform { low, high } => (low as f32 + (high as f32 - low as f32) * u(i)) as f64,
        Dist::Normal { mean, std } => {
            let p = i & !1;
            let (r, t) = ((-2.0f32 * u(p).ln()).sqrt(), 6.283_185_5_f32 * u(p + 1));
            (mean as f32 + std as f32 * if i % 2 == 0 { r * t.cos() } else { r * t.sin() }) as f64
        }
    })
}
