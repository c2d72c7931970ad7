//! The host side of bernoulli and dropout: the same Philox words compared on the host, read a block at a time.
use super::{Bernoulli, Dropout, Stream};
use crate::base::element::{Element, HostData};
use crate::base::generator::Words;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Result};

impl Stream {
    /// The reader of the draw's words: element i is kept when its word is below the threshold.
    fn kept(&self) -> impl FnMut(usize) -> bool + '_ {
        let mut w = Words::new(self.key, self.base);
        move |i| (w.get(i) as u64) < self.thr
    }
}

/// y = keep ? x * scale : 0 with the kernels' arithmetic (f16/bf16 through f32).
fn host_dropout<T: Element>(
    x: &[T],
    mut keep: impl FnMut(usize) -> bool,
    scale: f64,
    dtype: DType,
) -> Result<HostData> {
    let f = |i: usize| -> f64 {
        if !keep(i) {
            return 0.0;
        }
        match dtype {
            DType::F64 => x[i].to_f64() * scale,
            _ => (x[i].to_f64() as f32 * scale as f32) as f64,
        }
    };
    HostData::try_from_fn(dtype, x.len(), f)
}

pub(super) fn bernoulli(desc: &Bernoulli) -> Result<Tensor> {
    let mut keep = desc.stream.kept();
    let data = HostData::try_from_fn(desc.dtype, desc.n, |i| keep(i) as u8 as f64)?;
    Ok(Tensor::from_host_data(data, &desc.shape))
}

pub(super) fn dropout(desc: &Dropout) -> Result<(Tensor, Tensor)> {
    let x = &desc.x;
    let n = x.numel();
    let xs = x.host_view(&x.shape, &x.strides)?;
    let y = with_host!(&xs, v => host_dropout(v, desc.stream.kept(), desc.scale, x.dtype))?;
    let mut keep = desc.stream.kept();
    let mask = HostData::try_from_fn(x.dtype, n, |i| keep(i) as u8 as f64)?;
    Ok((
        Tensor::from_host_data(y, &x.shape),
        Tensor::from_host_data(mask, &x.shape),
    ))
}
