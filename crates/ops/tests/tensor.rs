//! Tensor creation, transfers, views, elementwise ops and RNG on every device against the host reference.
use ndarray::{ArrayD, IxDyn};
use netcl_core_devices::test_devices;
use netcl_ops::testing::{dtypes_for, random_tensor, random_view, sample, Cases};
use netcl_ops::{BinaryOp, DType, Device, Error, Generator, Tensor};

#[test]
fn round_trips_every_dtype_on_every_device() {
    for dev in test_devices().unwrap() {
        for dtype in dtypes_for(&dev) {
            for n in [0usize, 1, 7, 1000, 70_001] {
                let h = sample(dtype, &[n], n as u64 + 3);
                let d = h.to_device(&dev).unwrap();
                assert_eq!((d.shape(), d.dtype(), d.device()), (&[n][..], dtype, &dev));
                let back = d.to_device(&Device::host()).unwrap();
                assert_eq!(
                    back.to_vec_f64().unwrap(),
                    h.to_vec_f64().unwrap(),
                    "{dev} {dtype} n={n}"
                );
            }
        }
        let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let t = Tensor::from_vec(v.clone(), &[2, 3, 4], &dev).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), v);
        assert!(matches!(t.to_vec::<f64>(), Err(Error::DType { .. })));
        let arr = ArrayD::from_shape_vec(IxDyn(&[2, 3, 4]), v).unwrap();
        let transposed = arr.view().permuted_axes(IxDyn(&[2, 0, 1]));
        let from_nd = Tensor::from_ndarray(transposed.view(), &dev).unwrap();
        assert_eq!(from_nd.shape(), &[4, 2, 3]);
        assert_eq!(from_nd.to_ndarray::<f32>().unwrap(), transposed.to_owned());
    }
}

#[test]
fn transfers_between_opencl_devices() {
    let devices = test_devices().unwrap();
    let h = sample(DType::F32, &[5000], 42);
    let mut t = h.clone();
    for dev in devices.iter().chain(devices.iter().rev()) {
        t = t.to_device(dev).unwrap();
    }
    assert_eq!(t.to_vec::<f32>().unwrap(), h.to_vec::<f32>().unwrap());
}

#[test]
fn creation_matches_the_host() {
    let host = Device::host();
    for dev in test_devices().unwrap() {
        for dtype in dtypes_for(&dev) {
            for shape in [vec![0], vec![1], vec![3, 5, 7], vec![1000, 3]] {
                for value in [0.0, 1.0, -2.5, 7.0] {
                    let d = Tensor::full(&shape, value, dtype, &dev).unwrap();
                    let h = Tensor::full(&shape, value, dtype, &host).unwrap();
                    assert_eq!(
                        d.to_vec_f64().unwrap(),
                        h.to_vec_f64().unwrap(),
                        "full {dev} {dtype} {shape:?} {value}"
                    );
                }
            }
            assert!(Tensor::zeros(&[4], dtype, &dev)
                .unwrap()
                .to_vec_f64()
                .unwrap()
                .iter()
                .all(|&x| x == 0.0));
            assert!(Tensor::ones(&[4], dtype, &dev)
                .unwrap()
                .to_vec_f64()
                .unwrap()
                .iter()
                .all(|&x| x == 1.0));
            for (start, end, step) in [
                (0.0, 10.0, 1.0),
                (2.0, 50.0, 3.0),
                (1.0, 0.0, 1.0),
                (0.0, 1000.0, 1.0),
            ] {
                let d = Tensor::arange(start, end, step, dtype, &dev).unwrap();
                let h = Tensor::arange(start, end, step, dtype, &host).unwrap();
                assert_eq!(
                    d.to_vec_f64().unwrap(),
                    h.to_vec_f64().unwrap(),
                    "arange {dev} {dtype}"
                );
            }
        }
        let u = Tensor::arange(5.0, 0.0, -1.0, DType::U32, &dev).unwrap();
        assert_eq!(u.to_vec::<u32>().unwrap(), vec![5, 4, 3, 2, 1]);
        let i = Tensor::arange(3.0, -7.0, -3.0, DType::I32, &dev).unwrap();
        assert_eq!(i.to_vec::<i32>().unwrap(), vec![3, 0, -3, -6]);
        assert!(Tensor::arange(-1e300, 1e300, 1.0, DType::F32, &dev).is_err());
        let f = Tensor::arange(0.5, -1.0, -0.25, DType::F32, &dev).unwrap();
        assert_eq!(
            f.to_vec::<f32>().unwrap(),
            vec![0.5, 0.25, 0.0, -0.25, -0.5, -0.75]
        );
        assert!(Tensor::arange(0.0, 1.0, 0.0, DType::F32, &dev).is_err());
    }
}

#[test]
fn views_and_contiguous_match_the_host() {
    let mut c = Cases(0xC0FFEE);
    let devices = test_devices().unwrap();
    for case in 0..300 {
        let shape = c.shape(5, 6);
        let dtype = [DType::F32, DType::F16, DType::I32, DType::BF16][case % 4];
        let host = sample(dtype, &shape, case as u64);
        let seed = c.next_u64();
        let expected = random_view(&host, &mut Cases(seed)).contiguous().unwrap();
        for dev in &devices {
            let view = random_view(&host.to_device(dev).unwrap(), &mut Cases(seed));
            assert!(view.shares_storage(&view.clone()));
            let got = view.contiguous().unwrap();
            assert!(got.is_contiguous());
            assert_eq!(got.shape(), expected.shape(), "case {case} on {dev}");
            assert_eq!(
                got.to_vec_f64().unwrap(),
                expected.to_vec_f64().unwrap(),
                "case {case} on {dev}"
            );
        }
    }
}

#[test]
fn copies_and_sums_of_views_in_runs_of_four_match_the_host_in_every_dtype() {
    // Views whose dense rows start at multiples of 4 elements (copied 4 at a time) and views
    // just off that (an offset of 2, rows of 6): contiguous(), a concat of heads (as the
    // attention's values and its gradients' gather take them) and sums of such views.
    let devices = test_devices().unwrap();
    for (case, dtype) in DType::ALL.into_iter().enumerate() {
        let host = sample(dtype, &[2, 5, 3, 8], case as u64);
        let views = |t: &Tensor| -> Vec<Tensor> {
            vec![
                t.narrow(1, 1, 3).unwrap(),
                t.narrow(3, 4, 4).unwrap(),
                t.narrow(3, 2, 6).unwrap(),
                t.narrow(2, 1, 2).unwrap().transpose(1, 2).unwrap(),
            ]
        };
        let heads = |t: &Tensor| -> Tensor {
            let parts: Vec<Tensor> = (0..3).map(|h| t.narrow(2, h, 1).unwrap()).collect();
            let parts: Vec<&Tensor> = parts.iter().rev().collect();
            Tensor::concat(&parts, 2).unwrap()
        };
        // Elementwise over such views: 4 elements a work-item, and one by one (rows of 6).
        let sums = |t: &Tensor| -> Vec<f64> {
            let a = t.narrow(3, 4, 4).unwrap().add(&t.narrow(3, 0, 4).unwrap());
            let b = t.narrow(3, 2, 6).unwrap().add(&t.narrow(3, 0, 6).unwrap());
            let mut v = a.unwrap().to_vec_f64().unwrap();
            v.extend(b.unwrap().to_vec_f64().unwrap());
            v
        };
        let want: Vec<Vec<f64>> = views(&host)
            .iter()
            .map(|v| v.contiguous().unwrap().to_vec_f64().unwrap())
            .chain([heads(&host).to_vec_f64().unwrap(), sums(&host)])
            .collect();
        for dev in devices.iter().filter(|d| dtypes_for(d).contains(&dtype)) {
            let t = host.to_device(dev).unwrap();
            let got: Vec<Vec<f64>> = views(&t)
                .iter()
                .map(|v| v.contiguous().unwrap().to_vec_f64().unwrap())
                .chain([heads(&t).to_vec_f64().unwrap(), sums(&t)])
                .collect();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "{dtype} view {i} on {dev}");
            }
        }
    }
}

#[test]
fn contiguous_of_transposed_views_matches_the_host() {
    // The tiled transpose path: ragged tiles, a batch dim, an offset, a row stride wider than
    // the rows, every dtype; and its launch is counted.
    let devices = test_devices().unwrap();
    for (case, dtype) in DType::ALL.into_iter().enumerate() {
        let host = sample(dtype, &[3, 37, 70], case as u64);
        let views = |t: &Tensor| {
            let narrowed = t.narrow(2, 3, 45).unwrap().narrow(1, 1, 33).unwrap();
            // Size-1 leading dims whose strides mean nothing: a broadcast, a one-element slice.
            let broadcast = t
                .narrow(0, 0, 2)
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .broadcast_to(&[3, 1, 2, 70, 37])
                .unwrap();
            let sliced = t
                .unsqueeze(1)
                .unwrap()
                .transpose(2, 3)
                .unwrap()
                .slice(0, 1, 2, 2)
                .unwrap();
            vec![
                t.transpose(1, 2).unwrap(),
                narrowed.transpose(1, 2).unwrap(),
                t.narrow(0, 1, 1)
                    .unwrap()
                    .reshape(&[37, 70])
                    .unwrap()
                    .transpose(0, 1)
                    .unwrap(),
                broadcast,
                sliced,
            ]
        };
        let want: Vec<Vec<f64>> = views(&host)
            .iter()
            .map(|v| v.contiguous().unwrap().to_vec_f64().unwrap())
            .collect();
        for dev in &devices {
            if !dtypes_for(dev).contains(&dtype) {
                continue;
            }
            for (i, v) in views(&host.to_device(dev).unwrap()).iter().enumerate() {
                let before = netcl_kernels::thread_launches("transpose_copy");
                let got = v.contiguous().unwrap();
                if dev.is_opencl() {
                    // The broadcast's batch dims do not merge: it takes the strided copy.
                    let tiled = i != 3;
                    assert_eq!(
                        netcl_kernels::thread_launches("transpose_copy"),
                        before + tiled as u64,
                        "{dtype} view {i} on {dev}: tiled path {tiled}"
                    );
                }
                assert_eq!(
                    got.to_vec_f64().unwrap(),
                    want[i],
                    "{dtype} view {i} on {dev}"
                );
            }
        }
    }
}

#[test]
fn view_ops_share_storage_and_check_arguments() {
    for dev in test_devices().unwrap() {
        let t = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &dev)
            .unwrap()
            .reshape(&[2, 3, 4])
            .unwrap();
        let tr = t.transpose(0, 2).unwrap();
        assert!(tr.shares_storage(&t) && !tr.is_contiguous());
        assert_eq!(tr.shape(), &[4, 3, 2]);
        assert_eq!(
            tr.contiguous().unwrap().to_vec::<f32>().unwrap()[..4],
            [0.0, 12.0, 4.0, 16.0]
        );
        let nar = t.narrow(2, 1, 2).unwrap();
        assert_eq!(
            nar.to_vec::<f32>().unwrap(),
            vec![1., 2., 5., 6., 9., 10., 13., 14., 17., 18., 21., 22.]
        );
        let row = t.narrow(0, 1, 1).unwrap().squeeze(0).unwrap();
        assert!(row.is_contiguous() && row.shares_storage(&t) && row.offset() == 12);
        let col = Tensor::arange(0.0, 3.0, 1.0, DType::F32, &dev)
            .unwrap()
            .unsqueeze(1)
            .unwrap();
        let b = col.broadcast_to(&[2, 3, 4]).unwrap();
        assert_eq!(b.strides(), &[0, 1, 0]);
        assert_eq!(
            b.to_vec::<f32>().unwrap()[..8],
            [0., 0., 0., 0., 1., 1., 1., 1.]
        );
        assert_eq!(t.unsqueeze(3).unwrap().squeeze_all().shape(), &[2, 3, 4]);
        // Pieces side by side in one storage join as a view; out of order, strided apart or
        // from two storages they do not (concat copies those).
        let piece = |d: usize, s: usize, n: usize| t.narrow(d, s, n).unwrap();
        let (a, b, c) = (piece(1, 0, 1), piece(1, 1, 2), piece(2, 1, 2));
        let j = Tensor::joined(&[&a, &b], 1).unwrap();
        assert!(j.shares_storage(&t) && j.shape() == [2, 3, 4]);
        assert_eq!(j.to_vec::<f32>().unwrap(), t.to_vec::<f32>().unwrap());
        let rows = Tensor::joined(&[&piece(0, 0, 1), &piece(0, 1, 1)], 0).unwrap();
        assert!(rows.is_contiguous() && rows.shares_storage(&t));
        let c2 = piece(2, 3, 1);
        assert_eq!(
            Tensor::joined(&[&c, &c2], 2)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            t.narrow(2, 1, 3).unwrap().to_vec::<f32>().unwrap()
        );
        let other = Tensor::zeros(&[2, 3, 4], DType::F32, &dev).unwrap();
        let copy = other.narrow(1, 1, 2).unwrap();
        for parts in [
            vec![&b, &a],
            vec![&a, &piece(1, 2, 1)],
            vec![&a, &copy],
            vec![&a],
        ] {
            assert!(Tensor::joined(&parts, 1).is_none());
        }
        assert!(Tensor::joined(&[&a, &b], 3).is_none());
        // Pieces broadcast along the dim (stride 0) would join onto one element: copied.
        let bcast = t.narrow(0, 0, 1).unwrap().broadcast_to(&[2, 3, 4]).unwrap();
        assert!(Tensor::joined(&[&bcast, &bcast], 0).is_none());
        // Reshape of a non-contiguous view copies; of a contiguous one it does not.
        assert!(t.reshape(&[6, 4]).unwrap().shares_storage(&t));
        assert!(!tr.reshape(&[24]).unwrap().shares_storage(&t));
        // Bad arguments are errors naming the op and the shapes.
        // Sizes beyond memory are errors, not overflows.
        let huge = [usize::MAX / 2, 4];
        assert!(matches!(
            Tensor::zeros(&huge, DType::F32, &dev),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            Tensor::from_vec(vec![0f32; 4], &huge, &dev),
            Err(Error::Shape { .. })
        ));
        assert!(t.narrow(0, usize::MAX, 2).is_err());
        for err in [
            t.broadcast_to(&[usize::MAX / 2, 3, 4]).unwrap_err(),
            t.reshape(&[5, 5]).unwrap_err(),
            t.permute(&[0, 0, 1]).unwrap_err(),
            t.transpose(0, 3).unwrap_err(),
            t.slice(1, 2, 4, 1).unwrap_err(),
            t.squeeze(1).unwrap_err(),
            t.broadcast_to(&[2, 5, 4]).unwrap_err(),
            t.unsqueeze(4).unwrap_err(),
        ] {
            assert!(err.to_string().contains("[2, 3, 4]"), "{err}");
        }
    }
}

fn ulp_diff(a: f32, b: f32) -> u32 {
    if a == b {
        return 0;
    }
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

#[test]
fn binary_ops_broadcast_over_views_and_match_the_host() {
    let mut c = Cases(0xB1_0A2B);
    let devices = test_devices().unwrap();
    let ops = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];
    for case in 0..240 {
        let shape = c.shape(4, 5);
        // b broadcasts: some dims set to 1, some leading dims dropped.
        let mut bshape: Vec<usize> = shape
            .iter()
            .map(|&n| if c.below(3) == 0 { 1 } else { n })
            .collect();
        bshape.drain(..c.below(bshape.len()));
        let dtype = DType::ALL[case % 6];
        let op = ops[(case / 6) % 4];
        let a = sample(dtype, &shape, case as u64 + 1);
        let b = sample(dtype, &bshape, case as u64 + 99);
        let seed = c.next_u64();
        let expected = random_view(&a, &mut Cases(seed)).binary(&b, op);
        for dev in &devices {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let av = random_view(&a.to_device(dev).unwrap(), &mut Cases(seed));
            let got = av.binary(&b.to_device(dev).unwrap(), op);
            let (got, exp) = match (got, &expected) {
                (Ok(g), Ok(e)) => (g, e),
                (Err(_), Err(_)) => continue,
                (g, e) => panic!("case {case} {op:?} on {dev}: {g:?} vs host {e:?}"),
            };
            assert_eq!(got.shape(), exp.shape());
            let (g, e) = (got.to_vec_f64().unwrap(), exp.to_vec_f64().unwrap());
            for (i, (x, y)) in g.iter().zip(&e).enumerate() {
                // OpenCL allows 2.5 ulp for f32 division; everything else is exactly rounded.
                let ok = if op == BinaryOp::Div && dtype == DType::F32 {
                    ulp_diff(*x as f32, *y as f32) <= 3
                } else {
                    x == y
                };
                assert!(ok, "case {case} {op:?} {dtype} on {dev} at {i}: {x} vs {y}");
            }
        }
    }
}

#[test]
fn binary_ops_reject_mismatches_before_enqueue() {
    let devices = test_devices().unwrap();
    for dev in &devices {
        let a = Tensor::zeros(&[3, 2], DType::F32, dev).unwrap();
        let b = Tensor::zeros(&[4, 2], DType::F32, dev).unwrap();
        let e = a.add(&b).unwrap_err();
        assert!(
            matches!(e, Error::Shape { .. })
                && e.to_string().contains("add")
                && e.to_string().contains("[4, 2]"),
            "{e}"
        );
        let i = Tensor::zeros(&[3, 2], DType::I32, dev).unwrap();
        let e = a.mul(&i).unwrap_err();
        assert!(
            matches!(e, Error::DType { .. })
                && e.to_string().contains("mul")
                && e.to_string().contains("i32"),
            "{e}"
        );
        assert!(matches!(
            Tensor::from_vec(vec![1.0f32; 5], &[2, 3], dev),
            Err(Error::Shape { .. })
        ));
    }
    if let Some(dev) = devices.iter().find(|d| d.is_opencl()) {
        let a = Tensor::zeros(&[2], DType::F32, dev).unwrap();
        let h = Tensor::zeros(&[2], DType::F32, &Device::host()).unwrap();
        assert!(matches!(a.sub(&h), Err(Error::Device { .. })));
    }
}

#[test]
fn uniform_streams_are_bit_identical_and_follow_rand_philox() {
    let seed = 1234;
    let n = 10_003;
    // Independent reference: the rand_philox stream itself.
    let mut reference = rand_philox::Philox::from_u64_seed(seed);
    let expected: Vec<f32> = (0..n)
        .map(|_| rand_philox::u32_to_unit_f32(reference.next_u32()))
        .collect();
    let mut g = Generator::new(seed);
    let host = Tensor::rand(&[n], DType::F32, &Device::host(), &mut g).unwrap();
    assert_eq!(host.to_vec::<f32>().unwrap(), expected);
    for dev in test_devices().unwrap() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let mut gh = Generator::new(seed);
            let mut gd = Generator::new(seed);
            for (shape, low, high) in [
                (vec![n], 0.0, 1.0),
                (vec![3, 7, 5], -2.0, 3.0),
                (vec![1], 0.0, 1.0),
            ] {
                let h =
                    Tensor::uniform(&shape, low, high, dtype, &Device::host(), &mut gh).unwrap();
                let d = Tensor::uniform(&shape, low, high, dtype, &dev, &mut gd).unwrap();
                assert_eq!(
                    d.to_vec_f64().unwrap(),
                    h.to_vec_f64().unwrap(),
                    "{dev} {dtype} {shape:?}"
                );
                assert!(h
                    .to_vec_f64()
                    .unwrap()
                    .iter()
                    .all(|&x| x >= low && x <= high));
            }
            assert_eq!(gh, gd);
        }
        assert!(Tensor::rand(&[3], DType::I32, &dev, &mut Generator::new(1)).is_err());
    }
}

#[test]
fn normal_streams_match_across_devices_and_have_the_right_moments() {
    let n = 200_000;
    let h = Tensor::normal(
        &[n],
        1.5,
        2.0,
        DType::F64,
        &Device::host(),
        &mut Generator::new(7),
    )
    .unwrap();
    let v = h.to_vec_f64().unwrap();
    let mean = v.iter().sum::<f64>() / n as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
    assert!(
        (mean - 1.5).abs() < 0.02 && (var.sqrt() - 2.0).abs() < 0.02,
        "mean {mean} std {}",
        var.sqrt()
    );
    for dev in test_devices().unwrap() {
        for dtype in [DType::F32, DType::F64] {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let h =
                Tensor::randn(&[4097], dtype, &Device::host(), &mut Generator::new(99)).unwrap();
            let d = Tensor::randn(&[4097], dtype, &dev, &mut Generator::new(99)).unwrap();
            let tol = if dtype == DType::F32 { 2e-5 } else { 1e-12 };
            for (i, (x, y)) in d
                .to_vec_f64()
                .unwrap()
                .iter()
                .zip(h.to_vec_f64().unwrap())
                .enumerate()
            {
                assert!(
                    (x - y).abs() <= tol * (1.0 + y.abs()),
                    "{dev} {dtype} at {i}: {x} vs {y}"
                );
            }
        }
    }
}

#[test]
fn display_reads_the_same_values_on_every_device() {
    // Large enough to be summarised: only the corners are copied back from the device.
    let host = random_tensor(DType::F32, &[4, 30, 50], -2.0, 2.0, 7);
    let want = host.to_string();
    assert!(want.contains("..."), "{want}");
    for dev in test_devices().unwrap() {
        let t = host.to_device(&dev).unwrap();
        let got = t.to_string();
        assert_eq!(got.replace(&dev.to_string(), "host"), want, "on {dev}");
        // A strided view prints its own values.
        let v = t.permute(&[2, 0, 1]).unwrap();
        let hv = host.permute(&[2, 0, 1]).unwrap().contiguous().unwrap();
        assert_eq!(
            v.to_string().replace(&dev.to_string(), "host"),
            hv.to_string()
        );
    }
}
