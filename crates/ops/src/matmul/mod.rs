//! Matrix products: 2-D and batched with broadcast batch dims, any operand strides (transposes cost no copy), bias + activation epilogue (from the unary-op table); on OpenCL devices each product runs the plan of the GEMM planner (plan.rs).
pub(crate) mod matmul_async;
mod matmul_cpu;
mod matmul_gemv;
mod matmul_parts;
pub(crate) mod matmul_tc;
mod matmul_tiled;
mod matmul_wg;
mod opencl;
pub mod plan;
mod plan_display;
mod plan_tc;
pub(crate) mod precision;
mod probes;
mod reference;
mod source;
mod tensor_cores;
use crate::base::checks::same_float;
use crate::base::dispatch::dispatch;
use crate::base::layout::{broadcast_shapes, broadcast_strides, numel};
use crate::base::tensor::Tensor;
use crate::fused::activation::Activation;
use netcl_core_devices::{DType, Error, Result};
use netcl_kernels::{GemmTile, TcTile, WgTile};

/// Options of `Tensor::matmul_with`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulOptions<'a> {
    /// Added to every row of the product: shape (N), same dtype.
    pub bias: Option<&'a Tensor>,
    pub activation: Activation,
    /// Tile sizes to use instead of the device's tuning entry (for the autotuner).
    pub tile: Option<GemmTile>,
    /// The tensor-core tiling to use instead of the device's (for the autotuner).
    pub tc_tile: Option<TcTile>,
    /// The wgmma tiling to use instead of the planner's choice (for the autotuner), where the
    /// device runs it.
    pub wg_tile: Option<WgTile>,
    /// The product's dtype, when not the operands': only f32 for bf16 or f16 operands (the
    /// autocast products). Tensor cores write their f32 sums as they are; other devices round the
    /// product to the operands' dtype, then widen it. The bias then is f32 too.
    pub out_dtype: Option<DType>,
    /// A hint: A's entries (m, k) with k > m + d are zeros (a causal attention's scores'
    /// gradients), so the tiled kernels may stop each tile's K loop early. Results do not depend
    /// on it.
    pub lower: Option<isize>,
}

/// A checked product `act(A x B + bias)`: A (batch..., M, K) and B (batch..., K, N) at any
/// strides, their batch dims broadcast to `batch` (`sa`, `sb`: the operands' strides over it);
/// the output is a new contiguous (batch..., M, N) tensor of A's dtype.
#[derive(Clone, Debug)]
struct Matmul<'a> {
    a: Tensor,
    b: Tensor,
    batch: Vec<usize>,
    sa: Vec<usize>,
    sb: Vec<usize>,
    /// (M, K, N).
    dims: (usize, usize, usize),
    opts: MatmulOptions<'a>,
    /// Also A's row sums over K, where the product's kernel can add them up (one 2-D product).
    row_sums: bool,
    /// Which operands were 1-D (their dims are dropped from the result).
    vectors: MatmulVectors,
}

impl Matmul<'_> {
    /// The output shape: batch..., M, N.
    fn out_shape(&self) -> Vec<usize> {
        let mut shape = self.batch.clone();
        shape.extend([self.dims.0, self.dims.2]);
        shape
    }

    /// The result's shape: the output's without the dims 1-D operands added.
    fn result_shape(&self) -> Vec<usize> {
        let mut shape = self.out_shape();
        for d in self.vectors.dropped(shape.len()) {
            shape.remove(d);
        }
        shape
    }
}

/// The product and, where its kernel added them up, A's row sums.
type Product = (Tensor, Option<Tensor>);

impl_op!(Matmul<'_>, Product, "matmul", matmul);

/// NumPy's 1-D matmul operands, for the op and its autograd rule alike: a left vector (K) is
/// the row (1, K), a right vector (K) the column (K, 1), and the dims they add are dropped from
/// the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulVectors {
    left: bool,
    right: bool,
}

impl MatmulVectors {
    /// The operands of shapes `a` and `b`; an error naming matmul when either is 0-dim.
    pub fn of(a: &[usize], b: &[usize]) -> Result<MatmulVectors> {
        if a.is_empty() || b.is_empty() {
            return Err(Error::shape(
                "matmul",
                format!("operands {a:?} and {b:?} need at least one dim"),
            ));
        }
        Ok(MatmulVectors {
            left: a.len() == 1,
            right: b.len() == 1,
        })
    }

    /// The dim to unsqueeze the left operand at, when it is a vector.
    pub fn left(self) -> Option<usize> {
        self.left.then_some(0)
    }

    /// The dim to unsqueeze the right operand at, when it is a vector.
    pub fn right(self) -> Option<usize> {
        self.right.then_some(1)
    }

    /// The dims of an `n`-dim product of the unsqueezed operands to drop, last first (so each
    /// can be removed in turn).
    pub fn dropped(self, n: usize) -> Vec<usize> {
        let mut dims = Vec::new();
        if self.right {
            dims.push(n - 1);
        }
        if self.left {
            dims.push(n - 2);
        }
        dims
    }
}

impl Tensor {
    /// The matrix product over the last two dims: (..., M, K) x (..., K, N) -> (..., M, N), batch
    /// dims broadcast. A 1-D left operand is a row (K), a 1-D right operand a column (K).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.matmul_with(other, MatmulOptions::default())
    }

    /// `act(self x other + bias)` in one kernel.
    pub fn matmul_with(&self, other: &Tensor, opts: MatmulOptions<'_>) -> Result<Tensor> {
        Ok(self.product(other, opts, false)?.0)
    }

    /// `act(self x other + bias)` and the sums of self's rows over K (self's shape without its
    /// last dim): for a weight gradient dYᵀ X, the bias's gradient too. The product's kernel adds
    /// them up where it runs matmul_tiled.cl's or the f32 pipeline's tiles on a 2-D product (the sums
    /// of each A tile it stages, in the first column of tiles); elsewhere they are a sum of their
    /// own.
    pub fn matmul_with_row_sums(
        &self,
        other: &Tensor,
        opts: MatmulOptions<'_>,
    ) -> Result<(Tensor, Tensor)> {
        let in_kernel = self.ndim() == 2 && other.ndim() == 2;
        let (y, sums) = self.product(other, opts, in_kernel)?;
        let sums = match sums {
            Some(s) => s,
            None => self.sum(&[self.ndim() - 1], false)?,
        };
        Ok((y, sums))
    }

    /// The plan of `self x other` with `opts` on their device: the kernel, its tile, split and
    /// operand staging (`NETCL_DEBUG=gemm` prints each distinct one as products run).
    pub fn matmul_plan(&self, other: &Tensor, opts: MatmulOptions<'_>) -> Result<plan::GemmPlan> {
        let desc = self.describe(other, opts, false)?;
        Ok(opencl::plan_of(&desc, &self.device))
    }

    /// The checked product, with A's row sums when `row_sums` and its kernel adds them up.
    fn product(&self, other: &Tensor, opts: MatmulOptions<'_>, row_sums: bool) -> Result<Product> {
        let desc = self.describe(other, opts, row_sums)?;
        let out = opts.out_dtype.unwrap_or(self.dtype);
        if out != self.dtype && !self.device.is_opencl() {
            return Ok((widened(self, other, opts)?, None));
        }
        let (y, sums) = if numel(&desc.out_shape()) == 0 {
            (Tensor::alloc(&desc.out_shape(), out, &self.device)?, None)
        } else {
            dispatch(&self.device, &desc)?
        };
        Ok((y.reshape(&desc.result_shape())?, sums))
    }

    /// The checked description of `self x other` with `opts`.
    fn describe<'a>(
        &self,
        other: &Tensor,
        opts: MatmulOptions<'a>,
        row_sums: bool,
    ) -> Result<Matmul<'a>> {
        let op = "matmul";
        same_float(op, &[self, other])?;
        let vectors = MatmulVectors::of(&self.shape, &other.shape)?;
        let a = match vectors.left() {
            Some(d) => self.unsqueeze(d)?,
            None => self.clone(),
        };
        let b = match vectors.right() {
            Some(d) => other.unsqueeze(d)?,
            None => other.clone(),
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
        let out = opts.out_dtype.unwrap_or(self.dtype);
        let widening = out == DType::F32 && matches!(self.dtype, DType::BF16 | DType::F16);
        if out != self.dtype && !widening {
            return Err(Error::dtype(
                op,
                format!(
                    "a product of {} operands cannot be written as {out}; only bf16 and f16 \
                     products widen (to f32)",
                    self.dtype
                ),
            ));
        }
        if let Some(bias) = opts.bias {
            if bias.shape != [n] || bias.dtype != out || bias.device != self.device {
                return Err(Error::shape(
                    op,
                    format!(
                        "bias is {} {:?} on {} but the product has {n} columns of {out}",
                        bias.dtype, bias.shape, bias.device
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
        let strides = |t: &Tensor| {
            let nd = t.ndim();
            broadcast_strides(op, &t.shape[..nd - 2], &t.strides[..nd - 2], &batch)
        };
        let (sa, sb) = (strides(&a)?, strides(&b)?);
        Ok(Matmul {
            a,
            b,
            batch,
            sa,
            sb,
            dims: (m, k, n),
            opts,
            row_sums,
            vectors,
        })
    }
}

/// `a x b` rounded to the operands' dtype, then widened to `opts.out_dtype` (the bias added in
/// the operands' dtype): for devices without a kernel that writes the wider dtype.
pub(crate) fn widened(a: &Tensor, b: &Tensor, opts: MatmulOptions<'_>) -> Result<Tensor> {
    let bias = opts.bias.map(|t| t.to_dtype(a.dtype)).transpose()?;
    let narrow = MatmulOptions {
        bias: bias.as_ref(),
        out_dtype: None,
        ..opts
    };
    let y = a.matmul_with(b, narrow)?;
    y.to_dtype(opts.out_dtype.unwrap_or(a.dtype))
}
