//! Indexing (embedding, index_select, gather, scatter_add, index_add and backwards) on every device against naive references, and its checks: bad input rejected before a launch, large device index tensors reporting bad indices at the next read.
mod index_support;
use index_support::{assert_err, check_all, coords, lin, numel, random_indices, Idx, Input};
use netcl_core_devices::test_devices;
use netcl_ops::testing::{sample, Cases};
use netcl_ops::{DType, Device, Error, Tensor, INDEX_CHECK_LIMIT};

#[test]
fn indexing_ops_match_naive_references_on_every_device() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0x1D_E8);
    let cases = 640;
    for case in 0..cases {
        let dtype = DType::ALL[case % 6];
        let kind = (case / 6) % 8;
        let what = format!("case {case} kind {kind} {dtype}");
        match kind {
            // embedding / embedding_backward
            0 | 1 => {
                let (v, d) = (1 + c.below(9), c.below(7));
                let ids_shape = c.shape(3, 4);
                let ids = random_indices(&mut c, numel(&ids_shape), v);
                let idx = Idx::new(&ids, &ids_shape, &mut c);
                let mut out_shape = ids_shape.clone();
                out_shape.push(d);
                if kind == 0 {
                    let w = Input::exact(sample(dtype, &[v, d], case as u64), &mut c);
                    let wv = w.host().to_vec_f64().unwrap();
                    let want: Vec<f64> = (0..numel(&out_shape))
                        .map(|i| wv[ids[i / d.max(1)] as usize * d + i % d.max(1)])
                        .collect();
                    check_all(&devices, &what, dtype, &out_shape, &want, |dev| {
                        w.on(dev).embedding(&idx.on(dev))
                    });
                } else {
                    let g = Input::exact(sample(dtype, &out_shape, case as u64), &mut c);
                    let gv = g.host().to_vec_f64().unwrap();
                    let mut want = vec![0.0; v * d];
                    for (i, &x) in gv.iter().enumerate() {
                        want[ids[i / d] as usize * d + i % d] += x;
                    }
                    check_all(&devices, &what, dtype, &[v, d], &want, |dev| {
                        Tensor::embedding_backward(&g.on(dev), &idx.on(dev), v)
                    });
                }
            }
            // index_select / index_select_backward / index_add
            2..=4 => {
                let x = Input::new(sample(dtype, &c.shape(4, 5), case as u64), &mut c);
                let xh = x.host();
                let shape = xh.shape().to_vec();
                let dim = c.below(shape.len());
                let k = c.below(6);
                let ids = if shape[dim] == 0 {
                    vec![]
                } else {
                    random_indices(&mut c, k, shape[dim])
                };
                let k = ids.len();
                let idx = Idx::new(&ids, &[k], &mut c);
                let mut sel_shape = shape.clone();
                sel_shape[dim] = k;
                let xv = xh.to_vec_f64().unwrap();
                if kind == 2 {
                    let want: Vec<f64> = (0..numel(&sel_shape))
                        .map(|i| {
                            let mut cc = coords(i, &sel_shape);
                            cc[dim] = ids[cc[dim]] as usize;
                            xv[lin(&cc, &shape)]
                        })
                        .collect();
                    check_all(&devices, &what, dtype, &sel_shape, &want, |dev| {
                        x.on(dev).index_select(dim, &idx.on(dev))
                    });
                } else {
                    let src = Input::exact(sample(dtype, &sel_shape, case as u64 + 7), &mut c);
                    let sv = src.host().to_vec_f64().unwrap();
                    let mut want = if kind == 4 {
                        xv.clone()
                    } else {
                        vec![0.0; xv.len()]
                    };
                    for (i, &s) in sv.iter().enumerate() {
                        let mut cc = coords(i, &sel_shape);
                        cc[dim] = ids[cc[dim]] as usize;
                        want[lin(&cc, &shape)] += s;
                    }
                    check_all(&devices, &what, dtype, &shape, &want, |dev| {
                        let st = src.on(dev);
                        if kind == 4 {
                            x.on(dev).index_add(dim, &idx.on(dev), &st)
                        } else {
                            Tensor::index_select_backward(&st, dim, &idx.on(dev), &shape)
                        }
                    });
                }
            }
            // gather / gather_backward / scatter_add
            _ => {
                let x = Input::new(sample(dtype, &c.shape(4, 5), case as u64), &mut c);
                let xh = x.host();
                let shape = xh.shape().to_vec();
                let dim = c.below(shape.len());
                let idx_shape: Vec<usize> = shape
                    .iter()
                    .enumerate()
                    .map(|(d, &n)| {
                        if d == dim {
                            if n == 0 {
                                0
                            } else {
                                c.below(6)
                            }
                        } else {
                            c.below(n + 1)
                        }
                    })
                    .collect();
                let ids = random_indices(&mut c, numel(&idx_shape), shape[dim]);
                let idx = Idx::new(&ids, &idx_shape, &mut c);
                let xv = xh.to_vec_f64().unwrap();
                if kind == 5 {
                    let want: Vec<f64> = (0..ids.len())
                        .map(|i| {
                            let mut cc = coords(i, &idx_shape);
                            cc[dim] = ids[i] as usize;
                            xv[lin(&cc, &shape)]
                        })
                        .collect();
                    check_all(&devices, &what, dtype, &idx_shape, &want, |dev| {
                        x.on(dev).gather(dim, &idx.on(dev))
                    });
                } else {
                    // src is at least as large as idx in every dim; a narrowed view of it is used.
                    let src_shape: Vec<usize> = idx_shape.iter().map(|&n| n + c.below(2)).collect();
                    let src = sample(dtype, &src_shape, case as u64 + 5);
                    let sv = src.to_vec_f64().unwrap();
                    let mut want = if kind == 7 {
                        xv.clone()
                    } else {
                        vec![0.0; xv.len()]
                    };
                    for (i, &r) in ids.iter().enumerate() {
                        let mut cc = coords(i, &idx_shape);
                        let s = sv[lin(&cc, &src_shape)];
                        cc[dim] = r as usize;
                        want[lin(&cc, &shape)] += s;
                    }
                    let grad_like = kind == 6;
                    check_all(&devices, &what, dtype, &shape, &want, |dev| {
                        let s = src.to_device(dev)?;
                        if grad_like {
                            // gather_backward takes a grad of idx's shape.
                            let mut g = s;
                            for (d, &n) in idx_shape.iter().enumerate() {
                                g = g.narrow(d, 0, n)?;
                            }
                            Tensor::gather_backward(&g, dim, &idx.on(dev), &shape)
                        } else {
                            x.on(dev).scatter_add(dim, &idx.on(dev), &s)
                        }
                    });
                }
            }
        }
    }
}

#[test]
fn indexing_rejects_bad_input_before_enqueue() {
    for dev in test_devices().unwrap() {
        let x = Tensor::zeros(&[4, 3], DType::F32, &dev).unwrap();
        let i32s = |v: Vec<i32>, s: &[usize]| Tensor::from_vec(v, s, &dev).unwrap();
        let idx = i32s(vec![0, 3, 1], &[3]);
        let bad = i32s(vec![0, 4, 1], &[3]);
        let neg = i32s(vec![-1], &[1]);
        let fidx = Tensor::zeros(&[3], DType::F32, &dev).unwrap();
        assert_err(x.embedding(&bad), "embedding", &["index 4", "[4, 3]"]);
        assert_err(x.embedding(&neg), "embedding", &["index -1"]);
        assert_err(x.embedding(&fidx), "embedding", &["i32", "[3]"]);
        assert_err(idx.embedding(&idx), "embedding", &["[3]"]);
        assert_err(
            x.index_select(2, &idx),
            "index_select",
            &["dim 2", "[4, 3]"],
        );
        assert_err(
            x.index_select(0, &bad),
            "index_select",
            &["index 4", "size 4"],
        );
        assert_err(
            x.index_select(1, &idx),
            "index_select",
            &["index 3", "size 3"],
        );
        assert_err(x.index_select(0, &fidx), "index_select", &["f32"]);
        let idx2 = i32s(vec![0; 6], &[3, 2]);
        assert_err(x.index_select(0, &idx2), "index_select", &["1-D", "[3, 2]"]);
        assert_err(x.gather(0, &idx), "gather", &["rank", "[4, 3]"]);
        let wide = i32s(vec![0; 8], &[2, 4]);
        assert_err(x.gather(0, &wide), "gather", &["[2, 4]", "[4, 3]", "dim 1"]);
        let oob = i32s(vec![0, 0, 5, 0], &[2, 2]);
        assert_err(x.gather(0, &oob), "gather", &["index 5", "size 4"]);
        let src = Tensor::zeros(&[1, 2], DType::F32, &dev).unwrap();
        let ok = i32s(vec![0; 4], &[2, 2]);
        assert_err(
            x.scatter_add(0, &ok, &src),
            "scatter_add",
            &["[2, 2]", "[1, 2]"],
        );
        let src64 = Tensor::zeros(&[2, 2], DType::I32, &dev).unwrap();
        assert_err(
            x.scatter_add(0, &ok, &src64),
            "scatter_add",
            &["f32", "i32"],
        );
        assert_err(x.scatter_add(2, &ok, &src), "scatter_add", &["dim 2"]);
        let s3 = Tensor::zeros(&[3, 3], DType::F32, &dev).unwrap();
        assert_err(x.index_add(0, &bad, &s3), "index_add", &["index 4"]);
        assert_err(
            x.index_add(0, &idx, &src),
            "index_add",
            &["[1, 2]", "[4, 3]"],
        );
        assert_err(
            Tensor::embedding_backward(&src, &idx, 4),
            "embedding_backward",
            &["[1, 2]", "[3]"],
        );
        let g = Tensor::zeros(&[3, 3], DType::F32, &dev).unwrap();
        assert_err(
            Tensor::embedding_backward(&g, &bad, 4),
            "embedding_backward",
            &["index 4"],
        );
        assert_err(
            Tensor::index_select_backward(&g, 0, &idx, &[4, 4]),
            "index_select_backward",
            &["[3, 3]", "[4, 4]"],
        );
        assert_err(
            Tensor::gather_backward(&src, 0, &ok, &[4, 3]),
            "gather_backward",
            &["[1, 2]", "[2, 2]"],
        );
        if dev.is_opencl() {
            let h = Tensor::from_vec(vec![0i32], &[1], &Device::host()).unwrap();
            let e = x.embedding(&h).unwrap_err();
            assert!(matches!(e, Error::Device { .. }), "{e}");
            assert_err(x.index_select(0, &h), "index_select", &["[4, 3]", "[1]"]);
            let hs = Tensor::zeros(&[1, 3], DType::F32, &Device::host()).unwrap();
            let one = i32s(vec![0], &[1]);
            assert_err(x.index_add(0, &one, &hs), "index_add", &["[1, 3]"]);
        }
    }
}

#[test]
fn large_device_index_tensors_report_out_of_range_indices_at_the_next_read() {
    for dev in test_devices()
        .unwrap()
        .into_iter()
        .filter(|d| d.is_opencl())
    {
        let n = INDEX_CHECK_LIMIT + 5;
        let w = Tensor::arange(1.0, 9.0, 1.0, DType::F32, &dev)
            .unwrap()
            .reshape(&[4, 2])
            .unwrap();
        let mut ids: Vec<i32> = (0..n as i32).map(|i| i % 4).collect();
        ids[3] = 4;
        ids[7] = -2;
        let it = Tensor::from_vec(ids.clone(), &[n], &dev).unwrap();
        let e = w.embedding(&it).unwrap();
        // The kernel records a bad index (whichever work-item met one first); the next read
        // reports it, as the host does at once.
        let err = e.to_vec::<f32>().unwrap_err().to_string();
        let named = (err.contains("index 4") && err.contains("position 3"))
            || (err.contains("index -2") && err.contains("position 7"));
        assert!(err.contains("embedding") && named, "{dev}: {err}");
        // Reported once; the kernel never read out of bounds: bad rows are 0.
        let e = e.to_vec::<f32>().unwrap();
        assert_eq!(&e[6..8], &[0.0, 0.0], "{dev}: out-of-range row reads as 0");
        assert_eq!(&e[14..18], &[0.0, 0.0, 1.0, 2.0], "{dev}");
        assert_eq!(&e[4..6], &[5.0, 6.0], "{dev}");
        let g = Tensor::ones(&[n, 2], DType::F32, &dev).unwrap();
        let gw = Tensor::embedding_backward(&g, &it, 4).unwrap();
        let counts: Vec<f32> = (0..4)
            .flat_map(|r| {
                let k = ids.iter().filter(|&&i| i == r).count() as f32;
                [k, k]
            })
            .collect();
        assert_eq!(
            gw.to_vec::<f32>().unwrap(),
            counts,
            "{dev}: bad ids contribute nothing"
        );
        // The host checks every index.
        let hw = w.to_device(&Device::host()).unwrap();
        let hi = it.to_device(&Device::host()).unwrap();
        assert_err(hw.embedding(&hi), "embedding", &["index 4", "position 3"]);
    }
}
