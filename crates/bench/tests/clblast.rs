//! CLBlastSgemm through the run-time loaded library: results against a host f64 matmul, offsets and shape errors (skipped where libclblast is not installed).
use netcl_bench::clblast::ClBlast;
use netcl_core_devices::{opencl_test_devices, DType, Result};
use netcl_ops::Tensor;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| ((i * 2654435761 + seed * 40503) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

#[test]
fn sgemm_matches_host_reference() -> Result<()> {
    let blas = match ClBlast::load() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("skipped: {e}");
            return Ok(());
        }
    };
    let (m, k, n) = (37usize, 19usize, 23usize);
    // `a` is a row window (offset 3 * k elements) of a larger tensor, to check the offsets.
    let big = values((m + 5) * k, 1);
    let bv = values(k * n, 2);
    let av = &big[3 * k..(3 + m) * k];
    let mut want = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k)
                .map(|p| av[i * k + p] as f64 * bv[p * n + j] as f64)
                .sum();
        }
    }
    for dev in opencl_test_devices()? {
        let a = Tensor::from_vec(big.clone(), &[m + 5, k], &dev)?.narrow(0, 3, m)?;
        assert_eq!(a.offset(), 3 * k);
        let b = Tensor::from_vec(bv.clone(), &[k, n], &dev)?;
        let c = Tensor::zeros(&[m, n], DType::F32, &dev)?;
        blas.sgemm(&a, &b, &c)?;
        let got = c.to_vec::<f32>()?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (*g as f64 - w).abs() < 1e-4,
                "{dev}: c[{i}] = {g}, want {w}"
            );
        }
        let wrong = Tensor::zeros(&[m, n + 1], DType::F32, &dev)?;
        let err = blas.sgemm(&a, &b, &wrong).unwrap_err().to_string();
        assert!(err.contains("CLBlastSgemm"), "{err}");
        let host = Tensor::zeros(&[m, n], DType::F32, &netcl_core_devices::Device::host())?;
        assert!(blas.sgemm(&a, &b, &host).is_err());
    }
    Ok(())
}
