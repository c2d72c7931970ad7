//! Layer and RMS normalisation (forward and backward), and the helpers batch_norm.rs shares.
use crate::base::acc::{acc_dtype, row_group};
use crate::base::axis::AxisSplit;
use crate::base::checks::{check_device, check_dtype, check_float, u32_arg};
use crate::base::element::HostData;
use crate::base::host::dense;
use crate::base::host::host_vals;
use crate::base::launch::{launch_1d, launch_groups, program_for};
use crate::base::layout::{is_contiguous, numel};
use crate::base::norm_params::check_eps;
use crate::base::norm_params::check_param;
use crate::base::norm_params::check_stat;
use crate::base::norm_params::NormGrads;
use crate::base::rows::{row_starts, starts_aligned, RowPlan};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Error, Result};
use netcl_kernels::sources::NORM;
use netcl_kernels::Kernel;

/// Rows and row length of `x` normalised over its trailing `normalized_shape`.
fn norm_rows(op: &str, x: &Tensor, normalized_shape: &[usize]) -> Result<(Vec<usize>, usize)> {
    check_float(op, x, "input")?;
    let k = normalized_shape.len();
    if k == 0 || k > x.ndim() || x.shape[x.ndim() - k..] != *normalized_shape {
        return Err(Error::shape(
            op,
            format!(
                "normalized shape {normalized_shape:?} is not the trailing dims of input {:?}",
                x.shape
            ),
        ));
    }
    Ok((x.shape[..x.ndim() - k].to_vec(), numel(normalized_shape)))
}

/// The statistics a norm forward saves for its backward.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stats {
    /// None (inference: nothing is allocated for a backward).
    None,
    /// The reciprocal standard deviation (rms_norm's backward).
    Rstd,
    /// Mean and reciprocal standard deviation (layer_norm's backward).
    MeanRstd,
}

/// y and the statistics asked for.
type NormOut = (Tensor, Option<Tensor>, Option<Tensor>);

impl Tensor {
    #[allow(clippy::too_many_arguments)]
    fn norm_forward(
        &self,
        op: &str,
        rms: bool,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
        stats: Stats,
    ) -> Result<NormOut> {
        let (lead, n) = norm_rows(op, self, normalized_shape)?;
        check_param(op, self, weight, "weight", normalized_shape)?;
        check_param(op, self, bias, "bias", normalized_shape)?;
        check_eps(op, eps)?;
        let rows = numel(&lead);
        let acc = acc_dtype(self.dtype);
        let mut mask = vec![false; self.ndim()];
        for m in &mut mask[lead.len()..] {
            *m = true;
        }
        let split = AxisSplit::new(self, &mask);
        if let Some(x) = split.host_rows(self) {
            let (w, b) = (host_vals(weight)?, host_vals(bias)?);
            let mut y = vec![0.0; rows * n];
            let (mut mean, mut rstd) = (vec![0.0; rows], vec![0.0; rows]);
            for o in 0..rows {
                let row = &x[o * n..(o + 1) * n];
                let mu = if rms || n == 0 {
                    0.0
                } else {
                    row.iter().sum::<f64>() / n as f64
                };
                let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n as f64;
                let rs = 1.0 / (var + eps).sqrt();
                for (j, &v) in row.iter().enumerate() {
                    let mut h = (v - mu) * rs;
                    if let Some(w) = &w {
                        h *= w[j];
                    }
                    if let Some(b) = &b {
                        h += b[j];
                    }
                    y[o * n + j] = h;
                }
                (mean[o], rstd[o]) = (mu, rs);
            }
            let stat =
                |v: &[f64]| Tensor::from_host_data(HostData::from_fn(acc, rows, |i| v[i]), &lead);
            return Ok((
                Tensor::from_host_data(
                    HostData::from_fn(self.dtype, y.len(), |i| y[i]),
                    &self.shape,
                ),
                (stats == Stats::MeanRstd).then(|| stat(&mean)),
                (stats != Stats::None).then(|| stat(&rstd)),
            ));
        }
        let (lk, lr) = split.layouts(op, self.offset)?;
        let n32 = u32_arg(op, "normalized size", n)?;
        u32_arg(op, "elements", rows * n)?;
        let y = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        let stat = |want: bool| {
            want.then(|| Tensor::alloc(&lead, acc, &self.device))
                .transpose()
        };
        let mean = stat(stats == Stats::MeanRstd)?;
        let rstd = stat(stats != Stats::None)?;
        if rows == 0 {
            return Ok((y, mean, rstd));
        }
        let (w, b) = (weight.map(dense).transpose()?, bias.map(dense).transpose()?);
        // Arguments before and after the kernels' own (rows: n, rows, team; general: lr, n).
        let head = |k: &mut Kernel| -> Result<()> {
            // Statistics not asked for are never written: y's buffer stands in for them.
            k.arg_mem(y.mem()?)?
                .arg_mem(mean.as_ref().unwrap_or(&y).mem()?)?
                .arg_mem(rstd.as_ref().unwrap_or(&y).mem()?)?
                .arg_mem(self.mem()?)?
                .arg_mem(w.as_ref().unwrap_or(self).mem()?)?
                .arg_mem(b.as_ref().unwrap_or(self).mem()?)?
                .arg(&lk)?;
            Ok(())
        };
        let tail = |k: &mut Kernel| -> Result<()> {
            crate::base::acc::arg_acc(k, self.dtype, eps)?;
            k.arg(&(rms as i32))?
                .arg(&(w.is_some() as i32))?
                .arg(&(b.is_some() as i32))?
                .arg(&((stats != Stats::None) as i32))?;
            Ok(())
        };
        // Contiguous rows: held in registers, one read and one write per element.
        if is_contiguous(&split.red_shape, &split.red_strides) {
            let aligned = starts_aligned(self.offset, &split.kept_shape, &split.kept_strides);
            if let Some((plan, mut k)) =
                RowPlan::kernel(&self.device, n, aligned, &NORM, self.dtype, "norm_rows")?
            {
                head(&mut k)?;
                plan.args(&mut k, n32, u32_arg(op, "rows", rows)?)?;
                tail(&mut k)?;
                let es = self.dtype.size();
                let bytes = 2 * rows * n * es + 2 * n * es + 2 * rows * acc.size();
                k.declare(bytes as u64, (8 * rows * n) as u64);
                plan.launch(op, &mut k, rows)?;
                return Ok((y, mean, rstd));
            }
        }
        let program = program_for(&self.device, &NORM, self.dtype)?;
        let mut k = Kernel::new(&program, "norm_fwd")?;
        head(&mut k)?;
        k.arg(&lr)?.arg(&n32)?;
        tail(&mut k)?;
        let group = row_group(&k, n);
        // x read, y written, weight and bias read, the statistics written; about eight flops
        // per element (mean, centre, square, sum, scale, weight, bias).
        let es = self.dtype.size();
        let bytes = 2 * rows * n * es + 2 * n * es + 2 * rows * acc.size();
        k.declare(bytes as u64, (8 * rows * n) as u64);
        launch_groups(op, &mut k, rows, group)?;
        Ok((y, mean, rstd))
    }

    /// Layer normalisation over the trailing `normalized_shape` dims (any strided input):
    /// `y = (x - mean) / sqrt(var + eps) * weight + bias` with the biased variance. Returns
    /// (y contiguous in x's dtype, mean, rstd), the statistics shaped like the leading dims, in
    /// [`acc_dtype`]. weight/bias: x's dtype, shape `normalized_shape`. One kernel.
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let _span = netcl_profiling::span("layer_norm");
        let (y, mean, rstd) = self.norm_forward(
            "layer_norm",
            false,
            normalized_shape,
            weight,
            bias,
            eps,
            Stats::MeanRstd,
        )?;
        let missing = || Error::invalid("layer_norm", "statistics were not computed");
        Ok((y, mean.ok_or_else(missing)?, rstd.ok_or_else(missing)?))
    }

    /// [`Tensor::layer_norm`]'s output alone: no statistics are allocated (inference).
    pub fn layer_norm_inference(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let _span = netcl_profiling::span("layer_norm");
        let ns = normalized_shape;
        Ok(self
            .norm_forward("layer_norm", false, ns, weight, bias, eps, Stats::None)?
            .0)
    }

    /// [`Tensor::rms_norm`]'s output alone: no statistics are allocated (inference).
    pub fn rms_norm_inference(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let _span = netcl_profiling::span("rms_norm");
        let ns = normalized_shape;
        Ok(self
            .norm_forward("rms_norm", true, ns, weight, None, eps, Stats::None)?
            .0)
    }

    /// RMS normalisation over the trailing `normalized_shape` dims:
    /// `y = x / sqrt(mean(x^2) + eps) * weight`. Returns (y, rstd) as [`Tensor::layer_norm`]. One kernel.
    pub fn rms_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        let _span = netcl_profiling::span("rms_norm");
        let (y, _, rstd) = self.norm_forward(
            "rms_norm",
            true,
            normalized_shape,
            weight,
            None,
            eps,
            Stats::Rstd,
        )?;
        let rstd =
            rstd.ok_or_else(|| Error::invalid("rms_norm", "statistics were not computed"))?;
        Ok((y, rstd))
    }

    #[allow(clippy::too_many_arguments)]
    fn norm_backward(
        &self,
        op: &str,
        dy: &Tensor,
        mean: Option<&Tensor>,
        rstd: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        want_bias: bool,
    ) -> Result<NormGrads> {
        let (lead, n) = norm_rows(op, self, normalized_shape)?;
        check_device(op, self, dy, "dy")?;
        check_dtype(op, dy, "dy", self.dtype)?;
        if dy.shape != self.shape {
            return Err(Error::shape(
                op,
                format!("dy {:?} does not match input {:?}", dy.shape, self.shape),
            ));
        }
        if let Some(m) = mean {
            check_stat(op, self, m, "mean", &lead)?;
        }
        check_stat(op, self, rstd, "rstd", &lead)?;
        check_param(op, self, weight, "weight", normalized_shape)?;
        let rms = mean.is_none();
        let rows = numel(&lead);
        let want_params = weight.is_some() || want_bias;
        if self.device.is_host() {
            let (x, g) = (self.to_vec_f64()?, dy.to_vec_f64()?);
            let mu = host_vals(mean)?;
            let rs = rstd.to_vec_f64()?;
            let w = host_vals(weight)?;
            let mut dx = vec![0.0; rows * n];
            let (mut dw, mut db) = (vec![0.0; n], vec![0.0; n]);
            for o in 0..rows {
                let m = mu.as_ref().map_or(0.0, |m| m[o]);
                let xh: Vec<f64> = (0..n).map(|j| (x[o * n + j] - m) * rs[o]).collect();
                let gw: Vec<f64> = (0..n)
                    .map(|j| g[o * n + j] * w.as_ref().map_or(1.0, |w| w[j]))
                    .collect();
                let mg = if rms {
                    0.0
                } else {
                    gw.iter().sum::<f64>() / n as f64
                };
                let mgx = gw.iter().zip(&xh).map(|(a, b)| a * b).sum::<f64>() / n as f64;
                for j in 0..n {
                    dx[o * n + j] = rs[o] * (gw[j] - mg - xh[j] * mgx);
                    dw[j] += g[o * n + j] * xh[j];
                    db[j] += g[o * n + j];
                }
            }
            let t = |v: &[f64], shape: &[usize]| {
                Tensor::from_host_data(HostData::from_fn(self.dtype, v.len(), |i| v[i]), shape)
            };
            return Ok(NormGrads {
                dx: t(&dx, &self.shape),
                dweight: weight.map(|_| t(&dw, normalized_shape)),
                dbias: want_bias.then(|| t(&db, normalized_shape)),
            });
        }
        let n32 = u32_arg(op, "normalized size", n)?;
        let rows32 = u32_arg(op, "rows", rows)?;
        u32_arg(op, "elements", rows * n)?;
        let program = program_for(&self.device, &NORM, self.dtype)?;
        // Column sums for dweight/dbias: about 2^18 work-items (rows in chunks of at least 8), enough
        // to keep a large GPU's memory busy; 2^14 left an H200 at a fifth of its bandwidth.
        let nchunks = ((1 << 18) / n.max(1)).clamp(1, rows.div_ceil(8).max(1));
        let chunk = rows.div_ceil(nchunks).max(1);
        let nchunks = rows.div_ceil(chunk).max(1);
        let (m, r) = (mean.map(dense).transpose()?, dense(rstd)?);
        let w = weight.map(dense).transpose()?;
        let dx = Tensor::alloc(&self.shape, self.dtype, &self.device)?;
        let some_dx = rows > 0 && n > 0;
        // Arguments after dx and the inputs: the statistics and weight.
        let stats = |k: &mut Kernel, x: &Tensor| -> Result<()> {
            k.arg_mem(m.as_ref().unwrap_or(&r).mem()?)?
                .arg_mem(r.mem()?)?
                .arg_mem(w.as_ref().unwrap_or(x).mem()?)?;
            Ok(())
        };
        // x and dy read, dx written, weight and statistics read; about ten flops per element.
        let es = self.dtype.size();
        let bytes = 3 * rows * n * es + n * es + 2 * rows * acc_dtype(self.dtype).size();
        let flops = 10 * rows * n;
        // Rows contiguous in x and dy: held in registers, one read of each and one write of dx.
        let mut rows_done = false;
        if some_dx {
            let mask: Vec<bool> = (0..self.ndim()).map(|d| d >= lead.len()).collect();
            let operands = [
                (&dx.strides[..], 0),
                (&self.strides[..], self.offset),
                (&dy.strides[..], dy.offset),
            ];
            if let Some((lk, aligned)) = row_starts(op, &self.shape, &mask, &operands)? {
                let name = "norm_bwd_rows";
                if let Some((plan, mut k)) =
                    RowPlan::kernel(&self.device, n, aligned, &NORM, self.dtype, name)?
                {
                    k.arg_mem(dx.mem()?)?
                        .arg_mem(dy.mem()?)?
                        .arg_mem(self.mem()?)?;
                    stats(&mut k, self)?;
                    k.arg(&lk)?;
                    plan.args(&mut k, n32, rows32)?;
                    k.arg(&(rms as i32))?.arg(&(w.is_some() as i32))?;
                    k.declare(bytes as u64, flops as u64);
                    plan.launch(op, &mut k, rows)?;
                    rows_done = true;
                }
            }
        }
        // The general kernels index x and dy densely from 0.
        let (x, g) = if (some_dx && !rows_done) || (want_params && n > 0) {
            (dense(self)?, dense(dy)?)
        } else {
            (self.clone(), dy.clone())
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
            let dw = Tensor::alloc(normalized_shape, self.dtype, &self.device)?;
            let db = Tensor::alloc(normalized_shape, self.dtype, &self.device)?;
            let acc = acc_dtype(self.dtype);
            let pw = Tensor::alloc(&[nchunks * n], acc, &self.device)?;
            let pb = Tensor::alloc(&[nchunks * n], acc, &self.device)?;
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
                launch_1d(&program, "norm_bwd_params_sum", n, |k| {
                    k.arg_mem(dw.mem()?)?
                        .arg_mem(db.mem()?)?
                        .arg_mem(pw.mem()?)?
                        .arg_mem(pb.mem()?)?
                        .arg(&(nchunks as u32))?
                        .arg(&1i32)?;
                    Ok(())
                })?;
            }
            dweight = weight.map(|_| dw);
            dbias = want_bias.then_some(db);
        }
        Ok(NormGrads { dx, dweight, dbias })
    }

    /// Gradients of [`Tensor::layer_norm`] for input `self` given `dy` and the forward's `mean` and
    /// `rstd`: dx always, dweight when `weight` is given, dbias when `bias` is true. Kernels: one
    /// for dx, two more for the parameter gradients (column sums in row chunks, then over chunks).
    pub fn layer_norm_backward(
        &self,
        dy: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: bool,
    ) -> Result<NormGrads> {
        self.norm_backward(
            "layer_norm_backward",
            dy,
            Some(mean),
            rstd,
            normalized_shape,
            weight,
            bias,
        )
    }

    /// Gradients of [`Tensor::rms_norm`] (dx, and dweight when `weight` is given); kernels as
    /// [`Tensor::layer_norm_backward`].
    pub fn rms_norm_backward(
        &self,
        dy: &Tensor,
        rstd: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
    ) -> Result<NormGrads> {
        self.norm_backward(
            "rms_norm_backward",
            dy,
            None,
            rstd,
            normalized_shape,
            weight,
            false,
        )
    }
}
