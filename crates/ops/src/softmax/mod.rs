//! softmax and log_softmax over any axis of strided views, and fused cross-entropy (forward, mean, backward).
mod opencl;
mod reference;
use crate::base::acc::acc_dtype;
use crate::base::checks::{check_device, check_dtype, check_float, u32_arg};
use crate::base::dispatch::dispatch;
use crate::base::layout::KernelLayout;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};

/// Outputs of [`Tensor::cross_entropy`].
#[derive(Clone, Debug)]
pub struct CrossEntropy {
    /// 0-dim mean loss over the rows that are not ignored (NaN when every row is).
    pub loss: Tensor,
    /// 0-dim count of rows that are not ignored (what the mean divides by).
    pub count: Tensor,
    /// Per-row losses (N), 0 for ignored rows.
    pub losses: Tensor,
    /// Per-row logsumexp of the logits (N), what the backward needs.
    pub lse: Tensor,
}

/// `CeLayout` of kernels/softmax.cl: logits (n, c) and targets (n) with their offsets and
/// strides, and the ignore index.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CeLayout {
    n: u32,
    c: u32,
    xoff: u32,
    xr: u32,
    xc: u32,
    toff: u32,
    ts: u32,
    use_ignore: i32,
    ignore: i32,
}

/// Validated logits [N, C] and targets [N] of a cross-entropy op.
#[derive(Clone, Debug)]
struct CeArgs {
    n: usize,
    c: usize,
    cl: CeLayout,
}

fn ce_args(
    op: &str,
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: Option<i32>,
) -> Result<CeArgs> {
    check_float(op, logits, "logits")?;
    check_device(op, logits, targets, "targets")?;
    check_dtype(op, targets, "targets", DType::I32)?;
    if logits.ndim() != 2 || targets.shape != [logits.shape[0]] {
        return Err(Error::shape(
            op,
            format!(
                "logits {:?} and targets {:?}: need logits [N, C] and targets [N]",
                logits.shape, targets.shape
            ),
        ));
    }
    let (n, c) = (logits.shape[0], logits.shape[1]);
    // Every offset a kernel computes must fit its 32-bit index.
    KernelLayout::new(op, &logits.shape, &[(&logits.strides, logits.offset)])?;
    KernelLayout::new(op, &targets.shape, &[(&targets.strides, targets.offset)])?;
    let cl = CeLayout {
        n: u32_arg(op, "rows", n)?,
        c: u32_arg(op, "classes", c)?,
        xoff: u32_arg(op, "offset", logits.offset)?,
        xr: u32_arg(op, "stride", logits.strides[0])?,
        xc: u32_arg(op, "stride", logits.strides[1])?,
        toff: u32_arg(op, "offset", targets.offset)?,
        ts: u32_arg(op, "stride", targets.strides[0])?,
        use_ignore: ignore_index.is_some() as i32,
        ignore: ignore_index.unwrap_or(0),
    };
    Ok(CeArgs { n, c, cl })
}

/// The mask of an `ndim`-dim tensor's axes that selects `dim` alone (the softmax rows).
fn dim_mask(ndim: usize, dim: usize) -> Vec<bool> {
    let mut mask = vec![false; ndim];
    mask[dim] = true;
    mask
}

/// A checked softmax (or log_softmax, `log`) of `x` along `dim`: a new contiguous tensor of x's
/// shape and dtype.
#[derive(Clone, Debug)]
struct Softmax {
    x: Tensor,
    dim: usize,
    log: bool,
}

impl Softmax {
    fn op(&self) -> &'static str {
        if self.log {
            "log_softmax"
        } else {
            "softmax"
        }
    }
}

impl_op!(Softmax, Tensor, "softmax", softmax, |d| d.op());

/// A checked softmax (or log_softmax, `log`) gradient along `dim` from the output `y` and the
/// upstream gradient `dy` (same shape, dtype and device): a new contiguous tensor of y's shape.
#[derive(Clone, Debug)]
struct SoftmaxBackward {
    y: Tensor,
    dy: Tensor,
    dim: usize,
    log: bool,
}

impl SoftmaxBackward {
    fn op(&self) -> &'static str {
        if self.log {
            "log_softmax_backward"
        } else {
            "softmax_backward"
        }
    }
}

impl_op!(
    SoftmaxBackward,
    Tensor,
    "softmax_backward",
    softmax_backward,
    |d| d.op()
);

/// Checked per-row cross-entropy of `logits` [N, C] against I32 `targets` [N]: (losses [N],
/// lse [N]) in the accumulator dtype.
#[derive(Clone, Debug)]
struct CrossEntropyRows {
    logits: Tensor,
    targets: Tensor,
    ignore_index: Option<i32>,
    args: CeArgs,
}

impl_op!(
    CrossEntropyRows,
    (Tensor, Tensor),
    "cross_entropy",
    cross_entropy_rows
);

/// The mean of per-row `losses` [N] over the rows whose target is not `ignore_index`: (loss,
/// count), 0-dim in the accumulator dtype of logits of `dtype`.
#[derive(Clone, Debug)]
struct CrossEntropyMean {
    losses: Tensor,
    targets: Tensor,
    ignore_index: Option<i32>,
    args: CeArgs,
    /// The logits' dtype (the kernel's program is built for it).
    dtype: DType,
}

impl_op!(
    CrossEntropyMean,
    (Tensor, Tensor),
    "cross_entropy_mean",
    cross_entropy_mean
);

/// A checked cross-entropy gradient w.r.t. `logits` [N, C]: `lse` [N], `grad` [] / [1] (read at
/// stride `gs` = 0) or [N], `count` [] / [1] when the loss was the mean; a new contiguous tensor
/// of the logits' shape and dtype.
#[derive(Clone, Debug)]
struct CrossEntropyBackward {
    logits: Tensor,
    targets: Tensor,
    lse: Tensor,
    grad: Tensor,
    count: Option<Tensor>,
    ignore_index: Option<i32>,
    args: CeArgs,
    /// grad's stride over the rows (0 when it broadcasts).
    gs: usize,
}

impl_op!(
    CrossEntropyBackward,
    Tensor,
    "cross_entropy_backward",
    cross_entropy_backward
);

impl Tensor {
    fn softmax_impl(&self, dim: usize, log: bool) -> Result<Tensor> {
        let desc = Softmax {
            x: self.clone(),
            dim,
            log,
        };
        let op = desc.op();
        check_float(op, self, "input")?;
        if dim >= self.ndim() {
            return Err(Error::invalid(
                op,
                format!("dim {dim} out of range for shape {:?}", self.shape),
            ));
        }
        dispatch(&self.device, &desc)
    }

    /// `exp(x - max) / sum(exp(x - max))` along `dim`; a contiguous result of the same shape and
    /// dtype (f16/bf16 computed in f32). One kernel. Rows of only -inf, or with NaN, give NaN.
    pub fn softmax(&self, dim: usize) -> Result<Tensor> {
        self.softmax_impl(dim, false)
    }

    /// `x - logsumexp(x)` along `dim`, as [`Tensor::softmax`]. One kernel.
    pub fn log_softmax(&self, dim: usize) -> Result<Tensor> {
        self.softmax_impl(dim, true)
    }

    fn softmax_backward_impl(&self, dy: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
        let desc = SoftmaxBackward {
            y: self.clone(),
            dy: dy.clone(),
            dim,
            log,
        };
        let op = desc.op();
        check_float(op, self, "output")?;
        check_device(op, self, dy, "dy")?;
        check_dtype(op, dy, "dy", self.dtype)?;
        if dy.shape != self.shape || dim >= self.ndim() {
            return Err(Error::shape(
                op,
                format!(
                    "dy {:?} and output {:?} must match, with dim {dim} inside them",
                    dy.shape, self.shape
                ),
            ));
        }
        dispatch(&self.device, &desc)
    }
    /// Gradient of [`Tensor::softmax`] along `dim` from its output `self` (y) and the upstream
    /// gradient `dy` (same shape and dtype, any strides): `y * (dy - sum(dy * y))`, contiguous.
    /// One kernel for rows contiguous in y and dy of up to 8192 elements; three otherwise
    /// (product, row sums, combine). f16/bf16 are computed in f32.
    pub fn softmax_backward(&self, dy: &Tensor, dim: usize) -> Result<Tensor> {
        self.softmax_backward_impl(dy, dim, false)
    }

    /// Gradient of [`Tensor::log_softmax`] along `dim` from its output `self` (y) and `dy`:
    /// `dy - exp(y) * sum(dy)`, as [`Tensor::softmax_backward`] (for other rows two kernels, row
    /// sums and combine; three for f16/bf16, which are summed in f32).
    pub fn log_softmax_backward(&self, dy: &Tensor, dim: usize) -> Result<Tensor> {
        self.softmax_backward_impl(dy, dim, true)
    }

    /// Per-row cross-entropy of logits `[N, C]` (this tensor, any strides) against I32 targets `[N]`:
    /// returns (losses `[N]`, lse `[N]`) in [`acc_dtype`], one kernel. Rows whose target equals
    /// `ignore_index` get loss 0. A target outside [0, C) is an error: at once for host tensors; on
    /// a device the kernel records it and the next read from that device returns the error
    /// (see `device_errors.rs`), and that row's loss and gradient are NaN.
    pub fn cross_entropy_rows(
        &self,
        targets: &Tensor,
        ignore_index: Option<i32>,
    ) -> Result<(Tensor, Tensor)> {
        let op = "cross_entropy";
        let args = ce_args(op, self, targets, ignore_index)?;
        let desc = CrossEntropyRows {
            logits: self.clone(),
            targets: targets.clone(),
            ignore_index,
            args,
        };
        dispatch(&self.device, &desc)
    }

    /// Mean cross-entropy over the rows not ignored, with the per-row losses, lse and count
    /// (see [`Tensor::cross_entropy_rows`]). Two kernels: per-row losses, then the mean.
    pub fn cross_entropy(
        &self,
        targets: &Tensor,
        ignore_index: Option<i32>,
    ) -> Result<CrossEntropy> {
        let op = "cross_entropy";
        let args = ce_args(op, self, targets, ignore_index)?;
        let (losses, lse) = self.cross_entropy_rows(targets, ignore_index)?;
        let desc = CrossEntropyMean {
            losses: losses.clone(),
            targets: targets.clone(),
            ignore_index,
            args,
            dtype: self.dtype,
        };
        let (loss, count) = dispatch(&self.device, &desc)?;
        Ok(CrossEntropy {
            loss,
            count,
            losses,
            lse,
        })
    }
    /// The mean of per-row cross-entropy losses (this tensor, `[N]`, as
    /// [`Tensor::cross_entropy_rows`] returns them) over the rows whose target is not
    /// `ignore_index`: (loss, count), 0-dim in the losses' dtype, as [`Tensor::cross_entropy`]
    /// computes them (losses computed in pieces, e.g. a chunked loss, meet here). One kernel.
    pub fn cross_entropy_mean(
        &self,
        targets: &Tensor,
        ignore_index: Option<i32>,
    ) -> Result<(Tensor, Tensor)> {
        let op = "cross_entropy_mean";
        check_dtype(op, self, "losses", acc_dtype(self.dtype))?;
        if self.ndim() != 1 {
            return Err(Error::shape(
                op,
                format!("losses {:?} must be [N]", self.shape),
            ));
        }
        // The rows' layout as the mean kernel reads it (one "class" per row: targets are not
        // range-checked by the mean).
        let args = ce_args(op, &self.unsqueeze(1)?, targets, ignore_index)?;
        let desc = CrossEntropyMean {
            // The kernel reads the losses densely from element 0.
            losses: crate::base::host::dense(self)?,
            targets: targets.clone(),
            ignore_index,
            args,
            dtype: self.dtype,
        };
        dispatch(&self.device, &desc)
    }

    /// Gradient of cross-entropy w.r.t. these logits [N, C]: `(softmax - onehot(target)) *
    /// grad[i] / count`, contiguous, in the logits' dtype. `lse` `[N]` is the forward's, `grad` the
    /// upstream gradient (`[]` or `[1]` broadcast, or `[N]` per row), `count` (`[]` or `[1]`) divides when
    /// given (the mean loss); all three in [`acc_dtype`]. Ignored rows get 0, rows with an
    /// out-of-range target NaN on devices (an error on the host). One kernel.
    pub fn cross_entropy_backward(
        &self,
        targets: &Tensor,
        lse: &Tensor,
        grad: &Tensor,
        count: Option<&Tensor>,
        ignore_index: Option<i32>,
    ) -> Result<Tensor> {
        let op = "cross_entropy_backward";
        let a = ce_args(op, self, targets, ignore_index)?;
        let acc = acc_dtype(self.dtype);
        let scalar = |t: &Tensor| t.numel() == 1 && t.ndim() <= 1;
        for (t, what) in [(lse, "lse"), (grad, "grad")]
            .into_iter()
            .chain(count.map(|c| (c, "count")))
        {
            check_device(op, self, t, what)?;
            check_dtype(op, t, what, acc)?;
        }
        if lse.shape != [a.n]
            || !(scalar(grad) || grad.shape == [a.n])
            || count.is_some_and(|c| !scalar(c))
        {
            return Err(Error::shape(
                op,
                format!(
                    "logits {:?}, lse {:?}, grad {:?}, count {:?}: need lse [N], grad [] or [N], count []",
                    self.shape,
                    lse.shape,
                    grad.shape,
                    count.map(|c| c.shape.clone())
                ),
            ));
        }
        let gs = if scalar(grad) { 0 } else { grad.strides[0] };
        let desc = CrossEntropyBackward {
            logits: self.clone(),
            targets: targets.clone(),
            lse: lse.clone(),
            grad: grad.clone(),
            count: count.cloned(),
            ignore_index,
            args: a,
            gs,
        };
        dispatch(&self.device, &desc)
    }
}
