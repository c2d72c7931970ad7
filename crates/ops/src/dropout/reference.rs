//! The host side of bernoulli and dropout: the same Philox words compared on the host.
use super::{Bernoulli, Dropout, Stream};
use crate::base::element::{Element, HostData};
use crate::base::generator::philox_words;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};

impl Stream {
    /// Whether each of the `n` elements is kept (its word below the threshold).
    fn keep(&self, n: usize) -> Vec<bool> {
        let w = philox_words(self.key, self.base, n);
        w.iter().take(n).map(|&w| (w as u64) < self.thr).collect()
    }
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

pub(super) fn bernoulli(desc: &Bernoulli) -> Result<Tensor> {
    let keep = desc.stream.keep(desc.n);
    let data = HostData::from_fn(desc.dtype, desc.n, |i| keep[i] as u8 as f64);
    Ok(Tensor::from_host_data(data, &desc.shape))
}

pub(super) fn dropout(desc: &Dropout) -> Result<(Tensor, Tensor)> {
    let x = &desc.x;
    let n = x.numel();
    let xs = x
        .host_view(&x.shape, &x.strides)
        .ok_or_else(|| Error::device("dropout", "host tensor without host storage"))?;
    let keep = desc.stream.keep(n);
    let y = with_host!(&xs, v => host_dropout(v, &keep, desc.scale, x.dtype));
    let mask = HostData::from_fn(x.dtype, n, |i| keep[i] as u8 as f64);
    Ok((
        Tensor::from_host_data(y, &x.shape),
        Tensor::from_host_data(mask, &x.shape),
    ))
}
