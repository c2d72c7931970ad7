//! Inputs and checks shared by the indexing and shape-op tests: index tensors and views that are the same on every device, naive index arithmetic, exact comparisons on every device.
#![allow(dead_code)] // each test file uses its own part
use netcl_ops::testing::{check_close, random_view, tolerance, Cases};
use netcl_ops::{DType, Device, Result, Tensor};

pub fn coords(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d].max(1);
        i /= shape[d].max(1);
    }
    c
}

pub fn lin(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |a, (&x, &n)| a * n + x)
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A host tensor seen on any device through a view that is the same on every device.
pub enum View {
    Plain,
    /// `testing::random_view` with this seed (the shape may change).
    Random(u64),
    /// The transpose of a contiguous transposed copy: same shape and values, permuted strides.
    Transposed,
    /// A narrow of the last dim of a wider tensor: same shape and values, offset and gaps.
    Narrowed,
}

pub struct Input {
    base: Tensor,
    view: View,
}

impl Input {
    /// Plain or a random view (the view decides the shape).
    pub fn new(base: Tensor, c: &mut Cases) -> Input {
        let view = if c.below(2) == 0 {
            View::Random(c.next_u64())
        } else {
            View::Plain
        };
        Input { base, view }
    }
    /// A view with the shape and values of `t`, usually non-contiguous.
    pub fn exact(t: Tensor, c: &mut Cases) -> Input {
        let nd = t.ndim();
        match c.below(3) {
            1 if nd >= 2 => Input {
                base: t.transpose(0, nd - 1).unwrap().contiguous().unwrap(),
                view: View::Transposed,
            },
            2 if nd >= 1 => Input {
                base: t.pad(&[(1, 0)], 9.0).unwrap(),
                view: View::Narrowed,
            },
            _ => Input {
                base: t,
                view: View::Plain,
            },
        }
    }
    pub fn on(&self, dev: &Device) -> Tensor {
        let t = self.base.to_device(dev).unwrap();
        let nd = t.ndim();
        match self.view {
            View::Plain => t,
            View::Random(s) => random_view(&t, &mut Cases(s)),
            View::Transposed => t.transpose(0, nd - 1).unwrap(),
            View::Narrowed => {
                let n = t.shape()[nd - 1];
                t.narrow(nd - 1, 1, n - 1).unwrap()
            }
        }
    }
    pub fn host(&self) -> Tensor {
        self.on(&Device::host())
    }
}

/// An i32 index tensor of `shape` holding `values`, contiguous or (when `strided`) every other
/// element of a tensor twice as long in the last dim.
pub struct Idx {
    base: Tensor,
    strided: bool,
}

impl Idx {
    pub fn new(values: &[i32], shape: &[usize], c: &mut Cases) -> Idx {
        let strided = !shape.is_empty() && c.below(2) == 0;
        if !strided {
            let base = Tensor::from_vec(values.to_vec(), shape, &Device::host()).unwrap();
            return Idx { base, strided };
        }
        let mut wide = shape.to_vec();
        *wide.last_mut().unwrap() *= 2;
        let v: Vec<i32> = values.iter().flat_map(|&x| [x, -7]).collect();
        let base = Tensor::from_vec(v, &wide, &Device::host()).unwrap();
        Idx { base, strided }
    }
    pub fn on(&self, dev: &Device) -> Tensor {
        let t = self.base.to_device(dev).unwrap();
        if self.strided {
            let d = t.ndim() - 1;
            let n = t.shape()[d];
            t.slice(d, 0, n, 2).unwrap()
        } else {
            t
        }
    }
}

pub fn random_indices(c: &mut Cases, n: usize, bound: usize) -> Vec<i32> {
    (0..n).map(|_| c.below(bound.max(1)) as i32).collect()
}

/// Runs `f` on every device that supports `dtype` and checks shape and values exactly against `want`.
pub fn check_all(
    devices: &[Device],
    what: &str,
    dtype: DType,
    shape: &[usize],
    want: &[f64],
    f: impl Fn(&Device) -> Result<Tensor>,
) {
    // The reference is converted to the dtype once, as the op rounds once.
    let want = netcl_ops::testing::host_tensor(dtype, want, shape)
        .to_vec_f64()
        .unwrap();
    for dev in devices {
        if dtype == DType::F64 && !dev.info().fp64 {
            continue;
        }
        let got = f(dev).unwrap_or_else(|e| panic!("{what} on {dev}: {e}"));
        assert_eq!(got.shape(), shape, "{what} on {dev}: shape");
        assert_eq!(got.dtype(), dtype, "{what} on {dev}: dtype");
        assert_eq!(got.device(), dev, "{what} on {dev}: device");
        assert_eq!(got.to_vec_f64().unwrap(), want, "{what} on {dev}");
    }
}

pub fn assert_err(r: Result<Tensor>, op: &str, needles: &[&str]) {
    let e = r.expect_err(op);
    let s = e.to_string();
    assert!(s.contains(op), "{s} should name {op}");
    for n in needles {
        assert!(s.contains(n), "{s} should contain {n}");
    }
}

/// `check_close` against a float reference, then bit equality with the host op.
pub fn check_sum(what: &str, dtype: DType, got: &Tensor, want: &[f64], host: &Tensor) {
    let g = got.to_vec_f64().unwrap();
    check_close(&g, want, tolerance(dtype), 1.0, what).unwrap_or_else(|m| panic!("{m}"));
    assert_eq!(g, host.to_vec_f64().unwrap(), "{what}: bits of the host op");
}
