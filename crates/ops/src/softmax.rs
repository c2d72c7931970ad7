//! softmax and log_softmax over any axis of strided views, and fused cross-entropy (forward, mean, backward).
use crate::checks::{check_device, check_dtype, check_float, u32_arg};
use crate::element::HostData;
use crate::launch::{launch_1d, launch_groups, program_for};
use crate::layout::{contiguous_strides, KernelLayout};
use crate::reduce::{pow2_floor, AxisSplit};
use crate::rows::{starts_aligned, RowPlan};
use crate::tensor::Tensor;
use netcl_core_devices::{DType, Error, Result};
use netcl_kernels::sources::SOFTMAX;
use netcl_kernels::Kernel;

/// The dtype kernels accumulate in for a float `dtype` (f32 for f32/f16/bf16, f64 for f64); row
/// statistics (logsumexp, mean, rstd) and losses are returned in it.
pub fn acc_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

/// Work-group size for rows of `n` elements under the kernel's limit (a power of two, 64..=256).
pub(crate) fn row_group(k: &Kernel, n: usize) -> usize {
    n.next_power_of_two()
        .clamp(64, 256)
        .min(pow2_floor(k.max_work_group_size()))
}

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
        let cs = contiguous_strides(&self.shape);
        let out_kept: Vec<usize> = (0..self.ndim())
            .filter(|&d| d != dim)
            .map(|d| cs[d])
            .collect();
        let os = cs[dim];
        if let Some(x) = split.host_rows(self) {
            let mut out = vec![0.0; rows * n];
            let mut idx = vec![0usize; split.kept_shape.len()];
            for o in 0..rows {
                let base: usize = idx.iter().zip(&out_kept).map(|(i, s)| i * s).sum();
                let row = &x[o * n..(o + 1) * n];
                let (m, s) = host_ms(row);
                for (j, &v) in row.iter().enumerate() {
                    out[base + j * os] = if log_out {
                        (v - m) - s.ln()
                    } else {
                        (v - m).exp() / s
                    };
                }
                for d in (0..idx.len()).rev() {
                    idx[d] += 1;
                    if idx[d] < split.kept_shape[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
            return Ok(Tensor::from_host_data(
                HostData::from_fn(self.dtype, out.len(), |i| out[i]),
                &self.shape,
            ));
        }
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

    /// Per-row cross-entropy of logits [N, C] (this tensor, any strides) against I32 targets [N]:
    /// returns (losses [N], lse [N]) in [`acc_dtype`], one kernel. Rows whose target equals
    /// `ignore_index` get loss 0. A target outside [0, C) is an error for host tensors; on a device
    /// it cannot be detected without a sync, and that row's loss (and gradient) is NaN instead.
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
                .arg(&a.cl)?;
            Ok(())
        };
        // Contiguous rows: held in registers, with 4-wide loads where aligned.
        if a.cl.xc == 1 || a.c == 1 {
            let aligned = starts_aligned(self.offset, &[a.n], &[self.strides[0]]);
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
    /// grad[i] / count`, contiguous, in the logits' dtype. `lse` [N] is the forward's, `grad` the
    /// upstream gradient ([] or [1] broadcast, or [N] per row), `count` ([] or [1]) divides when
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
        let program = program_for(&self.device, &SOFTMAX, self.dtype)?;
        launch_1d(&program, "cross_entropy_bwd", numel, |k| {
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
        })?;
        Ok(dx)
    }
}
