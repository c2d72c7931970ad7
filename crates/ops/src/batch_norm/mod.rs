//! Batch normalisation: training (batch statistics, running stats) and eval forwards, and the training backward.
use crate::base::acc::acc_dtype;
use crate::base::axis::{pow2_floor, AxisSplit};
use crate::base::checks::{check_device, check_dtype, check_float, u32_arg};
use crate::base::element::{Element, HostData};
use crate::base::host::{dense, host_vals};
use crate::base::launch::{launch_1d, launch_groups, program_for};
use crate::base::layout::{contiguous_strides, strided_positions, KernelLayout};
use crate::base::norm_params::{check_eps, check_param, check_stat, NormGrads};
use crate::base::tensor::{Storage, Tensor};
use netcl_core_devices::{Error, Result};
use netcl_kernels::sources::NORM;
use netcl_kernels::Kernel;

/// Outputs of [`Tensor::batch_norm_train`]: the result and the saved batch statistics (`[C]`, in
/// [`acc_dtype`]) that the backward needs.
#[derive(Clone, Debug)]
pub struct BatchNorm {
    pub y: Tensor,
    pub save_mean: Tensor,
    pub save_invstd: Tensor,
}

/// Write `vals` into the elements of host tensor `t` (its view, in row-major order).
fn host_store(t: &Tensor, vals: &[f64]) {
    fn put<T: Element>(v: &mut [T], t: &Tensor, vals: &[f64]) {
        for (pos, &x) in strided_positions(&t.shape, &t.strides, t.offset).zip(vals) {
            v[pos] = T::from_f64(x);
        }
    }
    if let Storage::Host(lock) = &t.storage.data {
        let mut g = lock.write().unwrap_or_else(|p| p.into_inner());
        with_host!(&mut *g, v => put(v, t, vals));
    }
}

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

impl Tensor {
    fn bn_check(
        &self,
        op: &str,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        running: &[(&Tensor, &str)],
        eps: f64,
    ) -> Result<usize> {
        check_float(op, self, "input")?;
        if self.ndim() < 2 {
            return Err(Error::shape(
                op,
                format!("input {:?} needs at least 2 dims (N, C, ...)", self.shape),
            ));
        }
        let c = self.shape[1];
        check_param(op, self, weight, "weight", &[c])?;
        check_param(op, self, bias, "bias", &[c])?;
        for (t, what) in running {
            check_stat(op, self, t, what, &[c])?;
        }
        check_eps(op, eps)?;
        Ok(c)
    }

    /// Batch normalisation in training mode for NC or NCHW (any trailing spatial dims, any
    /// strides): per-channel batch statistics over N and the spatial dims,
    /// `y = (x - mean) * invstd * weight + bias` with the biased variance. When running stats are given (`[C]`, in
    /// [`acc_dtype`], updated in place): `running = (1 - momentum) * running + momentum * stat`,
    /// with the unbiased variance. One kernel (one work-group per channel). Errors when a channel
    /// has fewer than 2 values.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm_train(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        momentum: f64,
        eps: f64,
    ) -> Result<BatchNorm> {
        let op = "batch_norm";
        let running: Vec<(&Tensor, &str)> = running_mean
            .map(|t| (t, "running_mean"))
            .into_iter()
            .chain(running_var.map(|t| (t, "running_var")))
            .collect();
        let c = self.bn_check(op, weight, bias, &running, eps)?;
        for (t, _) in &running {
            t.mark_modified();
        }
        if running_mean.is_some() != running_var.is_some() || !momentum.is_finite() {
            return Err(Error::invalid(
                op,
                format!("need both running stats or neither, and a finite momentum ({momentum})"),
            ));
        }
        let cnt = self.numel() / c.max(1);
        if cnt < 2 {
            return Err(Error::shape(
                op,
                format!(
                    "input {:?} has {cnt} value(s) per channel; training needs more than 1",
                    self.shape
                ),
            ));
        }
        let acc = acc_dtype(self.dtype);
        let mut mask = vec![true; self.ndim()];
        mask[1] = false;
        let split = AxisSplit::new(self, &mask);
        let inner: usize = self.shape[2..].iter().product();
        if let Some(x) = split.host_rows(self) {
            let xs = self.to_vec_f64()?;
            let (w, b) = (host_vals(weight)?, host_vals(bias)?);
            let (mut mean, mut invstd, mut uvar) = (vec![0.0; c], vec![0.0; c], vec![0.0; c]);
            for ch in 0..c {
                let row = &x[ch * cnt..(ch + 1) * cnt];
                let mu = row.iter().sum::<f64>() / cnt as f64;
                let m2 = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>();
                (mean[ch], invstd[ch]) = (mu, 1.0 / (m2 / cnt as f64 + eps).sqrt());
                uvar[ch] = m2 / (cnt - 1) as f64;
            }
            let y = HostData::from_fn(self.dtype, xs.len(), |i| {
                let ch = (i / inner) % c;
                let mut v = (xs[i] - mean[ch]) * invstd[ch];
                if let Some(w) = &w {
                    v *= w[ch];
                }
                v + b.as_ref().map_or(0.0, |b| b[ch])
            });
            if let (Some(rm), Some(rv)) = (running_mean, running_var) {
                let (m0, v0) = (rm.to_vec_f64()?, rv.to_vec_f64()?);
                let upd = |old: &[f64], new: &[f64]| -> Vec<f64> {
                    old.iter()
                        .zip(new)
                        .map(|(o, n)| (1.0 - momentum) * o + momentum * n)
                        .collect()
                };
                host_store(rm, &upd(&m0, &mean));
                host_store(rv, &upd(&v0, &uvar));
            }
            return Ok(BatchNorm {
                y: Tensor::from_host_data(y, &self.shape),
                save_mean: Tensor::from_host_data(HostData::from_fn(acc, c, |i| mean[i]), &[c]),
                save_invstd: Tensor::from_host_data(HostData::from_fn(acc, c, |i| invstd[i]), &[c]),
            });
        }
        for (t, what) in &running {
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
        let (lk, lr) = bn_layouts(op, self, &[self])?;
        let cnt32 = u32_arg(op, "values per channel", cnt)?;
        let y = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        let save_mean = Tensor::alloc(&[c], acc, &self.device)?;
        let save_invstd = Tensor::alloc(&[c], acc, &self.device)?;
        if c == 0 {
            return Ok(BatchNorm {
                y,
                save_mean,
                save_invstd,
            });
        }
        let program = program_for(&self.device, &NORM, self.dtype)?;
        let mut k = Kernel::new(&program, "bn_train")?;
        let group = 256.min(pow2_floor(k.max_work_group_size()));
        let (w, b) = (weight.map(dense).transpose()?, bias.map(dense).transpose()?);
        k.arg_mem(y.mem()?)?
            .arg_mem(save_mean.mem()?)?
            .arg_mem(save_invstd.mem()?)?
            .arg_mem(running_mean.unwrap_or(&save_mean).mem()?)?
            .arg_mem(running_var.unwrap_or(&save_invstd).mem()?)?
            .arg_mem(self.mem()?)?
            .arg_mem(w.as_ref().unwrap_or(self).mem()?)?
            .arg_mem(b.as_ref().unwrap_or(self).mem()?)?
            .arg(&lk)?
            .arg(&lr)?
            .arg(&cnt32)?;
        crate::base::acc::arg_acc(&mut k, self.dtype, eps)?;
        crate::base::acc::arg_acc(&mut k, self.dtype, momentum)?;
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

    /// Batch normalisation in eval mode with running statistics (`[C]`, [`acc_dtype`]):
    /// `y = (x - running_mean) / sqrt(running_var + eps) * weight + bias`. One kernel.
    pub fn batch_norm_eval(
        &self,
        running_mean: &Tensor,
        running_var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = "batch_norm";
        let c = self.bn_check(
            op,
            weight,
            bias,
            &[(running_mean, "running_mean"), (running_var, "running_var")],
            eps,
        )?;
        let inner: usize = self.shape[2..].iter().product();
        if let Some(x) = self.host_view(&self.shape, &self.strides) {
            let x = x.to_f64();
            let (rm, rv) = (running_mean.to_vec_f64()?, running_var.to_vec_f64()?);
            let (w, b) = (host_vals(weight)?, host_vals(bias)?);
            let y = HostData::from_fn(self.dtype, x.len(), |i| {
                let ch = (i / inner) % c;
                let mut v = (x[i] - rm[ch]) / (rv[ch] + eps).sqrt();
                if let Some(w) = &w {
                    v *= w[ch];
                }
                v + b.as_ref().map_or(0.0, |b| b[ch])
            });
            return Ok(Tensor::from_host_data(y, &self.shape));
        }
        let ys = contiguous_strides(&self.shape);
        let l = KernelLayout::new(op, &self.shape, &[(&ys, 0), (&self.strides, self.offset)])?;
        let (c32, inner32) = (
            u32_arg(op, "channels", c)?,
            u32_arg(op, "inner", inner.max(1))?,
        );
        let y = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        if y.numel() == 0 {
            return Ok(y);
        }
        let program = program_for(&self.device, &NORM, self.dtype)?;
        let (rm, rv) = (dense(running_mean)?, dense(running_var)?);
        let (w, b) = (weight.map(dense).transpose()?, bias.map(dense).transpose()?);
        launch_1d(&program, "bn_eval", y.numel(), |k| {
            k.arg_mem(y.mem()?)?
                .arg_mem(self.mem()?)?
                .arg_mem(rm.mem()?)?
                .arg_mem(rv.mem()?)?
                .arg_mem(w.as_ref().unwrap_or(self).mem()?)?
                .arg_mem(b.as_ref().unwrap_or(self).mem()?)?
                .arg(&l)?
                .arg(&c32)?
                .arg(&inner32)?;
            crate::base::acc::arg_acc(k, self.dtype, eps)?;
            k.arg(&(w.is_some() as i32))?.arg(&(b.is_some() as i32))?;
            Ok(())
        })?;
        Ok(y)
    }

    /// Gradients of [`Tensor::batch_norm_train`] for input `self` (N, C, ...) given `dy` (same
    /// shape) and the forward's `save_mean` and `save_invstd` (`[C]`, [`acc_dtype`]): with
    /// xhat = (x - mean) * invstd over each channel's N * spatial values,
    /// `dx = weight * invstd * (dy - mean(dy) - xhat * mean(dy * xhat))`, dweight = sum(dy * xhat)
    /// when `weight` is given, and dbias = sum(dy) always. Any strides; dx is contiguous, all in
    /// x's dtype. Two kernels: per-channel partial sums over slices, then the channel totals and dx.
    pub fn batch_norm_backward(
        &self,
        dy: &Tensor,
        save_mean: &Tensor,
        save_invstd: &Tensor,
        weight: Option<&Tensor>,
    ) -> Result<NormGrads> {
        let op = "batch_norm_backward";
        let stats = [(save_mean, "save_mean"), (save_invstd, "save_invstd")];
        let c = self.bn_check(op, weight, None, &stats, 0.0)?;
        check_device(op, self, dy, "dy")?;
        check_dtype(op, dy, "dy", self.dtype)?;
        if dy.shape != self.shape {
            return Err(Error::shape(
                op,
                format!("dy {:?} does not match input {:?}", dy.shape, self.shape),
            ));
        }
        let cnt = self.numel() / c.max(1);
        let inner: usize = self.shape[2..].iter().product();
        if self.device.is_host() {
            let (x, g) = (self.to_vec_f64()?, dy.to_vec_f64()?);
            let (mean, invstd) = (save_mean.to_vec_f64()?, save_invstd.to_vec_f64()?);
            let w = host_vals(weight)?;
            let ch = |i: usize| (i / inner.max(1)) % c;
            let (mut sdy, mut sdyx) = (vec![0.0; c], vec![0.0; c]);
            for i in 0..x.len() {
                sdy[ch(i)] += g[i];
                sdyx[ch(i)] += g[i] * (x[i] - mean[ch(i)]) * invstd[ch(i)];
            }
            let dx = HostData::from_fn(self.dtype, x.len(), |i| {
                let k = ch(i);
                let xh = (x[i] - mean[k]) * invstd[k];
                let wk = w.as_ref().map_or(1.0, |w| w[k]);
                wk * invstd[k] * (g[i] - sdy[k] / cnt as f64 - xh * sdyx[k] / cnt as f64)
            });
            let t = |v: &[f64]| {
                Tensor::from_host_data(HostData::from_fn(self.dtype, c, |i| v[i]), &[c])
            };
            return Ok(NormGrads {
                dx: Tensor::from_host_data(dx, &self.shape),
                dweight: weight.map(|_| t(&sdyx)),
                dbias: Some(t(&sdy)),
            });
        }
        // Slices of at least 4096 values, at most 256 per channel (one work-group merges them).
        let p = cnt.div_ceil(4096).clamp(1, 256);
        let chunk = cnt.div_ceil(p).max(1);
        let (lk, lr) = bn_layouts(op, self, &[self, dy])?;
        let cnt32 = u32_arg(op, "values per channel", cnt)?;
        // Kernels compute slice ends up to P * chunk in 32 bits.
        u32_arg(op, "values per channel (rounded to slices)", chunk * p)?;
        let (chunk32, p32) = (chunk as u32, p as u32);
        let dx = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        let dw = Tensor::alloc(&[c], self.dtype, &self.device)?;
        let db = Tensor::alloc(&[c], self.dtype, &self.device)?;
        if c > 0 {
            let acc = acc_dtype(self.dtype);
            let part = Tensor::alloc(&[c * p * 2], acc, &self.device)?;
            let (mean, invstd) = (dense(save_mean)?, dense(save_invstd)?);
            let w = weight.map(dense).transpose()?;
            let program = program_for(&self.device, &NORM, self.dtype)?;
            let mut k1 = Kernel::new(&program, "bn_bwd_part")?;
            let mut k2 = Kernel::new(&program, "bn_bwd_dx")?;
            let group = 256
                .min(pow2_floor(k1.max_work_group_size()))
                .min(pow2_floor(k2.max_work_group_size()));
            k1.arg_mem(part.mem()?)?
                .arg_mem(self.mem()?)?
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
                .arg_mem(self.mem()?)?
                .arg_mem(dy.mem()?)?
                .arg_mem(mean.mem()?)?
                .arg_mem(invstd.mem()?)?
                .arg_mem(w.as_ref().unwrap_or(self).mem()?)?
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
            dweight: weight.map(|_| dw),
            dbias: Some(db),
        })
    }
}
