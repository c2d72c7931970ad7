//! The f32 matmul precision policy and the tensor-core GEMM: TF32 results within TF32 tolerance of the host (and visibly TF32 only where the probe found tensor cores), 16-bit products through tensor cores, global and per-device settings.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, random_tensor};
use netcl_ops::{
    device_float32_matmul_precision, has_tensor_cores, set_device_float32_matmul_precision,
    Activation, DType, Device, MatmulOptions, MatmulPrecision, Tensor, TensorCoreKind,
};

/// (batch, M, N, K, A stored transposed, B stored transposed, with a bias).
type Case = (Vec<usize>, usize, usize, usize, bool, bool, bool);

/// `(M, K) x (K, N)` cases: ragged over the 128 x 128 tile and its K step, transposed operands
/// (A stored (K, M), B stored (N, K)), a broadcast batch, bias and an activation.
fn cases() -> Vec<Case> {
    vec![
        (vec![], 130, 70, 100, false, false, true),
        (vec![], 64, 256, 96, true, false, false),
        (vec![], 33, 129, 200, false, true, true),
        (vec![2], 40, 24, 70, true, true, false),
        // 16-bit operands read as they lie: A (K, M) and B (K, N) row-major, ragged tiles, batch.
        (vec![], 72, 136, 64, true, false, true),
        (vec![3], 16, 24, 32, true, false, false),
    ]
}

fn operand(dtype: DType, batch: &[usize], r: usize, c: usize, t: bool, seed: u64) -> Tensor {
    let mut shape = batch.to_vec();
    shape.extend(if t { [c, r] } else { [r, c] });
    let x = random_tensor(dtype, &shape, -1.0, 1.0, seed);
    let nd = shape.len();
    if t {
        x.transpose(nd - 2, nd - 1).unwrap()
    } else {
        x
    }
}

/// Runs every case on `dev` in `dtype` (with precision `p` for f32), the product written in `out`
/// (f32 for 16-bit operands, with an f32 bias) or in `dtype`, and compares with the host's f64
/// product of the same (rounded) inputs; returns whether any result differed from the exact f32
/// kernel's by a bit.
fn run(dev: &Device, dtype: DType, out: Option<DType>, tol: f64) -> bool {
    let mut differs = false;
    for (i, (batch, m, n, k, ta, tb, bias)) in cases().into_iter().enumerate() {
        let seed = 100 * i as u64;
        let a = operand(dtype, &batch, m, k, ta, seed);
        let b = operand(dtype, &[], k, n, tb, seed + 1);
        let bias_t = bias.then(|| {
            random_tensor(dtype, &[n], -1.0, 1.0, seed + 2)
                .to_dtype(out.unwrap_or(dtype))
                .unwrap()
        });
        let opts = |bias, out_dtype| MatmulOptions {
            bias,
            activation: Activation::Relu,
            out_dtype,
            ..Default::default()
        };
        let to64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        let bias64 = bias_t.as_ref().map(to64);
        let want = to64(&a)
            .matmul_with(&to64(&b), opts(bias64.as_ref(), None))
            .unwrap();
        let (ad, bd) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
        let biasd = bias_t.as_ref().map(|t| t.to_device(dev).unwrap());
        let got = ad.matmul_with(&bd, opts(biasd.as_ref(), out)).unwrap();
        let what = format!("{dtype} -> {out:?} {batch:?} {m}x{k}x{n} (ta {ta}, tb {tb}) on {dev}");
        assert_eq!(got.shape(), want.shape(), "{what}");
        assert_eq!(got.dtype(), out.unwrap_or(dtype), "{what}");
        let g = got.to_vec_f64().unwrap();
        check_close(&g, &want.to_vec_f64().unwrap(), tol, 1.0, &what).unwrap();
        if dtype == DType::F32 {
            set_device_float32_matmul_precision(dev, Some(MatmulPrecision::Highest));
            let exact = ad.matmul_with(&bd, opts(biasd.as_ref(), None)).unwrap();
            set_device_float32_matmul_precision(dev, Some(MatmulPrecision::High));
            differs |= exact.to_vec_f64().unwrap() != g;
        }
    }
    differs
}

/// Both tests set the host device's own precision: one at a time (they run in parallel threads).
static HOST_SETTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn tf32_and_16_bit_products_match_the_host_on_every_device() {
    let _one = HOST_SETTING.lock().unwrap_or_else(|p| p.into_inner());
    assert!(!has_tensor_cores(&Device::host(), TensorCoreKind::Tf32));
    for dev in test_devices().unwrap() {
        set_device_float32_matmul_precision(&dev, Some(MatmulPrecision::High));
        assert_eq!(device_float32_matmul_precision(&dev), MatmulPrecision::High);
        // TF32 keeps 10 mantissa bits: |error| <= about 2^-11 * sum |a||b| (K <= 200 of [-1, 1]).
        let tf32 = has_tensor_cores(&dev, TensorCoreKind::Tf32);
        let differs = run(&dev, DType::F32, None, 2e-2);
        // "high" uses TF32 exactly where tensor cores were found, and exact f32 elsewhere.
        assert_eq!(differs, tf32, "TF32 in use on {dev}: {tf32}");
        set_device_float32_matmul_precision(&dev, None);
        // bf16 and f16 inputs (through tensor cores where present): the output's rounding
        // dominates, plus f32 accumulation.
        run(&dev, DType::BF16, None, 6e-2);
        run(&dev, DType::F16, None, 1e-2);
        // Written in f32 (autocast's products): the same bounds hold where the product is rounded
        // to 16 bits first (devices without tensor cores).
        run(&dev, DType::BF16, Some(DType::F32), 6e-2);
        run(&dev, DType::F16, Some(DType::F32), 1e-2);
    }
}

#[test]
fn a_product_widens_only_from_16_bits_to_f32() {
    let dev = Device::host();
    let a = random_tensor(DType::F32, &[4, 8], -1.0, 1.0, 1);
    let widen = |t: &Tensor, out, bias| {
        let opts = MatmulOptions {
            out_dtype: Some(out),
            bias,
            ..Default::default()
        };
        t.matmul_with(&t.transpose(0, 1).unwrap(), opts)
    };
    let e = widen(&a, DType::BF16, None).unwrap_err().to_string();
    assert!(e.contains("f32 operands") && e.contains("bf16"), "{e}");
    let h = a.to_dtype(DType::BF16).unwrap();
    let e = widen(&h, DType::F16, None).unwrap_err().to_string();
    assert!(e.contains("f16"), "{e}");
    let bias16 = Tensor::zeros(&[4], DType::BF16, &dev).unwrap();
    let e = widen(&h, DType::F32, Some(&bias16))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bias is bf16"), "{e}");
    let y = widen(&h, DType::F32, None).unwrap();
    assert_eq!(y.dtype(), DType::F32);
}

#[test]
fn precision_settings_parse_and_layer() {
    let _one = HOST_SETTING.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(
        "High".parse::<MatmulPrecision>().unwrap(),
        MatmulPrecision::High
    );
    assert_eq!(
        " highest".parse::<MatmulPrecision>().unwrap(),
        MatmulPrecision::Highest
    );
    let e = "medium".parse::<MatmulPrecision>().unwrap_err().to_string();
    assert!(e.contains("medium"), "{e}");
    // A device's own setting wins over the process-wide one and can be cleared. (The process-wide
    // setting is left alone: tests in this binary run in parallel.)
    let h = Device::host();
    set_device_float32_matmul_precision(&h, Some(MatmulPrecision::High));
    assert_eq!(device_float32_matmul_precision(&h), MatmulPrecision::High);
    set_device_float32_matmul_precision(&h, None);
    assert_eq!(
        device_float32_matmul_precision(&h),
        netcl_ops::float32_matmul_precision()
    );
    // With "high" the host stays exact f32: bit-identical to "highest".
    let a = random_tensor(DType::F32, &[9, 17], -1.0, 1.0, 5);
    let b = random_tensor(DType::F32, &[17, 3], -1.0, 1.0, 6);
    let exact = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();
    set_device_float32_matmul_precision(&h, Some(MatmulPrecision::High));
    let high = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();
    set_device_float32_matmul_precision(&h, None);
    assert_eq!(exact, high);
}

fn relu(bias: Option<&Tensor>, out_dtype: Option<DType>) -> MatmulOptions<'_> {
    MatmulOptions {
        bias,
        activation: Activation::Relu,
        out_dtype,
        ..Default::default()
    }
}

/// Products on tensor cores (Hopper's wgmma where its probe passed, in both of its tilings;
/// mma.sync or the portable kernels elsewhere) in every operand layout, 16-bit and f32 outputs,
/// with a bias and an activation: small integers make every sum exact, so each result must equal
/// the host's bit for bit (16-bit outputs: the host's exact sum rounded once).
#[test]
fn tensor_core_products_match_the_host_exactly() {
    let _one = HOST_SETTING.lock().unwrap_or_else(|p| p.into_inner());
    for dev in test_devices().unwrap() {
        let cus = dev.info().compute_units as usize;
        // Ragged M and N; K over two or three steps of 128 bytes (the last ragged), then one
        // ragged step in a shape that makes two waves of 128 x 256 tiles (wgmma's wide tiling).
        for (m, n, k) in [(136, 200, 72), (136, 256 * cus - 8, 40)] {
            exact_products(&dev, m, n, k);
        }
    }
}

fn exact_products(dev: &Device, m: usize, n: usize, k: usize) {
    {
        let ints = |len: usize, s: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7 + s * 13 + (i / 97) * 3) % 5) as f32 - 2.0)
                .collect()
        };
        let host = Device::host();
        let a = Tensor::from_vec(ints(m * k, 1), &[m, k], &host).unwrap();
        let b = Tensor::from_vec(ints(k * n, 2), &[k, n], &host).unwrap();
        let bias = Tensor::from_vec(ints(n, 3), &[n], &host).unwrap();
        let want = a.matmul_with(&b, relu(Some(&bias), None)).unwrap();
        set_device_float32_matmul_precision(dev, Some(MatmulPrecision::High));
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                // Stored transposed (A as (K, M), B as (N, K)) and viewed back.
                let put = |t: &Tensor, tr: bool| {
                    let s = if tr {
                        t.transpose(0, 1).unwrap().contiguous().unwrap()
                    } else {
                        t.clone()
                    };
                    let d = s.to_dtype(dtype).unwrap().to_device(dev).unwrap();
                    if tr {
                        d.transpose(0, 1).unwrap()
                    } else {
                        d
                    }
                };
                let (ad, bd) = (put(&a, ta), put(&b, tb));
                let outs: &[DType] = if dtype == DType::F32 {
                    &[DType::F32]
                } else {
                    &[dtype, DType::F32]
                };
                for &out in outs {
                    let bias_d = bias.to_dtype(out).unwrap().to_device(dev).unwrap();
                    let got =
                        ad.matmul_with(&bd, relu(Some(&bias_d), Some(out).filter(|&o| o != dtype)));
                    let got = got.unwrap().to_vec_f64().unwrap();
                    let want = want.to_dtype(out).unwrap().to_vec_f64().unwrap();
                    let bad = got.iter().zip(&want).position(|(g, w)| g != w);
                    assert!(
                        bad.is_none(),
                        "{dtype} -> {out} {m}x{k}x{n} (ta {ta}, tb {tb}) on {dev}: first difference at {:?}",
                        bad.map(|i| (i, got[i], want[i]))
                    );
                }
            }
        }
        set_device_float32_matmul_precision(dev, None);
    }
}
