//! matmul on every device against the host GEMM: random sizes, batch broadcasting, transposed and strided operands, epilogues, errors.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, random_tensor, Cases};
use netcl_ops::{
    has_async_gemm, Activation, DType, Device, Error, GemmTile, MatmulOptions, Tensor,
};

mod matmul_support;

use matmul_support::{check, operand, tiled, FLOATS};

#[test]
fn matmul_matches_the_host_over_shapes_strides_and_batches() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0x6E44);
    let mut cases = 0;
    // Every epilogue of the unary-op table (and none).
    let acts = Activation::all();
    for act in [
        Activation::Relu,
        Activation::Gelu,
        Activation::GeluTanh,
        Activation::Silu,
    ] {
        assert!(acts.contains(&act), "{act:?}");
    }
    for case in 0..520 {
        let dtype = FLOATS[case % 4];
        let big = case % 50 == 0;
        let dim = |c: &mut Cases| if big { 60 + c.below(90) } else { c.below(40) };
        let (m, n, k) = (dim(&mut c), dim(&mut c), dim(&mut c));
        let batch_a: Vec<usize> = (0..c.below(3)).map(|_| 1 + c.below(3)).collect();
        // b's batch dims broadcast against a's: a suffix with some dims set to 1.
        let mut batch_b: Vec<usize> = batch_a
            .iter()
            .map(|&d| if c.below(3) == 0 { 1 } else { d })
            .collect();
        batch_b.drain(..c.below(batch_b.len() + 1));
        let (ta, tb) = (c.below(2) == 0, c.below(2) == 0);
        let a = operand(dtype, &batch_a, m, k, ta, case as u64);
        let b = operand(dtype, &batch_b, k, n, tb, case as u64 + 7);
        let bias =
            (c.below(2) == 0).then(|| random_tensor(dtype, &[n], -1.0, 1.0, case as u64 + 9));
        let act = acts[c.below(acts.len())];
        fn opts(bias: Option<&Tensor>, activation: Activation) -> MatmulOptions<'_> {
            MatmulOptions {
                bias,
                activation,
                ..Default::default()
            }
        }
        let want = a.matmul_with(&b, opts(bias.as_ref(), act)).unwrap();
        for dev in devices
            .iter()
            .filter(|d| dtype != DType::F64 || d.info().fp64)
        {
            let (ad, bd) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
            let biasd = bias.as_ref().map(|t| t.to_device(dev).unwrap());
            let got = ad.matmul_with(&bd, opts(biasd.as_ref(), act)).unwrap();
            let what = format!(
                "case {case} {dtype} {:?} x {:?} (ta {ta}, tb {tb}) {act:?} on {dev}",
                a.shape(),
                b.shape()
            );
            check(&got, &want, dtype, k, &what);
            cases += 1;
        }
    }
    assert!(cases >= 500);
}

#[test]
fn one_dim_operands_sliced_views_and_explicit_tiles() {
    for dev in test_devices().unwrap() {
        let h = Device::host();
        let a = random_tensor(DType::F32, &[7, 12], -1.0, 1.0, 1);
        let v = random_tensor(DType::F32, &[12], -1.0, 1.0, 2);
        let w = random_tensor(DType::F32, &[12, 5], -1.0, 1.0, 3);
        let (ad, vd, wd) = (
            a.to_device(&dev).unwrap(),
            v.to_device(&dev).unwrap(),
            w.to_device(&dev).unwrap(),
        );
        check(
            &ad.matmul(&vd).unwrap(),
            &a.matmul(&v).unwrap(),
            DType::F32,
            12,
            "matrix x vector",
        );
        assert_eq!(ad.matmul(&vd).unwrap().shape(), &[7]);
        assert_eq!(vd.matmul(&wd).unwrap().shape(), &[5]);
        assert_eq!(vd.matmul(&vd).unwrap().shape(), &[] as &[usize]);
        check(
            &vd.matmul(&vd).unwrap(),
            &v.matmul(&v).unwrap(),
            DType::F32,
            12,
            "dot",
        );
        // Every other row and column: neither stride is 1.
        let big = random_tensor(DType::F32, &[14, 24], -1.0, 1.0, 4);
        let s = |t: &Tensor| t.slice(0, 0, 14, 2).unwrap().slice(1, 0, 24, 2).unwrap();
        let bd = big.to_device(&dev).unwrap();
        check(
            &s(&bd).matmul(&wd).unwrap(),
            &s(&big).matmul(&w).unwrap(),
            DType::F32,
            12,
            "strided",
        );
        // K = 0 gives the bias (through the activation); empty M gives an empty result.
        let e = Tensor::zeros(&[3, 0], DType::F32, &dev).unwrap();
        let f = Tensor::zeros(&[0, 4], DType::F32, &dev).unwrap();
        let bias = Tensor::from_vec(vec![1.0f32, -1.0, 2.0, -3.0], &[4], &dev).unwrap();
        let opts = MatmulOptions {
            bias: Some(&bias),
            activation: Activation::Relu,
            ..Default::default()
        };
        assert_eq!(
            e.matmul_with(&f, opts).unwrap().to_vec::<f32>().unwrap(),
            [1., 0., 2., 0., 1., 0., 2., 0., 1., 0., 2., 0.]
        );
        assert_eq!(
            Tensor::zeros(&[0, 5], DType::F32, &dev)
                .unwrap()
                .matmul(&w.to_device(&dev).unwrap().narrow(0, 0, 5).unwrap())
                .unwrap()
                .shape(),
            &[0, 5]
        );
        if !dev.is_host() {
            // Every tile the autotuner may try gives the same product.
            let x = random_tensor(DType::F32, &[67, 45], -1.0, 1.0, 5);
            let y = random_tensor(DType::F32, &[45, 39], -1.0, 1.0, 6);
            let want = x.matmul(&y).unwrap();
            for tile in [
                GemmTile {
                    bm: 16,
                    bn: 16,
                    bk: 8,
                    wm: 2,
                    wn: 2,
                },
                GemmTile {
                    bm: 32,
                    bn: 64,
                    bk: 16,
                    wm: 4,
                    wn: 8,
                },
                GemmTile {
                    bm: 64,
                    bn: 32,
                    bk: 8,
                    wm: 8,
                    wn: 4,
                },
                // 64 staged elements per work-item: beyond the bit masks of in-range rows.
                GemmTile {
                    bm: 32,
                    bn: 32,
                    bk: 32,
                    wm: 8,
                    wn: 8,
                },
            ] {
                let opts = MatmulOptions {
                    tile: Some(tile),
                    ..Default::default()
                };
                let got = x
                    .to_device(&dev)
                    .unwrap()
                    .matmul_with(&y.to_device(&dev).unwrap(), opts)
                    .unwrap();
                check(&got, &want, DType::F32, 45, &format!("{tile:?} on {dev}"));
            }
            // Both operands K-contiguous with 16-byte aligned rows (x Wᵀ): runs of 4 along K in
            // one load each, over ragged M and N, a K with a partial last step, and a batch.
            for k in [48, 52] {
                let x = random_tensor(DType::F32, &[2, 67, k], -1.0, 1.0, 8);
                let w = random_tensor(DType::F32, &[39, k], -1.0, 1.0, 9);
                let want = x.matmul(&w.transpose(0, 1).unwrap()).unwrap();
                for (bm, bn, wm, wn) in [(64, 32, 4, 4), (64, 64, 4, 4), (32, 64, 2, 4)] {
                    let tile = GemmTile {
                        bm,
                        bn,
                        bk: 16,
                        wm,
                        wn,
                    };
                    let opts = MatmulOptions {
                        tile: Some(tile),
                        ..Default::default()
                    };
                    let (xd, wd) = (x.to_device(&dev).unwrap(), w.to_device(&dev).unwrap());
                    let got = xd.matmul_with(&wd.transpose(0, 1).unwrap(), opts).unwrap();
                    check(
                        &got,
                        &want,
                        DType::F32,
                        k,
                        &format!("x Wᵀ, K {k}, {tile:?} on {dev}"),
                    );
                }
            }
            // 39 columns in tiles of 16: 32 in two tiles, then a strip of 8-wide tiles, with the
            // bias and the activation read and applied at the strip's columns.
            let bias = random_tensor(DType::F32, &[39], -1.0, 1.0, 7);
            let epilogue = |t: Option<GemmTile>, d: &Device| {
                let opts = MatmulOptions {
                    tile: t,
                    bias: Some(&bias.to_device(d).unwrap()),
                    activation: Activation::Relu,
                    ..Default::default()
                };
                let (xd, yd) = (x.to_device(d).unwrap(), y.to_device(d).unwrap());
                xd.matmul_with(&yd, opts).unwrap()
            };
            let want = epilogue(None, &Device::host());
            let tile = GemmTile {
                bm: 16,
                bn: 16,
                bk: 8,
                wm: 2,
                wn: 2,
            };
            let got = epilogue(Some(tile), &dev);
            check(
                &got,
                &want,
                DType::F32,
                45,
                &format!("strip with bias on {dev}"),
            );
            // Sizes that are multiples of the tile take the kernel without bounds checks.
            let (x, y) = (
                random_tensor(DType::F32, &[64, 32], -1.0, 1.0, 10),
                random_tensor(DType::F32, &[32, 48], -1.0, 1.0, 11),
            );
            let tile = GemmTile {
                bm: 16,
                bn: 16,
                bk: 8,
                wm: 4,
                wn: 4,
            };
            // With a bias and an activation: the aligned build's 16-byte stores apply both.
            let bias = random_tensor(DType::F32, &[48], -1.0, 1.0, 12);
            let bias_d = bias.to_device(&dev).unwrap();
            let opts = |tile, bias| MatmulOptions {
                tile,
                bias: Some(bias),
                activation: Activation::Relu,
                ..Default::default()
            };
            let got = x
                .to_device(&dev)
                .unwrap()
                .matmul_with(&y.to_device(&dev).unwrap(), opts(Some(tile), &bias_d))
                .unwrap();
            check(
                &got,
                &x.matmul_with(&y, opts(None, &bias)).unwrap(),
                DType::F32,
                32,
                &format!("aligned on {dev}"),
            );
            let bad = GemmTile {
                bm: 30,
                bn: 32,
                bk: 8,
                wm: 4,
                wn: 4,
            };
            let opts = MatmulOptions {
                tile: Some(bad),
                ..Default::default()
            };
            assert!(x
                .to_device(&dev)
                .unwrap()
                .matmul_with(&y.to_device(&dev).unwrap(), opts)
                .is_err());
        }
        let _ = h;
    }
}

#[test]
fn matmul_is_deterministic() {
    for dev in test_devices().unwrap() {
        let x = random_tensor(DType::F32, &[3, 70, 90], -1.0, 1.0, 8)
            .to_device(&dev)
            .unwrap();
        let y = random_tensor(DType::F32, &[90, 50], -1.0, 1.0, 9)
            .to_device(&dev)
            .unwrap();
        let first = x.matmul(&y).unwrap().to_host_data().unwrap();
        for _ in 0..3 {
            assert_eq!(
                x.matmul(&y).unwrap().to_host_data().unwrap(),
                first,
                "{dev}"
            );
        }
    }
}

#[test]
fn bad_matmul_input_is_an_error_naming_the_shapes() {
    for dev in test_devices().unwrap() {
        let a = Tensor::zeros(&[2, 3, 4], DType::F32, &dev).unwrap();
        let b = Tensor::zeros(&[5, 6], DType::F32, &dev).unwrap();
        let e = a.matmul(&b).unwrap_err();
        assert!(
            matches!(e, Error::Shape { .. })
                && e.to_string().contains("[2, 3, 4]")
                && e.to_string().contains("[5, 6]"),
            "{e}"
        );
        let c = Tensor::zeros(&[3, 4, 2], DType::F32, &dev).unwrap();
        let e = a.matmul(&c).unwrap_err();
        assert!(e.to_string().contains("batch"), "{e}");
        let i = Tensor::zeros(&[4, 2], DType::I32, &dev).unwrap();
        assert!(matches!(a.matmul(&i), Err(Error::DType { .. })));
        let h = Tensor::zeros(&[4, 2], DType::F16, &dev).unwrap();
        assert!(matches!(a.matmul(&h), Err(Error::DType { .. })));
        let ok = Tensor::zeros(&[4, 2], DType::F32, &dev).unwrap();
        let bias = Tensor::zeros(&[3], DType::F32, &dev).unwrap();
        let opts = MatmulOptions {
            bias: Some(&bias),
            ..Default::default()
        };
        let e = a.matmul_with(&ok, opts).unwrap_err();
        assert!(e.to_string().contains("bias"), "{e}");
        let s = Tensor::full(&[], 1.0, DType::F32, &dev).unwrap();
        assert!(s.matmul(&ok).is_err());
    }
}

/// Reference attention in f64 from the definition.
fn attention_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (b, tq, tk, d, dv): (usize, usize, usize, usize, usize),
    causal: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; b * tq * dv];
    for z in 0..b {
        for i in 0..tq {
            let s: Vec<f64> = (0..tk)
                .map(|j| {
                    if causal && j > i + tk - tq {
                        return f64::NEG_INFINITY;
                    }
                    (0..d)
                        .map(|x| q[(z * tq + i) * d + x] * k[(z * tk + j) * d + x])
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            for c in 0..dv {
                out[(z * tq + i) * dv + c] =
                    (0..tk).map(|j| e[j] / sum * v[(z * tk + j) * dv + c]).sum();
            }
        }
    }
    out
}

#[test]
fn causal_attention_matches_the_definition() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xA77E);
    for case in 0..40 {
        let dtype = [DType::F32, DType::F64][case % 2];
        let (b, tk, d, dv) = (
            1 + c.below(3),
            1 + c.below(20),
            1 + c.below(16),
            1 + c.below(9),
        );
        let tq = 1 + c.below(tk);
        let causal = c.below(2) == 0;
        let q = random_tensor(dtype, &[b, tq, d], -1.0, 1.0, case as u64);
        let k = random_tensor(dtype, &[b, tk, d], -1.0, 1.0, case as u64 + 1);
        let v = random_tensor(dtype, &[b, tk, dv], -1.0, 1.0, case as u64 + 2);
        let want = attention_ref(
            &q.to_vec_f64().unwrap(),
            &k.to_vec_f64().unwrap(),
            &v.to_vec_f64().unwrap(),
            (b, tq, tk, d, dv),
            causal,
        );
        for dev in devices
            .iter()
            .filter(|x| dtype != DType::F64 || x.info().fp64)
        {
            let (qd, kd, vd) = (
                q.to_device(dev).unwrap(),
                k.to_device(dev).unwrap(),
                v.to_device(dev).unwrap(),
            );
            let att = Tensor::attention(&qd, &kd, &vd, None, causal, None).unwrap();
            assert_eq!(att.out.shape(), &[b, tq, dv]);
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
            check_close(
                &att.out.to_vec_f64().unwrap(),
                &want,
                tol,
                1.0,
                &format!("case {case} {dtype} causal {causal} on {dev}"),
            )
            .unwrap();
        }
    }
    let dev = Device::host();
    let q = Tensor::zeros(&[2, 3, 4], DType::F32, &dev).unwrap();
    let k = Tensor::zeros(&[2, 5, 3], DType::F32, &dev).unwrap();
    let e = Tensor::attention(&q, &k, &k, None, false, None)
        .err()
        .unwrap();
    assert!(e.to_string().contains("[2, 3, 4]"), "{e}");
}

#[test]
fn pipelined_f32_products_match_the_host() {
    // Products big enough to keep the 128 x 128 tile (a work-group per compute unit or more), on
    // devices that run matmul_async.cl: every way of reaching an operand (row- or column-major,
    // a column-major view with an odd stride), ragged edges, a strip of columns, batch dims with
    // broadcasting, both operands K-contiguous, and the epilogue. Elsewhere the portable kernels
    // take these shapes, and the tests above cover them at smaller sizes.
    for dev in test_devices().unwrap() {
        if !has_async_gemm(&dev) {
            continue;
        }
        let side = 128 * (dev.info().compute_units as f64).sqrt().ceil() as usize;
        let cases = [
            (side, side, 64, false, false, &[][..]),
            (side + 5, side + 32, 37, true, false, &[][..]),
            (side - 3, side + 7, 72, false, true, &[][..]),
            (side + 64, side + 1, 9, true, true, &[][..]),
            (side / 2 + 16, side / 2, 40, false, true, &[2usize, 2][..]),
            // Both K-contiguous and big: B (then A) copied N- (M-) contiguous first.
            (2053, 1100, 72, false, true, &[][..]),
            (1100, 2100, 40, false, true, &[][..]),
        ];
        for (i, &(m, n, k, ta, tb, batch)) in cases.iter().enumerate() {
            let a = operand(DType::F32, batch, m, k, ta, 11 + i as u64);
            let b = operand(
                DType::F32,
                &batch[batch.len().min(1)..],
                k,
                n,
                tb,
                21 + i as u64,
            );
            // M contiguous with an odd K stride: a view of a (k, m + 1) tensor.
            let a = if i == 3 {
                let wide = random_tensor(DType::F32, &[k, m + 1], -1.0, 1.0, 31);
                wide.narrow(1, 0, m).unwrap().transpose(0, 1).unwrap()
            } else {
                a
            };
            let bias = random_tensor(DType::F32, &[n], -1.0, 1.0, 41);
            for (bias, act) in [(None, Activation::None), (Some(&bias), Activation::Gelu)] {
                let opts = MatmulOptions {
                    bias,
                    activation: act,
                    ..Default::default()
                };
                let want = a.matmul_with(&b, opts).unwrap();
                let biasd = bias.map(|t| t.to_device(&dev).unwrap());
                let opts = MatmulOptions {
                    bias: biasd.as_ref(),
                    ..opts
                };
                let (ad, bd) = (a.to_device(&dev).unwrap(), b.to_device(&dev).unwrap());
                let got = ad.matmul_with(&bd, opts).unwrap();
                let what = format!(
                    "pipelined {:?} x {:?} {act:?} on {dev}",
                    a.shape(),
                    b.shape()
                );
                check(&got, &want, DType::F32, k, &what);
            }
        }
    }
}

#[test]
fn cpu_devices_take_the_cpu_kernels_on_every_layout() {
    // `x` on `dev` with the same strides: a copy to a device is contiguous, so a transposed view
    // goes over in its stored order and is transposed there.
    fn on(dev: &Device, x: &Tensor, t: bool) -> Tensor {
        let nd = x.ndim();
        let flip = |x: &Tensor| x.transpose(nd - 2, nd - 1).unwrap();
        match t {
            true => flip(&flip(x).to_device(dev).unwrap()),
            false => x.to_device(dev).unwrap(),
        }
    }
    // matmul_cpu.cl on CPU OpenCL devices (PoCL): one block row against a transposed weight (dot
    // products), one block row against row-major B (B read in place), and ragged batched products
    // with both operands transposed, a bias and an activation (B packed into column panels).
    use netcl_kernels::thread_launches;
    let host = Device::host();
    let cpus = test_devices()
        .unwrap()
        .into_iter()
        .filter(|d| d != &host && d.info().kind == netcl_core_devices::DeviceKind::Cpu);
    for dev in cpus {
        for dtype in [DType::F32, DType::F64] {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let bias = random_tensor(dtype, &[45], -1.0, 1.0, 5);
            for (batch, m, k, ta, tb, kernels) in [
                (vec![], 6, 70, false, true, ["matmul_cpu_nt", ""]),
                (vec![], 5, 33, true, false, ["matmul_cpu_nn", ""]),
                (
                    vec![3],
                    37,
                    19,
                    true,
                    true,
                    ["matmul_cpu_pack", "matmul_cpu_nn"],
                ),
                (
                    vec![2, 1],
                    9,
                    40,
                    false,
                    false,
                    ["matmul_cpu_pack", "matmul_cpu_nn"],
                ),
            ] {
                let a = operand(dtype, &batch, m, k, ta, m as u64);
                let b = operand(dtype, &batch[batch.len().min(1)..], k, 45, tb, k as u64);
                let opts = |bias| MatmulOptions {
                    bias,
                    activation: Activation::Relu,
                    ..Default::default()
                };
                let want = a.matmul_with(&b, opts(Some(&bias))).unwrap();
                let before = kernels.map(thread_launches);
                let (ad, bd) = (on(&dev, &a, ta), on(&dev, &b, tb));
                let biasd = bias.to_device(&dev).unwrap();
                let got = ad.matmul_with(&bd, opts(Some(&biasd))).unwrap();
                let what = format!("{dev} {dtype} {batch:?} {m}x{k}x45 (ta {ta}, tb {tb})");
                check(&got, &want, dtype, k, &what);
                for (name, n0) in kernels.iter().zip(before) {
                    if !name.is_empty() {
                        assert_eq!(thread_launches(name), n0 + 1, "{name}: {what}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_lower_hint_skips_only_zeros() {
    // A zero past column m + d (a causal attention's scores' gradients): the tiled kernels stop
    // each tile's K loop at the last column its rows may see; the product is the full one.
    let devices = test_devices().unwrap();
    let (m, k, n) = (70, 90, 33);
    for d in [-3isize, 0, 5, 40] {
        let full = random_tensor(DType::F32, &[m, k], -1.0, 1.0, 60);
        let v: Vec<f32> = (full.to_vec::<f32>().unwrap().into_iter().enumerate())
            .map(|(i, x)| {
                if ((i % k) as isize) > (i / k) as isize + d {
                    0.0
                } else {
                    x
                }
            })
            .collect();
        let a = Tensor::from_vec(v, &[m, k], &Device::host()).unwrap();
        let b = random_tensor(DType::F32, &[k, n], -1.0, 1.0, 61);
        let want = a.matmul(&b).unwrap();
        for dev in &devices {
            let tile = tiled(dev);
            let opts = MatmulOptions {
                lower: Some(d),
                tile,
                ..Default::default()
            };
            let got = a
                .to_device(dev)
                .unwrap()
                .matmul_with(&b.to_device(dev).unwrap(), opts)
                .unwrap();
            check(&got, &want, DType::F32, k, &format!("lower {d} on {dev}"));
        }
    }
}
