//! Shared test helpers: random parameters and gradients on a device, and plain-Rust f64 references of PyTorch's SGD/Adam/AdamW update formulas.
#![allow(dead_code)]
use netcl_autograd::Parameter;
use netcl_ops::testing::{host_tensor, Cases};
use netcl_ops::{DType, Device, Tensor};

/// Shapes of the test parameters (a matrix, a vector, a 3-D block, and one never given a grad).
pub const SHAPES: [&[usize]; 4] = [&[7, 5], &[13], &[2, 3, 4], &[3, 3]];

/// Whether parameter `i` has a gradient at step `s` (0-based): 0 always, 1 not at step 2,
/// 2 only from step 2 on (its state starts late), 3 never.
pub fn has_grad(i: usize, s: usize) -> bool {
    match i {
        0 => true,
        1 => s != 2,
        2 => s >= 2,
        _ => false,
    }
}

/// `n` uniform values in [lo, hi) rounded to `dtype`, as f64.
pub fn values(c: &mut Cases, dtype: DType, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    let v: Vec<f64> = (0..n).map(|_| c.uniform(lo, hi)).collect();
    host_tensor(dtype, &v, &[n]).to_vec_f64().unwrap()
}

/// A tensor of `dtype` holding `v` (exactly representable) on `dev`.
pub fn tensor(dev: &Device, dtype: DType, v: &[f64], shape: &[usize]) -> Tensor {
    host_tensor(dtype, v, shape).to_device(dev).unwrap()
}

pub fn param(dev: &Device, dtype: DType, v: &[f64], shape: &[usize]) -> Parameter {
    Parameter::new(tensor(dev, dtype, v, shape)).unwrap()
}

/// The initial values and the gradients of every step (None where `has_grad` is false) of the
/// test parameters, rounded to `dtype`.
pub struct Problem {
    pub init: Vec<Vec<f64>>,
    pub grads: Vec<Vec<Option<Vec<f64>>>>,
}

impl Problem {
    pub fn new(seed: u64, dtype: DType, steps: usize) -> Problem {
        let mut c = Cases::new(seed);
        let numel = |s: &[usize]| s.iter().product::<usize>();
        let init = SHAPES
            .iter()
            .map(|s| values(&mut c, dtype, numel(s), -1.0, 1.0))
            .collect();
        let grads = (0..steps)
            .map(|s| {
                SHAPES
                    .iter()
                    .enumerate()
                    .map(|(i, sh)| {
                        has_grad(i, s).then(|| values(&mut c, dtype, numel(sh), -1.0, 1.0))
                    })
                    .collect()
            })
            .collect();
        Problem { init, grads }
    }

    /// Fresh parameters holding the initial values on `dev`.
    pub fn params(&self, dev: &Device, dtype: DType) -> Vec<Parameter> {
        self.init
            .iter()
            .zip(SHAPES)
            .map(|(v, s)| param(dev, dtype, v, s))
            .collect()
    }

    /// Give each parameter its gradient of step `s` (or none).
    pub fn set_grads(&self, params: &[Parameter], s: usize) {
        for (p, g) in params.iter().zip(&self.grads[s]) {
            match g {
                Some(g) => {
                    let t = tensor(p.device(), p.dtype(), g, p.shape());
                    p.set_grad(Some(t)).unwrap()
                }
                None => p.zero_grad(),
            }
        }
    }
}

/// SGD settings for the reference.
#[derive(Clone, Copy, Debug)]
pub struct SgdCfg {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
}

/// One SGD step of one parameter, PyTorch's documented algorithm in f64.
pub fn sgd_ref(c: &SgdCfg, p: &mut [f64], g: &[f64], buf: &mut Option<Vec<f64>>) {
    let gt: Vec<f64> = g
        .iter()
        .zip(p.iter())
        .map(|(g, p)| g + c.weight_decay * p)
        .collect();
    let dir: Vec<f64> = if c.momentum != 0.0 {
        let b: Vec<f64> = match buf.take() {
            None => gt.clone(),
            Some(b) => b
                .iter()
                .zip(&gt)
                .map(|(b, g)| c.momentum * b + (1.0 - c.dampening) * g)
                .collect(),
        };
        let d = if c.nesterov {
            gt.iter().zip(&b).map(|(g, b)| g + c.momentum * b).collect()
        } else {
            b.clone()
        };
        *buf = Some(b);
        d
    } else {
        gt
    };
    for (p, d) in p.iter_mut().zip(dir) {
        *p -= c.lr * d;
    }
}

/// Adam / AdamW settings for the reference.
#[derive(Clone, Copy, Debug)]
pub struct AdamCfg {
    pub decoupled: bool,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub amsgrad: bool,
}

/// Moments, the running maximum of v (amsgrad) and update count of one parameter in the reference.
#[derive(Clone, Debug, Default)]
pub struct AdamRefState {
    pub m: Vec<f64>,
    pub v: Vec<f64>,
    pub max_v: Vec<f64>,
    pub t: usize,
}

/// One Adam (or AdamW) step of one parameter, PyTorch's documented algorithm in f64:
/// bias-corrected moments `m_hat = m / (1 - b1^t)`, `v_hat = v / (1 - b2^t)` (with amsgrad
/// `max_v / (1 - b2^t)`, where `max_v` is the largest v so far) and
/// `p -= lr * m_hat / (sqrt(v_hat) + eps)`.
pub fn adam_ref(c: &AdamCfg, p: &mut [f64], g: &[f64], s: &mut AdamRefState) {
    if s.t == 0 {
        s.m = vec![0.0; p.len()];
        s.v = vec![0.0; p.len()];
        s.max_v = vec![0.0; p.len()];
    }
    s.t += 1;
    let t = s.t as i32;
    for j in 0..p.len() {
        let mut gj = g[j];
        if c.decoupled {
            p[j] -= c.lr * c.weight_decay * p[j];
        } else {
            gj += c.weight_decay * p[j];
        }
        s.m[j] = c.beta1 * s.m[j] + (1.0 - c.beta1) * gj;
        s.v[j] = c.beta2 * s.v[j] + (1.0 - c.beta2) * gj * gj;
        let m_hat = s.m[j] / (1.0 - c.beta1.powi(t));
        s.max_v[j] = s.max_v[j].max(s.v[j]);
        let second = if c.amsgrad { s.max_v[j] } else { s.v[j] };
        let v_hat = second / (1.0 - c.beta2.powi(t));
        p[j] -= c.lr * m_hat / (v_hat.sqrt() + c.eps);
    }
}

/// Relative tolerance of a handful of optimizer steps in `dtype`.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        _ => 1e-5,
    }
}

/// The float dtypes optimizers are tested in on `dev`.
pub fn dtypes(dev: &Device) -> Vec<DType> {
    let mut d = vec![DType::F32];
    if dev.info().fp64 {
        d.push(DType::F64);
    }
    d
}

/// Every element of `got` equal, bit for bit, to `want`.
pub fn same_bits(got: &Tensor, want: &Tensor, what: &str) {
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    assert_eq!(g.len(), w.len(), "{what}: lengths");
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            a.to_bits() == b.to_bits(),
            "{what}: element {i}: {a} vs {b}"
        );
    }
}
