//! The host shape ops: row-major bytes of the inputs rearranged, or values made element by element.
use super::{Concat, OneHot, Pad, Tri, TriMask};
use crate::base::element::HostData;
use crate::base::layout::{contiguous_strides, numel, strided_positions};
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;

/// The elements of a host tensor in row-major order (its bytes through `as_bytes`).
fn host_bytes(t: &Tensor) -> Result<HostData> {
    t.to_host_data()
}

/// Whether element `(r, c)` lies in the triangle that triu (`upper`) / tril keeps.
fn in_triangle(r: usize, c: usize, diagonal: i64, upper: bool) -> bool {
    let d = c as i128 - r as i128;
    if upper {
        d >= diagonal as i128
    } else {
        d <= diagonal as i128
    }
}

/// One-hot rows on the host.
pub(super) fn one_hot(desc: &OneHot) -> Result<Tensor> {
    let v = desc.ids.to_vec::<i32>()?;
    let classes = desc.classes;
    let data = HostData::try_from_fn(desc.dtype, numel(&desc.shape), |i| {
        (v[i / classes] as usize == i % classes) as u8 as f64
    })?;
    Ok(Tensor::from_host_data(data, &desc.shape))
}

/// The join on the host: for every index of the dims before `dim`, each input's row in turn.
pub(super) fn concat(desc: &Concat) -> Result<Tensor> {
    let Concat {
        tensors,
        dim,
        shape,
    } = desc;
    let (dim, dtype) = (*dim, tensors[0].dtype);
    let size = dtype.size();
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product::<usize>() * size;
    let parts = tensors.iter().map(host_bytes).collect::<Result<Vec<_>>>()?;
    let mut out = HostData::try_filled(dtype, numel(shape), 0.0)?;
    let bytes = out.as_bytes_mut();
    let mut at = 0;
    for o in 0..outer {
        for (t, b) in tensors.iter().zip(&parts) {
            let row = t.shape[dim] * inner;
            bytes[at..at + row].copy_from_slice(&b.as_bytes()[o * row..(o + 1) * row]);
            at += row;
        }
    }
    Ok(Tensor::from_host_data(out, shape))
}

/// The padded tensor on the host: `value` everywhere, then the input's elements at `before`.
pub(super) fn pad(desc: &Pad) -> Result<Tensor> {
    let Pad {
        x,
        before,
        shape,
        value,
    } = desc;
    let size = x.dtype.size();
    let mut out = HostData::try_filled(x.dtype, numel(shape), *value)?;
    let bytes = out.as_bytes_mut();
    let out_strides = contiguous_strides(shape);
    let start: usize = before.iter().zip(&out_strides).map(|(b, s)| b * s).sum();
    let src = host_bytes(x)?;
    let src = src.as_bytes();
    for (i, p) in strided_positions(&x.shape, &out_strides, start).enumerate() {
        bytes[p * size..(p + 1) * size].copy_from_slice(&src[i * size..(i + 1) * size]);
    }
    Ok(Tensor::from_host_data(out, shape))
}

/// triu / tril on the host: the elements outside the triangle set to 0.
pub(super) fn tri(desc: &Tri) -> Result<Tensor> {
    let Tri { x, diagonal, upper } = desc;
    let nd = x.ndim();
    let (rows, cols) = (x.shape[nd - 2], x.shape[nd - 1]);
    let size = x.dtype.size();
    let zero = HostData::try_filled(x.dtype, 1, 0.0)?.as_bytes().to_vec();
    let mut out = host_bytes(x)?;
    let bytes = out.as_bytes_mut();
    for i in 0..x.numel() {
        let (r, c) = ((i / cols.max(1)) % rows.max(1), i % cols.max(1));
        if !in_triangle(r, c, *diagonal, *upper) {
            bytes[i * size..(i + 1) * size].copy_from_slice(&zero);
        }
    }
    Ok(Tensor::from_host_data(out, &x.shape))
}

/// A triangular mask on the host.
pub(super) fn tri_mask(desc: &TriMask) -> Result<Tensor> {
    let (rows, cols, (inside, outside)) = (desc.rows, desc.cols, desc.values);
    let data = HostData::try_from_fn(desc.dtype, rows * cols, |i| {
        if in_triangle(i / cols, i % cols, desc.diagonal, desc.upper) {
            inside
        } else {
            outside
        }
    })?;
    Ok(Tensor::from_host_data(data, &[rows, cols]))
}
