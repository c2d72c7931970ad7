//! The OpenCL side of batch norm (kernels/norm.cl): one work-group per channel for training, one work-item per element for eval, two passes for the backward.
use super::{BatchNorm, BatchNormBackward, BatchNormEval, BatchNormTrain};
use crate::base::acc::{acc_dtype, arg_acc};
use crate::base::axis::pow2_floor;
use crate::base::checks::u32_arg;
use crate::base::host::dense;
use crate::base::launch::{launch_1d, launch_groups, program_for};
use crate::base::layout::{contiguous_strides, KernelLayout};
use crate::base::norm_params::NormGrads;
use crate::base::tensor::Tensor;
use netcl_core_devices::{Device, Error, Result};
use netcl_kernels::sources::NORM;
use netcl_kernels::Kernel;

/// `(strides, offset)` pairs as [`KernelLayout::new`] takes them.
fn operands(v: &[(Vec<usize>, usize)]) -> Vec<(&[usize], usize)> {
    v.iter().map(|(s, o)| (s.as_slice(), *o)).collect()
}

/// Kernel layouts of a batch norm over `x` (N, C, ...): channel c at `lk` offsets and its
/// (N, spatial) element r at `lr` offsets, for operand 0 the contiguous output (shaped like x)
/// and then each of `inputs` (x's shape, any strides).
fn bn_layouts(op: &str, x: &Tensor, inputs: &[&Tensor]) -> Result<(KernelLayout, KernelLayout)> {
    let not_c =
        |s: &[usize]| -> Vec<usize> { (0..s.len()).filter(|&d| d != 1).map(|d| s[d]).collect() };
    let ys = contiguous_strides(&x.shape);
    let mut channel = vec![(vec![ys[1]], 0)];
    let mut rest = vec![(not_c(&ys), 0)];
    for t in inputs {
        channel.push((vec![t.strides[1]], t.offset));
        rest.push((not_c(&t.strides), 0));
    }
    Ok((
        KernelLayout::new(op, &[x.shape[1]], &operands(&channel))?,
        KernelLayout::new(op, &not_c(&x.shape), &operands(&rest))?,
    ))
}

/// `bn_train`: one work-group per channel computes its statistics, y, and the running stats
/// (updated in place, so they must be dense).
pub(super) fn train(desc: &BatchNormTrain, device: &Device) -> Result<BatchNorm> {
    let op = "batch_norm";
    let BatchNormTrain {
        x,
        c,
        cnt,
        weight,
        bias,
        running,
        momentum,
        eps,
    } = desc;
    let c = *c;
    let (running_mean, running_var) = match running {
        Some((m, v)) => (Some(m), Some(v)),
        None => (None, None),
    };
    for (t, what) in running_mean
        .map(|t| (t, "running_mean"))
        .into_iter()
        .chain(running_var.map(|t| (t, "running_var")))
    {
        if !(t.is_contiguous() && t.offset == 0) {
            return Err(Error::invalid(
                op,
                format!(
                    "{what} {:?} must be a dense tensor (it is updated in place)",
                    t.shape
                ),
            ));
        }
    }
    let acc = acc_dtype(x.dtype);
    let (lk, lr) = bn_layouts(op, x, &[x])?;
    let cnt32 = u32_arg(op, "values per channel", *cnt)?;
    let y = Tensor::alloc(&x.shape, x.dtype, device)?;
    let save_mean = Tensor::alloc(&[c], acc, device)?;
    let save_invstd = Tensor::alloc(&[c], acc, device)?;
    if c == 0 {
        return Ok(BatchNorm {
            y,
            save_mean,
            save_invstd,
        });
    }
    let program = program_for(device, &NORM, x.dtype)?;
    let mut k = Kernel::new(&program, "bn_train")?;
    let group = 256.min(pow2_floor(k.max_work_group_size()));
    let w = weight.as_ref().map(dense).transpose()?;
    let b = bias.as_ref().map(dense).transpose()?;
    k.arg_mem(y.mem()?)?
        .arg_mem(save_mean.mem()?)?
        .arg_mem(save_invstd.mem()?)?
        .arg_mem(running_mean.unwrap_or(&save_mean).mem()?)?
        .arg_mem(running_var.unwrap_or(&save_invstd).mem()?)?
        .arg_mem(x.mem()?)?
        .arg_mem(w.as_ref().unwrap_or(x).mem()?)?
        .arg_mem(b.as_ref().unwrap_or(x).mem()?)?
        .arg(&lk)?
        .arg(&lr)?
        .arg(&cnt32)?;
    arg_acc(&mut k, x.dtype, *eps)?;
    arg_acc(&mut k, x.dtype, *momentum)?;
    k.arg(&(w.is_some() as i32))?
        .arg(&(b.is_some() as i32))?
        .arg(&(running_mean.is_some() as i32))?;
    launch_groups(op, &mut k, c, group)?;
    Ok(BatchNorm {
        y,
        save_mean,
        save_invstd,
    })
}

/// `bn_eval`: one work-item per element, x read through its view.
pub(super) fn eval(desc: &BatchNormEval, device: &Device) -> Result<Tensor> {
    let op = "batch_norm";
    let BatchNormEval {
        x,
        c,
        running_mean,
        running_var,
        weight,
        bias,
        eps,
    } = desc;
    let inner: usize = x.shape[2..].iter().product();
    // Operand 0: y (contiguous), operand 1: x.
    let ys = contiguous_strides(&x.shape);
    let l = KernelLayout::new(op, &x.shape, &[(&ys, 0), (&x.strides, x.offset)])?;
    let (c32, inner32) = (
        u32_arg(op, "channels", *c)?,
        u32_arg(op, "inner", inner.max(1))?,
    );
    let y = Tensor::alloc(&x.shape, x.dtype, device)?;
    if y.numel() == 0 {
        return Ok(y);
    }
    let program = program_for(device, &NORM, x.dtype)?;
    let (rm, rv) = (dense(running_mean)?, dense(running_var)?);
    let w = weight.as_ref().map(dense).transpose()?;
    let b = bias.as_ref().map(dense).transpose()?;
    launch_1d(&program, "bn_eval", y.numel(), |k| {
        k.arg_mem(y.mem()?)?
            .arg_mem(x.mem()?)?
            .arg_mem(rm.mem()?)?
            .arg_mem(rv.mem()?)?
            .arg_mem(w.as_ref().unwrap_or(x).mem()?)?
            .arg_mem(b.as_ref().unwrap_or(x).mem()?)?
            .arg(&l)?
            .arg(&c32)?
            .arg(&inner32)?;
        arg_acc(k, x.dtype, *eps)?;
        k.arg(&(w.is_some() as i32))?.arg(&(b.is_some() as i32))?;
        Ok(())
    })?;
    Ok(y)
}

/// `bn_bwd_part` (per-channel partial sums over slices) then `bn_bwd_dx` (the channel totals,
/// dweight, dbias and dx).
pub(super) fn backward(desc: &BatchNormBackward, device: &Device) -> Result<NormGrads> {
    let op = "batch_norm_backward";
    let BatchNormBackward {
        x,
        dy,
        c,
        save_mean,
        save_invstd,
        weight,
    } = desc;
    let c = *c;
    let cnt = x.numel() / c.max(1);
    // Slices of at least 4096 values, at most 256 per channel (one work-group merges them).
    let p = cnt.div_ceil(4096).clamp(1, 256);
    let chunk = cnt.div_ceil(p).max(1);
    let (lk, lr) = bn_layouts(op, x, &[x, dy])?;
    let cnt32 = u32_arg(op, "values per channel", cnt)?;
    // Kernels compute slice ends up to P * chunk in 32 bits.
    u32_arg(op, "values per channel (rounded to slices)", chunk * p)?;
    let (chunk32, p32) = (chunk as u32, p as u32);
    let dx = Tensor::alloc(&x.shape, x.dtype, device)?;
    let dw = Tensor::alloc(&[c], x.dtype, device)?;
    let db = Tensor::alloc(&[c], x.dtype, device)?;
    if c > 0 {
        let acc = acc_dtype(x.dtype);
        let part = Tensor::alloc(&[c * p * 2], acc, device)?;
        let (mean, invstd) = (dense(save_mean)?, dense(save_invstd)?);
        let w = weight.as_ref().map(dense).transpose()?;
        let program = program_for(device, &NORM, x.dtype)?;
        let mut k1 = Kernel::new(&program, "bn_bwd_part")?;
        let mut k2 = Kernel::new(&program, "bn_bwd_dx")?;
        let group = 256
            .min(pow2_floor(k1.max_work_group_size()))
            .min(pow2_floor(k2.max_work_group_size()));
        k1.arg_mem(part.mem()?)?
            .arg_mem(x.mem()?)?
            .arg_mem(dy.mem()?)?
            .arg_mem(mean.mem()?)?
            .arg_mem(invstd.mem()?)?
            .arg(&lk)?
            .arg(&lr)?
            .arg(&cnt32)?
            .arg(&chunk32)?
            .arg(&p32)?;
        launch_groups(op, &mut k1, c * p, group)?;
        k2.arg_mem(dx.mem()?)?
            .arg_mem(dw.mem()?)?
            .arg_mem(db.mem()?)?
            .arg_mem(part.mem()?)?
            .arg_mem(x.mem()?)?
            .arg_mem(dy.mem()?)?
            .arg_mem(mean.mem()?)?
            .arg_mem(invstd.mem()?)?
            .arg_mem(w.as_ref().unwrap_or(x).mem()?)?
            .arg(&lk)?
            .arg(&lr)?
            .arg(&cnt32)?
            .arg(&chunk32)?
            .arg(&p32)?
            .arg(&(w.is_some() as i32))?;
        launch_groups(op, &mut k2, c * p, group)?;
    }
    Ok(NormGrads {
        dx,
        dweight: weight.as_ref().map(|_| dw),
        dbias: Some(db),
    })
}
