//! Shape ops (one_hot, concat, stack, split, pad, triu/tril, masks) on every device against naive references, and their errors.
mod index_support;
use index_support::{assert_err, check_all, coords, lin, numel, random_indices, Idx, Input};
use netcl_core_devices::test_devices;
use netcl_ops::testing::{sample, Cases};
use netcl_ops::{DType, Device, Error, Tensor};

#[test]
fn shape_ops_match_naive_references_on_every_device() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0x5A_9E);
    for case in 0..600 {
        let dtype = DType::ALL[case % 6];
        let kind = (case / 6) % 6;
        let what = format!("case {case} kind {kind} {dtype}");
        match kind {
            // concat / stack
            0 | 1 => {
                let stack = kind == 1;
                let base = c.shape(4, 4);
                let dim = if stack {
                    c.below(base.len() + 1)
                } else {
                    c.below(base.len())
                };
                let inputs: Vec<Input> = (0..1 + c.below(4))
                    .map(|j| {
                        let mut s = base.clone();
                        if !stack {
                            s[dim] = c.below(4);
                        }
                        Input::exact(sample(dtype, &s, (case * 8 + j) as u64), &mut c)
                    })
                    .collect();
                let hs: Vec<Tensor> = inputs.iter().map(|i| i.host()).collect();
                // Reference: row-major interleave of the inputs.
                let mut shape = base.clone();
                let parts: Vec<(Vec<usize>, Vec<f64>)> = hs
                    .iter()
                    .map(|t| {
                        let mut s = t.shape().to_vec();
                        if stack {
                            s.insert(dim, 1);
                        }
                        (s, t.to_vec_f64().unwrap())
                    })
                    .collect();
                if stack {
                    shape.insert(dim, parts.len());
                } else {
                    shape[dim] = parts.iter().map(|p| p.0[dim]).sum();
                }
                let outer: usize = shape[..dim].iter().product();
                let mut want = vec![];
                for o in 0..outer {
                    for (s, v) in &parts {
                        let row: usize = s[dim..].iter().product();
                        want.extend_from_slice(&v[o * row..(o + 1) * row]);
                    }
                }
                check_all(&devices, &what, dtype, &shape, &want, |dev| {
                    let ts: Vec<Tensor> = inputs.iter().map(|i| i.on(dev)).collect();
                    let refs: Vec<&Tensor> = ts.iter().collect();
                    if stack {
                        Tensor::stack(&refs, dim)
                    } else {
                        Tensor::concat(&refs, dim)
                    }
                });
            }
            // pad
            2 => {
                let x = Input::new(sample(dtype, &c.shape(4, 4), case as u64), &mut c);
                let xh = x.host();
                let shape = xh.shape().to_vec();
                let pads: Vec<(usize, usize)> = (0..c.below(shape.len() + 1))
                    .map(|_| (c.below(3), c.below(3)))
                    .collect();
                let value: f64 = [0.0, 2.5, -1.0, 3.0][c.below(4)];
                let value = if dtype.is_float() { value } else { value.abs() };
                let mut out = shape.clone();
                let mut before = vec![0; shape.len()];
                for (k, &(b, a)) in pads.iter().enumerate() {
                    let d = shape.len() - 1 - k;
                    out[d] += b + a;
                    before[d] = b;
                }
                let xv = xh.to_vec_f64().unwrap();
                let want: Vec<f64> = (0..numel(&out))
                    .map(|i| {
                        let cc = coords(i, &out);
                        let inside = (0..shape.len())
                            .all(|d| cc[d] >= before[d] && cc[d] - before[d] < shape[d]);
                        if inside {
                            let xc: Vec<usize> =
                                (0..shape.len()).map(|d| cc[d] - before[d]).collect();
                            xv[lin(&xc, &shape)]
                        } else {
                            value
                        }
                    })
                    .collect();
                check_all(&devices, &what, dtype, &out, &want, |dev| {
                    x.on(dev).pad(&pads, value)
                });
            }
            // triu / tril of a tensor
            3 => {
                let mut s = c.shape(3, 5);
                s.push(c.below(6));
                let x = Input::new(sample(dtype, &s, case as u64), &mut c);
                let xh = x.host();
                let shape = xh.shape().to_vec();
                if shape.len() < 2 {
                    continue;
                }
                let diag = c.below(9) as i64 - 4;
                let upper = c.below(2) == 0;
                let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
                let xv = xh.to_vec_f64().unwrap();
                let want: Vec<f64> = (0..xv.len())
                    .map(|i| {
                        let (r, col) = ((i / cols) % rows, i % cols);
                        let d = col as i64 - r as i64;
                        let keep = if upper { d >= diag } else { d <= diag };
                        if keep {
                            xv[i]
                        } else {
                            0.0
                        }
                    })
                    .collect();
                check_all(&devices, &what, dtype, &shape, &want, |dev| {
                    if upper {
                        x.on(dev).triu(diag)
                    } else {
                        x.on(dev).tril(diag)
                    }
                });
            }
            // one_hot
            4 => {
                let ids_shape = c.shape(3, 5);
                let classes = 1 + c.below(6);
                let ids = random_indices(&mut c, numel(&ids_shape), classes);
                let idx = Idx::new(&ids, &ids_shape, &mut c);
                let mut shape = ids_shape.clone();
                shape.push(classes);
                let want: Vec<f64> = (0..numel(&shape))
                    .map(|i| (ids[i / classes] as usize == i % classes) as u8 as f64)
                    .collect();
                check_all(&devices, &what, dtype, &shape, &want, |dev| {
                    Tensor::one_hot(&idx.on(dev), classes, dtype)
                });
            }
            // masks and split views
            _ => {
                let (rows, cols) = (c.below(7), c.below(7));
                let diag = c.below(9) as i64 - 4;
                for upper in [false, true] {
                    let want: Vec<f64> = (0..rows * cols)
                        .map(|i| {
                            let d = (i % cols) as i64 - (i / cols) as i64;
                            (if upper { d >= diag } else { d <= diag }) as u8 as f64
                        })
                        .collect();
                    check_all(&devices, &what, dtype, &[rows, cols], &want, |dev| {
                        if upper {
                            Tensor::triu_mask(rows, cols, diag, dtype, dev)
                        } else {
                            Tensor::tril_mask(rows, cols, diag, dtype, dev)
                        }
                    });
                }
                let x = Input::new(sample(dtype, &c.shape(4, 6), case as u64), &mut c);
                let xh = x.host();
                let dim = c.below(xh.ndim());
                let n = xh.shape()[dim];
                let size = 1 + c.below(4);
                let mut sizes = vec![c.below(n + 1)];
                let mut left = n - sizes[0];
                while left > 0 {
                    let s = c.below(left + 1);
                    sizes.push(s);
                    left -= s;
                }
                for dev in &devices {
                    if dtype == DType::F64 && !dev.info().fp64 {
                        continue;
                    }
                    let xd = x.on(dev);
                    for (parts, kind) in [
                        (xd.split(size, dim).unwrap(), "split"),
                        (xd.split_sizes(&sizes, dim).unwrap(), "split_sizes"),
                    ] {
                        assert!(parts.iter().all(|p| p.shares_storage(&xd)), "{what} {kind}");
                        let refs: Vec<&Tensor> = parts.iter().collect();
                        let back = Tensor::concat(&refs, dim).unwrap();
                        assert_eq!(back.shape(), xh.shape(), "{what} {kind} on {dev}");
                        assert_eq!(
                            back.to_vec_f64().unwrap(),
                            xh.to_vec_f64().unwrap(),
                            "{what} {kind} on {dev}"
                        );
                    }
                    let chunks = xd.split(size, dim).unwrap();
                    assert_eq!(chunks.len(), n.div_ceil(size).max(1), "{what}");
                }
            }
        }
    }
}

#[test]
fn causal_mask_and_shape_op_errors() {
    for dev in test_devices().unwrap() {
        let m = Tensor::causal_mask(3, DType::F32, &dev).unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(
            m.to_vec::<f32>().unwrap(),
            vec![0.0, inf, inf, 0.0, 0.0, inf, 0.0, 0.0, 0.0],
            "{dev}"
        );
        for dtype in [DType::F16, DType::BF16] {
            let v = Tensor::causal_mask(2, dtype, &dev)
                .unwrap()
                .to_vec_f64()
                .unwrap();
            assert_eq!(v, vec![0.0, f64::NEG_INFINITY, 0.0, 0.0], "{dev} {dtype}");
        }
        assert_err(
            Tensor::causal_mask(2, DType::I32, &dev),
            "causal_mask",
            &["i32"],
        );
        let x = Tensor::zeros(&[2, 3], DType::F32, &dev).unwrap();
        let y = Tensor::zeros(&[2, 4], DType::F32, &dev).unwrap();
        let z = Tensor::zeros(&[2, 3], DType::I32, &dev).unwrap();
        assert_err(
            Tensor::concat(&[&x, &y], 0),
            "concat",
            &["[2, 3]", "[2, 4]"],
        );
        assert_err(Tensor::concat(&[&x, &z], 1), "concat", &["f32", "i32"]);
        assert_err(Tensor::concat(&[&x], 2), "concat", &["dim 2", "[2, 3]"]);
        assert_err(Tensor::concat(&[], 0), "concat", &[]);
        assert_err(Tensor::stack(&[&x, &y], 0), "stack", &["[2, 3]", "[2, 4]"]);
        assert_err(Tensor::stack(&[&x, &z], 0), "stack", &["f32", "i32"]);
        assert_err(Tensor::stack(&[&x], 3), "stack", &["dim 3"]);
        assert!(x.split(0, 1).unwrap_err().to_string().contains("[2, 3]"));
        assert!(x.split(1, 2).unwrap_err().to_string().contains("split"));
        assert!(x
            .split_sizes(&[1, 1], 1)
            .unwrap_err()
            .to_string()
            .contains("[2, 3]"));
        assert_err(x.pad(&[(1, 1); 3], 0.0), "pad", &["[2, 3]"]);
        assert_err(x.reshape(&[6]).unwrap().triu(0), "triu", &["[6]"]);
        assert_err(
            Tensor::one_hot(&x, 3, DType::F32),
            "one_hot",
            &["i32", "[2, 3]"],
        );
        let ids = Tensor::from_vec(vec![0i32, 3], &[2], &dev).unwrap();
        assert_err(
            Tensor::one_hot(&ids, 3, DType::F32),
            "one_hot",
            &["index 3", "3 classes"],
        );
        if dev.is_opencl() {
            let h = Tensor::zeros(&[2, 3], DType::F32, &Device::host()).unwrap();
            let e = Tensor::concat(&[&x, &h], 0).unwrap_err();
            assert!(
                matches!(e, Error::Device { .. }) && e.to_string().contains("concat"),
                "{e}"
            );
        }
    }
}
