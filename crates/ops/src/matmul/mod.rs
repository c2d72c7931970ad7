//! Matrix products: 2-D and batched with broadcast batch dims, any operand strides (transposes cost no copy), bias + activation epilogue (from the unary-op table).
pub(crate) mod cpu;
mod opencl;
mod reference;
pub(crate) mod tc;
use crate::base::checks::same_float;
use crate::base::dispatch::{dispatch, Op};
use crate::base::layout::{broadcast_shapes, broadcast_strides, numel};
use crate::base::tensor::Tensor;
use crate::fused::activation::Activation;
use netcl_core_devices::{Device, Error, Result};
use netcl_kernels::GemmTile;
pub(crate) use opencl::matmul_source;

/// Options of `Tensor::matmul_with`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulOptions<'a> {
    /// Added to every row of the product: shape (N), same dtype.
    pub bias: Option<&'a Tensor>,
    pub activation: Activation,
    /// Tile sizes to use instead of the device's tuning entry (for the autotuner).
    pub tile: Option<GemmTile>,
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
}

impl Matmul<'_> {
    /// The output shape: batch..., M, N.
    fn out_shape(&self) -> Vec<usize> {
        let mut shape = self.batch.clone();
        shape.extend([self.dims.0, self.dims.2]);
        shape
    }
}

impl Op for Matmul<'_> {
    type Output = Tensor;
    const NAME: &'static str = "matmul";
    fn opencl(&self, device: &Device) -> Result<Tensor> {
        opencl::matmul(self, device)
    }
    fn reference(&self) -> Result<Tensor> {
        reference::matmul(self)
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
        let op = "matmul";
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
        let strides = |t: &Tensor| {
            let nd = t.ndim();
            broadcast_strides(op, &t.shape[..nd - 2], &t.strides[..nd - 2], &batch)
        };
        let (sa, sb) = (strides(&a)?, strides(&b)?);
        let mut result_shape = batch.clone();
        result_shape.extend([m, n]);
        if other.ndim() == 1 {
            result_shape.pop();
        }
        if self.ndim() == 1 {
            result_shape.remove(result_shape.len() - if other.ndim() == 1 { 1 } else { 2 });
        }
        let desc = Matmul {
            a,
            b,
            batch,
            sa,
            sb,
            dims: (m, k, n),
            opts,
        };
        let out = if numel(&desc.out_shape()) == 0 {
            Tensor::alloc(&desc.out_shape(), self.dtype, &self.device)?
        } else {
            dispatch(&self.device, &desc)?
        };
        out.reshape(&result_shape)
    }
}
