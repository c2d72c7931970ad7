//! softmax and log_softmax over any axis of strided views, and fused cross-entropy (forward, mean, backward).
use crate::base::acc::acc_dtype;
use crate::base::acc::row_group;
use crate::base::axis::{pow2_floor, AxisSplit};
use crate::base::checks::{check_device, check_dtype, check_float, u32_arg};
use crate::base::device_errors::{code_of, record_arg};
use crate::base::element::HostData;
use crate::base::launch::{launch_1d, launch_groups, program_for};
use crate::base::layout::{contiguous_strides, KernelLayout};
use crate::base::rows::{row_starts, starts_aligned, RowPlan};
use crate::base::tensor::Tensor;
use crate::fused::expr::Expr;
use crate::fused::plan::fused;
use netcl_core_devices::{DType, Error, Result};
use netcl_kernels::sources::SOFTMAX;
use netcl_kernels::Kernel;
use rayon::prelude::*;

/// Host row statistics as the kernels define them: max, and the sum of exp(x - max) over
/// elements that are not -inf.
fn host_ms(row: &[f64]) -> (f64, f64) {
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &x| {
        if x.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(x)
        }
    });
    let s = row
        .iter()
        .filter(|&&x| x != f64::NEG_INFINITY)
        .map(|&x| (x - m).exp())
        .sum();
    (m, s)
}

/// A contiguous tensor of `shape` and `dtype` from `vals` laid out as rows along `dim` in the order
/// of [`AxisSplit::host_rows`] (the other dims row-major, then `dim`).
fn from_rows(dtype: DType, vals: &[f64], shape: &[usize], dim: usize) -> Result<Tensor> {
    let mut moved = shape.to_vec();
    let n = moved.remove(dim);
    moved.push(n);
    let last = shape.len() - 1;
    let back: Vec<usize> = (0..shape.len())
        .map(|d| match d.cmp(&dim) {
            std::cmp::Ordering::Less => d,
            std::cmp::Ordering::Equal => last,
            std::cmp::Ordering::Greater => d - 1,
        })
        .collect();
    Tensor::from_host_data(HostData::from_fn(dtype, vals.len(), |i| vals[i]), &moved)
        .permute(&back)?
        .contiguous()
}

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

impl CeArgs {
    /// For logits whose rows are contiguous (row kernels): whether every row starts at a multiple
    /// of 4 elements.
    fn rows_aligned(&self, logits: &Tensor) -> Option<bool> {
        (self.cl.xc == 1 || self.c == 1)
            .then(|| starts_aligned(logits.offset, &[self.n], &[logits.strides[0]]))
    }
}

/// For host targets: every target must be in [0, C) or the ignore index.
fn check_host_targets(op: &str, targets: &[f64], c: usize, ignore: Option<i32>) -> Result<()> {
    for (i, &t) in targets.iter().enumerate() {
        if Some(t as i32) != ignore && !(0.0..c as f64).contains(&t) {
            return Err(Error::invalid(
                op,
                format!("target {t} of row {i} is outside [0, {c}) for logits of {c} classes"),
            ));
        }
    }
    Ok(())
}

impl Tensor {
    fn softmax_impl(&self, dim: usize, log_out: bool) -> Result<Tensor> {
        let op = if log_out { "log_softmax" } else { "softmax" };
        let _span = netcl_profiling::span(op);
        check_float(op, self, "input")?;
        if dim >= self.ndim() {
            return Err(Error::invalid(
                op,
                format!("dim {dim} out of range for shape {:?}", self.shape),
            ));
        }
        let mut mask = vec![false; self.ndim()];
        mask[dim] = true;
        let split = AxisSplit::new(self, &mask);
        let (rows, n) = (split.nout(), split.nred());
        if let Some(x) = split.host_rows(self) {
            let mut out = vec![0.0; rows * n];
            let rows = x.par_chunks(n.max(1)).zip(out.par_chunks_mut(n.max(1)));
            rows.for_each(|(row, out)| {
                let (m, s) = host_ms(row);
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = if log_out {
                        (v - m) - s.ln()
                    } else {
                        (v - m).exp() / s
                    };
                }
            });
            return from_rows(self.dtype, &out, &self.shape, dim);
        }
        let cs = contiguous_strides(&self.shape);
        let out_kept: Vec<usize> = (0..self.ndim())
            .filter(|&d| d != dim)
            .map(|d| cs[d])
            .collect();
        let os = cs[dim];
        let lk = KernelLayout::new(
            op,
            &split.kept_shape,
            &[(&split.kept_strides, self.offset), (&out_kept, 0)],
        )?;
        KernelLayout::new(op, &self.shape, &[(&self.strides, self.offset)])?;
        let xs = u32_arg(op, "stride", self.strides[dim])?;
        let (n32, rows32) = (u32_arg(op, "row length", n)?, u32_arg(op, "rows", rows)?);
        let os32 = u32_arg(op, "stride", os)?;
        let out = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        if rows == 0 || n == 0 {
            return Ok(out);
        }
        // Contiguous rows: held in registers, one read and one write per element.
        if n == 1 || (xs == 1 && os == 1) {
            let aligned = starts_aligned(self.offset, &split.kept_shape, &split.kept_strides);
            let name = "softmax_rows";
            if let Some((plan, mut k)) =
                RowPlan::kernel(&self.device, n, aligned, &SOFTMAX, self.dtype, name)?
            {
                k.arg_mem(out.mem()?)?.arg_mem(self.mem()?)?.arg(&lk)?;
                plan.args(&mut k, n32, rows32)?;
                k.arg(&(log_out as i32))?;
                // One read and one write per element; max, subtract, exp, sum, scale.
                k.declare(
                    (2 * rows * n * self.dtype.size()) as u64,
                    (5 * rows * n) as u64,
                );
                plan.launch(op, &mut k, rows)?;
                return Ok(out);
            }
        }
        let program = program_for(&self.device, &SOFTMAX, self.dtype)?;
        let col = n <= 32 || (xs != 1 && rows >= 1024);
        let mut k = Kernel::new(&program, if col { "softmax_col" } else { "softmax_wg" })?;
        k.arg_mem(out.mem()?)?
            .arg_mem(self.mem()?)?
            .arg(&lk)?
            .arg(&n32)?
            .arg(&xs)?
            .arg(&os32)?
            .arg(&(log_out as i32))?;
        // Read and write every element; max, subtract, exp, sum and scale per element.
        k.declare(
            (2 * rows * n * self.dtype.size()) as u64,
            (5 * rows * n) as u64,
        );
        if col {
            k.arg(&rows32)?;
            let group = 256.min(pow2_floor(k.max_work_group_size()));
            k.launch(&[rows], &[group])?;
        } else {
            let group = row_group(&k, n);
            launch_groups(op, &mut k, rows, group)?;
        }
        Ok(out)
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

    fn softmax_backward_impl(&self, dy: &Tensor, dim: usize, log_out: bool) -> Result<Tensor> {
        let op = if log_out {
            "log_softmax_backward"
        } else {
            "softmax_backward"
        };
        let _span = netcl_profiling::span(op);
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
        let mut mask = vec![false; self.ndim()];
        mask[dim] = true;
        let split = AxisSplit::new(self, &mask);
        let (rows, n) = (split.nout(), split.nred());
        if let (Some(y), Some(g)) = (
            split.host_rows(self),
            AxisSplit::new(dy, &mask).host_rows(dy),
        ) {
            let mut dx = vec![0.0; rows * n];
            for (o, dx) in dx.chunks_mut(n.max(1)).enumerate() {
                let (y, g) = (&y[o * n..(o + 1) * n], &g[o * n..(o + 1) * n]);
                let s: f64 = if log_out {
                    g.iter().sum()
                } else {
                    g.iter().zip(y).map(|(g, y)| g * y).sum()
                };
                for ((d, &y), &g) in dx.iter_mut().zip(y).zip(g) {
                    *d = if log_out {
                        g - y.exp() * s
                    } else {
                        y * (g - s)
                    };
                }
            }
            return from_rows(self.dtype, &dx, &self.shape, dim);
        }
        if rows == 0 || n == 0 {
            return Tensor::alloc(&self.shape, self.dtype, &self.device);
        }
        // Rows contiguous in y and dy: held in registers, one read of each and one write of dx.
        let (n32, rows32) = (u32_arg(op, "row length", n)?, u32_arg(op, "rows", rows)?);
        let out_strides = contiguous_strides(&self.shape);
        let operands = [
            (&self.strides[..], self.offset),
            (&dy.strides[..], dy.offset),
            (&out_strides[..], 0),
        ];
        if let Some((lk, aligned)) = row_starts(op, &self.shape, &mask, &operands)? {
            let name = "softmax_bwd_rows";
            if let Some((plan, mut k)) =
                RowPlan::kernel(&self.device, n, aligned, &SOFTMAX, self.dtype, name)?
            {
                let dx = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
                k.arg_mem(dx.mem()?)?
                    .arg_mem(self.mem()?)?
                    .arg_mem(dy.mem()?)?
                    .arg(&lk)?;
                plan.args(&mut k, n32, rows32)?;
                k.arg(&(log_out as i32))?;
                // y and dy read, dx written; multiply, sum, subtract and scale per element.
                k.declare(
                    (3 * rows * n * self.dtype.size()) as u64,
                    (4 * rows * n) as u64,
                );
                plan.launch(op, &mut k, rows)?;
                return Ok(dx);
            }
        }
        // Strided or long rows: the row sums, then one fused elementwise kernel (softmax needs
        // dy * y first; f16/bf16 summed and combined in f32, as the row kernel does).
        let acc = acc_dtype(self.dtype);
        let (y, g, s) = (
            Expr::input(0).cast(acc),
            Expr::input(1).cast(acc),
            Expr::input(2),
        );
        let (sums, e) = if log_out && self.dtype == acc {
            (dy.sum(&[dim], true)?, g - y.exp() * s)
        } else if log_out {
            let ga = fused(&[dy], &[Expr::input(0).cast(acc)])?.remove(0);
            (ga.sum(&[dim], true)?, g - y.exp() * s)
        } else {
            let gy = fused(&[self, dy], &[g.clone() * y.clone()])?.remove(0);
            (gy.sum(&[dim], true)?, y * (g - s))
        };
        Ok(fused(&[self, dy, &sums], &[e.cast(self.dtype)])?.remove(0))
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
        let _span = netcl_profiling::span(op);
        let a = ce_args(op, self, targets, ignore_index)?;
        let acc = acc_dtype(self.dtype);
        if let (Some(x), Some(t)) = (
            self.host_view(&self.shape, &self.strides),
            targets.host_view(&targets.shape, &targets.strides),
        ) {
            let (x, t) = (x.to_f64(), t.to_f64());
            check_host_targets(op, &t, a.c, ignore_index)?;
            let mut losses = vec![0.0; a.n];
            let mut lse = vec![0.0; a.n];
            for i in 0..a.n {
                let row = &x[i * a.c..(i + 1) * a.c];
                let (m, s) = host_ms(row);
                lse[i] = m + s.ln();
                if Some(t[i] as i32) != ignore_index {
                    losses[i] = lse[i] - row[t[i] as usize];
                }
            }
            return Ok((
                Tensor::from_host_data(HostData::from_fn(acc, a.n, |i| losses[i]), &[a.n]),
                Tensor::from_host_data(HostData::from_fn(acc, a.n, |i| lse[i]), &[a.n]),
            ));
        }
        let losses = Tensor::alloc(&[a.n], acc, &self.device)?;
        let lse = Tensor::alloc(&[a.n], acc, &self.device)?;
        if a.n == 0 {
            return Ok((losses, lse));
        }
        let args = |k: &mut Kernel| -> Result<()> {
            k.arg_mem(losses.mem()?)?
                .arg_mem(lse.mem()?)?
                .arg_mem(self.mem()?)?
                .arg_mem(targets.mem()?)?
                .arg(&a.cl)?
                .arg_mem(record_arg(&self.device)?)?
                .arg(&code_of(op))?;
            Ok(())
        };
        // Contiguous rows: held in registers, with 4-wide loads where aligned.
        if let Some(aligned) = a.rows_aligned(self) {
            let name = "cross_entropy_rows";
            if let Some((plan, mut k)) =
                RowPlan::kernel(&self.device, a.c, aligned, &SOFTMAX, self.dtype, name)?
            {
                args(&mut k)?;
                k.arg(&(plan.team as u32))?;
                let bytes = a.n * a.c * self.dtype.size() + a.n * (4 + 2 * acc.size());
                k.declare(bytes as u64, (4 * a.n * a.c) as u64);
                plan.launch(op, &mut k, a.n)?;
                return Ok((losses, lse));
            }
        }
        let program = program_for(&self.device, &SOFTMAX, self.dtype)?;
        let mut k = Kernel::new(&program, "cross_entropy_fwd")?;
        args(&mut k)?;
        // Logits and targets read, losses and lse written; max, subtract, exp and sum per logit.
        let bytes = a.n * a.c * self.dtype.size() + a.n * (4 + 2 * acc.size());
        k.declare(bytes as u64, (4 * a.n * a.c) as u64);
        let group = row_group(&k, a.c);
        launch_groups(op, &mut k, a.n, group)?;
        Ok((losses, lse))
    }

    /// Mean cross-entropy over the rows not ignored, with the per-row losses, lse and count
    /// (see [`Tensor::cross_entropy_rows`]). Two kernels: per-row losses, then the mean.
    pub fn cross_entropy(
        &self,
        targets: &Tensor,
        ignore_index: Option<i32>,
    ) -> Result<CrossEntropy> {
        let op = "cross_entropy";
        let a = ce_args(op, self, targets, ignore_index)?;
        let acc = acc_dtype(self.dtype);
        let (losses, lse) = self.cross_entropy_rows(targets, ignore_index)?;
        if let (Some(l), Some(t)) = (
            losses.host_view(&losses.shape, &losses.strides),
            targets.host_view(&targets.shape, &targets.strides),
        ) {
            let (l, t) = (l.to_f64(), t.to_f64());
            let (mut sum, mut cnt) = (0.0, 0.0);
            for i in 0..a.n {
                if Some(t[i] as i32) != ignore_index {
                    sum += l[i];
                    cnt += 1.0;
                }
            }
            return Ok(CrossEntropy {
                loss: Tensor::from_host_data(HostData::filled(acc, 1, sum / cnt), &[]),
                count: Tensor::from_host_data(HostData::filled(acc, 1, cnt), &[]),
                losses,
                lse,
            });
        }
        let loss = Tensor::alloc(&[], acc, &self.device)?;
        let count = Tensor::alloc(&[], acc, &self.device)?;
        let program = program_for(&self.device, &SOFTMAX, self.dtype)?;
        let mut k = Kernel::new(&program, "cross_entropy_mean")?;
        k.arg_mem(loss.mem()?)?
            .arg_mem(count.mem()?)?
            .arg_mem(losses.mem()?)?
            .arg_mem(targets.mem()?)?
            .arg(&a.cl)?;
        let group = 256.min(pow2_floor(k.max_work_group_size()));
        k.launch(&[group], &[group])?;
        Ok(CrossEntropy {
            loss,
            count,
            losses,
            lse,
        })
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
        let _span = netcl_profiling::span(op);
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
        if let (Some(x), Some(t), Some(l), Some(g)) = (
            self.host_view(&self.shape, &self.strides),
            targets.host_view(&targets.shape, &targets.strides),
            lse.host_view(&lse.shape, &lse.strides),
            grad.host_view(&[a.n], &[gs]),
        ) {
            let (x, t, l, g) = (x.to_f64(), t.to_f64(), l.to_f64(), g.to_f64());
            check_host_targets(op, &t, a.c, ignore_index)?;
            let cnt = match count {
                Some(c) => c.to_vec_f64()?[0],
                None => 1.0,
            };
            let dx = HostData::from_fn(self.dtype, a.n * a.c, |k| {
                let (i, j) = (k / a.c, k % a.c);
                if Some(t[i] as i32) == ignore_index {
                    return 0.0;
                }
                let p = (x[k] - l[i]).exp();
                (p - if j == t[i] as usize { 1.0 } else { 0.0 }) * (g[i] / cnt)
            });
            return Ok(Tensor::from_host_data(dx, &self.shape));
        }
        let loff = u32_arg(op, "offset", lse.offset)?;
        let ls = u32_arg(op, "stride", lse.strides[0])?;
        let cnt_t = count.unwrap_or(grad);
        let coff = u32_arg(op, "offset", cnt_t.offset)?;
        let numel = a.n * a.c;
        let goff = u32_arg(op, "offset", grad.offset)?;
        let gs32 = u32_arg(op, "stride", gs)?;
        let dx = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        if numel == 0 {
            return Ok(dx);
        }
        let args = |k: &mut Kernel| -> Result<()> {
            // Logits read and gradient written; exp, subtract, scale and divide per logit.
            let bytes = 2 * numel * self.dtype.size() + a.n * (4 + acc.size());
            k.declare(bytes as u64, 4 * numel as u64);
            k.arg_mem(dx.mem()?)?
                .arg_mem(self.mem()?)?
                .arg_mem(targets.mem()?)?
                .arg_mem(lse.mem()?)?
                .arg_mem(grad.mem()?)?
                .arg_mem(cnt_t.mem()?)?
                .arg(&a.cl)?
                .arg(&loff)?
                .arg(&ls)?
                .arg(&goff)?
                .arg(&gs32)?
                .arg(&coff)?
                .arg(&(count.is_some() as i32))?;
            Ok(())
        };
        // Contiguous rows: a team per row, 4-wide where aligned, each row's target, lse and scale
        // read once per work-item.
        if let Some(aligned) = a.rows_aligned(self) {
            let name = "cross_entropy_bwd_rows";
            if let Some((plan, mut k)) =
                RowPlan::kernel(&self.device, a.c, aligned, &SOFTMAX, self.dtype, name)?
            {
                args(&mut k)?;
                k.arg(&(plan.team as u32))?;
                plan.launch(op, &mut k, a.n)?;
                return Ok(dx);
            }
        }
        let program = program_for(&self.device, &SOFTMAX, self.dtype)?;
        launch_1d(&program, "cross_entropy_bwd", numel, args)?;
        Ok(dx)
    }
}
