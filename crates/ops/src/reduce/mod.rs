//! Reductions over any set of axes of strided views: sum, mean, max, min, argmax, argmin, var, logsumexp.
use crate::base::acc::arg_acc;
use crate::base::axis::pow2_floor;
use crate::base::axis::AxisSplit;
use crate::base::checks::u32_arg;
use crate::base::element::HostData;
use crate::base::launch::program_for;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::sources::REDUCE;
use netcl_kernels::Kernel;
use rayon::prelude::*;

/// A reduction. Its name is the kernel prefix (`sum_wg`, `sum_merge`, `sum_col`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceOp {
    Sum,
    /// Empty reductions give NaN.
    Mean,
    /// NaN propagates; an empty reduction is an error.
    Max,
    Min,
    /// Index (I32) of the first maximum within the reduced elements, counted row-major over the
    /// reduced axes in increasing axis order; NaN counts as the maximum. Empty is an error.
    ArgMax,
    ArgMin,
    /// Variance `sum((x - mean)^2) / max(n - correction, 0)` (correction 1 = unbiased); NaN when
    /// the denominator is 0.
    Var {
        correction: f64,
    },
    /// `log(sum(exp(x)))` computed around the maximum; empty gives -inf.
    LogSumExp,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
            ReduceOp::Var { .. } => "var",
            ReduceOp::LogSumExp => "logsumexp",
        }
    }

    /// The dtype of the result for input `dtype`.
    pub fn out_dtype(self, dtype: DType) -> DType {
        match self {
            ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I32,
            _ => dtype,
        }
    }

    fn float_only(self) -> bool {
        matches!(
            self,
            ReduceOp::Mean | ReduceOp::Var { .. } | ReduceOp::LogSumExp
        )
    }

    fn needs_elements(self) -> bool {
        matches!(
            self,
            ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin
        )
    }

    /// The op's scalar kernel parameter (the correction of var).
    fn param(self) -> f64 {
        match self {
            ReduceOp::Var { correction } => correction,
            _ => 0.0,
        }
    }
}

/// `axes` of a tensor of `shape` as a mask; errors name `op`, the axes and the shape.
pub(crate) fn axis_mask(op: &str, shape: &[usize], axes: &[usize]) -> Result<Vec<bool>> {
    let mut mask = vec![false; shape.len()];
    for &a in axes {
        if a >= shape.len() {
            return Err(Error::invalid(
                op,
                format!("axis {a} out of range for shape {shape:?} (axes {axes:?})"),
            ));
        }
        if std::mem::replace(&mut mask[a], true) {
            return Err(Error::invalid(
                op,
                format!("axis {a} repeated in axes {axes:?} of shape {shape:?}"),
            ));
        }
    }
    Ok(mask)
}

/// Host reference: reduce one row of f64 values.
fn host_reduce(op: ReduceOp, row: &[f64]) -> f64 {
    let n = row.len();
    let arg = |better: fn(f64, f64) -> bool| {
        let mut best = 0;
        for i in 1..n {
            let (b, x) = (row[best], row[i]);
            if !b.is_nan() && (x.is_nan() || better(x, b)) {
                best = i;
            }
        }
        best as f64
    };
    match op {
        ReduceOp::Sum => row.iter().sum(),
        ReduceOp::Mean => row.iter().sum::<f64>() / n as f64,
        ReduceOp::Max => {
            row.iter().fold(
                f64::NEG_INFINITY,
                |m, &x| {
                    if x.is_nan() || x > m {
                        x
                    } else {
                        m
                    }
                },
            )
        }
        ReduceOp::Min => row.iter().fold(
            f64::INFINITY,
            |m, &x| {
                if x.is_nan() || x < m {
                    x
                } else {
                    m
                }
            },
        ),
        ReduceOp::ArgMax => arg(|x, b| x > b),
        ReduceOp::ArgMin => arg(|x, b| x < b),
        ReduceOp::Var { correction } => {
            let mean = row.iter().sum::<f64>() / n as f64;
            let m2: f64 = row.iter().map(|x| (x - mean) * (x - mean)).sum();
            m2 / (n as f64 - correction).max(0.0)
        }
        ReduceOp::LogSumExp => {
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
            if row.iter().any(|x| x.is_nan()) {
                f64::NAN
            } else if m.is_infinite() {
                m
            } else {
                m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
            }
        }
    }
}

/// How a device reduction is laid out over work-items.
enum Plan {
    /// One work-item per output.
    Col,
    /// Work-groups of `group` items, `nsplit` per output over chunks of `chunk` reduced elements.
    Groups {
        group: usize,
        nsplit: usize,
        chunk: usize,
    },
}

fn plan(device: &Device, nout: usize, nred: usize, red_contiguous: bool) -> Plan {
    // Short reductions, or many outputs whose reduced elements are far apart (adjacent work-items
    // then read adjacent kept elements): one work-item per output.
    if nred <= 16 || (nout >= 4096 && !red_contiguous) || (nout >= 65536 && nred <= 64) {
        return Plan::Col;
    }
    let group = 256.min(pow2_floor(device.info().max_work_group_size));
    // Few outputs over many elements: split each output over several work-groups (two kernels).
    let target_groups = 1024;
    let mut nsplit = 1;
    if nout < target_groups / 2 {
        nsplit = (target_groups / nout)
            .min(nred / (group * 16))
            .clamp(1, 1024);
    }
    let chunk = nred.div_ceil(nsplit);
    let nsplit = nred.div_ceil(chunk.max(1)).max(1);
    Plan::Groups {
        group,
        nsplit,
        chunk,
    }
}

impl Tensor {
    /// Reduce over `axes` (each at most once; `&[]` reduces nothing). With `keepdim` the reduced
    /// dims stay as size 1, otherwise they are removed. Any strided view is read in place.
    /// Device kernels: one (two when a few outputs each reduce many elements).
    pub fn reduce(&self, op: ReduceOp, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        let name = op.name();
        let _span = netcl_profiling::span(name);
        let mask = axis_mask(name, &self.shape, axes)?;
        if op.float_only() && !self.dtype.is_float() {
            return Err(Error::dtype(
                name,
                format!(
                    "{} {:?}: {name} needs a float dtype",
                    self.dtype, self.shape
                ),
            ));
        }
        let split = AxisSplit::new(self, &mask);
        let (nout, nred) = (split.nout(), split.nred());
        if op.needs_elements() && split.red_shape.contains(&0) {
            return Err(Error::shape(
                name,
                format!(
                    "{name} over empty axes {axes:?} of shape {:?} has no elements",
                    self.shape
                ),
            ));
        }
        if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) && nred > i32::MAX as usize {
            return Err(Error::shape(
                name,
                format!("{nred} reduced elements exceed the I32 index range"),
            ));
        }
        let out_shape: Vec<usize> = if keepdim {
            (0..self.ndim())
                .map(|d| if mask[d] { 1 } else { self.shape[d] })
                .collect()
        } else {
            split.kept_shape.clone()
        };
        let out_dtype = op.out_dtype(self.dtype);
        if let Some(rows) = split.host_rows(self) {
            let vals: Vec<f64> = (0..nout)
                .into_par_iter()
                .map(|o| host_reduce(op, &rows[o * nred..(o + 1) * nred]))
                .collect();
            return Ok(Tensor::from_host_data(
                HostData::from_fn(out_dtype, nout, |i| vals[i]),
                &out_shape,
            ));
        }
        let (lk, lr) = split.layouts(name, self.offset)?;
        let nred32 = u32_arg(name, "reduced extent", nred)?;
        let nout32 = u32_arg(name, "output count", nout)?;
        let out = Tensor::alloc(&out_shape, out_dtype, &self.device)?;
        if nout == 0 {
            return Ok(out);
        }
        let program = program_for(&self.device, &REDUCE, self.dtype)?;
        let red_contiguous = lr.ndim == 0 || lr.stride[0][lr.ndim as usize - 1] == 1;
        // Every input element read and combined once, every output written once.
        let bytes = nout * nred * self.dtype.size() + nout * out_dtype.size();
        let work = (bytes as u64, (nout * nred) as u64);
        match plan(&self.device, nout, nred, red_contiguous) {
            Plan::Col => {
                let mut k = Kernel::new(&program, &format!("{name}_col"))?;
                k.arg_mem(out.mem()?)?
                    .arg_mem(self.mem()?)?
                    .arg(&lk)?
                    .arg(&lr)?
                    .arg(&nred32)?;
                arg_acc(&mut k, self.dtype, op.param())?;
                k.arg(&nout32)?.declare(work.0, work.1);
                let group = 256.min(pow2_floor(k.max_work_group_size()));
                k.launch(&[nout], &[group])
            }
            Plan::Groups {
                group,
                nsplit,
                chunk,
            } => {
                let groups = nout
                    .checked_mul(nsplit)
                    .filter(|&g| g.checked_mul(group).is_some_and(|n| n <= u32::MAX as usize))
                    .ok_or_else(|| {
                        Error::shape(name, format!("{nout} outputs need too many work-groups"))
                    })?;
                let mut k = Kernel::new(&program, &format!("{name}_wg"))?;
                let group = group.min(pow2_floor(k.max_work_group_size()));
                // Partial states are at most 4 accumulators: 32 bytes each is enough.
                let part = if nsplit > 1 {
                    Some(Tensor::alloc(&[groups * 8], DType::U32, &self.device)?)
                } else {
                    None
                };
                let mut merge = match &part {
                    Some(_) => Some(Kernel::new(&program, &format!("{name}_merge"))?),
                    None => None,
                };
                let mgroup = merge
                    .as_ref()
                    .map_or(group, |m| group.min(pow2_floor(m.max_work_group_size())));
                k.arg_mem(out.mem()?)?
                    .arg_mem(part.as_ref().unwrap_or(self).mem()?)?
                    .arg_mem(self.mem()?)?
                    .arg(&lk)?
                    .arg(&lr)?
                    .arg(&nred32)?
                    .arg(&u32_arg(name, "chunk", chunk)?)?
                    .arg(&(nsplit as u32))?;
                arg_acc(&mut k, self.dtype, op.param())?;
                if let (Some(m), Some(p)) = (merge.as_mut(), part.as_ref()) {
                    m.arg_mem(out.mem()?)?
                        .arg_mem(p.mem()?)?
                        .arg(&(nsplit as u32))?
                        .arg(&nred32)?;
                    arg_acc(m, self.dtype, op.param())?;
                }
                k.declare(work.0, work.1)
                    .launch(&[groups * group], &[group])?;
                match merge.as_mut() {
                    Some(m) => m.launch(&[nout * mgroup], &[mgroup]),
                    None => Ok(()),
                }
            }
        }?;
        Ok(out)
    }

    /// Reduce over every axis to a 0-dim tensor.
    pub fn reduce_all(&self, op: ReduceOp) -> Result<Tensor> {
        let axes: Vec<usize> = (0..self.ndim()).collect();
        self.reduce(op, &axes, false)
    }

    pub fn sum(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keepdim)
    }
    pub fn mean(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, axes, keepdim)
    }
    pub fn max(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, axes, keepdim)
    }
    pub fn min(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, axes, keepdim)
    }
    /// I32 indices of the first maxima (see [`ReduceOp::ArgMax`]).
    pub fn argmax(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMax, axes, keepdim)
    }
    pub fn argmin(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMin, axes, keepdim)
    }
    /// Variance with `correction` (1.0 = unbiased, 0.0 = population).
    pub fn var(&self, axes: &[usize], correction: f64, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Var { correction }, axes, keepdim)
    }
    pub fn logsumexp(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::LogSumExp, axes, keepdim)
    }

    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Sum)
    }
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Mean)
    }
    pub fn max_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Max)
    }
    pub fn min_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Min)
    }
    /// The row-major flat index of the first maximum, as a 0-dim I32 tensor.
    pub fn argmax_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::ArgMax)
    }
    pub fn argmin_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::ArgMin)
    }
    pub fn var_all(&self, correction: f64) -> Result<Tensor> {
        self.reduce_all(ReduceOp::Var { correction })
    }
    pub fn logsumexp_all(&self) -> Result<Tensor> {
        self.reduce_all(ReduceOp::LogSumExp)
    }
}
