//! matmul's products off the tiled kernel, on every device against the host: long K split into parts, skinny products (few rows or columns), A's row sums beside the product, and a bias that is a view into a larger tensor.
mod matmul_support;

use matmul_support::{check, matmul_on, operand, tiled, FLOATS};
use netcl_core_devices::test_devices;
use netcl_ops::testing::random_tensor;
use netcl_ops::{
    has_tensor_cores, Activation, DType, Device, GemmTile, MatmulOptions, TensorCoreKind,
};

#[test]
fn long_k_with_few_output_tiles_splits_k() {
    // A handful of output tiles and K >= 1024: the device path sums partial products over K
    // chunks (weight gradients of convolutions have this shape), and applies the bias and the
    // activation in the sum (a small batch through a wide layer). An explicit tile takes the
    // tiled kernels on CPU devices too (else their f32 products run matmul_cpu.cl, unsplit).
    for dev in test_devices().unwrap() {
        for (m, k, n, ta, tb) in [
            (5, 4096, 3, false, false),
            (33, 2304, 9, true, false),
            (7, 3000, 40, false, true),
            (2, 1031, 2, true, true),
        ] {
            for dtype in [DType::F32, DType::F64] {
                if dtype == DType::F64 && !dev.info().fp64 {
                    continue;
                }
                let a = operand(dtype, &[], m, k, ta, 7);
                let b = operand(dtype, &[], k, n, tb, 8);
                let want = a.matmul(&b).unwrap();
                let what = format!("split-K {m}x{k}x{n} {dtype} on {dev}");
                check(&matmul_on(&dev, &a, &b), &want, dtype, k, &what);
                let bias = random_tensor(dtype, &[n], -1.0, 1.0, 9);
                let with = |bias, tile| MatmulOptions {
                    bias: Some(bias),
                    activation: Activation::Silu,
                    tile,
                    ..Default::default()
                };
                let want = a.matmul_with(&b, with(&bias, None)).unwrap();
                let tile = tiled(&dev);
                let got = a
                    .to_device(&dev)
                    .unwrap()
                    .matmul_with(
                        &b.to_device(&dev).unwrap(),
                        with(&bias.to_device(&dev).unwrap(), tile),
                    )
                    .unwrap();
                check(
                    &got,
                    &want,
                    dtype,
                    k,
                    &format!("split-K {m}x{k}x{n} + bias, silu, {dtype} on {dev}"),
                );
            }
        }
    }
}

#[test]
fn sixteen_bit_split_k_on_tensor_cores_sums_f32_parts() {
    // K chunks whose sums cancel: 16-bit parts would each be rounded at the chunks' larger
    // magnitude (off by several ulps of the product); tensor cores' f32 sums keep the product
    // within the dtype's own rounding.
    for dev in test_devices().unwrap() {
        for (dtype, kind) in [
            (DType::F16, TensorCoreKind::F16),
            (DType::BF16, TensorCoreKind::Bf16),
        ] {
            if !has_tensor_cores(&dev, kind) {
                continue;
            }
            let a = operand(dtype, &[], 96, 4096, true, 110);
            let b = operand(dtype, &[], 4096, 40, false, 111);
            let want = a.matmul(&b).unwrap();
            let what = format!("{dev} {dtype} 96x4096x40");
            check(&matmul_on(&dev, &a, &b), &want, dtype, 4096, &what);
        }
    }
}

#[test]
fn skinny_products_on_either_side_match_the_host() {
    // A few rows of A (one-token decoding against B = Wᵀ, weight gradients of a narrow layer:
    // dYᵀ X) or a few columns of B (a classifier head x Wᵀ, a LoRA down-projection), each operand
    // stored either way, so that the skinny kernels run both their work-item layouts; odd sizes,
    // the bias on either side, every epilogue, and a 1-D left operand.
    let devices = test_devices().unwrap();
    let host = Device::host();
    for dtype in FLOATS {
        for (i, (m, k, n, at, bt)) in [
            (1, 1, 1, false, true),
            (1, 300, 33, true, true),
            (2, 31, 100, false, true),
            (3, 64, 7, true, true),
            (4, 1025, 40, false, true),
            (37, 300, 10, false, true),
            (37, 300, 10, true, true),
            (10, 256, 70, true, false),
            (16, 100, 33, false, true),
            (5, 2000, 3, false, false),
            (300, 17, 1, true, false),
        ]
        .into_iter()
        .enumerate()
        {
            let a = operand(dtype, &[], m, k, at, 50 + i as u64);
            let b = operand(dtype, &[], k, n, bt, 60 + i as u64);
            let bias = random_tensor(dtype, &[n], -1.0, 1.0, 70 + i as u64);
            for act in Activation::all() {
                let opts = MatmulOptions {
                    bias: (i % 2 == 0).then_some(&bias),
                    activation: act,
                    ..Default::default()
                };
                let want = a.matmul_with(&b, opts).unwrap();
                for dev in &devices {
                    if dev == &host || (dtype == DType::F64 && !dev.info().fp64) {
                        continue;
                    }
                    let (ad, bd, biasd) = (
                        a.to_device(dev).unwrap(),
                        b.to_device(dev).unwrap(),
                        bias.to_device(dev).unwrap(),
                    );
                    let opts = MatmulOptions {
                        bias: (i % 2 == 0).then_some(&biasd),
                        activation: act,
                        ..Default::default()
                    };
                    let got = ad.matmul_with(&bd, opts).unwrap();
                    check(
                        &got,
                        &want,
                        dtype,
                        k,
                        &format!("{dev} {dtype} {m}x{k}x{n} at {at} bt {bt} {act:?}"),
                    );
                }
            }
            if bt {
                // A 1-D left operand against B = Wᵀ.
                let v = random_tensor(dtype, &[k], -1.0, 1.0, 40 + i as u64);
                let want = v.matmul(&b).unwrap();
                for dev in devices.iter().filter(|d| *d != &host) {
                    if dtype == DType::F64 && !dev.info().fp64 {
                        continue;
                    }
                    let what = format!("{dev} {dtype} vector x {k}x{n}");
                    check(&matmul_on(dev, &v, &b), &want, dtype, k, &what);
                }
            }
        }
    }
}

#[test]
fn row_sums_beside_the_product_match_the_host() {
    // A weight gradient dYᵀ X with its bias gradient: A read transposed or not, ragged and
    // tile-sized shapes, the dispatcher's kernels (a product big enough for the f32 pipeline's
    // 128 x 128 tiles on devices that run it) and explicit tiles (matmul_tiled.cl on every OpenCL
    // device; 128 x 16 tiles make each work-item sum two rows), skinny products (both
    // work-item layouts, 4 and 16 rows); the sums against the host's sum over K.
    let devices = test_devices().unwrap();
    let tall = GemmTile {
        bm: 128,
        bn: 16,
        bk: 8,
        wm: 8,
        wn: 4,
    };
    for dtype in FLOATS {
        for (i, (m, k, n, at, bt)) in [
            (37, 45, 29, true, false),
            (64, 64, 64, false, false),
            (130, 70, 140, true, false),
            (96, 600, 40, true, false),
            (5, 33, 70, false, false),
            (10, 256, 70, true, false),
            (3, 200, 50, true, true),
            (2048, 64, 1024, true, false),
        ]
        .into_iter()
        .enumerate()
        {
            if m == 2048 && dtype != DType::F32 {
                continue; // the pipeline's size: f32 only, the others are slow on CPU devices
            }
            let a = operand(dtype, &[], m, k, at, 80 + i as u64);
            let b = operand(dtype, &[], k, n, bt, 90 + i as u64);
            let want_y = a.matmul(&b).unwrap();
            let want_s = a.sum(&[1], false).unwrap();
            for dev in &devices {
                if dtype == DType::F64 && !dev.info().fp64 {
                    continue;
                }
                let (ad, bd) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
                let explicit = match m {
                    2048 => [None, None], // the dispatcher's (pipeline) tiles only
                    _ => [tiled(dev), (!dev.is_host()).then_some(tall)],
                };
                for tile in [None].into_iter().chain(explicit) {
                    let opts = MatmulOptions {
                        tile,
                        ..Default::default()
                    };
                    let (y, sums) = ad.matmul_with_row_sums(&bd, opts).unwrap();
                    let what = format!("{dev} {dtype} {m}x{k}x{n} at {at} bt {bt} tile {tile:?}");
                    check(&y, &want_y, dtype, k, &what);
                    assert_eq!(sums.dtype(), dtype, "{what}");
                    check(&sums, &want_s, dtype, k, &format!("{what} row sums"));
                }
            }
        }
    }
    // Batched operands: the sums over each batch's rows.
    let dev = &devices[devices.len() - 1];
    let a = operand(DType::F32, &[3], 20, 30, true, 100)
        .to_device(dev)
        .unwrap();
    let b = operand(DType::F32, &[3], 30, 10, false, 101)
        .to_device(dev)
        .unwrap();
    let (_, sums) = a
        .matmul_with_row_sums(&b, MatmulOptions::default())
        .unwrap();
    check(
        &sums,
        &a.sum(&[2], false).unwrap(),
        DType::F32,
        30,
        "batched row sums",
    );
}

/// A bias that is a piece of a larger tensor (the keys' bias of q/k/v biases joined, as a Qwen2
/// model holds them): every kernel (tiled, skinny, split) adds the piece, not its buffer's start.
#[test]
fn a_bias_view_at_an_offset_is_added_from_its_offset() {
    let joined = random_tensor(DType::F32, &[40], -1.0, 1.0, 7);
    let bias = joined.narrow(0, 24, 8).unwrap();
    for (m, k) in [(3, 16), (64, 32), (1, 4096)] {
        let x = random_tensor(DType::F32, &[m, k], -1.0, 1.0, 8);
        let w = random_tensor(DType::F32, &[k, 8], -1.0, 1.0, 9);
        let want = x
            .matmul_with(&w, with_bias(&bias))
            .unwrap()
            .to_vec_f64()
            .unwrap();
        for dev in test_devices().unwrap() {
            let on = |t: &netcl_ops::Tensor| t.to_device(&dev).unwrap();
            let b = on(&joined).narrow(0, 24, 8).unwrap();
            let got = on(&x).matmul_with(&on(&w), with_bias(&b)).unwrap();
            let got = got.to_vec_f64().unwrap();
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(worst < 1e-3, "{dev} m {m} k {k}: {worst}");
        }
    }
}

fn with_bias(b: &netcl_ops::Tensor) -> MatmulOptions<'_> {
    MatmulOptions {
        bias: Some(b),
        ..Default::default()
    }
}
