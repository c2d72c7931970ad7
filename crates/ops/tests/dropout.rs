//! Bernoulli/dropout masks on every device: bit-identical to the rand_philox stream, keep rates and argument checks.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, random_view, sample, tolerance, Cases};
use netcl_ops::{DType, Generator, Tensor};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// The independent mask: rand_philox's stream, 1 where a word is below round(keep * 2^32).
fn philox_mask(seed: u64, n: usize, keep: f64) -> Vec<f64> {
    let mut r = rand_philox::Philox::from_u64_seed(seed);
    let thr = (keep * 4_294_967_296.0).round() as u64;
    (0..n)
        .map(|_| ((r.next_u32() as u64) < thr) as u8 as f64)
        .collect()
}

#[test]
fn bernoulli_and_dropout_masks_are_bit_identical_everywhere() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xD80);
    for case in 0..240 {
        let dtype = if case % 2 == 0 {
            FLOATS[(case / 2) % 4]
        } else {
            DType::ALL[(case / 2) % 6]
        };
        let shape = c.shape(4, 7);
        let n: usize = shape.iter().product();
        let p = [0.0, 0.1, 0.5, 0.9, 1.0, 0.37][c.below(6)];
        let seed = c.next_u64();
        let what = format!("case {case} {dtype} {shape:?} p {p}");
        if !dtype.is_float() || case % 3 == 0 {
            let want = philox_mask(seed, n, p);
            for dev in &devices {
                if dtype == DType::F64 && !dev.info().fp64 {
                    continue;
                }
                let mut g = Generator::new(seed);
                let m = Tensor::bernoulli(p, &shape, dtype, dev, &mut g).unwrap();
                assert_eq!((m.shape(), m.dtype()), (&shape[..], dtype), "{what}");
                assert_eq!(m.to_vec_f64().unwrap(), want, "{what} on {dev}");
                assert_eq!(g.counter(), n.div_ceil(4) as u128, "{what}");
            }
            continue;
        }
        // dropout of a random view: the mask follows the view's row-major order.
        let base = sample(dtype, &shape, case as u64);
        let vseed = c.next_u64();
        let xh = random_view(&base, &mut Cases(vseed));
        let m = xh.numel();
        let mask = philox_mask(seed, m, 1.0 - p);
        let xv = xh.to_vec_f64().unwrap();
        let want_y: Vec<f64> = xv
            .iter()
            .zip(&mask)
            .map(|(x, k)| if *k == 1.0 { x / (1.0 - p) } else { 0.0 })
            .collect();
        let mut host_y = None;
        for dev in &devices {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let x = random_view(&base.to_device(dev).unwrap(), &mut Cases(vseed));
            let mut g = Generator::new(seed);
            let (y, mk) = x.dropout(p, &mut g).unwrap();
            assert_eq!(g.counter(), m.div_ceil(4) as u128, "{what}");
            assert_eq!((y.shape(), mk.shape()), (xh.shape(), xh.shape()), "{what}");
            assert_eq!(mk.to_vec_f64().unwrap(), mask, "{what} mask on {dev}");
            let yv = y.to_vec_f64().unwrap();
            check_close(
                &yv,
                &want_y,
                tolerance(dtype),
                0.0,
                &format!("{what} y on {dev}"),
            )
            .unwrap();
            // y is bit-identical across devices too (one correctly rounded multiply).
            match &host_y {
                None => host_y = Some(yv),
                Some(h) => assert_eq!(&yv, h, "{what} y on {dev} vs host"),
            }
        }
    }
}

#[test]
fn dropout_keeps_about_one_minus_p_and_checks_arguments() {
    for dev in test_devices().unwrap() {
        let x = Tensor::ones(&[100_000], DType::F32, &dev).unwrap();
        let (y, m) = x.dropout(0.3, &mut Generator::new(5)).unwrap();
        let kept = m.to_vec::<f32>().unwrap().iter().sum::<f32>() / 100_000.0;
        assert!((kept - 0.7).abs() < 0.01, "{dev}: kept {kept}");
        let mean = y.to_vec::<f32>().unwrap().iter().sum::<f32>() / 100_000.0;
        assert!((mean - 1.0).abs() < 0.02, "{dev}: mean {mean}");
        for p in [-0.1, 1.5, f64::NAN] {
            let e = x
                .dropout(p, &mut Generator::new(1))
                .unwrap_err()
                .to_string();
            assert!(e.contains("dropout") && e.contains("[100000]"), "{e}");
            let e = Tensor::bernoulli(p, &[2, 3], DType::F32, &dev, &mut Generator::new(1))
                .unwrap_err()
                .to_string();
            assert!(e.contains("bernoulli") && e.contains("[2, 3]"), "{e}");
        }
        let i = Tensor::zeros(&[4], DType::I32, &dev).unwrap();
        let e = i
            .dropout(0.5, &mut Generator::new(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("dropout") && e.contains("i32"), "{e}");
        let (y, m) = x.dropout(1.0, &mut Generator::new(2)).unwrap();
        assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        assert!(m.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        let (y, _) = x.dropout(0.0, &mut Generator::new(2)).unwrap();
        assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.0));
    }
}
