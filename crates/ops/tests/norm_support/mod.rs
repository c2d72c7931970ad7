//! Helpers of the norm tests (norm.rs, batch_norm.rs): float dtypes, closeness checks and finite differences.
use netcl_ops::testing::{check_close, dtypes_for};
use netcl_ops::{DType, Device, Tensor};

pub fn float_dtypes(dev: &Device) -> Vec<DType> {
    dtypes_for(dev)
        .into_iter()
        .filter(|d| d.is_float())
        .collect()
}

pub fn close(got: &Tensor, want: &Tensor, tol: f64, scale: f64, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    check_close(
        &got.to_vec_f64().unwrap(),
        &want.to_vec_f64().unwrap(),
        tol,
        scale,
        what,
    )
    .unwrap();
}

/// Central finite differences of `f` at `x`.
pub fn fd(x: &[f64], f: &dyn Fn(&[f64]) -> f64) -> Vec<f64> {
    (0..x.len())
        .map(|k| {
            let (mut p, mut m) = (x.to_vec(), x.to_vec());
            p[k] += 1e-6;
            m[k] -= 1e-6;
            (f(&p) - f(&m)) / 2e-6
        })
        .collect()
}
