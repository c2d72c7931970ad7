//! The host side of layer and RMS norm: rows in f64, statistics in the accumulator dtype.
use super::{NormBackward, NormForward, NormOut, Stats};
use crate::base::acc::acc_dtype;
use crate::base::element::HostData;
use crate::base::host::{host_vals, named};
use crate::base::layout::numel;
use crate::base::norm_params::NormGrads;
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;

pub(super) fn forward(desc: &NormForward) -> Result<NormOut> {
    let NormForward {
        op,
        x: input,
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
    let (n, eps, stats) = (*n, *eps, *stats);
    let rows = numel(lead);
    let acc = acc_dtype(input.dtype);
    let x = split.host_rows(input).map_err(|e| named(op, e))?;
    let (w, b) = (host_vals(weight.as_ref())?, host_vals(bias.as_ref())?);
    let mut y = vec![0.0; rows * n];
    let (mut mean, mut rstd) = (vec![0.0; rows], vec![0.0; rows]);
    for o in 0..rows {
        let row = &x[o * n..(o + 1) * n];
        let mu = if *rms || n == 0 {
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
    let stat = |v: &[f64]| -> Result<Tensor> {
        Ok(Tensor::from_host_data(
            HostData::try_from_fn(acc, rows, |i| v[i])?,
            lead,
        ))
    };
    Ok((
        Tensor::from_host_data(
            HostData::try_from_fn(*out, y.len(), |i| y[i])?,
            &input.shape,
        ),
        (stats == Stats::MeanRstd)
            .then(|| stat(&mean))
            .transpose()?,
        (stats != Stats::None).then(|| stat(&rstd)).transpose()?,
    ))
}

pub(super) fn backward(desc: &NormBackward) -> Result<NormGrads> {
    let NormBackward {
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
        ..
    } = desc;
    let n = *n;
    let rms = mean.is_none();
    let rows = numel(lead);
    let (x, g) = (input.to_vec_f64()?, dy.to_vec_f64()?);
    let mu = host_vals(mean.as_ref())?;
    let rs = rstd.to_vec_f64()?;
    let w = host_vals(weight.as_ref())?;
    let mut dx = host_vals(plus.as_ref())?.unwrap_or_else(|| vec![0.0; rows * n]);
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
            dx[o * n + j] += rs[o] * (gw[j] - mg - xh[j] * mgx);
            dw[j] += g[o * n + j] * xh[j];
            db[j] += g[o * n + j];
        }
    }
    let t = |v: &[f64], shape: &[usize]| -> Result<Tensor> {
        Ok(Tensor::from_host_data(
            HostData::try_from_fn(input.dtype, v.len(), |i| v[i])?,
            shape,
        ))
    };
    Ok(NormGrads {
        dx: t(&dx, &input.shape)?,
        dweight: weight
            .as_ref()
            .map(|_| t(&dw, normalized_shape))
            .transpose()?,
        dbias: want_bias.then(|| t(&db, normalized_shape)).transpose()?,
    })
}
