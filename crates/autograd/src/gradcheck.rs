//! gradcheck: backward-pass gradients against central finite differences in f64, on any device.
use crate::tape::{Tape, Var};
use netcl_ops::{DType, Error, Generator, Result, Tensor};

/// Settings of [`gradcheck`]. A gradient entry passes when |analytic − numeric| ≤ atol + rtol·|numeric|.
#[derive(Clone, Copy, Debug)]
pub struct GradcheckOptions {
    /// Finite-difference step.
    pub eps: f64,
    pub atol: f64,
    pub rtol: f64,
    /// Seed of the random projection of the output onto a scalar.
    pub seed: u64,
    /// At most this many elements per input are perturbed (chosen evenly spread); 0 = all.
    pub max_elements: usize,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions {
            eps: 1e-6,
            atol: 1e-6,
            rtol: 1e-4,
            seed: 0x9e37_79b9,
            max_elements: 0,
        }
    }
}

/// What [`gradcheck`] compared.
#[derive(Clone, Debug, Default)]
pub struct GradcheckReport {
    /// Gradient entries compared.
    pub checked: usize,
    pub max_abs_err: f64,
}

/// Check the gradients `f` produces for each float input against finite differences. Inputs are
/// converted to f64 on their device; `f` maps those Vars to one output of any shape (reduced to
/// a scalar by a fixed random projection). Integer inputs stay constants. Returns an error that
/// lists the mismatching entries (input, element, analytic, numeric) when the check fails.
pub fn gradcheck(
    f: impl Fn(&[Var]) -> Result<Var>,
    inputs: &[Tensor],
    opts: GradcheckOptions,
) -> Result<GradcheckReport> {
    let op = "gradcheck";
    let xs: Vec<Tensor> = inputs
        .iter()
        .map(|t| {
            if t.dtype().is_float() {
                t.to_dtype(DType::F64)
            } else {
                Ok(t.clone())
            }
        })
        .collect::<Result<_>>()?;
    let tape = Tape::new();
    let vars: Vec<Var> = xs
        .iter()
        .map(|t| {
            if t.dtype().is_float() {
                tape.leaf(t)
            } else {
                Ok(Var::constant(t.clone()))
            }
        })
        .collect::<Result<_>>()?;
    let out = f(&vars)?;
    if out.dtype() != DType::F64 {
        return Err(Error::dtype(
            op,
            format!(
                "the output is {}; with f64 inputs it should be f64",
                out.dtype()
            ),
        ));
    }
    let mut gen = Generator::new(opts.seed);
    let w = Tensor::uniform(out.shape(), -1.0, 1.0, DType::F64, out.device(), &mut gen)?;
    let w_host = w.to_vec_f64()?;
    let grads = tape.backward_with(&out, &w)?;

    let project = |args: &[Var]| -> Result<f64> {
        let y = f(args)?.value().to_vec_f64()?;
        Ok(y.iter().zip(&w_host).map(|(a, b)| a * b).sum())
    };
    let mut report = GradcheckReport::default();
    let mut bad = Vec::new();
    for (i, x) in xs.iter().enumerate() {
        if !x.dtype().is_float() {
            continue;
        }
        let analytic = match grads.get(&vars[i]) {
            Some(g) => g.to_vec_f64()?,
            None => vec![0.0; x.numel()],
        };
        let base = x.to_vec_f64()?;
        let n = base.len();
        let picks: Vec<usize> = if opts.max_elements == 0 || n <= opts.max_elements {
            (0..n).collect()
        } else {
            (0..opts.max_elements)
                .map(|k| k * n / opts.max_elements)
                .collect()
        };
        for j in picks {
            let at = |delta: f64| -> Result<f64> {
                let mut v = base.clone();
                v[j] += delta;
                let t = Tensor::from_vec(v, x.shape(), x.device())?;
                let args: Vec<Var> = (0..xs.len())
                    .map(|k| {
                        if k == i {
                            Var::constant(t.clone())
                        } else {
                            Var::constant(xs[k].clone())
                        }
                    })
                    .collect();
                project(&args)
            };
            let numeric = (at(opts.eps)? - at(-opts.eps)?) / (2.0 * opts.eps);
            let err = (analytic[j] - numeric).abs();
            report.checked += 1;
            if err.is_nan() || err > report.max_abs_err {
                report.max_abs_err = err;
            }
            if err.is_nan() || err > opts.atol + opts.rtol * numeric.abs() {
                bad.push(format!(
                    "input {i} {:?} element {j}: analytic {:.8e}, numeric {:.8e}",
                    x.shape(),
                    analytic[j],
                    numeric
                ));
            }
        }
    }
    if !bad.is_empty() {
        let shown = bad.iter().take(8).cloned().collect::<Vec<_>>().join("; ");
        return Err(Error::invalid(
            op,
            format!(
                "{} of {} gradient entries differ from finite differences: {shown}",
                bad.len(),
                report.checked
            ),
        ));
    }
    Ok(report)
}
