//! The OpenCL side of layer and RMS norm (kernels/norm.cl): register-resident row kernels where rows are contiguous, general kernels otherwise, and the parameter gradients' two-pass column sums.
use super::{NormBackward, NormForward, NormOut, Stats};
use crate::base::acc::{acc_dtype, arg_acc, row_group};
use crate::base::checks::u32_arg;
use crate::base::host::dense;
use crate::base::launch::{launch_1d, launch_groups};
use crate::base::layout::{is_contiguous, numel};
use crate::base::norm_params::NormGrads;
use crate::base::rows::{row_starts, starts_aligned, RowPlan};
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::sources::NORM;
use netcl_kernels::{program, Kernel, Program};
use std::sync::Arc;

/// kernels/norm.cl's build options beyond x's dtype: y's (and dy's) storage where it differs.
fn y_option(x: DType, y: DType) -> &'static str {
    match y {
        DType::BF16 if x != y => " -DY_BF16",
        DType::F16 if x != y => " -DY_F16",
        _ => "",
    }
}

/// kernels/norm.cl for x's dtype and y's.
fn norm_program(device: &Device, x: DType, y: DType) -> Result<Arc<Program>> {
    program(
        device,
        &NORM,
        &format!("{}{}", x.build_option(), y_option(x, y)),
    )
}

/// The forward: `norm_rows` over contiguous rows when a row plan fits, else `norm_fwd` (one
/// work-group per row, any strides).
pub(super) fn forward(desc: &NormForward, device: &Device) -> Result<NormOut> {
    let NormForward {
        op,
        x,
        out,
        rms,
        lead,
        n,
        split,
        weight,
        bias,
        eps,
        stats,
    } = desc;
    let (op, n, stats) = (*op, *n, *stats);
    let rows = numel(lead);
    let acc = acc_dtype(x.dtype);
    let (lk, lr) = split.layouts(op, x.offset)?;
    let n32 = u32_arg(op, "normalized size", n)?;
    u32_arg(op, "elements", rows * n)?;
    let y = Tensor::alloc(&x.shape, *out, device)?;
    let stat = |want: bool| want.then(|| Tensor::alloc(lead, acc, device)).transpose();
    let mean = stat(stats == Stats::MeanRstd)?;
    let rstd = stat(stats != Stats::None)?;
    if rows == 0 {
        return Ok((y, mean, rstd));
    }
    let w = weight.as_ref().map(dense).transpose()?;
    let b = bias.as_ref().map(dense).transpose()?;
    // Arguments before and after the kernels' own (rows: n, rows, team; general: lr, n).
    let head = |k: &mut Kernel| -> Result<()> {
        // Statistics not asked for are never written: y's buffer stands in for them.
        k.arg_mem(y.mem()?)?
            .arg_mem(mean.as_ref().unwrap_or(&y).mem()?)?
            .arg_mem(rstd.as_ref().unwrap_or(&y).mem()?)?
            .arg_mem(x.mem()?)?
            .arg_mem(w.as_ref().unwrap_or(x).mem()?)?
            .arg_mem(b.as_ref().unwrap_or(x).mem()?)?
            .arg(&lk)?;
        Ok(())
    };
    let tail = |k: &mut Kernel| -> Result<()> {
        arg_acc(k, x.dtype, *eps)?;
        k.arg(&(*rms as i32))?
            .arg(&(w.is_some() as i32))?
            .arg(&(b.is_some() as i32))?
            .arg(&((stats != Stats::None) as i32))?;
        Ok(())
    };
    // x read, y written, weight and bias read, the statistics written; about eight flops per
    // element (mean, centre, square, sum, scale, weight, bias).
    let es = x.dtype.size();
    let bytes = rows * n * (es + out.size()) + 2 * n * es + 2 * rows * acc.size();
    let flops = 8 * rows * n;
    // Contiguous rows: held in registers, one read and one write per element.
    if is_contiguous(&split.red_shape, &split.red_strides) {
        let aligned = starts_aligned(x.offset, &split.kept_shape, &split.kept_strides);
        if let Some((plan, mut k)) = RowPlan::kernel_with(
            device,
            n,
            aligned,
            &NORM,
            (x.dtype, y_option(x.dtype, *out)),
            "norm_rows",
        )? {
            head(&mut k)?;
            plan.args(&mut k, n32, u32_arg(op, "rows", rows)?)?;
            tail(&mut k)?;
            k.declare(bytes as u64, flops as u64);
            plan.launch(op, &mut k, rows)?;
            return Ok((y, mean, rstd));
        }
    }
    let program = norm_program(device, x.dtype, *out)?;
    let mut k = Kernel::new(&program, "norm_fwd")?;
    head(&mut k)?;
    k.arg(&lr)?.arg(&n32)?;
    tail(&mut k)?;
    let group = row_group(&k, n);
    k.declare(bytes as u64, flops as u64);
    launch_groups(op, &mut k, rows, group)?;
    Ok((y, mean, rstd))
}

/// The backward: dx by `norm_bwd_rows` over contiguous rows of x and dy when a row plan fits,
/// else `norm_bwd_x` on dense copies; dweight and dbias by `norm_bwd_params_part` (column sums
/// over chunks of rows) and `norm_bwd_params_sum` (over the chunks).
pub(super) fn backward(desc: &NormBackward, device: &Device) -> Result<NormGrads> {
    let NormBackward {
        op,
        x: input,
        dy,
        mean,
        rstd,
        normalized_shape,
        lead,
        n,
        weight,
        want_bias,
        plus,
    } = desc;
    let (op, n, want_bias) = (*op, *n, *want_bias);
    let rms = mean.is_none();
    let rows = numel(lead);
    let want_params = weight.is_some() || want_bias;
    let n32 = u32_arg(op, "normalized size", n)?;
    let rows32 = u32_arg(op, "rows", rows)?;
    u32_arg(op, "elements", rows * n)?;
    let program = norm_program(device, input.dtype, dy.dtype)?;
    // Column sums for dweight/dbias: about 2^18 work-items (rows in chunks of at least 8), enough
    // to keep a large GPU's memory busy; 2^14 left an H200 at a fifth of its bandwidth.
    let nchunks = ((1 << 18) / n.max(1)).clamp(1, rows.div_ceil(8).max(1));
    let chunk = rows.div_ceil(nchunks).max(1);
    let nchunks = rows.div_ceil(chunk).max(1);
    let (m, r) = (mean.as_ref().map(dense).transpose()?, dense(rstd)?);
    let w = weight.as_ref().map(dense).transpose()?;
    let dx = Tensor::alloc(&input.shape, input.dtype, device)?;
    // The addend is read like dx (contiguous from offset 0) by the rows kernel.
    let plus_dense = plus.as_ref().map(dense).transpose()?;
    let some_dx = rows > 0 && n > 0;
    // Arguments after dx and the inputs: the statistics and weight.
    let stats = |k: &mut Kernel, x: &Tensor| -> Result<()> {
        k.arg_mem(m.as_ref().unwrap_or(&r).mem()?)?
            .arg_mem(r.mem()?)?
            .arg_mem(w.as_ref().unwrap_or(x).mem()?)?;
        Ok(())
    };
    // x and dy read, dx written, weight and statistics read; about ten flops per element.
    let es = input.dtype.size();
    let bytes = (2 + plus.is_some() as usize) * rows * n * es
        + rows * n * dy.dtype.size()
        + n * es
        + 2 * rows * acc_dtype(input.dtype).size();
    let flops = 10 * rows * n;
    // Rows contiguous in x and dy: held in registers, one read of each and one write of dx.
    let mut rows_done = false;
    if some_dx {
        let mask: Vec<bool> = (0..input.ndim()).map(|d| d >= lead.len()).collect();
        let operands = [
            (&dx.strides[..], 0),
            (&input.strides[..], input.offset),
            (&dy.strides[..], dy.offset),
        ];
        if let Some((lk, aligned)) = row_starts(op, &input.shape, &mask, &operands)? {
            let name = "norm_bwd_rows";
            if let Some((plan, mut k)) = RowPlan::kernel_with(
                device,
                n,
                aligned,
                &NORM,
                (input.dtype, y_option(input.dtype, dy.dtype)),
                name,
            )? {
                k.arg_mem(dx.mem()?)?
                    .arg_mem(dy.mem()?)?
                    .arg_mem(input.mem()?)?;
                stats(&mut k, input)?;
                k.arg_mem(plus_dense.as_ref().unwrap_or(&dx).mem()?)?;
                k.arg(&lk)?;
                plan.args(&mut k, n32, rows32)?;
                k.arg(&(rms as i32))?
                    .arg(&(w.is_some() as i32))?
                    .arg(&(plus.is_some() as i32))?;
                k.declare(bytes as u64, flops as u64);
                plan.launch(op, &mut k, rows)?;
                rows_done = true;
            }
        }
    }
    // The general kernels index x and dy densely from 0.
    let (x, g) = if (some_dx && !rows_done) || (want_params && n > 0) {
        (dense(input)?, dense(dy)?)
    } else {
        (input.clone(), dy.clone())
    };
    if some_dx && !rows_done {
        let mut kx = Kernel::new(&program, "norm_bwd_x")?;
        let group = row_group(&kx, n);
        kx.arg_mem(dx.mem()?)?
            .arg_mem(g.mem()?)?
            .arg_mem(x.mem()?)?;
        stats(&mut kx, &x)?;
        kx.arg(&n32)?
            .arg(&(rms as i32))?
            .arg(&(w.is_some() as i32))?;
        kx.declare(bytes as u64, flops as u64);
        launch_groups(op, &mut kx, rows, group)?;
    }
    let (mut dweight, mut dbias) = (None, None);
    if want_params {
        let dw = Tensor::alloc(normalized_shape, input.dtype, device)?;
        let db = Tensor::alloc(normalized_shape, input.dtype, device)?;
        let acc = acc_dtype(input.dtype);
        let pw = Tensor::alloc(&[nchunks * n], acc, device)?;
        let pb = Tensor::alloc(&[nchunks * n], acc, device)?;
        if n > 0 {
            launch_1d(&program, "norm_bwd_params_part", nchunks * n, |k| {
                k.arg_mem(pw.mem()?)?
                    .arg_mem(pb.mem()?)?
                    .arg_mem(g.mem()?)?
                    .arg_mem(x.mem()?)?
                    .arg_mem(m.as_ref().unwrap_or(&r).mem()?)?
                    .arg_mem(r.mem()?)?
                    .arg(&rows32)?
                    .arg(&n32)?
                    .arg(&(chunk as u32))?
                    .arg(&(rms as i32))?;
                Ok(())
            })?;
            let mut ks = Kernel::new(&program, "norm_bwd_params_sum")?;
            let group = row_group(&ks, nchunks);
            ks.arg_mem(dw.mem()?)?
                .arg_mem(db.mem()?)?
                .arg_mem(pw.mem()?)?
                .arg_mem(pb.mem()?)?
                .arg(&(nchunks as u32))?
                .arg(&1i32)?
                .arg(&n32)?;
            launch_groups(op, &mut ks, n, group)?;
        }
        dweight = weight.as_ref().map(|_| dw);
        dbias = want_bias.then_some(db);
    }
    // The general kernel has no addend: the sum as its own kernel.
    let dx = match (&plus_dense, rows_done) {
        (Some(p), false) => dx.add(p)?,
        _ => dx,
    };
    Ok(NormGrads { dx, dweight, dbias })
}
