//! The host side of batch norm: per-channel statistics and the outputs in f64.
use super::{BatchNorm, BatchNormBackward, BatchNormEval, BatchNormTrain};
use crate::base::acc::acc_dtype;
use crate::base::axis::AxisSplit;
use crate::base::element::{Element, HostData};
use crate::base::host::host_vals;
use crate::base::layout::strided_positions;
use crate::base::norm_params::NormGrads;
use crate::base::tensor::{Storage, Tensor};
use netcl_core_devices::{Error, Result};

/// Write `vals` into the elements of host tensor `t` (its view, in row-major order).
fn host_store(op: &str, t: &Tensor, vals: &[f64]) -> Result<()> {
    fn put<T: Element>(v: &mut [T], t: &Tensor, vals: &[f64]) {
        for (pos, &x) in strided_positions(&t.shape, &t.strides, t.offset).zip(vals) {
            v[pos] = T::from_f64(x);
        }
    }
    let Storage::Host(lock) = &t.storage.data else {
        return Err(Error::device(op, "host tensor without host storage"));
    };
    let mut g = lock.write().unwrap_or_else(|p| p.into_inner());
    with_host!(&mut *g, v => put(v, t, vals));
    Ok(())
}

/// Channel `ch` of element `i` of a row-major (N, C, inner...) tensor.
fn channel(i: usize, inner: usize, c: usize) -> usize {
    (i / inner) % c
}

/// The normalised value `v` of channel `ch` times its weight plus its bias (each when given).
fn affine(v: f64, ch: usize, w: &Option<Vec<f64>>, b: &Option<Vec<f64>>) -> f64 {
    let mut v = v;
    if let Some(w) = w {
        v *= w[ch];
    }
    v + b.as_ref().map_or(0.0, |b| b[ch])
}

pub(super) fn train(desc: &BatchNormTrain) -> Result<BatchNorm> {
    let op = "batch_norm";
    let BatchNormTrain {
        x: input,
        c,
        cnt,
        weight,
        bias,
        running,
        momentum,
        eps,
    } = desc;
    let (c, cnt, momentum) = (*c, *cnt, *momentum);
    let acc = acc_dtype(input.dtype);
    let mut mask = vec![true; input.ndim()];
    mask[1] = false;
    let inner: usize = input.shape[2..].iter().product();
    let x = AxisSplit::new(input, &mask).host_rows(input)?;
    let xs = input.to_vec_f64()?;
    let (w, b) = (host_vals(weight.as_ref())?, host_vals(bias.as_ref())?);
    let (mut mean, mut invstd, mut uvar) = (vec![0.0; c], vec![0.0; c], vec![0.0; c]);
    for ch in 0..c {
        let row = &x[ch * cnt..(ch + 1) * cnt];
        let mu = row.iter().sum::<f64>() / cnt as f64;
        let m2 = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>();
        (mean[ch], invstd[ch]) = (mu, 1.0 / (m2 / cnt as f64 + eps).sqrt());
        uvar[ch] = m2 / (cnt - 1) as f64;
    }
    let y = HostData::try_from_fn(input.dtype, xs.len(), |i| {
        let ch = channel(i, inner, c);
        affine((xs[i] - mean[ch]) * invstd[ch], ch, &w, &b)
    })?;
    if let Some((rm, rv)) = running {
        let (m0, v0) = (rm.to_vec_f64()?, rv.to_vec_f64()?);
        let upd = |old: &[f64], new: &[f64]| -> Vec<f64> {
            old.iter()
                .zip(new)
                .map(|(o, n)| (1.0 - momentum) * o + momentum * n)
                .collect()
        };
        host_store(op, rm, &upd(&m0, &mean))?;
        host_store(op, rv, &upd(&v0, &uvar))?;
    }
    let stat = |v: &[f64]| -> Result<Tensor> {
        Ok(Tensor::from_host_data(
            HostData::try_from_fn(acc, c, |i| v[i])?,
            &[c],
        ))
    };
    Ok(BatchNorm {
        y: Tensor::from_host_data(y, &input.shape),
        save_mean: stat(&mean)?,
        save_invstd: stat(&invstd)?,
    })
}

pub(super) fn eval(desc: &BatchNormEval) -> Result<Tensor> {
    let BatchNormEval {
        x: input,
        c,
        running_mean,
        running_var,
        weight,
        bias,
        eps,
    } = desc;
    let inner: usize = input.shape[2..].iter().product();
    let x = input.host_view_f64(&input.shape, &input.strides)?;
    let (rm, rv) = (running_mean.to_vec_f64()?, running_var.to_vec_f64()?);
    let (w, b) = (host_vals(weight.as_ref())?, host_vals(bias.as_ref())?);
    let y = HostData::try_from_fn(input.dtype, x.len(), |i| {
        let ch = channel(i, inner, *c);
        affine((x[i] - rm[ch]) / (rv[ch] + eps).sqrt(), ch, &w, &b)
    })?;
    Ok(Tensor::from_host_data(y, &input.shape))
}

pub(super) fn backward(desc: &BatchNormBackward) -> Result<NormGrads> {
    let BatchNormBackward {
        x: input,
        dy,
        c,
        save_mean,
        save_invstd,
        weight,
    } = desc;
    let c = *c;
    let cnt = input.numel() / c.max(1);
    let inner: usize = input.shape[2..].iter().product();
    let (x, g) = (input.to_vec_f64()?, dy.to_vec_f64()?);
    let (mean, invstd) = (save_mean.to_vec_f64()?, save_invstd.to_vec_f64()?);
    let w = host_vals(weight.as_ref())?;
    let ch = |i: usize| channel(i, inner.max(1), c);
    let (mut sdy, mut sdyx) = (vec![0.0; c], vec![0.0; c]);
    for i in 0..x.len() {
        sdy[ch(i)] += g[i];
        sdyx[ch(i)] += g[i] * (x[i] - mean[ch(i)]) * invstd[ch(i)];
    }
    let dx = HostData::try_from_fn(input.dtype, x.len(), |i| {
        let k = ch(i);
        let xh = (x[i] - mean[k]) * invstd[k];
        let wk = w.as_ref().map_or(1.0, |w| w[k]);
        wk * invstd[k] * (g[i] - sdy[k] / cnt as f64 - xh * sdyx[k] / cnt as f64)
    })?;
    let t = |v: &[f64]| -> Result<Tensor> {
        Ok(Tensor::from_host_data(
            HostData::try_from_fn(input.dtype, c, |i| v[i])?,
            &[c],
        ))
    };
    Ok(NormGrads {
        dx: Tensor::from_host_data(dx, &input.shape),
        dweight: weight.as_ref().map(|_| t(&sdyx)).transpose()?,
        dbias: Some(t(&sdy)?),
    })
}
