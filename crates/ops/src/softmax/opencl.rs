//! The OpenCL softmax kernels (softmax.cl): row kernels for contiguous rows, work-group and column kernels otherwise, cross-entropy forward, mean and backward.
use super::{
    dim_mask, CeArgs, CrossEntropyBackward, CrossEntropyMean, CrossEntropyRows, Softmax,
    SoftmaxBackward,
};
use crate::base::acc::{acc_dtype, row_group};
use crate::base::axis::{pow2_floor, AxisSplit};
use crate::base::checks::u32_arg;
use crate::base::device_errors::{code_of, record_arg};
use crate::base::launch::{launch_1d, launch_groups, program_for};
use crate::base::layout::{contiguous_strides, KernelLayout};
use crate::base::rows::{row_starts, starts_aligned, RowPlan};
use crate::base::tensor::Tensor;
use crate::fused::eval::fused;
use crate::fused::expr::Expr;
use netcl_core_devices::{Device, Result};
use netcl_kernels::sources::SOFTMAX;
use netcl_kernels::Kernel;

impl CeArgs {
    /// For logits whose rows are contiguous (row kernels): whether every row starts at a multiple
    /// of 4 elements.
    fn rows_aligned(&self, logits: &Tensor) -> Option<bool> {
        (self.cl.xc == 1 || self.c == 1)
            .then(|| starts_aligned(logits.offset, &[self.n], &[logits.strides[0]]))
    }

    /// Whether every row is contiguous, 4-aligned and a multiple of 4 logits long.
    fn vec4(&self, logits: &Tensor) -> bool {
        self.c.is_multiple_of(4) && self.rows_aligned(logits) == Some(true)
    }
}

/// softmax or log_softmax: the row kernel for contiguous rows it takes, else `softmax_col` (short
/// rows, or many strided ones) or `softmax_wg` (a work-group per row).
pub(super) fn softmax(desc: &Softmax, device: &Device) -> Result<Tensor> {
    let op = desc.op();
    let Softmax { x, dim, log } = desc;
    let dim = *dim;
    let split = AxisSplit::new(x, &dim_mask(x.ndim(), dim));
    let (rows, n) = (split.nout(), split.nred());
    let cs = contiguous_strides(&x.shape);
    let out_kept: Vec<usize> = (0..x.ndim()).filter(|&d| d != dim).map(|d| cs[d]).collect();
    let os = cs[dim];
    let lk = KernelLayout::new(
        op,
        &split.kept_shape,
        &[(&split.kept_strides, x.offset), (&out_kept, 0)],
    )?;
    KernelLayout::new(op, &x.shape, &[(&x.strides, x.offset)])?;
    let xs = u32_arg(op, "stride", x.strides[dim])?;
    let (n32, rows32) = (u32_arg(op, "row length", n)?, u32_arg(op, "rows", rows)?);
    let os32 = u32_arg(op, "stride", os)?;
    let out = Tensor::alloc(&x.shape, x.dtype, device)?;
    if rows == 0 || n == 0 {
        return Ok(out);
    }
    // Contiguous rows: held in registers, one read and one write per element.
    if n == 1 || (xs == 1 && os == 1) {
        let aligned = starts_aligned(x.offset, &split.kept_shape, &split.kept_strides);
        let name = "softmax_rows";
        if let Some((plan, mut k)) = RowPlan::kernel(device, n, aligned, &SOFTMAX, x.dtype, name)? {
            k.arg_mem(out.mem()?)?.arg_mem(x.mem()?)?.arg(&lk)?;
            plan.args(&mut k, n32, rows32)?;
            k.arg(&(*log as i32))?;
            // One read and one write per element; max, subtract, exp, sum, scale.
            k.declare(
                (2 * rows * n * x.dtype.size()) as u64,
                (5 * rows * n) as u64,
            );
            plan.launch(op, &mut k, rows)?;
            return Ok(out);
        }
    }
    let program = program_for(device, &SOFTMAX, x.dtype)?;
    let col = n <= 32 || (xs != 1 && rows >= 1024);
    let mut k = Kernel::new(&program, if col { "softmax_col" } else { "softmax_wg" })?;
    k.arg_mem(out.mem()?)?
        .arg_mem(x.mem()?)?
        .arg(&lk)?
        .arg(&n32)?
        .arg(&xs)?
        .arg(&os32)?
        .arg(&(*log as i32))?;
    // Read and write every element; max, subtract, exp, sum and scale per element.
    k.declare(
        (2 * rows * n * x.dtype.size()) as u64,
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

/// The softmax or log_softmax gradient: one row kernel for rows contiguous in y and dy, else row
/// sums and a fused combine.
pub(super) fn softmax_backward(desc: &SoftmaxBackward, device: &Device) -> Result<Tensor> {
    let op = desc.op();
    let SoftmaxBackward { y, dy, dim, log } = desc;
    let (dim, log) = (*dim, *log);
    let mask = dim_mask(y.ndim(), dim);
    let split = AxisSplit::new(y, &mask);
    let (rows, n) = (split.nout(), split.nred());
    if rows == 0 || n == 0 {
        return Tensor::alloc(&y.shape, y.dtype, device);
    }
    // Rows contiguous in y and dy: held in registers, one read of each and one write of dx.
    let (n32, rows32) = (u32_arg(op, "row length", n)?, u32_arg(op, "rows", rows)?);
    let out_strides = contiguous_strides(&y.shape);
    let operands = [
        (&y.strides[..], y.offset),
        (&dy.strides[..], dy.offset),
        (&out_strides[..], 0),
    ];
    if let Some((lk, aligned)) = row_starts(op, &y.shape, &mask, &operands)? {
        let name = "softmax_bwd_rows";
        if let Some((plan, mut k)) = RowPlan::kernel(device, n, aligned, &SOFTMAX, y.dtype, name)? {
            let dx = Tensor::alloc(&y.shape, y.dtype, device)?;
            k.arg_mem(dx.mem()?)?
                .arg_mem(y.mem()?)?
                .arg_mem(dy.mem()?)?
                .arg(&lk)?;
            plan.args(&mut k, n32, rows32)?;
            k.arg(&(log as i32))?;
            // y and dy read, dx written; multiply, sum, subtract and scale per element.
            k.declare(
                (3 * rows * n * y.dtype.size()) as u64,
                (4 * rows * n) as u64,
            );
            plan.launch(op, &mut k, rows)?;
            return Ok(dx);
        }
    }
    // Strided or long rows: the row sums, then one fused elementwise kernel (softmax needs
    // dy * y first; f16/bf16 summed and combined in f32, as the row kernel does).
    let acc = acc_dtype(y.dtype);
    let (ye, g, s) = (
        Expr::input(0).cast(acc),
        Expr::input(1).cast(acc),
        Expr::input(2),
    );
    let (sums, e) = if log && y.dtype == acc {
        (dy.sum(&[dim], true)?, g - ye.exp() * s)
    } else if log {
        let ga = fused(&[dy], &[Expr::input(0).cast(acc)])?.remove(0);
        (ga.sum(&[dim], true)?, g - ye.exp() * s)
    } else {
        let gy = fused(&[y, dy], &[g.clone() * ye.clone()])?.remove(0);
        (gy.sum(&[dim], true)?, ye * (g - s))
    };
    Ok(fused(&[y, dy, &sums], &[e.cast(y.dtype)])?.remove(0))
}

/// The kernel arguments shared by the cross-entropy forward kernels.
fn ce_rows_args(
    k: &mut Kernel,
    desc: &CrossEntropyRows,
    device: &Device,
    losses: &Tensor,
    lse: &Tensor,
) -> Result<()> {
    k.arg_mem(losses.mem()?)?
        .arg_mem(lse.mem()?)?
        .arg_mem(desc.logits.mem()?)?
        .arg_mem(desc.targets.mem()?)?
        .arg(&desc.args.cl)?
        .arg_mem(record_arg(device)?)?
        .arg(&code_of("cross_entropy"))?;
    Ok(())
}

/// Per-row losses and lse: `cross_entropy_rows` for contiguous rows, else `cross_entropy_fwd`
/// (a work-group per row). Out-of-range targets go to the device error record.
pub(super) fn cross_entropy_rows(
    desc: &CrossEntropyRows,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let op = "cross_entropy";
    let (x, a) = (&desc.logits, &desc.args);
    let acc = acc_dtype(x.dtype);
    let losses = Tensor::alloc(&[a.n], acc, device)?;
    let lse = Tensor::alloc(&[a.n], acc, device)?;
    if a.n == 0 {
        return Ok((losses, lse));
    }
    // Logits and targets read, losses and lse written; max, subtract, exp and sum per logit.
    let bytes = a.n * a.c * x.dtype.size() + a.n * (4 + 2 * acc.size());
    // Contiguous rows: held in registers, with 4-wide loads where aligned.
    if let Some(aligned) = a.rows_aligned(x) {
        let name = "cross_entropy_rows";
        if let Some((plan, mut k)) = RowPlan::kernel(device, a.c, aligned, &SOFTMAX, x.dtype, name)?
        {
            ce_rows_args(&mut k, desc, device, &losses, &lse)?;
            k.arg(&(plan.team as u32))?;
            k.declare(bytes as u64, (4 * a.n * a.c) as u64);
            plan.launch(op, &mut k, a.n)?;
            return Ok((losses, lse));
        }
    }
    let program = program_for(device, &SOFTMAX, x.dtype)?;
    let mut k = Kernel::new(&program, "cross_entropy_fwd")?;
    ce_rows_args(&mut k, desc, device, &losses, &lse)?;
    k.arg(&(a.vec4(x) as i32))?;
    k.declare(bytes as u64, (4 * a.n * a.c) as u64);
    let group = row_group(&k, a.c);
    launch_groups(op, &mut k, a.n, group)?;
    Ok((losses, lse))
}

/// The mean loss and the count of rows not ignored: one work-group of `cross_entropy_mean`.
pub(super) fn cross_entropy_mean(
    desc: &CrossEntropyMean,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let acc = acc_dtype(desc.dtype);
    let loss = Tensor::alloc(&[], acc, device)?;
    let count = Tensor::alloc(&[], acc, device)?;
    let program = program_for(device, &SOFTMAX, desc.dtype)?;
    let mut k = Kernel::new(&program, "cross_entropy_mean")?;
    k.arg_mem(loss.mem()?)?
        .arg_mem(count.mem()?)?
        .arg_mem(desc.losses.mem()?)?
        .arg_mem(desc.targets.mem()?)?
        .arg(&desc.args.cl)?;
    let group = 256.min(pow2_floor(k.max_work_group_size()));
    k.launch(&[group], &[group])?;
    Ok((loss, count))
}

/// The cross-entropy gradient: `cross_entropy_bwd_rows` (a team per row) for contiguous rows,
/// else `cross_entropy_bwd` (a work-item per logit).
pub(super) fn cross_entropy_backward(
    desc: &CrossEntropyBackward,
    device: &Device,
) -> Result<Tensor> {
    let op = "cross_entropy_backward";
    let CrossEntropyBackward {
        logits: x,
        targets,
        lse,
        grad,
        count,
        args: a,
        gs,
        ..
    } = desc;
    let acc = acc_dtype(x.dtype);
    let loff = u32_arg(op, "offset", lse.offset)?;
    let ls = u32_arg(op, "stride", lse.strides[0])?;
    let cnt_t = count.as_ref().unwrap_or(grad);
    let coff = u32_arg(op, "offset", cnt_t.offset)?;
    let numel = a.n * a.c;
    let goff = u32_arg(op, "offset", grad.offset)?;
    let gs32 = u32_arg(op, "stride", *gs)?;
    let dx = Tensor::alloc(&x.shape, x.dtype, device)?;
    if numel == 0 {
        return Ok(dx);
    }
    let args = |k: &mut Kernel| -> Result<()> {
        // Logits read and gradient written; exp, subtract, scale and divide per logit.
        let bytes = 2 * numel * x.dtype.size() + a.n * (4 + acc.size());
        k.declare(bytes as u64, 4 * numel as u64);
        k.arg_mem(dx.mem()?)?
            .arg_mem(x.mem()?)?
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
    if let Some(aligned) = a.rows_aligned(x) {
        let name = "cross_entropy_bwd_rows";
        if let Some((plan, mut k)) = RowPlan::kernel(device, a.c, aligned, &SOFTMAX, x.dtype, name)?
        {
            args(&mut k)?;
            k.arg(&(plan.team as u32))?;
            plan.launch(op, &mut k, a.n)?;
            return Ok(dx);
        }
    }
    // Long rows: a work-item per logit, or per four where the rows allow 4-wide access.
    let program = program_for(device, &SOFTMAX, x.dtype)?;
    let vec = a.vec4(x);
    u32_arg(op, "elements", numel)?;
    let items = if vec { numel / 4 } else { numel };
    launch_1d(&program, "cross_entropy_bwd", items, |k| {
        args(k)?;
        k.arg(&(vec as i32))?;
        Ok(())
    })?;
    Ok(dx)
}
