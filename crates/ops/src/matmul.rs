//! Matrix products: 2-D and batched with broadcast batch dims, any operand strides (transposes cost no copy), bias + activation epilogue.
use crate::checks::same_float;
use crate::element::HostData;
use crate::layout::{
    broadcast_shapes, broadcast_strides, check_reach, contiguous_strides, numel, KernelLayout,
};
use crate::tensor::Tensor;
use ndarray::{Array2, ArrayView2};
use netcl_core_devices::{DType, Error, Result};
use netcl_kernels::sources::MATMUL;
use netcl_kernels::{gemm_tile, program, GemmTile, Kernel};

/// The activation applied by the matmul epilogue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    #[default]
    None,
    Relu,
    /// GELU with the exact erf.
    Gelu,
    /// GELU's tanh approximation.
    GeluTanh,
    Silu,
}

impl Activation {
    fn code(self) -> u32 {
        self as u32
    }
    fn host(self, v: f64) -> f64 {
        use crate::expr::UnaryOp;
        match self {
            Activation::None => v,
            Activation::Relu => UnaryOp::Relu.host(v),
            Activation::Gelu => UnaryOp::Gelu.host(v),
            Activation::GeluTanh => UnaryOp::GeluTanh.host(v),
            Activation::Silu => UnaryOp::Silu.host(v),
        }
    }
}

/// Options of `Tensor::matmul_with`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulOptions<'a> {
    /// Added to every row of the product: shape (N), same dtype.
    pub bias: Option<&'a Tensor>,
    pub activation: Activation,
    /// Tile sizes to use instead of the device's tuning entry (for the autotuner).
    pub tile: Option<GemmTile>,
}

impl Tensor {
    /// The matrix product over the last two dims: (..., M, K) x (..., K, N) -> (..., M, N), batch
    /// dims broadcast. A 1-D left operand is a row (K), a 1-D right operand a column (K).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.matmul_with(other, MatmulOptions::default())
    }

    /// `act(self x other + bias)` in one kernel.
    pub fn matmul_with(&self, other: &Tensor, opts: MatmulOptions<'_>) -> Result<Tensor> {
        let op = "matmul";
        let _span = netcl_profiling::span(op);
        same_float(op, &[self, other])?;
        if self.ndim() == 0 || other.ndim() == 0 {
            return Err(Error::shape(
                op,
                format!(
                    "operands {:?} and {:?} need at least one dim",
                    self.shape, other.shape
                ),
            ));
        }
        let a = if self.ndim() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if other.ndim() == 1 {
            other.unsqueeze(1)?
        } else {
            other.clone()
        };
        let (m, k) = (a.shape[a.ndim() - 2], a.shape[a.ndim() - 1]);
        let (k2, n) = (b.shape[b.ndim() - 2], b.shape[b.ndim() - 1]);
        if k != k2 {
            return Err(Error::shape(
                op,
                format!(
                    "inner dims differ: {:?} x {:?} ({k} vs {k2})",
                    self.shape, other.shape
                ),
            ));
        }
        if let Some(bias) = opts.bias {
            if bias.shape != [n] || bias.dtype != self.dtype || bias.device != self.device {
                return Err(Error::shape(
                    op,
                    format!(
                        "bias is {} {:?} on {} but the product has {n} columns of {}",
                        bias.dtype, bias.shape, bias.device, self.dtype
                    ),
                ));
            }
        }
        let batch = broadcast_shapes(op, &a.shape[..a.ndim() - 2], &b.shape[..b.ndim() - 2])
            .map_err(|_| {
                Error::shape(
                    op,
                    format!(
                        "batch dims of {:?} and {:?} do not broadcast",
                        self.shape, other.shape
                    ),
                )
            })?;
        let sa = broadcast_strides(
            op,
            &a.shape[..a.ndim() - 2],
            &a.strides[..a.ndim() - 2],
            &batch,
        )?;
        let sb = broadcast_strides(
            op,
            &b.shape[..b.ndim() - 2],
            &b.strides[..b.ndim() - 2],
            &batch,
        )?;
        let mut shape = batch.clone();
        shape.extend([m, n]);
        let out = Tensor::alloc(&shape, self.dtype, &self.device)?;
        let mut result_shape = shape.clone();
        if other.ndim() == 1 {
            result_shape.pop();
        }
        if self.ndim() == 1 {
            result_shape.remove(result_shape.len() - if other.ndim() == 1 { 1 } else { 2 });
        }
        if numel(&shape) == 0 {
            return out.reshape(&result_shape);
        }
        let (sam, sak) = (a.strides[a.ndim() - 2], a.strides[a.ndim() - 1]);
        let (sbk, sbn) = (b.strides[b.ndim() - 2], b.strides[b.ndim() - 1]);
        if self.device.is_host() {
            host_matmul(&a, &b, &batch, &sa, &sb, &out, opts)?;
            return out.reshape(&result_shape);
        }
        let mut full_a = sa.clone();
        full_a.extend([sam, sak]);
        let mut full_b = sb.clone();
        full_b.extend([sbk, sbn]);
        let mut a_shape = batch.clone();
        a_shape.extend([m, k]);
        let mut b_shape = batch.clone();
        b_shape.extend([k, n]);
        let too_far = || {
            Error::shape(
                op,
                format!(
                    "{:?} x {:?} reaches past the 32-bit kernel index",
                    self.shape, other.shape
                ),
            )
        };
        check_reach(op, &a_shape, &full_a, a.offset).map_err(|_| too_far())?;
        check_reach(op, &b_shape, &full_b, b.offset).map_err(|_| too_far())?;
        if numel(&shape) > u32::MAX as usize {
            return Err(too_far());
        }
        let so = contiguous_strides(&batch)
            .iter()
            .map(|s| s * m * n)
            .collect::<Vec<_>>();
        let layout = KernelLayout::new(op, &batch, &[(&so, 0), (&sa, a.offset), (&sb, b.offset)])?;
        let cus = self.device.info().compute_units as usize;
        let tile = opts
            .tile
            .unwrap_or_else(|| gemm_tile(&self.device).fit(m, n, numel(&batch), cus));
        let groups = m.div_ceil(tile.bm as usize) * n.div_ceil(tile.bn as usize) * numel(&batch);
        let plain = opts.bias.is_none() && opts.activation == Activation::None;
        if let (true, Some(s)) = (plain && numel(&batch) == 1, split_k(groups, cus, k)) {
            // Too few output tiles for the device and a long K (weight gradients): S partial
            // products over K chunks as one batched GEMM over strided views, then their sum.
            let kc = k / s;
            let av = a.view_of(vec![s, m, kc], vec![kc * sak, sam, sak], a.offset);
            let bv = b.view_of(vec![s, kc, n], vec![kc * sbk, sbk, sbn], b.offset);
            return av.matmul(&bv)?.sum(&[0], false)?.reshape(&result_shape);
        }
        let acc_bytes = if self.dtype == DType::F64 { 8 } else { 4 };
        tile.check(&self.device, acc_bytes)?;
        let aligned =
            m % tile.bm as usize == 0 && n % tile.bn as usize == 0 && k % tile.bk as usize == 0;
        let options = format!(
            "{} {} -DACT={}{}",
            self.dtype.build_option(),
            tile.options(),
            opts.activation.code(),
            if aligned { " -DALIGNED" } else { "" }
        );
        let program = program(&self.device, &MATMUL, &options)?;
        let [tx, ty] = tile.local();
        let groups_n = n.div_ceil(tile.bn as usize);
        let groups_m = m.div_ceil(tile.bm as usize);
        let u = |x: usize| x as u32;
        let mut kern = Kernel::new(&program, "matmul")?;
        kern.arg_mem(out.mem()?)?
            .arg_mem(a.mem()?)?
            .arg_mem(b.mem()?)?
            .arg_mem(opts.bias.map_or_else(|| out.mem(), |t| t.mem())?)?
            .arg(&layout)?;
        for v in [m, n, k, sam, sak, sbk, sbn] {
            kern.arg(&u(v))?;
        }
        kern.arg(&u(opts.bias.is_some() as usize))?;
        // A, B and C once each (and the bias); a multiply and an add per (batch, m, n, k).
        let elems = a.numel() + b.numel() + numel(&shape) + opts.bias.map_or(0, |_| n);
        kern.declare(
            (elems * self.dtype.size()) as u64,
            2 * (numel(&batch) * m * n * k) as u64,
        );
        kern.launch(&[groups_n * tx, groups_m * ty, numel(&batch)], &[tx, ty, 1])?;
        out.reshape(&result_shape)
    }
}

/// The number of K chunks for a GEMM of `groups` work-groups on `cus` compute units: a divisor
/// of `k` giving about two work-groups per compute unit with chunks of at least 128, or None.
fn split_k(groups: usize, cus: usize, k: usize) -> Option<usize> {
    if groups >= cus || k < 1024 {
        return None;
    }
    let want = (2 * cus).div_ceil(groups).min(k / 128);
    (2..=want).rev().find(|s| k.is_multiple_of(*s))
}

/// Host reference: per batch, ndarray's GEMM in f32 (f16/bf16/f32) or f64, then the epilogue.
fn host_matmul(
    a: &Tensor,
    b: &Tensor,
    batch: &[usize],
    sa: &[usize],
    sb: &[usize],
    out: &Tensor,
    opts: MatmulOptions<'_>,
) -> Result<()> {
    let (m, k) = (a.shape[a.ndim() - 2], a.shape[a.ndim() - 1]);
    let n = b.shape[b.ndim() - 1];
    let view = |t: &Tensor, s: &[usize], rows: usize, cols: usize| -> Result<Vec<f64>> {
        let mut shape = batch.to_vec();
        shape.extend([rows, cols]);
        let mut strides = s.to_vec();
        strides.extend(&t.strides[t.ndim() - 2..]);
        t.host_view(&shape, &strides)
            .map(|h| h.to_f64())
            .ok_or_else(|| Error::device("matmul", "host tensor without host storage"))
    };
    let (av, bv) = (view(a, sa, m, k)?, view(b, sb, k, n)?);
    let bias = opts.bias.map(|t| t.to_vec_f64()).transpose()?;
    let mut result = Vec::with_capacity(numel(batch) * m * n);
    for z in 0..numel(batch) {
        let (x, y) = (
            &av[z * m * k..(z + 1) * m * k],
            &bv[z * k * n..(z + 1) * k * n],
        );
        let prod: Vec<f64> = if a.dtype == DType::F64 {
            let x = ArrayView2::from_shape((m, k), x)
                .map_err(|e| Error::shape("matmul", format!("host operands: {e}")))?;
            let y = ArrayView2::from_shape((k, n), y)
                .map_err(|e| Error::shape("matmul", format!("host operands: {e}")))?;
            x.dot(&y).into_iter().collect()
        } else {
            let x = Array2::from_shape_vec((m, k), x.iter().map(|&v| v as f32).collect())
                .map_err(|e| Error::shape("matmul", format!("host operands: {e}")))?;
            let y = Array2::from_shape_vec((k, n), y.iter().map(|&v| v as f32).collect())
                .map_err(|e| Error::shape("matmul", format!("host operands: {e}")))?;
            x.dot(&y).into_iter().map(|v| v as f64).collect()
        };
        for (i, v) in prod.into_iter().enumerate() {
            let v = v + bias.as_ref().map_or(0.0, |bb| bb[i % n]);
            let v = if a.dtype == DType::F64 {
                v
            } else {
                v as f32 as f64
            };
            result.push(opts.activation.host(v));
        }
    }
    let data = HostData::from_fn(out.dtype, result.len(), |i| result[i]);
    match &out.storage.data {
        crate::tensor::Storage::Host(lock) => {
            *lock.write().unwrap_or_else(|p| p.into_inner()) = data;
            Ok(())
        }
        crate::tensor::Storage::Device(_) => {
            Err(Error::device("matmul", "host product into a device tensor"))
        }
    }
}
