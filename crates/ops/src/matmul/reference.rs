//! The host reference GEMM: matrixmultiply per batch (threaded) in f32 or f64, f16/bf16 through packed f32, then the epilogue.
use super::Matmul;
use crate::base::element::{Element, HostData};
use crate::base::layout::{numel, strided_positions};
use crate::base::tensor::{Storage, Tensor};
use crate::fused::activation::Activation;
use netcl_core_devices::{Error, Result};
use netcl_core_memory::host_vec;
use rayon::prelude::*;

/// The product on the host, into a new host tensor (row sums are left to the caller).
pub(super) fn matmul(desc: &Matmul<'_>) -> Result<(Tensor, Option<Tensor>)> {
    let out = Tensor::alloc(&desc.out_shape(), desc.a.dtype, &desc.a.device)?;
    let Matmul {
        a,
        b,
        batch,
        sa,
        sb,
        opts,
        ..
    } = desc;
    host_matmul(a, b, batch, sa, sb, &out, *opts)?;
    Ok((out, None))
}

/// A host GEMM in one arithmetic: `c = a x b` for row-major `c` (m x n, row stride n), `a` and
/// `b` at any strides (matrixmultiply packs them, so transposed views cost no copy).
trait HostGemm: Copy {
    /// # Safety
    /// `a` reaches `(m-1)*ra + (k-1)*ca`, `b` `(k-1)*rb + (n-1)*cb`, `c` `m*n` elements.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: *const Self,
        ra: usize,
        ca: usize,
        b: *const Self,
        rb: usize,
        cb: usize,
        c: *mut Self,
    );
    fn widen(self) -> f64;
    /// Rounds an f64 to this arithmetic.
    fn narrow(x: f64) -> Self;
}

macro_rules! host_gemm {
    ($t:ty, $f:path) => {
        impl HostGemm for $t {
            unsafe fn gemm(
                m: usize,
                k: usize,
                n: usize,
                a: *const $t,
                ra: usize,
                ca: usize,
                b: *const $t,
                rb: usize,
                cb: usize,
                c: *mut $t,
            ) {
                let i = |s: usize| s as isize;
                $f(
                    m,
                    k,
                    n,
                    1.0,
                    a,
                    i(ra),
                    i(ca),
                    b,
                    i(rb),
                    i(cb),
                    0.0,
                    c,
                    i(n),
                    1,
                )
            }
            fn widen(self) -> f64 {
                self as f64
            }
            fn narrow(x: f64) -> $t {
                x as $t
            }
        }
    };
}
host_gemm!(f32, matrixmultiply::sgemm);
host_gemm!(f64, matrixmultiply::dgemm);

/// One operand of a host GEMM: storage, the element offset of each batch, row and column strides.
struct HostOperand<'a, T> {
    data: &'a [T],
    offsets: Vec<usize>,
    rows: usize,
    cols: usize,
}

impl<'a, T> HostOperand<'a, T> {
    /// Operand `t` (`rows` x `cols` per batch) with batch strides `s` over `batch`.
    fn of(data: &'a [T], t: &Tensor, batch: &[usize], s: &[usize]) -> Self {
        let nd = t.ndim();
        HostOperand {
            data,
            offsets: strided_positions(batch, s, t.offset).collect(),
            rows: t.strides[nd - 2],
            cols: t.strides[nd - 1],
        }
    }

    /// The same operand packed contiguously (`data` holds its batches row-major).
    fn packed(data: &'a [T], batches: usize, rows: usize, cols: usize) -> Self {
        HostOperand {
            data,
            offsets: (0..batches).map(|z| z * rows * cols).collect(),
            rows: cols,
            cols: 1,
        }
    }
}

/// Every batch's product into `c` (batches of m x n, row-major), then `c = act(c + bias)` in the
/// arithmetic.
fn host_gemm<T: HostGemm + Send>(
    a: &HostOperand<'_, T>,
    b: &HostOperand<'_, T>,
    (m, k, n): (usize, usize, usize),
    c: &mut [T],
    bias: Option<&[f64]>,
    act: Activation,
) {
    for (z, cz) in c.chunks_mut(m * n).enumerate() {
        // SAFETY: the offsets and strides are those of valid views of `a.data` and `b.data`
        // (checked when the views were made), `cz` holds m*n elements.
        unsafe {
            T::gemm(
                m,
                k,
                n,
                a.data.as_ptr().add(a.offsets[z]),
                a.rows,
                a.cols,
                b.data.as_ptr().add(b.offsets[z]),
                b.rows,
                b.cols,
                cz.as_mut_ptr(),
            )
        };
    }
    if bias.is_none() && act == Activation::None {
        return;
    }
    c.par_chunks_mut(n).for_each(|row| {
        for (j, v) in row.iter_mut().enumerate() {
            let x = T::narrow(v.widen() + bias.map_or(0.0, |b| b[j]));
            *v = T::narrow(act.host(x.widen()));
        }
    });
}

/// `host_gemm` reading both operands (tensor, batch strides) in their storage (f32 or f64).
fn gemm_in_place<T: HostGemm + Element + Send>(
    c: &mut [T],
    [(a, sa), (b, sb)]: [(&Tensor, &[usize]); 2],
    batch: &[usize],
    dims: (usize, usize, usize),
    bias: Option<&[f64]>,
    act: Activation,
) -> Result<()> {
    let no_host = || Error::device("matmul", "host tensor without host storage");
    let ga = a.host().ok_or_else(no_host)?;
    // One lock when both operands view one storage (x.matmul(x.t())).
    let gb = if b.shares_storage(a) {
        None
    } else {
        Some(b.host().ok_or_else(no_host)?)
    };
    let (Some(x), Some(y)) = (T::unwrap(&ga), T::unwrap(gb.as_deref().unwrap_or(&ga))) else {
        return Err(Error::dtype("matmul", "host operands of another dtype"));
    };
    let (x, y) = (
        HostOperand::of(x, a, batch, sa),
        HostOperand::of(y, b, batch, sb),
    );
    host_gemm(&x, &y, dims, c, bias, act);
    Ok(())
}

/// Host reference: per batch, matrixmultiply's GEMM (threaded) in f32 (f32 directly, f16/bf16
/// through packed f32 copies) or f64, reading the operands at their strides, then the epilogue
/// (bias added and rounded, then the activation) in place.
fn host_matmul(
    a: &Tensor,
    b: &Tensor,
    batch: &[usize],
    sa: &[usize],
    sb: &[usize],
    out: &Tensor,
    opts: super::MatmulOptions<'_>,
) -> Result<()> {
    let (m, k) = (a.shape[a.ndim() - 2], a.shape[a.ndim() - 1]);
    let n = b.shape[b.ndim() - 1];
    let dims = (m, k, n);
    let bias = opts.bias.map(|t| t.to_vec_f64()).transpose()?;
    let bias = bias.as_deref();
    let act = opts.activation;
    let Storage::Host(lock) = &out.storage.data else {
        return Err(Error::device("matmul", "host product into a device tensor"));
    };
    // The output is new, so its lock is not one of the operands'.
    let mut g = lock.write().unwrap_or_else(|p| p.into_inner());
    match &mut *g {
        HostData::F32(c) => gemm_in_place(c, [(a, sa), (b, sb)], batch, dims, bias, act)?,
        HostData::F64(c) => gemm_in_place(c, [(a, sa), (b, sb)], batch, dims, bias, act)?,
        half => {
            // f16/bf16: the operands packed as f32, the product in f32, rounded once at the end.
            let packed = |t: &Tensor, s: &[usize], rows: usize, cols: usize| -> Result<Vec<f32>> {
                let mut shape = batch.to_vec();
                shape.extend([rows, cols]);
                let mut strides = s.to_vec();
                strides.extend(&t.strides[t.ndim() - 2..]);
                let h = t.host_view(&shape, &strides)?;
                Ok(with_host!(&h, v => {
                    let mut out = host_vec(v.len())?;
                    out.extend(v.iter().map(|e| e.to_f64() as f32));
                    out
                }))
            };
            let (xs, ys) = (packed(a, sa, m, k)?, packed(b, sb, k, n)?);
            let z = numel(batch);
            let (x, y) = (
                HostOperand::packed(&xs, z, m, k),
                HostOperand::packed(&ys, z, k, n),
            );
            let mut c = vec![0f32; z * m * n];
            host_gemm(&x, &y, dims, &mut c, bias, Activation::None);
            with_host!(half, dst => {
                for (d, &v) in dst.iter_mut().zip(&c) {
                    *d = Element::from_f64(act.host(v as f64));
                }
            });
        }
    }
    Ok(())
}
