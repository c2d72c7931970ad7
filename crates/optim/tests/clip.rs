//! clip_grad_norm and clip_grad_norm_on_device on every device against a host f64 computation: below and above the threshold, many and shared gradients, mixed dtypes and devices.
mod common;

use common::*;
use netcl_autograd::Parameter;
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, Cases};
use netcl_ops::{DType, Device, Tensor};
use netcl_optim::{clip_grad_norm, clip_grad_norm_on_device, grad_norm};

/// Parameters of `shapes` with random gradients (the last one without a gradient), and the
/// gradients' values.
fn setup(
    dev: &Device,
    dtypes: &[DType],
    shapes: &[Vec<usize>],
    seed: u64,
) -> (Vec<Parameter>, Vec<Vec<f64>>) {
    let mut c = Cases::new(seed);
    let mut params = Vec::new();
    let mut grads = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        let dtype = dtypes[i % dtypes.len()];
        let n: usize = s.iter().product();
        let p = param(dev, dtype, &values(&mut c, dtype, n, -1.0, 1.0), s);
        if i + 1 < shapes.len() {
            let g = values(&mut c, dtype, n, -2.0, 2.0);
            p.set_grad(Some(tensor(dev, dtype, &g, s))).unwrap();
            grads.push(g);
        }
        params.push(p);
    }
    (params, grads)
}

fn host_norm(grads: &[Vec<f64>]) -> f64 {
    grads.iter().flatten().map(|x| x * x).sum::<f64>().sqrt()
}

/// Tolerance for a gradient of `dtype` after scaling (f16 storage rounds at 1e-3).
fn grad_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1e-3,
        d => tol(d).max(1e-6),
    }
}

fn check_grads(params: &[Parameter], grads: &[Vec<f64>], factor: f64, what: &str) {
    for (i, (p, g)) in params.iter().zip(grads).enumerate() {
        let got = p.grad().unwrap().to_vec_f64().unwrap();
        let want: Vec<f64> = g.iter().map(|x| x * factor).collect();
        check_close(
            &got,
            &want,
            grad_tol(p.dtype()),
            1e-3,
            &format!("{what}: grad {i}"),
        )
        .unwrap();
    }
    assert!(params.last().unwrap().grad().is_none(), "{what}");
}

fn shapes(n: usize) -> Vec<Vec<usize>> {
    (0..n).map(|i| vec![1 + i % 4, 3 + 2 * i]).collect()
}

#[test]
fn clip_grad_norm_matches_the_host_below_and_above_the_threshold() {
    let mut cases = 0;
    for dev in test_devices().unwrap() {
        let mut kinds: Vec<Vec<DType>> = vec![vec![DType::F32], vec![DType::F32, DType::F16]];
        if dev.info().fp64 {
            kinds.push(vec![DType::F64]);
            kinds.push(vec![DType::F32, DType::F64]);
        }
        for dts in &kinds {
            // 4 gradients, and 21 (more than one fused sum's fan-in).
            for n in [5, 22] {
                let norm_tol = if dts.contains(&DType::F64) && dts.len() == 1 {
                    1e-12
                } else {
                    1e-5
                };
                for on_device in [false, true] {
                    for above in [false, true] {
                        let seed = (n * 10 + above as usize) as u64;
                        let (params, grads) = setup(&dev, dts, &shapes(n), seed);
                        let want = host_norm(&grads);
                        let max_norm = if above { want / 3.0 } else { want * 2.0 };
                        let what =
                            format!("{dts:?} n {n} above {above} on_device {on_device} on {dev}");
                        assert!(
                            (grad_norm(&params).unwrap() - want).abs() <= norm_tol * want,
                            "{what}: grad_norm"
                        );
                        let got = if on_device {
                            let t = clip_grad_norm_on_device(&params, max_norm)
                                .unwrap()
                                .unwrap();
                            assert_eq!(t.shape(), &[] as &[usize]);
                            assert_eq!(t.device(), &dev);
                            t.to_vec_f64().unwrap()[0]
                        } else {
                            clip_grad_norm(&params, max_norm).unwrap()
                        };
                        assert!(
                            (got - want).abs() <= norm_tol * want,
                            "{what}: norm {got} vs {want}"
                        );
                        let factor = if above { max_norm / (want + 1e-6) } else { 1.0 };
                        check_grads(&params, &grads, factor, &what);
                        if above {
                            // f16 storage of the scaled gradients moves the norm by ~1e-3.
                            let t = if dts.contains(&DType::F16) {
                                2e-3
                            } else {
                                1e-5
                            };
                            let after = grad_norm(&params).unwrap();
                            assert!((after - max_norm).abs() <= t * max_norm, "{what}: {after}");
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases >= 16, "{cases} cases");
}

#[test]
fn unclipped_gradients_keep_their_values_exactly() {
    for dev in test_devices().unwrap() {
        let (params, grads) = setup(&dev, &[DType::F32], &shapes(4), 99);
        let norm = clip_grad_norm(&params, 1e9).unwrap();
        assert!(norm > 0.0);
        for (p, g) in params.iter().zip(&grads) {
            assert_eq!(&p.grad().unwrap().to_vec_f64().unwrap(), g, "{dev}");
        }
    }
}

#[test]
fn shared_gradient_tensors_are_scaled_once_and_the_original_is_kept() {
    for dev in test_devices().unwrap() {
        let a = param(&dev, DType::F32, &[0.0, 0.0], &[2]);
        let b = param(&dev, DType::F32, &[0.0, 0.0], &[2]);
        let g = tensor(&dev, DType::F32, &[3.0, 4.0], &[2]);
        for on_device in [false, true] {
            a.set_grad(Some(g.clone())).unwrap();
            b.set_grad(Some(g.clone())).unwrap();
            // Total norm sqrt(2 * 25) = 5 sqrt 2; clip to 1.
            let norm = if on_device {
                clip_grad_norm_on_device(&[a.clone(), b.clone()], 1.0)
                    .unwrap()
                    .unwrap()
                    .to_vec_f64()
                    .unwrap()[0]
            } else {
                clip_grad_norm(&[a.clone(), b.clone()], 1.0).unwrap()
            };
            let want = 50f64.sqrt();
            assert!((norm - want).abs() < 1e-5 * want, "{dev}: {norm}");
            let f = 1.0 / (want + 1e-6);
            for p in [&a, &b] {
                let got = p.grad().unwrap().to_vec_f64().unwrap();
                check_close(&got, &[3.0 * f, 4.0 * f], 1e-6, 0.0, "shared grad").unwrap();
            }
            assert_eq!(
                g.to_vec_f64().unwrap(),
                [3.0, 4.0],
                "{dev}: caller's tensor"
            );
        }
    }
}

#[test]
fn zero_and_missing_gradients() {
    for dev in test_devices().unwrap() {
        let ps = [param(&dev, DType::F32, &[1.0, 2.0], &[2])];
        assert_eq!(clip_grad_norm(&ps, 1.0).unwrap(), 0.0);
        assert!(clip_grad_norm_on_device(&ps, 1.0).unwrap().is_none());
        ps[0]
            .set_grad(Some(Tensor::zeros(&[2], DType::F32, &dev).unwrap()))
            .unwrap();
        assert_eq!(clip_grad_norm(&ps, 1.0).unwrap(), 0.0);
        let n = clip_grad_norm_on_device(&ps, 1.0).unwrap().unwrap();
        assert_eq!(n.to_vec_f64().unwrap(), [0.0]);
        assert_eq!(ps[0].grad().unwrap().to_vec_f64().unwrap(), [0.0, 0.0]);
        let e = clip_grad_norm(&ps, -1.0).unwrap_err().to_string();
        assert!(e.contains("max_norm") && e.contains("-1"), "{e}");
        let e = clip_grad_norm_on_device(&ps, f64::NAN)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_norm must be >= 0, got NaN"), "{e}");
    }
}

#[test]
fn gradients_on_several_devices() {
    let devices = test_devices().unwrap();
    if devices.len() < 2 {
        return;
    }
    let mut c = Cases::new(5);
    let mut params = Vec::new();
    let mut grads = Vec::new();
    for (i, dev) in devices.iter().enumerate() {
        let n = 10 + i;
        let p = param(dev, DType::F32, &vec![0.0; n], &[n]);
        let g = values(&mut c, DType::F32, n, -1.0, 1.0);
        p.set_grad(Some(tensor(dev, DType::F32, &g, &[n]))).unwrap();
        params.push(p);
        grads.push(g);
    }
    let e = clip_grad_norm_on_device(&params, 0.5)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("clip_grad_norm_on_device") && e.contains("host"),
        "{e}"
    );
    let want = host_norm(&grads);
    let got = clip_grad_norm(&params, 0.5).unwrap();
    assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
    for (i, (p, g)) in params.iter().zip(&grads).enumerate() {
        let got = p.grad().unwrap().to_vec_f64().unwrap();
        let want: Vec<f64> = g.iter().map(|x| x * 0.5 / (want + 1e-6)).collect();
        check_close(&got, &want, 1e-6, 1e-3, &format!("grad {i}")).unwrap();
    }
}
