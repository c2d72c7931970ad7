//! Layers, Sequential, init and losses on every device: forwards against host references, parameter gradients against finite differences, errors naming the layer.
use netcl_autograd::{gradcheck, GradcheckOptions, Tape, Var};
use netcl_core_devices::test_devices;
use netcl_nn::*;
use netcl_ops::testing::random_tensor;
use netcl_ops::{Conv2dParams, DType, Device, Generator, Tensor};

fn rnd(dev: &Device, dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    random_tensor(dtype, shape, -1.0, 1.0, seed)
        .to_device(dev)
        .unwrap()
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

/// d(sum(model(x) * proj)) / dp for every parameter, by backward and by central differences (f64).
fn check_module_grads(model: &dyn Module, x: &Tensor, what: &str) {
    let tape = Tape::new();
    let y = model.forward(&tape, &Var::from(x)).unwrap();
    let proj = random_tensor(DType::F64, y.shape(), -1.0, 1.0, 99)
        .to_device(x.device())
        .unwrap();
    let pv = proj.to_vec_f64().unwrap();
    for p in model.parameters() {
        p.zero_grad();
    }
    tape.backward_with(&y, &proj).unwrap();
    let eval = || -> f64 {
        let y = model.forward(&Tape::no_grad(), &Var::from(x)).unwrap();
        y.value()
            .to_vec_f64()
            .unwrap()
            .iter()
            .zip(&pv)
            .map(|(a, b)| a * b)
            .sum()
    };
    for (name, p) in model.named_parameters() {
        let g = p
            .grad()
            .unwrap_or_else(|| panic!("{what}: {name} got no gradient"))
            .to_vec_f64()
            .unwrap();
        let base = p.value().to_vec_f64().unwrap();
        let n = base.len();
        for j in (0..n).step_by((n / 6).max(1)) {
            let at = |d: f64| {
                let mut v = base.clone();
                v[j] += d;
                p.assign(&Tensor::from_vec(v, p.shape(), &Device::host()).unwrap())
                    .unwrap();
                eval()
            };
            let num = (at(1e-6) - at(-1e-6)) / 2e-6;
            at(0.0);
            assert!(
                (num - g[j]).abs() <= 1e-6 + 1e-4 * num.abs(),
                "{what} {name}[{j}]: backward {} vs numeric {num}",
                g[j]
            );
        }
    }
}

#[test]
fn linear_matches_matmul_and_fuses_relu() {
    for dev in test_devices().unwrap() {
        let mut g = Generator::new(1);
        let lin = Linear::new(5, 3, &dev, &mut g).unwrap();
        let x = rnd(&dev, DType::F32, &[4, 5], 2);
        let y = lin.forward(&Tape::no_grad(), &Var::from(&x)).unwrap();
        let want = x
            .to_device(&Device::host())
            .unwrap()
            .matmul(
                &lin.weight
                    .value()
                    .to_device(&Device::host())
                    .unwrap()
                    .transpose(0, 1)
                    .unwrap(),
            )
            .unwrap()
            .add(
                &lin.bias
                    .as_ref()
                    .unwrap()
                    .value()
                    .to_device(&Device::host())
                    .unwrap(),
            )
            .unwrap();
        close(
            &y.value().to_vec_f64().unwrap(),
            &want.to_vec_f64().unwrap(),
            1e-5,
            "linear",
        );
        // Sequential fuses Linear + ReLU; the result and gradients equal the unfused pair.
        let seq = Sequential::new()
            .with(Linear::new(5, 3, &dev, &mut Generator::new(7)).unwrap())
            .with(ReLU);
        let lin2 = Linear::new(5, 3, &dev, &mut Generator::new(7)).unwrap();
        let (t1, t2) = (Tape::new(), Tape::new());
        let a = seq.forward(&t1, &Var::from(&x)).unwrap();
        let b = lin2.forward(&t2, &Var::from(&x)).unwrap().relu().unwrap();
        assert_eq!(t1.len() + 1, t2.len(), "fused: one op fewer on the tape");
        close(
            &a.value().to_vec_f64().unwrap(),
            &b.value().to_vec_f64().unwrap(),
            0.0,
            "fused relu",
        );
        t1.backward(&a.sum_all().unwrap()).unwrap();
        t2.backward(&b.sum_all().unwrap()).unwrap();
        let (ga, gb) = (
            seq.parameters()[0].grad().unwrap(),
            lin2.weight.grad().unwrap(),
        );
        close(
            &ga.to_vec_f64().unwrap(),
            &gb.to_vec_f64().unwrap(),
            1e-6,
            "fused relu grad",
        );
    }
}

#[test]
fn module_parameter_gradients_match_finite_differences() {
    for dev in test_devices().unwrap() {
        let mut g = Generator::new(3);
        let f64lin = |i, o, g: &mut Generator| {
            Linear::with_init(i, o, true, Init::Default, DType::F64, &dev, g).unwrap()
        };
        let mlp = Sequential::new()
            .with(f64lin(6, 5, &mut g))
            .with(Tanh)
            .with(f64lin(5, 4, &mut g))
            .with(ReLU)
            .with(f64lin(4, 2, &mut g));
        check_module_grads(&mlp, &rnd(&dev, DType::F64, &[3, 6], 4), "mlp");
        let conv = |i, o, g: &mut Generator| {
            let p = Conv2dParams {
                padding: (1, 1),
                ..Default::default()
            };
            Conv2d::with_init(
                i,
                o,
                (3, 3),
                p,
                true,
                Init::KaimingUniform,
                DType::F64,
                &dev,
                g,
            )
            .unwrap()
        };
        let cnn = Sequential::new()
            .with(conv(1, 2, &mut g))
            .with(GELU)
            .with(MaxPool2d::new(2))
            .with(Flatten)
            .with(f64lin(8, 3, &mut g));
        check_module_grads(&cnn, &rnd(&dev, DType::F64, &[2, 1, 4, 4], 5), "cnn");
    }
}

#[test]
fn named_parameters_and_describe() {
    let dev = Device::host();
    let mut g = Generator::new(0);
    let m = Sequential::new()
        .with(Conv2d::new(1, 4, 3, Conv2dParams::default(), &dev, &mut g).unwrap())
        .with(BatchNorm2d::new(4, &dev).unwrap())
        .with(ReLU)
        .with(Flatten)
        .with(Dropout::new(0.5, 1).unwrap())
        .with(Linear::new(16, 2, &dev, &mut g).unwrap());
    let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"]
    );
    let bufs: Vec<String> = m.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(bufs, ["1.running_mean", "1.running_var"]);
    assert_eq!(m.num_parameters(), 4 * 9 + 4 + 4 + 4 + 16 * 2 + 2);
    let d = m.describe();
    assert_eq!(d["layers"][0]["type"], "Conv2d");
    assert_eq!(d["layers"][5]["in"], 16);
}

#[test]
fn sequential_errors_name_the_layer() {
    let dev = Device::host();
    let mut g = Generator::new(0);
    let m = Sequential::new()
        .with(Linear::new(4, 3, &dev, &mut g).unwrap())
        .with(ReLU)
        .with(Linear::new(5, 2, &dev, &mut g).unwrap());
    let err = m
        .forward(
            &Tape::no_grad(),
            &Var::from(rnd(&dev, DType::F32, &[2, 4], 1)),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layer 2 (Linear) of Sequential: linear")
            && err.contains("[2, 3]")
            && err.contains("[2, 5]"),
        "{err}"
    );
}

/// The debug mode's creation site is the line that called the model, through Sequential and a
/// Linear fused with its ReLU (`#[track_caller]` down from `Module::forward`), on every device.
#[test]
fn anomaly_site_is_the_line_that_called_the_model() {
    for dev in test_devices().unwrap() {
        let w = Tensor::full(&[2, 2], 1e30, DType::F32, &dev).unwrap();
        let lin = Linear::from_weights(w, None).unwrap();
        let m = Sequential::new().with(lin).with(ReLU);
        let x = Var::from(Tensor::full(&[1, 2], 1e30, DType::F32, &dev).unwrap());
        let _guard = netcl_core_devices::debug::DebugGuard::anomaly();
        let line = line!() + 1;
        let err = m.forward(&Tape::no_grad(), &x).unwrap_err().to_string();
        assert!(err.contains("linear"), "{dev}: {err}");
        assert!(
            err.contains(&format!("tests/layers.rs:{line}:")),
            "{dev}: the site should be line {line} of this file: {err}"
        );
    }
}

#[test]
fn init_rules_have_the_right_spread() {
    let dev = Device::host();
    let mut g = Generator::new(11);
    let (fi, fo) = (400, 100);
    let stats = |t: Tensor| {
        let v = t.to_vec_f64().unwrap();
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
        let max = v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        (mean, sd, max)
    };
    let cases = [
        (Init::Default, 1.0 / 20.0 / 3f64.sqrt(), Some(1.0 / 20.0)),
        (
            Init::XavierUniform { gain: 1.0 },
            (2.0 / 500.0f64).sqrt(),
            Some((6.0 / 500.0f64).sqrt()),
        ),
        (
            Init::XavierNormal { gain: 1.0 },
            (2.0 / 500.0f64).sqrt(),
            None,
        ),
        (
            Init::KaimingUniform,
            (2.0 / 400.0f64).sqrt(),
            Some((6.0 / 400.0f64).sqrt()),
        ),
        (Init::KaimingNormal, (2.0 / 400.0f64).sqrt(), None),
    ];
    for (init, sd_want, bound) in cases {
        let (mean, sd, max) = stats(
            init.tensor(&[fo, fi], fi, fo, DType::F32, &dev, &mut g)
                .unwrap(),
        );
        assert!(
            mean.abs() < 0.05 * sd_want * 10.0 && (sd / sd_want - 1.0).abs() < 0.03,
            "{init:?}: mean {mean} sd {sd} want {sd_want}"
        );
        if let Some(b) = bound {
            assert!(max <= b && max > 0.98 * b, "{init:?}: max {max} bound {b}");
        }
    }
    // Seeded: the same seed gives the same weights.
    let a = Linear::new(3, 2, &dev, &mut Generator::new(5)).unwrap();
    let b = Linear::new(3, 2, &dev, &mut Generator::new(5)).unwrap();
    assert_eq!(
        a.weight.value().to_vec_f64().unwrap(),
        b.weight.value().to_vec_f64().unwrap()
    );
}

#[test]
fn losses_against_host_formulas_and_gradcheck() {
    let logits = [
        0.5, -1.0, 2.0, 0.1, 0.3, 0.3, -0.7, 1.2, 0.0, 0.4, -0.2, 0.9,
    ];
    let targets = [2i32, 0, 3];
    let (n, c) = (3, 4);
    for dev in test_devices().unwrap() {
        let x = Tensor::from_vec(logits.to_vec(), &[n, c], &dev).unwrap();
        let t = Tensor::from_vec(targets.to_vec(), &[n], &dev).unwrap();
        for (eps, ignore) in [(0.0, None), (0.1, None), (0.2, Some(0))] {
            let opts = CrossEntropyOptions {
                ignore_index: ignore,
                label_smoothing: eps,
            };
            let got = cross_entropy_with(&Var::from(&x), &t, opts)
                .unwrap()
                .item()
                .unwrap();
            let (mut sum, mut cnt) = (0.0, 0.0);
            for i in 0..n {
                if Some(targets[i]) == ignore {
                    continue;
                }
                let row = &logits[i * c..(i + 1) * c];
                let lse = row.iter().map(|v: &f64| v.exp()).sum::<f64>().ln();
                let logp: Vec<f64> = row.iter().map(|v| v - lse).collect();
                let smooth = -logp.iter().sum::<f64>() / c as f64;
                sum += (1.0 - eps) * -logp[targets[i] as usize] + eps * smooth;
                cnt += 1.0;
            }
            close(
                &[got],
                &[sum / cnt],
                1e-12,
                &format!("cross_entropy eps {eps} ignore {ignore:?} on {dev}"),
            );
            gradcheck(
                |v| cross_entropy_with(&v[0], &t, opts),
                std::slice::from_ref(&x),
                GradcheckOptions::default(),
            )
            .unwrap();
        }
        let nll = nll_loss(&Var::from(&x).log_softmax(1).unwrap(), &t)
            .unwrap()
            .item()
            .unwrap();
        let ce = cross_entropy(&Var::from(&x), &t).unwrap().item().unwrap();
        close(&[nll], &[ce], 1e-12, "nll of log_softmax = cross_entropy");
        gradcheck(
            |v| nll_loss(&v[0], &t),
            std::slice::from_ref(&x),
            GradcheckOptions::default(),
        )
        .unwrap();
        let y = Tensor::from_vec(vec![1.0f64; 12], &[3, 4], &dev).unwrap();
        let mse = mse_loss(&Var::from(&x), &Var::from(&y))
            .unwrap()
            .item()
            .unwrap();
        close(
            &[mse],
            &[logits.iter().map(|v| (v - 1.0) * (v - 1.0)).sum::<f64>() / 12.0],
            1e-12,
            "mse",
        );
        gradcheck(
            |v| mse_loss(&v[0], &v[1]),
            &[x.clone(), y],
            GradcheckOptions::default(),
        )
        .unwrap();
    }
}

#[test]
fn batch_norm_and_dropout_modes() {
    for dev in test_devices().unwrap() {
        let mut bn = BatchNorm2d::new(2, &dev).unwrap();
        let x = rnd(&dev, DType::F32, &[4, 2, 3, 3], 20)
            .add_scalar(3.0)
            .unwrap();
        bn.forward(&Tape::no_grad(), &Var::from(&x)).unwrap();
        let xs = x.to_vec_f64().unwrap();
        for ch in 0..2 {
            let vals: Vec<f64> = (0..4)
                .flat_map(|n| (0..9).map(move |k| (n, k)))
                .map(|(n, k)| xs[n * 18 + ch * 9 + k])
                .collect();
            let m = vals.iter().sum::<f64>() / 36.0;
            let var = vals.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 35.0;
            let rm = bn.running_mean.to_vec_f64().unwrap()[ch];
            let rv = bn.running_var.to_vec_f64().unwrap()[ch];
            close(
                &[rm, rv],
                &[0.1 * m, 0.9 + 0.1 * var],
                1e-5,
                "running stats",
            );
        }
        bn.eval();
        let y = bn
            .forward(&Tape::no_grad(), &Var::from(&x))
            .unwrap()
            .value()
            .to_vec_f64()
            .unwrap();
        let (rm, rv) = (
            bn.running_mean.to_vec_f64().unwrap(),
            bn.running_var.to_vec_f64().unwrap(),
        );
        let want: Vec<f64> = xs
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let ch = (i / 9) % 2;
                (v - rm[ch]) / (rv[ch] + 1e-5).sqrt()
            })
            .collect();
        close(&y, &want, 1e-5, "batch norm eval");

        let mut d = Dropout::new(0.25, 9).unwrap();
        let ones = Tensor::ones(&[4000], DType::F32, &dev).unwrap();
        let y = d
            .forward(&Tape::no_grad(), &Var::from(&ones))
            .unwrap()
            .value()
            .to_vec_f64()
            .unwrap();
        let dropped = y.iter().filter(|&&v| v == 0.0).count() as f64 / 4000.0;
        assert!((dropped - 0.25).abs() < 0.03, "dropout rate {dropped}");
        assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
        d.eval();
        let y = d.forward(&Tape::no_grad(), &Var::from(&ones)).unwrap();
        assert!(
            y.value().to_vec_f64().unwrap().iter().all(|&v| v == 1.0),
            "dropout in eval mode is the identity"
        );
    }
}

#[test]
fn pooling_layers_follow_pytorchs_defaults() {
    // A 2x2 plane of ones, kernel 2 with padding 1: each window holds one pixel and three pads.
    // PyTorch's AvgPool2d divides by the padded window (0.25) unless count_include_pad=False (1).
    let p = netcl_ops::Pool2dParams::new((2, 2)).padding((1, 1));
    for dev in test_devices().unwrap() {
        let x = Var::from(&Tensor::ones(&[1, 1, 2, 2], DType::F32, &dev).unwrap());
        let tape = Tape::no_grad();
        let with_pad = AvgPool2d::with(p).forward(&tape, &x).unwrap();
        assert_eq!(with_pad.value().to_vec_f64().unwrap(), [0.25; 4], "{dev}");
        let inside = AvgPool2d::with(p).count_include_pad(false);
        let y = inside.forward(&tape, &x).unwrap();
        assert_eq!(y.value().to_vec_f64().unwrap(), [1.0; 4], "{dev}");
        // ceil_mode keeps the partial last window: 5 -> 3 with kernel 2.
        let x5 = Var::from(&Tensor::ones(&[1, 2, 5, 5], DType::F32, &dev).unwrap());
        let m = MaxPool2d(netcl_ops::Pool2dParams::new((2, 2)).ceil_mode(true));
        assert_eq!(m.forward(&tape, &x5).unwrap().shape(), &[1, 2, 3, 3]);
        assert_eq!(m.describe()["ceil_mode"], true);
        assert_eq!(inside.describe()["count_include_pad"], false);
    }
}

/// Layers too large for the host are errors, not aborts or panics.
#[test]
fn layers_past_memory_are_errors() {
    let host = Device::host();
    let mut g = Generator::new(0);
    for (inn, out) in [(1usize << 20, 1usize << 20), (4, 1 << 62), (1 << 62, 4)] {
        let e = Linear::new(inn, out, &host, &mut g).err().unwrap();
        assert!(
            matches!(
                e,
                netcl_ops::Error::OutOfMemory { .. } | netcl_ops::Error::Shape { .. }
            ),
            "Linear::new({inn}, {out}): {e}"
        );
    }
}
