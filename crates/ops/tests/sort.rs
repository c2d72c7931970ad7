//! Stable sort of i32 keys (sort_stable / argsort_stable) on every device against a sort of (key, position) pairs, with stability, reruns, launch counts and errors.
use netcl_core_devices::test_devices;
use netcl_kernels::{thread_launches, thread_launches_total};
use netcl_ops::testing::Cases;
use netcl_ops::{DType, Device, Tensor};

/// Reference: (key, position) pairs sorted (all distinct, so any sort gives the stable order).
fn reference(keys: &[i32]) -> (Vec<i32>, Vec<i32>) {
    let mut pairs: Vec<(i32, i32)> = keys
        .iter()
        .enumerate()
        .map(|(i, &k)| (k, i as i32))
        .collect();
    pairs.sort_unstable();
    pairs.into_iter().unzip()
}

/// Keys of one of several kinds: few distinct values, small signed, full i32 range with the
/// extremes, already sorted, reversed.
fn keys(c: &mut Cases, n: usize, kind: usize) -> Vec<i32> {
    (0..n)
        .map(|i| match kind {
            0 => c.below(3) as i32,
            1 => c.below(101) as i32 - 50,
            2 => match c.below(8) {
                0 => i32::MAX,
                1 => i32::MIN,
                _ => c.next_u64() as i32,
            },
            3 => (i / 7) as i32,
            _ => (n - i) as i32 - 3,
        })
        .collect()
}

/// The keys on `dev`, contiguous or (when `strided`) every third element of a longer tensor
/// starting at element 1.
fn on(v: &[i32], dev: &Device, strided: bool) -> Tensor {
    if !strided {
        return Tensor::from_vec(v.to_vec(), &[v.len()], dev).unwrap();
    }
    let wide: Vec<i32> = std::iter::once(-9)
        .chain(v.iter().flat_map(|&x| [x, 77, -77]))
        .collect();
    let t = Tensor::from_vec(wide, &[3 * v.len() + 1], dev).unwrap();
    t.slice(0, 1, 3 * v.len() + 1, 3).unwrap()
}

#[test]
fn sort_stable_matches_a_pair_sort_on_every_device() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0x50_27);
    let mut lengths = vec![
        0, 1, 2, 3, 5, 64, 255, 1000, 1023, 1024, 1025, 2048, 3000, 4096, 8191, 8192, 8193, 20000,
    ];
    lengths.extend((0..12).map(|_| 1 + c.below(5000)));
    for (case, &n) in lengths.iter().enumerate() {
        let kind = case % 5;
        let v = keys(&mut c, n, kind);
        let (want_keys, want_perm) = reference(&v);
        for dev in &devices {
            let strided = case % 3 == 1;
            let what = format!("case {case}: n {n} kind {kind} strided {strided} on {dev}");
            let x = on(&v, dev, strided);
            let (k, p) = x.sort_stable().unwrap();
            for t in [&k, &p] {
                assert_eq!(t.shape(), &[n], "{what}");
                assert_eq!(t.dtype(), DType::I32, "{what}");
                assert_eq!(t.device(), dev, "{what}");
                assert!(t.is_contiguous(), "{what}");
            }
            assert_eq!(k.to_vec::<i32>().unwrap(), want_keys, "{what}: keys");
            assert_eq!(p.to_vec::<i32>().unwrap(), want_perm, "{what}: permutation");
            let again = x.argsort_stable().unwrap().to_vec::<i32>().unwrap();
            assert_eq!(again, want_perm, "{what}: argsort rerun");
        }
    }
}

#[test]
fn equal_keys_keep_their_order_and_reruns_are_identical() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(91);
    // Long runs of equal keys across chunk and merge boundaries.
    let n: usize = 5000;
    let v: Vec<i32> = (0..n).map(|_| [7, -2, 7, 0][c.below(4)]).collect();
    for dev in &devices {
        let x = on(&v, dev, false);
        let first = x.argsort_stable().unwrap().to_vec::<i32>().unwrap();
        for w in first.windows(2) {
            let (a, b) = (w[0] as usize, w[1] as usize);
            assert!(
                v[a] < v[b] || (v[a] == v[b] && a < b),
                "{dev}: {a} (key {}) before {b} (key {})",
                v[a],
                v[b]
            );
        }
        let mut seen = first.clone();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..n as i32).collect::<Vec<_>>(),
            "{dev}: a permutation"
        );
        for run in 0..3 {
            let p = x.argsort_stable().unwrap().to_vec::<i32>().unwrap();
            assert_eq!(p, first, "{dev}: run {run}");
        }
    }
}

#[test]
fn device_sort_launches_follow_the_documented_count() {
    for dev in test_devices()
        .unwrap()
        .into_iter()
        .filter(|d| d.is_opencl())
    {
        if dev.info().max_work_group_size < 256 || dev.info().local_mem_bytes < 8192 {
            continue; // chunks smaller than 1024 pairs: more stages than counted here
        }
        // 1 + s(s+3)/2 launches for s = log2(p / 1024).
        for (n, want) in [
            (1, 1),
            (1024, 1),
            (1025, 3),
            (4096, 6),
            (8192, 10),
            (16384, 15),
        ] {
            let x = Tensor::zeros(&[n], DType::I32, &dev).unwrap();
            let (t0, c0, m0) = (
                thread_launches_total(),
                thread_launches("sort_chunks"),
                thread_launches("sort_merge"),
            );
            x.sort_stable().unwrap();
            let total = thread_launches_total() - t0;
            let chunks = thread_launches("sort_chunks") - c0;
            let merges = thread_launches("sort_merge") - m0;
            assert_eq!(total, want, "{dev}: n {n}");
            assert_eq!(chunks + merges, want, "{dev}: n {n}: only sort kernels");
        }
        let empty = Tensor::zeros(&[0], DType::I32, &dev).unwrap();
        let t0 = thread_launches_total();
        let (k, p) = empty.sort_stable().unwrap();
        assert_eq!(thread_launches_total(), t0, "{dev}: nothing to sort");
        assert_eq!((k.numel(), p.numel()), (0, 0), "{dev}");
    }
}

#[test]
fn sort_rejects_bad_input() {
    for dev in test_devices().unwrap() {
        let m = Tensor::zeros(&[2, 3], DType::I32, &dev).unwrap();
        let e = m.sort_stable().unwrap_err().to_string();
        assert!(e.contains("sort_stable") && e.contains("[2, 3]"), "{e}");
        let f = Tensor::zeros(&[4], DType::F32, &dev).unwrap();
        let e = f.argsort_stable().unwrap_err().to_string();
        assert!(e.contains("sort_stable") && e.contains("f32"), "{e}");
        let s = Tensor::zeros(&[], DType::I32, &dev).unwrap();
        assert!(
            s.sort_stable().is_err(),
            "{dev}: a 0-dim tensor has no order"
        );
    }
}
