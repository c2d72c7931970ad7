//! Indexing (embedding, index_select, gather, scatter_add, index_add and backwards) and shape ops (one_hot, concat, stack, split, pad, triu/tril, masks) on every device against naive references.
use netcl_core_devices::test_devices;
use netcl_kernels::{thread_launches, thread_launches_total};
use netcl_ops::testing::{check_close, random_tensor, random_view, sample, tolerance, Cases};
use netcl_ops::{DType, Device, Error, Result, Tensor, INDEX_CHECK_LIMIT};

fn coords(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d].max(1);
        i /= shape[d].max(1);
    }
    c
}

fn lin(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |a, (&x, &n)| a * n + x)
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A host tensor seen on any device through a view that is the same on every device.
enum View {
    Plain,
    /// `testing::random_view` with this seed (the shape may change).
    Random(u64),
    /// The transpose of a contiguous transposed copy: same shape and values, permuted strides.
    Transposed,
    /// A narrow of the last dim of a wider tensor: same shape and values, offset and gaps.
    Narrowed,
}

struct Input {
    base: Tensor,
    view: View,
}

impl Input {
    /// Plain or a random view (the view decides the shape).
    fn new(base: Tensor, c: &mut Cases) -> Input {
        let view = if c.below(2) == 0 {
            View::Random(c.next_u64())
        } else {
            View::Plain
        };
        Input { base, view }
    }
    /// A view with the shape and values of `t`, usually non-contiguous.
    fn exact(t: Tensor, c: &mut Cases) -> Input {
        let nd = t.ndim();
        match c.below(3) {
            1 if nd >= 2 => Input {
                base: t.transpose(0, nd - 1).unwrap().contiguous().unwrap(),
                view: View::Transposed,
            },
            2 if nd >= 1 => Input {
                base: t.pad(&[(1, 0)], 9.0).unwrap(),
                view: View::Narrowed,
            },
            _ => Input {
                base: t,
                view: View::Plain,
            },
        }
    }
    fn on(&self, dev: &Device) -> Tensor {
        let t = self.base.to_device(dev).unwrap();
        let nd = t.ndim();
        match self.view {
            View::Plain => t,
            View::Random(s) => random_view(&t, &mut Cases(s)),
            View::Transposed => t.transpose(0, nd - 1).unwrap(),
            View::Narrowed => {
                let n = t.shape()[nd - 1];
                t.narrow(nd - 1, 1, n - 1).unwrap()
            }
        }
    }
    fn host(&self) -> Tensor {
        self.on(&Device::host())
    }
}

/// An i32 index tensor of `shape` holding `values`, contiguous or (when `strided`) every other
/// element of a tensor twice as long in the last dim.
struct Idx {
    base: Tensor,
    strided: bool,
}

impl Idx {
    fn new(values: &[i32], shape: &[usize], c: &mut Cases) -> Idx {
        let strided = !shape.is_empty() && c.below(2) == 0;
        if !strided {
            let base = Tensor::from_vec(values.to_vec(), shape, &Device::host()).unwrap();
            return Idx { base, strided };
        }
        let mut wide = shape.to_vec();
        *wide.last_mut().unwrap() *= 2;
        let v: Vec<i32> = values.iter().flat_map(|&x| [x, -7]).collect();
        let base = Tensor::from_vec(v, &wide, &Device::host()).unwrap();
        Idx { base, strided }
    }
    fn on(&self, dev: &Device) -> Tensor {
        let t = self.base.to_device(dev).unwrap();
        if self.strided {
            let d = t.ndim() - 1;
            let n = t.shape()[d];
            t.slice(d, 0, n, 2).unwrap()
        } else {
            t
        }
    }
}

fn random_indices(c: &mut Cases, n: usize, bound: usize) -> Vec<i32> {
    (0..n).map(|_| c.below(bound.max(1)) as i32).collect()
}

/// Runs `f` on every device that supports `dtype` and checks shape and values exactly against `want`.
fn check_all(
    devices: &[Device],
    what: &str,
    dtype: DType,
    shape: &[usize],
    want: &[f64],
    f: impl Fn(&Device) -> Result<Tensor>,
) {
    // The reference is converted to the dtype once, as the op rounds once.
    let want = netcl_ops::testing::host_tensor(dtype, want, shape)
        .to_vec_f64()
        .unwrap();
    for dev in devices {
        if dtype == DType::F64 && !dev.info().fp64 {
            continue;
        }
        let got = f(dev).unwrap_or_else(|e| panic!("{what} on {dev}: {e}"));
        assert_eq!(got.shape(), shape, "{what} on {dev}: shape");
        assert_eq!(got.dtype(), dtype, "{what} on {dev}: dtype");
        assert_eq!(got.device(), dev, "{what} on {dev}: device");
        assert_eq!(got.to_vec_f64().unwrap(), want, "{what} on {dev}");
    }
}

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
fn scatter_and_index_add_are_bit_identical_across_runs_and_devices() {
    let devices = test_devices().unwrap();
    // Many repeated indices and values that are not exact sums, so summation order matters.
    let (v, d, n) = (7, 71, 600);
    let mut c = Cases::new(77);
    let ids: Vec<i32> = (0..n).map(|_| c.below(v) as i32).collect();
    let grad = random_tensor(DType::F32, &[n, d], -1.0, 1.0, 5);
    let x = random_tensor(DType::F32, &[v, d], -1.0, 1.0, 6);
    let ids_t = Tensor::from_vec(ids, &[n], &Device::host()).unwrap();
    let host = (
        x.index_add(0, &ids_t, &grad)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        Tensor::embedding_backward(&grad, &ids_t, v)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        x.transpose(0, 1)
            .unwrap()
            .scatter_add(
                1,
                &ids_t.unsqueeze(0).unwrap().broadcast_to(&[d, n]).unwrap(),
                &grad.transpose(0, 1).unwrap(),
            )
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for dev in &devices {
        let (xd, gd, id) = (
            x.to_device(dev).unwrap(),
            grad.to_device(dev).unwrap(),
            ids_t.to_device(dev).unwrap(),
        );
        for run in 0..3 {
            let a = xd.index_add(0, &id, &gd).unwrap().to_vec::<f32>().unwrap();
            let b = Tensor::embedding_backward(&gd, &id, v)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let s = xd
                .transpose(0, 1)
                .unwrap()
                .scatter_add(
                    1,
                    &id.unsqueeze(0).unwrap().broadcast_to(&[d, n]).unwrap(),
                    &gd.transpose(0, 1).unwrap(),
                )
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            assert_eq!(bits(&a), bits(&host.0), "index_add run {run} on {dev}");
            assert_eq!(
                bits(&b),
                bits(&host.1),
                "embedding_backward run {run} on {dev}"
            );
            assert_eq!(bits(&s), bits(&host.2), "scatter_add run {run} on {dev}");
        }
    }
}

fn assert_err(r: Result<Tensor>, op: &str, needles: &[&str]) {
    let e = r.expect_err(op);
    let s = e.to_string();
    assert!(s.contains(op), "{s} should name {op}");
    for n in needles {
        assert!(s.contains(n), "{s} should contain {n}");
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

/// `check_close` against a float reference, then bit equality with the host op.
fn check_sum(what: &str, dtype: DType, got: &Tensor, want: &[f64], host: &Tensor) {
    let g = got.to_vec_f64().unwrap();
    check_close(&g, want, tolerance(dtype), 1.0, what).unwrap_or_else(|m| panic!("{m}"));
    assert_eq!(g, host.to_vec_f64().unwrap(), "{what}: bits of the host op");
}

#[test]
fn row_scatters_over_many_repeated_indices_match_the_host() {
    let devices = test_devices().unwrap();
    let host = Device::host();
    let mut c = Cases::new(0xE3_B0);
    // (V, D, ids shape): many repeats, V = 1, D = 1, no ids, multi-dim ids, past a sort chunk.
    let cases: [(usize, usize, &[usize]); 9] = [
        (50, 7, &[3000]),
        (50, 3, &[30, 100]),
        (1, 5, &[40]),
        (9, 1, &[2000]),
        (13, 4, &[0]),
        (300, 16, &[2, 700]),
        (40, 33, &[1025]),
        (7, 5, &[1]),
        (2000, 8, &[4, 1024]),
    ];
    for (case, &(v, d, ids_shape)) in cases.iter().enumerate() {
        let dtype = [DType::F32, DType::F64, DType::F16, DType::BF16][case % 4];
        let n = numel(ids_shape);
        let ids = random_indices(&mut c, n, v);
        let idx = Idx::new(&ids, ids_shape, &mut c);
        let mut gshape = ids_shape.to_vec();
        gshape.push(d);
        let g = Input::exact(
            random_tensor(dtype, &gshape, -1.0, 1.0, case as u64),
            &mut c,
        );
        let gv = g.host().to_vec_f64().unwrap();
        let mut want = vec![0.0; v * d];
        for (i, &x) in gv.iter().enumerate() {
            want[ids[i / d] as usize * d + i % d] += x;
        }
        let href = Tensor::embedding_backward(&g.host(), &idx.on(&host), v).unwrap();
        // index_add and index_select_backward along dim 0 of [V, 2, d'] with src [N, 2, d'].
        let x = Input::exact(
            random_tensor(dtype, &[v, d], -1.0, 1.0, 50 + case as u64),
            &mut c,
        );
        let flat = Idx::new(&ids, &[n], &mut c);
        let (d2, split) = if d % 2 == 0 { (d / 2, 2) } else { (d, 1) };
        let rows3 = |t: Tensor, r: usize| t.reshape(&[r, split, d2]).unwrap();
        let add_want: Vec<f64> = x
            .host()
            .to_vec_f64()
            .unwrap()
            .iter()
            .zip(&want)
            .map(|(a, b)| a + b)
            .collect();
        let gh = g.host().reshape(&[n, d]).unwrap();
        let add_ref = rows3(x.host(), v)
            .index_add(0, &flat.on(&host), &rows3(gh.clone(), n))
            .unwrap();
        let sel_ref =
            Tensor::index_select_backward(&rows3(gh, n), 0, &flat.on(&host), &[v, split, d2])
                .unwrap();
        for dev in &devices {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let what = format!("case {case} V {v} D {d} ids {ids_shape:?} {dtype} on {dev}");
            let gd = g.on(dev);
            for run in 0..2 {
                let got = Tensor::embedding_backward(&gd, &idx.on(dev), v).unwrap();
                assert_eq!(got.shape(), &[v, d], "{what}");
                check_sum(&format!("{what} run {run}"), dtype, &got, &want, &href);
            }
            let g2 = rows3(gd.reshape(&[n, d]).unwrap(), n);
            let sel = Tensor::index_select_backward(&g2, 0, &flat.on(dev), &[v, split, d2]);
            check_sum(
                &format!("{what} index_select_backward"),
                dtype,
                &sel.unwrap(),
                &want,
                &sel_ref,
            );
            let added = rows3(x.on(dev), v)
                .index_add(0, &flat.on(dev), &g2)
                .unwrap();
            check_sum(
                &format!("{what} index_add"),
                dtype,
                &added,
                &add_want,
                &add_ref,
            );
            // The same on 2-D views (strided x and grad as they come).
            let g2d = if ids_shape.len() == 1 {
                gd.clone()
            } else {
                gd.reshape(&[n, d]).unwrap()
            };
            let added = x.on(dev).index_add(0, &flat.on(dev), &g2d).unwrap();
            let add_ref = add_ref.reshape(&[v, d]).unwrap();
            check_sum(
                &format!("{what} 2-D index_add"),
                dtype,
                &added,
                &add_want,
                &add_ref,
            );
            let sel = Tensor::index_select_backward(&g2d, 0, &flat.on(dev), &[v, d]).unwrap();
            check_sum(
                &format!("{what} 2-D index_select_backward"),
                dtype,
                &sel,
                &want,
                &href,
            );
        }
    }
}

#[test]
fn embedding_backward_launches_the_sort_and_one_kernel() {
    for dev in test_devices()
        .unwrap()
        .into_iter()
        .filter(|d| d.is_opencl())
    {
        if dev.info().max_work_group_size < 256 || dev.info().local_mem_bytes < 8192 {
            continue; // smaller sort chunks: more launches than counted here
        }
        let (v, d, n) = (100, 4, 8192);
        let ids: Vec<i32> = (0..n as i32).map(|i| (i * 37) % v).collect();
        let ids = Tensor::from_vec(ids, &[8, n / 8], &dev).unwrap();
        let g = Tensor::ones(&[8, n / 8, d], DType::F32, &dev).unwrap();
        let (t0, s0) = (thread_launches_total(), thread_launches("scatter_add"));
        let w = Tensor::embedding_backward(&g, &ids, v as usize).unwrap();
        assert_eq!(
            thread_launches_total() - t0,
            11,
            "{dev}: 10 sort launches and 1"
        );
        assert_eq!(thread_launches("scatter_add"), s0, "{dev}");
        let counts = w.to_vec::<f32>().unwrap();
        let per_row = |r: usize| (0..n).filter(|&i| (i * 37) % v as usize == r).count();
        for r in 0..v as usize {
            assert_eq!(counts[r * d], per_row(r) as f32, "{dev}: row {r}");
        }
    }
}
