//! The one-token decode ops (GEMV with RMSNorm and residual, SwiGLU, RoPE + KV-cache write; single-query attention over a cache with padding and grouped heads) on every device against the host's composition of the general ops, and bad input.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, host_tensor, random_tensor, tolerance};
use netcl_ops::{DType, Device, KvWrite, RmsScale, RopeFreqs, RopeStyle, Tensor};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// The dtypes of `FLOATS` that `dev` runs.
fn floats(dev: &Device) -> Vec<DType> {
    FLOATS
        .into_iter()
        .filter(|&d| d != DType::F64 || dev.info().fp64)
        .collect()
}

fn rand(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    random_tensor(dtype, shape, -1.0, 1.0, seed)
}

/// `got` (any device) against `want` (host) within the dtype's tolerance of the largest value.
fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let g = got.to_vec_f64().unwrap();
    let w = want.to_vec_f64().unwrap();
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    if let Err(msg) = check_close(&g, &w, tolerance(got.dtype()), scale, what) {
        panic!("{msg}");
    }
}

#[test]
fn decode_linear_and_swiglu_match_the_composed_ops() {
    for dev in test_devices().unwrap() {
        for dtype in floats(&dev) {
            // Batches below, at and above a work-group's 4 rows; K a multiple of 4 or not
            // (vector or scalar loads) and long enough for teams of 32, 64 and 256 work-items;
            // an odd N (a unit with one row); batches that the tensor-core kernel takes on
            // devices that have one (K a multiple of 32; more than one 32-row group, more than
            // one 256-K chunk, more units than one work-group's 32; SwiGLU units enough for a
            // work-group per compute unit of a 132-unit GPU without splitting K).
            let cases = [
                (1, 40, 7),
                (4, 42, 16),
                (6, 9, 5),
                (1, 1024, 6),
                (5, 4100, 3),
                (6, 64, 10),
                (37, 288, 75),
                (6, 288, 4301),
            ];
            for (case, &(b, k, n)) in cases.iter().enumerate() {
                let seed = case as u64 * 10;
                let x = rand(dtype, &[b, k], seed);
                let w = rand(dtype, &[n, k], seed + 1);
                let up = rand(dtype, &[n, k], seed + 2);
                let res = rand(dtype, &[b, n], seed + 3);
                let norm = RmsScale {
                    weight: random_tensor(dtype, &[k], 0.5, 1.5, seed + 4),
                    eps: 1e-5,
                };
                let on = |t: &Tensor| t.to_device(&dev).unwrap();
                let norm_d = RmsScale {
                    weight: on(&norm.weight),
                    eps: norm.eps,
                };
                let what = format!("{dev} {dtype} B {b} K {k} N {n}");
                for with_norm in [false, true] {
                    let (nh, nd) = if with_norm {
                        (Some(&norm), Some(&norm_d))
                    } else {
                        (None, None)
                    };
                    for with_res in [false, true] {
                        let want = x.decode_linear(nh, &w, with_res.then_some(&res)).unwrap();
                        let got = on(&x)
                            .decode_linear(nd, &on(&w), with_res.then(|| on(&res)).as_ref())
                            .unwrap();
                        close(
                            &got,
                            &want,
                            &format!("{what} linear norm {with_norm} res {with_res}"),
                        );
                    }
                    let want = x.decode_swiglu(nh, &w, &up).unwrap();
                    let got = on(&x).decode_swiglu(nd, &on(&w), &on(&up)).unwrap();
                    close(&got, &want, &format!("{what} swiglu norm {with_norm}"));
                }
            }
        }
    }
}

#[test]
fn decode_qkv_rotates_and_writes_the_caches_like_the_composed_ops() {
    let (h, hkv, hd, k, s, at) = (4, 2, 8, 32, 10, 5);
    // 3 rows, and 37 (the tensor-core kernel's two row groups where a device has one).
    for (dev, b) in test_devices()
        .unwrap()
        .into_iter()
        .flat_map(|d| [(d.clone(), 3), (d, 37)])
    {
        for dtype in floats(&dev) {
            for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
                for table in [false, true] {
                    let x = rand(dtype, &[b, k], 1);
                    let wq = rand(dtype, &[h * hd, k], 2);
                    let wk = rand(dtype, &[hkv * hd, k], 3);
                    let wv = rand(dtype, &[hkv * hd, k], 4);
                    let norm = RmsScale {
                        weight: random_tensor(dtype, &[k], 0.5, 1.5, 5),
                        eps: 1e-6,
                    };
                    let acc = netcl_ops::acc_dtype(dtype);
                    // Llama 3's scaled table, or a base.
                    let f: Vec<f64> = (0..hd / 2).map(|i| 0.7f64.powi(i as i32)).collect();
                    let freqs = |d: &Device| match table {
                        true => {
                            RopeFreqs::Table(host_tensor(acc, &f, &[hd / 2]).to_device(d).unwrap())
                        }
                        false => RopeFreqs::Theta(500.0),
                    };
                    let write = |d: &Device| KvWrite {
                        k_cache: rand(dtype, &[b, hkv, s, hd], 6).to_device(d).unwrap(),
                        v_cache: rand(dtype, &[b, hkv, s, hd], 7).to_device(d).unwrap(),
                        pos: position(at, d),
                        pads: Some(
                            Tensor::from_vec(
                                (0..b).map(|i| [0i32, 2, 5][i % 3]).collect(),
                                &[b],
                                d,
                            )
                            .unwrap(),
                        ),
                        style,
                        freqs: freqs(d),
                    };
                    let host = Device::host();
                    let (kw_h, kw_d) = (write(&host), write(&dev));
                    let want = x.decode_qkv(Some(&norm), &wq, &wk, &wv, &kw_h).unwrap();
                    let on = |t: &Tensor| t.to_device(&dev).unwrap();
                    let norm_d = RmsScale {
                        weight: on(&norm.weight),
                        eps: norm.eps,
                    };
                    let got = on(&x)
                        .decode_qkv(Some(&norm_d), &on(&wq), &on(&wk), &on(&wv), &kw_d)
                        .unwrap();
                    let what = format!("{dev} {dtype} {style:?} table {table}");
                    close(&got, &want, &format!("{what} q"));
                    close(&kw_d.k_cache, &kw_h.k_cache, &format!("{what} k cache"));
                    close(&kw_d.v_cache, &kw_h.v_cache, &format!("{what} v cache"));
                }
            }
        }
    }
}

#[test]
fn decode_attention_matches_the_host_softmax() {
    // Head dims: a multiple of 4, not one, and above one work-group's 128 (two per work-item);
    // key counts of one, several and more than one 128-key chunk.
    for dev in test_devices().unwrap() {
        for dtype in floats(&dev) {
            for &(hd, s, len) in &[(8, 300, 300), (6, 20, 1), (200, 140, 137)] {
                let (b, h, hkv) = (3, 4, 2);
                let q = rand(dtype, &[b, h * hd], 11);
                let kc = rand(dtype, &[b, hkv, s, hd], 12);
                let vc = rand(dtype, &[b, hkv, s, hd], 13);
                let pads = Tensor::from_vec(
                    vec![0i32, 1, (len as i32 - 1).min(3)],
                    &[b],
                    &Device::host(),
                )
                .unwrap();
                for use_pads in [false, true] {
                    let p = use_pads.then_some(&pads);
                    let at = position(len - 1, &Device::host());
                    let want = q.decode_attention(&kc, &vc, &at, p, h).unwrap();
                    let on = |t: &Tensor| t.to_device(&dev).unwrap();
                    let pd = use_pads.then(|| on(&pads));
                    let got = on(&q)
                        .decode_attention(&on(&kc), &on(&vc), &on(&at), pd.as_ref(), h)
                        .unwrap();
                    close(
                        &got,
                        &want,
                        &format!("{dev} {dtype} hd {hd} len {len} pads {use_pads}"),
                    );
                }
            }
        }
    }
}

#[test]
fn decode_ops_reject_bad_input_naming_the_values() {
    let dev = Device::host();
    let x = rand(DType::F32, &[2, 8], 1);
    let w = rand(DType::F32, &[4, 6], 2);
    let e = x.decode_linear(None, &w, None).unwrap_err().to_string();
    assert!(e.contains("decode_linear") && e.contains("[4, 6]"), "{e}");
    let cache = Tensor::zeros(&[2, 1, 4, 8], DType::F32, &dev).unwrap();
    let q = rand(DType::F32, &[2, 16], 3);
    let e = q
        .decode_attention(&cache, &cache, &position(4, &dev), None, 2)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("decode_attention") && e.contains("position 4 is outside [0, 4)"),
        "{e}"
    );
    let e = q
        .decode_attention(&cache, &cache, &position(1, &dev), None, 3)
        .unwrap_err()
        .to_string();
    assert!(e.contains("3 heads"), "{e}");
    let two = Tensor::zeros(&[2], DType::I32, &dev).unwrap();
    let e = q
        .decode_attention(&cache, &cache, &two, None, 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("position is [2]"), "{e}");
    let wq = rand(DType::F32, &[8, 8], 4);
    let kv = KvWrite {
        k_cache: cache.clone(),
        v_cache: cache.clone(),
        pos: position(4, &dev),
        pads: None,
        style: RopeStyle::Halves,
        freqs: RopeFreqs::Theta(1e4),
    };
    let e = x
        .decode_qkv(None, &wq, &wq, &wq, &kv)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("decode_qkv") && e.contains("position 4 is outside [0, 4)"),
        "{e}"
    );
    let bad_pads = KvWrite {
        pos: position(1, &dev),
        pads: Some(Tensor::zeros(&[3], DType::I32, &dev).unwrap()),
        ..kv
    };
    let e = x
        .decode_qkv(None, &wq, &wq, &wq, &bad_pads)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pads") && e.contains("[3]"), "{e}");
}

/// The I32 (1) position tensor the decode ops read.
fn position(at: usize, dev: &Device) -> Tensor {
    Tensor::from_vec(vec![at as i32], &[1], dev).unwrap()
}

#[test]
fn a_position_outside_the_cache_is_reported_at_the_next_read() {
    // The kernels read the position on the device: one outside the cache writes nothing and is
    // reported as a bad index is, at the next read.
    for dev in test_devices().unwrap() {
        let x = rand(DType::F32, &[2, 8], 1).to_device(&dev).unwrap();
        let wq = rand(DType::F32, &[8, 8], 4).to_device(&dev).unwrap();
        let cache = Tensor::zeros(&[2, 1, 4, 8], DType::F32, &dev).unwrap();
        let kv = KvWrite {
            k_cache: cache.clone(),
            v_cache: cache.clone(),
            pos: position(7, &dev),
            pads: None,
            style: RopeStyle::Halves,
            freqs: RopeFreqs::Theta(1e4),
        };
        let run = || -> netcl_ops::Result<Vec<f32>> {
            let q = x.decode_qkv(None, &wq, &wq, &wq, &kv)?;
            q.decode_attention(&cache, &cache, &kv.pos, None, 1)?
                .read_async()?
                .wait::<f32>()
        };
        let e = run().unwrap_err().to_string();
        assert!(e.contains("position 7 is outside [0, 4)"), "{dev}: {e}");
        assert!(
            cache.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0),
            "{dev}: nothing written"
        );
        // On a device: an asynchronous read dropped unread leaves the error to the next read;
        // an error that a later synchronous read reported is not reported again by an
        // asynchronous read queued before it.
        if dev.is_opencl() {
            let q = x.decode_qkv(None, &wq, &wq, &wq, &kv).unwrap();
            drop(q.read_async().unwrap());
            let e = q.to_vec::<f32>().unwrap_err().to_string();
            assert!(e.contains("position 7"), "{dev}: {e}");
            let q = x.decode_qkv(None, &wq, &wq, &wq, &kv).unwrap();
            let pending = q.read_async().unwrap();
            let again = x.decode_qkv(None, &wq, &wq, &wq, &kv).unwrap();
            let e = again.to_vec::<f32>().unwrap_err().to_string();
            assert!(e.contains("position 7"), "{dev}: {e}");
            assert!(pending.wait::<f32>().is_ok(), "{dev}: reported once");
        }
        // The record is cleared: a position inside the cache works again.
        let kv = KvWrite {
            pos: position(3, &dev),
            ..kv
        };
        let q = x.decode_qkv(None, &wq, &wq, &wq, &kv).unwrap();
        let o = q
            .decode_attention(&cache, &cache, &kv.pos, None, 1)
            .unwrap();
        assert_eq!(o.to_vec::<f32>().unwrap().len(), 16, "{dev}");
    }
}
