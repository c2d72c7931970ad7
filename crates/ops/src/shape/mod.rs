//! Shape ops: one_hot, concat, stack, split (views), constant pad, triu/tril and triangular (causal) masks.
use crate::base::acc::arg_acc;
use crate::base::checks::{need_i32, same_device, u32_arg};
use crate::base::element::HostData;
use crate::base::index_checks::check_indices;
use crate::base::launch::{launch_1d, program_for};
use crate::base::layout::{check_reach, strided_positions};
use crate::base::layout::{checked_numel, contiguous_strides, numel, KernelLayout, MAX_DIMS};
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::sources::{COPY, SHAPE};

/// `PadLayout` of kernels/shape.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PadLayout {
    ndim: u32,
    shape: [u32; MAX_DIMS],
    before: [u32; MAX_DIMS],
    in_shape: [u32; MAX_DIMS],
    x_stride: [u32; MAX_DIMS],
    x_offset: u32,
}

/// Copy `src` into `dst`, a view of a freshly allocated device tensor of the same dtype (one kernel).
fn copy_into(op: &str, dst: &Tensor, src: &Tensor) -> Result<()> {
    if src.numel() == 0 {
        return Ok(());
    }
    let layout = KernelLayout::new(
        op,
        &src.shape,
        &[(&dst.strides, dst.offset), (&src.strides, src.offset)],
    )?;
    let program = program_for(&src.device, &COPY, src.dtype)?;
    launch_1d(&program, "strided_copy", src.numel(), |k| {
        k.declare((2 * src.numel() * src.dtype.size()) as u64, 0);
        k.arg_mem(dst.mem()?)?.arg_mem(src.mem()?)?.arg(&layout)?;
        Ok(())
    })
}

/// Row-major bytes of a host tensor.
fn host_bytes(t: &Tensor) -> Result<Vec<u8>> {
    Ok(t.to_host_data()?.as_bytes().to_vec())
}

impl Tensor {
    /// `ids` (i32, any shape) as one-hot rows: the result is `[..ids, classes]` of `dtype`, 1 at
    /// each id and 0 elsewhere. Ids must be in `[0, classes)`; unchecked large device id tensors
    /// (see [`crate::INDEX_CHECK_LIMIT`]) give all-zero rows for ids out of range. One kernel.
    pub fn one_hot(ids: &Tensor, classes: usize, dtype: DType) -> Result<Tensor> {
        let op = "one_hot";
        need_i32(op, ids)?;
        let mut shape = ids.shape.clone();
        shape.push(classes);
        checked_numel(op, &shape, dtype.size())?;
        check_indices(op, ids, classes, &format!("{classes} classes"))?;
        if let Some(v) = ids
            .device
            .is_host()
            .then(|| ids.to_vec::<i32>())
            .transpose()?
        {
            let data = HostData::from_fn(dtype, numel(&shape), |i| {
                (v[i / classes] as usize == i % classes) as u8 as f64
            });
            return Ok(Tensor::from_host_data(data, &shape));
        }
        let out = Tensor::alloc(&shape, dtype, &ids.device)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let mut id_strides = ids.strides.clone();
        id_strides.push(0);
        let layout =
            KernelLayout::new(op, &shape, &[(&out.strides, 0), (&id_strides, ids.offset)])?;
        let c = u32_arg(op, "size", classes)?;
        let program = program_for(&ids.device, &SHAPE, dtype)?;
        launch_1d(&program, "one_hot", out.numel(), |k| {
            k.arg_mem(out.mem()?)?
                .arg_mem(ids.mem()?)?
                .arg(&c)?
                .arg(&layout)?;
            Ok(())
        })?;
        Ok(out)
    }

    /// The tensors joined along `dim`: same dtype, device and rank, equal sizes but in `dim`.
    /// One strided-copy kernel per non-empty input, writing into a view of the result.
    pub fn concat(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        let op = "concat";
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid(op, "no tensors to concatenate"))?;
        let shapes: Vec<&Vec<usize>> = tensors.iter().map(|t| &t.shape).collect();
        if dim >= first.ndim() {
            return Err(Error::invalid(
                op,
                format!("dim {dim} out of range for shapes {shapes:?}"),
            ));
        }
        for t in &tensors[1..] {
            same_device(op, first, t)?;
            if t.dtype != first.dtype {
                return Err(Error::dtype(
                    op,
                    format!(
                        "{} and {} tensors (shapes {shapes:?})",
                        first.dtype, t.dtype
                    ),
                ));
            }
            let fits = t.ndim() == first.ndim()
                && (0..t.ndim()).all(|d| d == dim || t.shape[d] == first.shape[d]);
            if !fits {
                return Err(Error::shape(
                    op,
                    format!("shapes {shapes:?} differ outside dim {dim}"),
                ));
            }
        }
        let total = tensors
            .iter()
            .try_fold(0usize, |a, t| a.checked_add(t.shape[dim]))
            .ok_or_else(|| Error::shape(op, format!("shapes {shapes:?} overflow in dim {dim}")))?;
        let mut shape = first.shape.clone();
        shape[dim] = total;
        checked_numel(op, &shape, first.dtype.size())?;
        if first.device.is_host() {
            let size = first.dtype.size();
            let outer: usize = shape[..dim].iter().product();
            let inner: usize = shape[dim + 1..].iter().product::<usize>() * size;
            let parts = tensors
                .iter()
                .map(|t| host_bytes(t))
                .collect::<Result<Vec<_>>>()?;
            let mut bytes = Vec::with_capacity(numel(&shape) * size);
            for o in 0..outer {
                for (t, b) in tensors.iter().zip(&parts) {
                    let row = t.shape[dim] * inner;
                    bytes.extend_from_slice(&b[o * row..(o + 1) * row]);
                }
            }
            return Ok(Tensor::from_host_data(
                HostData::from_bytes(first.dtype, &bytes),
                &shape,
            ));
        }
        let out = Tensor::alloc(&shape, first.dtype, &first.device)?;
        let mut start = 0;
        for t in tensors {
            copy_into(op, &out.narrow(dim, start, t.shape[dim])?, t)?;
            start += t.shape[dim];
        }
        Ok(out)
    }

    /// The tensors (same shape, dtype and device) stacked along a new dim `dim` (0..=ndim).
    /// One strided-copy kernel per non-empty input.
    pub fn stack(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        let op = "stack";
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid(op, "no tensors to stack"))?;
        let shapes: Vec<&Vec<usize>> = tensors.iter().map(|t| &t.shape).collect();
        if dim > first.ndim() {
            return Err(Error::invalid(
                op,
                format!("dim {dim} out of range for stacking shapes {shapes:?}"),
            ));
        }
        if tensors.iter().any(|t| t.shape != first.shape) {
            return Err(Error::shape(op, format!("shapes {shapes:?} differ")));
        }
        let views = tensors
            .iter()
            .map(|t| t.unsqueeze(dim))
            .collect::<Result<Vec<_>>>()?;
        Tensor::concat(&views.iter().collect::<Vec<_>>(), dim).map_err(|e| match e {
            Error::DType { msg, .. } => Error::dtype(op, msg),
            Error::Device { msg, .. } => Error::device(op, msg),
            other => other,
        })
    }

    /// Views of consecutive chunks of `size` entries along `dim` (the last may be shorter), as
    /// `torch.split` with an int. No copies; an empty dim gives one empty view.
    pub fn split(&self, size: usize, dim: usize) -> Result<Vec<Tensor>> {
        let op = "split";
        if dim >= self.ndim() || size == 0 {
            return Err(Error::invalid(
                op,
                format!("chunk size {size} along dim {dim} of {:?}", self.shape),
            ));
        }
        let n = self.shape[dim];
        if n == 0 {
            return Ok(vec![self.clone()]);
        }
        (0..n)
            .step_by(size)
            .map(|s| self.narrow(dim, s, size.min(n - s)))
            .collect()
    }

    /// Views of consecutive chunks of the given sizes along `dim`, which must sum to its size.
    /// No copies.
    pub fn split_sizes(&self, sizes: &[usize], dim: usize) -> Result<Vec<Tensor>> {
        let op = "split_sizes";
        if dim >= self.ndim()
            || sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s)) != Some(self.shape[dim])
        {
            return Err(Error::invalid(
                op,
                format!("sizes {sizes:?} do not split dim {dim} of {:?}", self.shape),
            ));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                start += s;
                self.narrow(dim, start - s, s)
            })
            .collect()
    }

    /// This tensor surrounded by `value`: `pads[0] = (before, after)` pads the last dim,
    /// `pads[1]` the one before it, and so on (the order of `torch.nn.functional.pad`); pads are
    /// non-negative (no cropping). One kernel.
    pub fn pad(&self, pads: &[(usize, usize)], value: f64) -> Result<Tensor> {
        let op = "pad";
        let nd = self.ndim();
        if pads.len() > nd {
            return Err(Error::invalid(
                op,
                format!(
                    "{} pad pairs for the {nd} dims of {:?}",
                    pads.len(),
                    self.shape
                ),
            ));
        }
        let mut before = vec![0usize; nd];
        let mut shape = self.shape.clone();
        for (k, &(b, a)) in pads.iter().enumerate() {
            let d = nd - 1 - k;
            before[d] = b;
            shape[d] = b
                .checked_add(a)
                .and_then(|p| p.checked_add(self.shape[d]))
                .ok_or_else(|| {
                    Error::shape(op, format!("pads {pads:?} overflow shape {:?}", self.shape))
                })?;
        }
        let n = checked_numel(op, &shape, self.dtype.size())?;
        if self.device.is_host() {
            let size = self.dtype.size();
            let mut bytes = HostData::filled(self.dtype, n, value).as_bytes().to_vec();
            let out_strides = contiguous_strides(&shape);
            let start: usize = before.iter().zip(&out_strides).map(|(b, s)| b * s).sum();
            let src = host_bytes(self)?;
            for (i, p) in strided_positions(&self.shape, &out_strides, start).enumerate() {
                bytes[p * size..(p + 1) * size].copy_from_slice(&src[i * size..(i + 1) * size]);
            }
            return Ok(Tensor::from_host_data(
                HostData::from_bytes(self.dtype, &bytes),
                &shape,
            ));
        }
        let out = Tensor::alloc(&shape, self.dtype, &self.device)?;
        if n == 0 {
            return Ok(out);
        }
        if nd > MAX_DIMS {
            return Err(Error::shape(
                op,
                format!("{:?} has more than {MAX_DIMS} dims", self.shape),
            ));
        }
        check_reach(op, &self.shape, &self.strides, self.offset)?;
        let mut l = PadLayout {
            ndim: nd as u32,
            shape: [1; MAX_DIMS],
            before: [0; MAX_DIMS],
            in_shape: [1; MAX_DIMS],
            x_stride: [0; MAX_DIMS],
            x_offset: u32_arg(op, "offset", self.offset)?,
        };
        for d in 0..nd {
            l.shape[d] = u32_arg(op, "size", shape[d])?;
            l.before[d] = u32_arg(op, "size", before[d])?;
            l.in_shape[d] = u32_arg(op, "size", self.shape[d])?;
            l.x_stride[d] = u32_arg(op, "stride", self.strides[d])?;
        }
        let program = program_for(&self.device, &SHAPE, self.dtype)?;
        launch_1d(&program, "pad_constant", n, |k| {
            k.arg_mem(out.mem()?)?.arg_mem(self.mem()?)?.arg(&l)?;
            arg_acc(k, self.dtype, value)
        })?;
        Ok(out)
    }

    /// The upper triangle of the last two dims: elements with `col - row >= diagonal` kept, the
    /// rest 0 (`torch.triu`). One kernel.
    pub fn triu(&self, diagonal: i64) -> Result<Tensor> {
        self.tri("triu", diagonal, true)
    }

    /// The lower triangle of the last two dims: elements with `col - row <= diagonal` kept, the
    /// rest 0 (`torch.tril`). One kernel.
    pub fn tril(&self, diagonal: i64) -> Result<Tensor> {
        self.tri("tril", diagonal, false)
    }

    fn tri(&self, op: &str, diagonal: i64, upper: bool) -> Result<Tensor> {
        let nd = self.ndim();
        if nd < 2 {
            return Err(Error::shape(
                op,
                format!("needs at least 2 dims, got {:?}", self.shape),
            ));
        }
        let (rows, cols) = (self.shape[nd - 2], self.shape[nd - 1]);
        let keep = |i: usize| {
            let (r, c) = ((i / cols.max(1)) % rows.max(1), i % cols.max(1));
            let d = c as i128 - r as i128;
            if upper {
                d >= diagonal as i128
            } else {
                d <= diagonal as i128
            }
        };
        if self.device.is_host() {
            let size = self.dtype.size();
            let zero = HostData::filled(self.dtype, 1, 0.0).as_bytes().to_vec();
            let mut bytes = host_bytes(self)?;
            for i in 0..self.numel() {
                if !keep(i) {
                    bytes[i * size..(i + 1) * size].copy_from_slice(&zero);
                }
            }
            return Ok(Tensor::from_host_data(
                HostData::from_bytes(self.dtype, &bytes),
                &self.shape,
            ));
        }
        let out = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let layout = KernelLayout::new(
            op,
            &self.shape,
            &[(&out.strides, 0), (&self.strides, self.offset)],
        )?;
        let (r, c) = (u32_arg(op, "size", rows)?, u32_arg(op, "size", cols)?);
        let diag = diagonal.clamp(i32::MIN as i64, i32::MAX as i64) as i32;
        let program = program_for(&self.device, &SHAPE, self.dtype)?;
        launch_1d(&program, "tri_select", out.numel(), |k| {
            k.arg_mem(out.mem()?)?
                .arg_mem(self.mem()?)?
                .arg(&r)?
                .arg(&c)?
                .arg(&diag)?
                .arg(&(upper as u32))?;
            arg_acc(k, self.dtype, 0.0)?;
            k.arg(&layout)?;
            Ok(())
        })?;
        Ok(out)
    }

    /// A `[rows, cols]` mask: 1 where `col - row >= diagonal` (what `triu` keeps), else 0. One kernel.
    pub fn triu_mask(
        rows: usize,
        cols: usize,
        diagonal: i64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        tri_mask(
            "triu_mask",
            [rows, cols],
            diagonal,
            true,
            (1.0, 0.0),
            dtype,
            device,
        )
    }

    /// A `[rows, cols]` mask: 1 where `col - row <= diagonal` (what `tril` keeps), else 0. One kernel.
    pub fn tril_mask(
        rows: usize,
        cols: usize,
        diagonal: i64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        tri_mask(
            "tril_mask",
            [rows, cols],
            diagonal,
            false,
            (1.0, 0.0),
            dtype,
            device,
        )
    }

    /// The additive causal attention mask `[t, t]`: 0 where a query (row) may attend a key
    /// (col <= row), `-inf` above the diagonal; add it to the scores before softmax. Float dtypes.
    /// One kernel.
    pub fn causal_mask(t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(Error::dtype(
                "causal_mask",
                format!("needs a float dtype for -inf, not {dtype} (shape [{t}, {t}])"),
            ));
        }
        tri_mask(
            "causal_mask",
            [t, t],
            0,
            false,
            (0.0, f64::NEG_INFINITY),
            dtype,
            device,
        )
    }
}

/// A `[rows, cols]` tensor: `values.0` where triu (`upper`) / tril keeps the element, else `values.1`.
fn tri_mask(
    op: &str,
    [rows, cols]: [usize; 2],
    diagonal: i64,
    upper: bool,
    values: (f64, f64),
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let n = checked_numel(op, &[rows, cols], dtype.size())?;
    let keep = |i: usize| {
        let d = (i % cols) as i128 - (i / cols) as i128;
        if upper {
            d >= diagonal as i128
        } else {
            d <= diagonal as i128
        }
    };
    if device.is_host() {
        let data = HostData::from_fn(dtype, n, |i| if keep(i) { values.0 } else { values.1 });
        return Ok(Tensor::from_host_data(data, &[rows, cols]));
    }
    let out = Tensor::alloc(&[rows, cols], dtype, device)?;
    if n == 0 {
        return Ok(out);
    }
    let c = u32_arg(op, "size", cols)?;
    let diag = diagonal.clamp(i32::MIN as i64, i32::MAX as i64) as i32;
    let program = program_for(device, &SHAPE, dtype)?;
    launch_1d(&program, "tri_mask", n, |k| {
        k.arg_mem(out.mem()?)?
            .arg(&c)?
            .arg(&diag)?
            .arg(&(upper as u32))?;
        arg_acc(k, dtype, values.0)?;
        arg_acc(k, dtype, values.1)
    })?;
    Ok(out)
}
