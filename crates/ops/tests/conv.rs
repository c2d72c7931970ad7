//! conv2d (+ input/weight/bias gradients) and max/avg/adaptive pooling (+ backwards) on every device against nested-loop f64 references; adjoint identities, determinism, errors.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, random_tensor, tolerance, Cases};
use netcl_ops::{Conv2dParams, DType, Device, Error, Pool2dParams, Tensor};

const FLOATS: [DType; 6] = [
    DType::F32,
    DType::F64,
    DType::F32,
    DType::F16,
    DType::F32,
    DType::BF16,
];

fn supports(dev: &Device, dtype: DType) -> bool {
    dtype != DType::F64 || dev.info().fp64
}

/// A random-valued (N, C, H, W) tensor that is contiguous, a channels-last permuted view, or a
/// sliced view with steps (its H and W dims do not merge), by `kind`.
fn input(dtype: DType, shape: [usize; 4], kind: usize, seed: u64) -> Tensor {
    let [n, c, h, w] = shape;
    match kind % 3 {
        0 => random_tensor(dtype, &shape, -1.0, 1.0, seed),
        1 => random_tensor(dtype, &[n, h, w, c], -1.0, 1.0, seed)
            .permute(&[0, 3, 1, 2])
            .unwrap(),
        _ => random_tensor(dtype, &[n, c + 1, h + 2, 2 * w], -1.0, 1.0, seed)
            .narrow(1, 1, c)
            .unwrap()
            .narrow(2, 2, h)
            .unwrap()
            .slice(3, 1, 2 * w, 2)
            .unwrap(),
    }
}

fn dims(t: &Tensor) -> [usize; 4] {
    let s = t.shape();
    [s[0], s[1], s[2], s[3]]
}

fn out_len(size: usize, k: usize, s: usize, p: usize, d: usize) -> usize {
    pool_len(size, k, s, p, d, false)
}

/// PyTorch's pooling output size: with `ceil`, rounded up, then one less when the last window
/// would start at or beyond the input's end plus its left padding.
fn pool_len(size: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> usize {
    let up = if ceil { s - 1 } else { 0 };
    let out = (size + 2 * p - d * (k - 1) - 1 + up) / s + 1;
    if ceil && (out - 1) * s >= size + p {
        out - 1
    } else {
        out
    }
}

/// For every (output, input, weight) element triple the forward multiplies: calls
/// `f(y_index, x_index, w_index)` in nested-loop order.
fn conv_taps(
    xs: [usize; 4],
    ws: [usize; 4],
    p: Conv2dParams,
    mut f: impl FnMut(usize, usize, usize),
) {
    let [n, c, h, w] = xs;
    let [co, cg, kh, kw] = ws;
    let (ho, wo) = (
        out_len(h, kh, p.stride.0, p.padding.0, p.dilation.0),
        out_len(w, kw, p.stride.1, p.padding.1, p.dilation.1),
    );
    let cog = co / p.groups;
    for b in 0..n {
        for o in 0..co {
            let g = o / cog;
            for oh in 0..ho {
                for ow in 0..wo {
                    let yi = ((b * co + o) * ho + oh) * wo + ow;
                    for ci in 0..cg {
                        let ch = g * cg + ci;
                        for ki in 0..kh {
                            let hh = (oh * p.stride.0 + ki * p.dilation.0) as isize
                                - p.padding.0 as isize;
                            if hh < 0 || hh as usize >= h {
                                continue;
                            }
                            for kj in 0..kw {
                                let wi = (ow * p.stride.1 + kj * p.dilation.1) as isize
                                    - p.padding.1 as isize;
                                if wi < 0 || wi as usize >= w {
                                    continue;
                                }
                                let xi = ((b * c + ch) * h + hh as usize) * w + wi as usize;
                                f(yi, xi, ((o * cg + ci) * kh + ki) * kw + kj);
                            }
                        }
                    }
                }
            }
        }
    }
}

struct ConvRef {
    y: Vec<f64>,
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
}

fn conv_ref(x: &Tensor, w: &Tensor, b: Option<&Tensor>, gy: &Tensor, p: Conv2dParams) -> ConvRef {
    let (xv, wv, gv) = (
        x.to_vec_f64().unwrap(),
        w.to_vec_f64().unwrap(),
        gy.to_vec_f64().unwrap(),
    );
    let gs = dims(gy);
    let per = gs[2] * gs[3];
    let mut y = vec![0.0; gv.len()];
    if let Some(b) = b {
        let bv = b.to_vec_f64().unwrap();
        for (i, v) in y.iter_mut().enumerate() {
            *v = bv[(i / per) % gs[1]];
        }
    }
    let (mut dx, mut dw) = (vec![0.0; xv.len()], vec![0.0; wv.len()]);
    conv_taps(dims(x), dims(w), p, |yi, xi, wi| {
        y[yi] += xv[xi] * wv[wi];
        dx[xi] += gv[yi] * wv[wi];
        dw[wi] += gv[yi] * xv[xi];
    });
    let mut db = vec![0.0; gs[1]];
    for (i, g) in gv.iter().enumerate() {
        db[(i / per) % gs[1]] += g;
    }
    ConvRef { y, dx, dw, db }
}

/// A random convolution: input shape, weight shape, params (groups incl. depthwise, and 1x1).
fn conv_case(c: &mut Cases, case: usize) -> ([usize; 4], [usize; 4], Conv2dParams) {
    let (groups, cg, cog) = match c.below(4) {
        0 => {
            let g = 1 + c.below(4);
            (g, 1, 1 + c.below(2)) // depthwise (with a channel multiplier)
        }
        1 => (2 + c.below(2), 1 + c.below(3), 1 + c.below(3)),
        _ => (1, 1 + c.below(4), 1 + c.below(5)),
    };
    let pointwise = case.is_multiple_of(5);
    let (kh, kw) = if pointwise {
        (1, 1)
    } else {
        (1 + c.below(3), 1 + c.below(3))
    };
    let mut p = Conv2dParams {
        stride: (1 + c.below(3), 1 + c.below(3)),
        padding: (c.below(3), c.below(3)),
        dilation: (1 + c.below(2), 1 + c.below(2)),
        groups,
    };
    if pointwise {
        p.stride = (1, 1);
        p.padding = (0, 0);
    }
    // Every 30th case is larger, so launches span several work-groups and GEMM tiles.
    let extra = if case % 30 == 7 { 16 } else { 0 };
    let size = |c: &mut Cases, k: usize, pd: usize, d: usize| {
        let eff = d * (k - 1) + 1;
        eff.saturating_sub(2 * pd).max(1) + c.below(7) + extra
    };
    let h = size(c, kh, p.padding.0, p.dilation.0);
    let w = size(c, kw, p.padding.1, p.dilation.1);
    let n = 1 + c.below(3);
    ([n, groups * cg, h, w], [groups * cog, cg, kh, kw], p)
}

fn tol_for(dtype: DType, k: usize) -> f64 {
    match dtype {
        DType::F32 => 1e-5 * (k as f64).sqrt().max(1.0),
        DType::F64 => 1e-10,
        d => tolerance(d) * 2.0,
    }
}

#[test]
fn conv2d_and_gradients_match_nested_loops_on_every_device() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xC0117);
    let mut checks = 0;
    for case in 0..260 {
        let dtype = FLOATS[case % FLOATS.len()];
        let (xs, ws, p) = conv_case(&mut c, case);
        let x = input(dtype, xs, c.below(3), case as u64);
        let w = random_tensor(dtype, &ws, -1.0, 1.0, case as u64 + 1);
        let bias =
            (c.below(2) == 0).then(|| random_tensor(dtype, &[ws[0]], -1.0, 1.0, case as u64 + 2));
        let ho = out_len(xs[2], ws[2], p.stride.0, p.padding.0, p.dilation.0);
        let wo = out_len(xs[3], ws[3], p.stride.1, p.padding.1, p.dilation.1);
        let gy = input(dtype, [xs[0], ws[0], ho, wo], c.below(3), case as u64 + 3);
        let r = conv_ref(&x, &w, bias.as_ref(), &gy, p);
        let k = ws[1] * ws[2] * ws[3];
        let kb = xs[0] * ho * wo;
        for dev in devices.iter().filter(|d| supports(d, dtype)) {
            let what =
                |op: &str| format!("case {case} {op} {dtype} x {xs:?} w {ws:?} {p:?} on {dev}");
            let (xd, wd, gd) = (
                x.to_device(dev).unwrap(),
                w.to_device(dev).unwrap(),
                gy.to_device(dev).unwrap(),
            );
            let bd = bias.as_ref().map(|b| b.to_device(dev).unwrap());
            let y = xd.conv2d(&wd, bd.as_ref(), p).unwrap();
            assert_eq!(y.shape(), gy.shape(), "{}", what("conv2d"));
            let got = y.to_vec_f64().unwrap();
            check_close(&got, &r.y, tol_for(dtype, k), 1.0, &what("conv2d")).unwrap();
            let dx = Tensor::conv2d_backward_input(&gd, &wd, &xs, p).unwrap();
            assert_eq!(dx.shape(), &xs);
            let got = dx.to_vec_f64().unwrap();
            check_close(&got, &r.dx, tol_for(dtype, k), 1.0, &what("backward_input")).unwrap();
            let dw = Tensor::conv2d_backward_weight(&gd, &xd, &ws, p).unwrap();
            assert_eq!(dw.shape(), &ws);
            let got = dw.to_vec_f64().unwrap();
            check_close(
                &got,
                &r.dw,
                tol_for(dtype, kb),
                2.0,
                &what("backward_weight"),
            )
            .unwrap();
            let db = Tensor::conv2d_backward_bias(&gd).unwrap();
            let got = db.to_vec_f64().unwrap();
            check_close(&got, &r.db, tol_for(dtype, kb), 2.0, &what("backward_bias")).unwrap();
            checks += 4;
        }
    }
    eprintln!("{checks} checks");
    assert!(checks >= 4 * 400, "{checks}");
}

fn dot(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter().zip(&b).map(|(x, y)| x * y).sum()
}

#[test]
fn conv2d_backwards_are_adjoints_in_f64() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xAD7);
    let mut checks = 0;
    for case in 0..60 {
        let (xs, ws, p) = conv_case(&mut c, case);
        let x = input(DType::F64, xs, case, case as u64);
        let w = random_tensor(DType::F64, &ws, -1.0, 1.0, case as u64 + 1);
        let ho = out_len(xs[2], ws[2], p.stride.0, p.padding.0, p.dilation.0);
        let wo = out_len(xs[3], ws[3], p.stride.1, p.padding.1, p.dilation.1);
        let g = random_tensor(
            DType::F64,
            &[xs[0], ws[0], ho, wo],
            -1.0,
            1.0,
            case as u64 + 2,
        );
        for dev in devices.iter().filter(|d| supports(d, DType::F64)) {
            let (xd, wd, gd) = (
                x.to_device(dev).unwrap(),
                w.to_device(dev).unwrap(),
                g.to_device(dev).unwrap(),
            );
            let lhs = dot(&xd.conv2d(&wd, None, p).unwrap(), &gd);
            let dx = Tensor::conv2d_backward_input(&gd, &wd, &xs, p).unwrap();
            let dw = Tensor::conv2d_backward_weight(&gd, &xd, &ws, p).unwrap();
            let what = format!("case {case} x {xs:?} w {ws:?} {p:?} on {dev}");
            check_close(&[dot(&xd, &dx)], &[lhs], 1e-10, 1.0, &what).unwrap();
            check_close(&[dot(&wd, &dw)], &[lhs], 1e-10, 1.0, &what).unwrap();
            checks += 2;
        }
    }
    eprintln!("{checks} checks");
    assert!(checks >= 120);
}

/// Nested-loop pooling references over row-major (N, C, H, W) values.
struct PoolRef {
    y: Vec<f64>,
    idx: Vec<i32>,
    dx: Vec<f64>,
}

fn max_pool_ref(x: &[f64], xs: [usize; 4], p: Pool2dParams, gy: &[f64]) -> PoolRef {
    let [n, c, h, w] = xs;
    let ho = pool_len(
        h,
        p.kernel.0,
        p.stride.0,
        p.padding.0,
        p.dilation.0,
        p.ceil_mode,
    );
    let wo = pool_len(
        w,
        p.kernel.1,
        p.stride.1,
        p.padding.1,
        p.dilation.1,
        p.ceil_mode,
    );
    let (mut y, mut idx, mut dx) = (vec![], vec![], vec![0.0; x.len()]);
    for pl in 0..n * c {
        for oh in 0..ho {
            for ow in 0..wo {
                let mut best: Option<(f64, usize)> = None;
                for ki in 0..p.kernel.0 {
                    for kj in 0..p.kernel.1 {
                        let hh =
                            (oh * p.stride.0 + ki * p.dilation.0) as isize - p.padding.0 as isize;
                        let ww =
                            (ow * p.stride.1 + kj * p.dilation.1) as isize - p.padding.1 as isize;
                        if hh < 0 || ww < 0 || hh as usize >= h || ww as usize >= w {
                            continue;
                        }
                        let at = hh as usize * w + ww as usize;
                        let v = x[pl * h * w + at];
                        if best.is_none_or(|(b, _)| v > b) {
                            best = Some((v, at));
                        }
                    }
                }
                // A dilated window may have no tap inside the input: -inf, index -1.
                let (v, at) = best.map_or((f64::NEG_INFINITY, -1), |(v, a)| (v, a as i32));
                if at >= 0 {
                    dx[pl * h * w + at as usize] += gy[y.len()];
                }
                y.push(v);
                idx.push(at);
            }
        }
    }
    PoolRef { y, idx, dx }
}

fn avg_pool_ref(x: &[f64], xs: [usize; 4], p: Pool2dParams, inc: bool, gy: &[f64]) -> PoolRef {
    let [n, c, h, w] = xs;
    let ho = pool_len(h, p.kernel.0, p.stride.0, p.padding.0, 1, p.ceil_mode);
    let wo = pool_len(w, p.kernel.1, p.stride.1, p.padding.1, 1, p.ceil_mode);
    let (mut y, mut dx) = (vec![], vec![0.0; x.len()]);
    for pl in 0..n * c {
        for oh in 0..ho {
            for ow in 0..wo {
                // Taps inside the input, and those inside the padded input (a ceil-mode window
                // may reach past the padding).
                let (mut taps, mut padded) = (vec![], 0);
                for ki in 0..p.kernel.0 {
                    for kj in 0..p.kernel.1 {
                        let hh = (oh * p.stride.0 + ki) as isize - p.padding.0 as isize;
                        let ww = (ow * p.stride.1 + kj) as isize - p.padding.1 as isize;
                        if hh >= 0 && ww >= 0 && (hh as usize) < h && (ww as usize) < w {
                            taps.push(pl * h * w + hh as usize * w + ww as usize);
                        }
                        let (ph, pw) = (p.padding.0 as isize, p.padding.1 as isize);
                        if hh < h as isize + ph && ww < w as isize + pw {
                            padded += 1;
                        }
                    }
                }
                let div = if inc {
                    padded as f64
                } else {
                    taps.len() as f64
                };
                let g = gy[y.len()];
                y.push(taps.iter().map(|&i| x[i]).sum::<f64>() / div);
                for &i in &taps {
                    dx[i] += g / div;
                }
            }
        }
    }
    PoolRef { y, idx: vec![], dx }
}

fn adaptive_ref(x: &[f64], xs: [usize; 4], out: (usize, usize), gy: &[f64]) -> PoolRef {
    let [n, c, h, w] = xs;
    let (mut y, mut dx) = (vec![], vec![0.0; x.len()]);
    let win = |o: usize, size: usize, out: usize| {
        let s = (o as f64 * size as f64 / out as f64).floor() as usize;
        let e = ((o + 1) as f64 * size as f64 / out as f64).ceil() as usize;
        s..e
    };
    for pl in 0..n * c {
        for oh in 0..out.0 {
            for ow in 0..out.1 {
                let taps: Vec<usize> = win(oh, h, out.0)
                    .flat_map(|hh| win(ow, w, out.1).map(move |ww| pl * h * w + hh * w + ww))
                    .collect();
                let div = taps.len() as f64;
                let g = gy[y.len()];
                y.push(taps.iter().map(|&i| x[i]).sum::<f64>() / div);
                for &i in &taps {
                    dx[i] += g / div;
                }
            }
        }
    }
    PoolRef { y, idx: vec![], dx }
}

#[test]
fn pooling_and_backwards_match_nested_loops_on_every_device() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0x9001);
    let mut checks = 0;
    for case in 0..200 {
        let dtype = FLOATS[case % FLOATS.len()];
        let kind = case % 3;
        let kernel = (1 + c.below(3), 1 + c.below(3));
        let dilation = if kind == 0 {
            (1 + c.below(2), 1 + c.below(2))
        } else {
            (1, 1)
        };
        let eff = (
            dilation.0 * (kernel.0 - 1) + 1,
            dilation.1 * (kernel.1 - 1) + 1,
        );
        let p = Pool2dParams {
            kernel,
            stride: (1 + c.below(3), 1 + c.below(3)),
            padding: (c.below(eff.0 / 2 + 1), c.below(eff.1 / 2 + 1)),
            dilation,
            ceil_mode: c.below(2) == 0,
        };
        let inc = c.below(2) == 0;
        let xs = [
            1 + c.below(3),
            1 + c.below(4),
            eff.0.saturating_sub(2 * p.padding.0).max(1) + c.below(7),
            eff.1.saturating_sub(2 * p.padding.1).max(1) + c.below(7),
        ];
        let adaptive_out = (1 + c.below(xs[2] + 1), 1 + c.below(xs[3] + 1));
        let x = input(dtype, xs, c.below(3), case as u64);
        let xv = x.to_vec_f64().unwrap();
        let ys = match kind {
            2 => [xs[0], xs[1], adaptive_out.0, adaptive_out.1],
            _ => [
                xs[0],
                xs[1],
                pool_len(
                    xs[2],
                    kernel.0,
                    p.stride.0,
                    p.padding.0,
                    dilation.0,
                    p.ceil_mode,
                ),
                pool_len(
                    xs[3],
                    kernel.1,
                    p.stride.1,
                    p.padding.1,
                    dilation.1,
                    p.ceil_mode,
                ),
            ],
        };
        let gy = input(dtype, ys, c.below(3), case as u64 + 1);
        let gv = gy.to_vec_f64().unwrap();
        let r = match kind {
            0 => max_pool_ref(&xv, xs, p, &gv),
            1 => avg_pool_ref(&xv, xs, p, inc, &gv),
            _ => adaptive_ref(&xv, xs, adaptive_out, &gv),
        };
        let tol = tol_for(dtype, 9);
        for dev in devices.iter().filter(|d| supports(d, dtype)) {
            let what = format!("case {case} kind {kind} {dtype} x {xs:?} {p:?} inc {inc} on {dev}");
            let (xd, gd) = (x.to_device(dev).unwrap(), gy.to_device(dev).unwrap());
            let (y, dx) = match kind {
                0 => {
                    let (y, idx) = xd.max_pool2d(p).unwrap();
                    assert_eq!(idx.to_vec::<i32>().unwrap(), r.idx, "{what}");
                    let dx = Tensor::max_pool2d_backward(&gd, &idx, &xs, p).unwrap();
                    (y, dx)
                }
                1 => (
                    xd.avg_pool2d(p, inc).unwrap(),
                    Tensor::avg_pool2d_backward(&gd, &xs, p, inc).unwrap(),
                ),
                _ => (
                    xd.adaptive_avg_pool2d(adaptive_out).unwrap(),
                    Tensor::adaptive_avg_pool2d_backward(&gd, &xs).unwrap(),
                ),
            };
            assert_eq!(y.shape(), &ys, "{what}");
            assert_eq!(dx.shape(), &xs, "{what}");
            check_close(&y.to_vec_f64().unwrap(), &r.y, tol, 1.0, &what).unwrap();
            check_close(&dx.to_vec_f64().unwrap(), &r.dx, tol, 1.0, &what).unwrap();
            checks += 2;
        }
    }
    eprintln!("{checks} checks");
    assert!(checks >= 2 * 350, "{checks}");
}

#[test]
fn max_pool_backward_over_windows_tiling_the_input_matches_nested_loops() {
    // Kernel = stride, no padding, the input a whole number of windows: the backward writes
    // each window's pixels from one work-item. Inputs and gradients as views too; every pixel
    // gets one window's gradient or none, so the values match exactly.
    let devices = test_devices().unwrap();
    for (case, (xs, k)) in [
        ([2, 3, 8, 6], (2, 2)),
        ([1, 2, 9, 6], (3, 3)),
        ([3, 1, 4, 10], (2, 1)),
        ([1, 4, 5, 5], (1, 5)),
    ]
    .into_iter()
    .enumerate()
    {
        for dtype in FLOATS {
            let p = Pool2dParams::new(k);
            let x = input(dtype, xs, case % 3, 40 + case as u64);
            let ys = [xs[0], xs[1], xs[2] / k.0, xs[3] / k.1];
            let gy = input(dtype, ys, (case + 1) % 3, 50 + case as u64);
            let r = max_pool_ref(&x.to_vec_f64().unwrap(), xs, p, &gy.to_vec_f64().unwrap());
            for dev in devices.iter().filter(|d| supports(d, dtype)) {
                let what = format!("{dtype} x {xs:?} kernel {k:?} on {dev}");
                let (_, idx) = x.to_device(dev).unwrap().max_pool2d(p).unwrap();
                assert_eq!(idx.to_vec::<i32>().unwrap(), r.idx, "{what}");
                let g = gy.to_device(dev).unwrap();
                let dx = Tensor::max_pool2d_backward(&g, &idx, &xs, p).unwrap();
                check_close(&dx.to_vec_f64().unwrap(), &r.dx, 0.0, 0.0, &what).unwrap();
            }
        }
    }
}

#[test]
fn ceil_mode_pooling_gives_pytorchs_values() {
    // torch.arange(25.).view(1, 1, 5, 5) with kernel 2, ceil_mode=True: a partial last row and
    // column; avg_pool2d (count_include_pad) divides a partial window by its clipped size.
    let x: Vec<f64> = (0..25).map(f64::from).collect();
    let p = Pool2dParams::new((2, 2)).ceil_mode(true);
    let max = [6.0, 8.0, 9.0, 16.0, 18.0, 19.0, 21.0, 23.0, 24.0];
    let avg = [3.0, 5.0, 6.5, 13.0, 15.0, 16.5, 20.5, 22.5, 24.0];
    // kernel 3, stride 3, padding 1 over 5: rounding up gives 3 windows, but the third would
    // start in the right padding, so PyTorch keeps 2.
    let q = Pool2dParams::new((3, 3)).padding((1, 1)).ceil_mode(true);
    let max_q = [6.0, 9.0, 21.0, 24.0];
    for dev in test_devices().unwrap() {
        let xd = Tensor::from_vec(x.clone(), &[1, 1, 5, 5], &dev).unwrap();
        let (y, idx) = xd.max_pool2d(p).unwrap();
        assert_eq!(y.shape(), &[1, 1, 3, 3], "on {dev}");
        assert_eq!(y.to_vec_f64().unwrap(), max, "on {dev}");
        assert_eq!(
            idx.to_vec::<i32>().unwrap(),
            [6, 8, 9, 16, 18, 19, 21, 23, 24]
        );
        assert_eq!(xd.avg_pool2d(p, true).unwrap().to_vec_f64().unwrap(), avg);
        let (yq, _) = xd.max_pool2d(q).unwrap();
        assert_eq!(yq.shape(), &[1, 1, 2, 2], "on {dev}");
        assert_eq!(yq.to_vec_f64().unwrap(), max_q, "on {dev}");
    }
}

fn bits(t: &Tensor) -> Vec<u8> {
    t.to_host_data().unwrap().as_bytes().to_vec()
}

#[test]
fn reruns_are_bit_identical() {
    let p = Conv2dParams {
        stride: (2, 1),
        padding: (1, 2),
        dilation: (1, 2),
        groups: 2,
    };
    let pp = Pool2dParams {
        kernel: (3, 3),
        stride: (1, 2),
        padding: (1, 1),
        dilation: (1, 1),
        ceil_mode: true,
    };
    for dev in test_devices().unwrap() {
        let x = random_tensor(DType::F32, &[3, 4, 19, 23], -1.0, 1.0, 1)
            .to_device(&dev)
            .unwrap();
        let w = random_tensor(DType::F32, &[6, 2, 3, 3], -1.0, 1.0, 2)
            .to_device(&dev)
            .unwrap();
        let b = random_tensor(DType::F32, &[6], -1.0, 1.0, 3)
            .to_device(&dev)
            .unwrap();
        let run = || {
            let y = x.conv2d(&w, Some(&b), p).unwrap();
            let dx = Tensor::conv2d_backward_input(&y, &w, x.shape(), p).unwrap();
            let dw = Tensor::conv2d_backward_weight(&y, &x, w.shape(), p).unwrap();
            let db = Tensor::conv2d_backward_bias(&y).unwrap();
            let (m, idx) = x.max_pool2d(pp).unwrap();
            let dm = Tensor::max_pool2d_backward(&m, &idx, x.shape(), pp).unwrap();
            let da = Tensor::avg_pool2d_backward(&m, x.shape(), pp, false).unwrap();
            let a = x.adaptive_avg_pool2d((5, 7)).unwrap();
            let dad = Tensor::adaptive_avg_pool2d_backward(&a, x.shape()).unwrap();
            [y, dx, dw, db, m, dm, da, a, dad].map(|t| bits(&t))
        };
        assert_eq!(run(), run(), "on {dev}");
    }
}

#[test]
fn pointwise_conv_matches_the_general_path() {
    // 1x1 at stride 1 without padding takes the no-im2col path; stride 2 takes im2col.
    for dev in test_devices().unwrap() {
        let x = input(DType::F32, [2, 6, 5, 7], 2, 4)
            .to_device(&dev)
            .unwrap();
        let w = random_tensor(DType::F32, &[4, 3, 1, 1], -1.0, 1.0, 5)
            .to_device(&dev)
            .unwrap();
        let p = Conv2dParams {
            groups: 2,
            ..Conv2dParams::default()
        };
        let fast = x.conv2d(&w, None, p).unwrap();
        let padded = Conv2dParams {
            padding: (1, 1),
            ..p
        };
        let slow = x.conv2d(&w, None, padded).unwrap();
        let inner = slow.narrow(2, 1, 5).unwrap().narrow(3, 1, 7).unwrap();
        let (a, b) = (fast.to_vec_f64().unwrap(), inner.to_vec_f64().unwrap());
        check_close(&a, &b, 1e-6, 1.0, &format!("1x1 on {dev}")).unwrap();
    }
}

fn expect_err(r: Result<Tensor, Error>, op: &str, shape: &str) {
    let e = r.expect_err("bad input must fail");
    let msg = e.to_string();
    assert!(msg.contains(op), "{msg} does not name {op}");
    assert!(msg.contains(shape), "{msg} does not name {shape}");
}

#[test]
fn bad_input_is_an_error_naming_the_op_and_shapes() {
    let h = Device::host();
    let f = |s: &[usize]| Tensor::zeros(s, DType::F32, &h).unwrap();
    let d = Conv2dParams::default();
    let x = f(&[2, 4, 5, 5]);
    // channel mismatch
    expect_err(
        x.conv2d(&f(&[3, 3, 3, 3]), None, d),
        "conv2d",
        "[3, 3, 3, 3]",
    );
    // groups not dividing channels
    let g3 = Conv2dParams { groups: 3, ..d };
    expect_err(
        x.conv2d(&f(&[3, 1, 3, 3]), None, g3),
        "conv2d",
        "[2, 4, 5, 5]",
    );
    // kernel larger than the padded input
    expect_err(
        x.conv2d(&f(&[3, 4, 6, 6]), None, d),
        "conv2d",
        "[3, 4, 6, 6]",
    );
    let dil = Conv2dParams {
        dilation: (3, 3),
        ..d
    };
    expect_err(
        x.conv2d(&f(&[3, 4, 3, 3]), None, dil),
        "conv2d",
        "[2, 4, 5, 5]",
    );
    // wrong weight rank, wrong input rank
    expect_err(x.conv2d(&f(&[3, 4, 3]), None, d), "conv2d", "[3, 4, 3]");
    expect_err(
        f(&[4, 5, 5]).conv2d(&f(&[3, 4, 3, 3]), None, d),
        "conv2d",
        "[4, 5, 5]",
    );
    // bias shape, zero stride
    expect_err(
        x.conv2d(&f(&[3, 4, 3, 3]), Some(&f(&[4])), d),
        "conv2d",
        "[4]",
    );
    let s0 = Conv2dParams {
        stride: (0, 1),
        ..d
    };
    expect_err(x.conv2d(&f(&[3, 4, 3, 3]), None, s0), "conv2d", "(0, 1)");
    // dtype mismatch and integer dtypes
    let w64 = Tensor::zeros(&[3, 4, 3, 3], DType::F64, &h).unwrap();
    expect_err(x.conv2d(&w64, None, d), "conv2d", "[3, 4, 3, 3]");
    let xi = Tensor::zeros(&[2, 4, 5, 5], DType::I32, &h).unwrap();
    expect_err(xi.conv2d(&xi, None, d), "conv2d", "[2, 4, 5, 5]");
    // backward shape mismatches
    let w = f(&[3, 4, 3, 3]);
    expect_err(
        Tensor::conv2d_backward_input(&f(&[2, 3, 4, 3]), &w, &[2, 4, 5, 5], d),
        "conv2d_backward_input",
        "[2, 3, 4, 3]",
    );
    expect_err(
        Tensor::conv2d_backward_weight(&f(&[2, 3, 3, 3]), &x, &[3, 2, 3, 3], d),
        "conv2d_backward_weight",
        "[3, 2, 3, 3]",
    );
    expect_err(
        Tensor::conv2d_backward_bias(&f(&[2, 3])),
        "conv2d_backward_bias",
        "[2, 3]",
    );
    // pooling
    let pp = Pool2dParams::new((6, 2));
    expect_err(x.max_pool2d(pp).map(|r| r.0), "max_pool2d", "[2, 4, 5, 5]");
    let wide_pad = Pool2dParams {
        padding: (2, 0),
        ..Pool2dParams::new((3, 3))
    };
    expect_err(
        x.max_pool2d(wide_pad).map(|r| r.0),
        "max_pool2d",
        "[2, 4, 5, 5]",
    );
    let dilated = Pool2dParams {
        dilation: (2, 2),
        ..Pool2dParams::new((2, 2))
    };
    expect_err(x.avg_pool2d(dilated, true), "avg_pool2d", "(2, 2)");
    expect_err(
        f(&[4, 5, 5]).avg_pool2d(Pool2dParams::new((2, 2)), true),
        "avg_pool2d",
        "[4, 5, 5]",
    );
    expect_err(
        x.adaptive_avg_pool2d((0, 2)),
        "adaptive_avg_pool2d",
        "(0, 2)",
    );
    let (y, idx) = x.max_pool2d(Pool2dParams::new((2, 2))).unwrap();
    let idx_f = f(idx.shape());
    expect_err(
        Tensor::max_pool2d_backward(&y, &idx_f, &[2, 4, 5, 5], Pool2dParams::new((2, 2))),
        "max_pool2d_backward",
        "[2, 4, 2, 2]",
    );
    expect_err(
        Tensor::max_pool2d_backward(&y, &idx, &[2, 4, 7, 7], Pool2dParams::new((2, 2))),
        "max_pool2d_backward",
        "[2, 4, 2, 2]",
    );
    expect_err(
        Tensor::adaptive_avg_pool2d_backward(&f(&[2, 4, 3]), &[2, 4, 5, 5]),
        "adaptive_avg_pool2d_backward",
        "[2, 4, 3]",
    );
    // device mismatch
    for dev in test_devices().unwrap().into_iter().filter(|d| !d.is_host()) {
        let xd = x.to_device(&dev).unwrap();
        expect_err(xd.conv2d(&w, None, d), "conv2d", "[3, 4, 3, 3]");
        expect_err(
            Tensor::max_pool2d_backward(
                &y.to_device(&dev).unwrap(),
                &idx,
                &[2, 4, 5, 5],
                Pool2dParams::new((2, 2)),
            ),
            "max_pool2d_backward",
            "[2, 4, 2, 2]",
        );
    }
}
