//! Every differentiable op's backward rule against finite differences (f64), on the host and every OpenCL device.
use netcl_autograd::{gradcheck, GradcheckOptions, Var, FLASH_MIN_QUERIES};
use netcl_core_devices::test_devices;
use netcl_ops::testing::random_tensor;
use netcl_ops::{
    Activation, Conv2dParams, DType, Device, Generator, Pool2dParams, Result, RopePositions,
    RopeStyle, Tensor, UnaryOp,
};

fn opts() -> GradcheckOptions {
    GradcheckOptions {
        max_elements: 10,
        ..Default::default()
    }
}

/// A random f64 tensor on `dev` with values in [lo, hi].
fn rnd(dev: &Device, shape: &[usize], lo: f64, hi: f64, seed: u64) -> Tensor {
    random_tensor(DType::F64, shape, lo, hi, seed)
        .to_device(dev)
        .unwrap()
}

/// Values of magnitude in [0.2, 1.5] with random signs: clear of the kinks at 0.
fn signed(dev: &Device, shape: &[usize], seed: u64) -> Tensor {
    let mag = random_tensor(DType::F64, shape, 0.2, 1.5, seed)
        .to_vec_f64()
        .unwrap();
    let sign = random_tensor(DType::F64, shape, -1.0, 1.0, seed ^ 0xabc)
        .to_vec_f64()
        .unwrap();
    let v: Vec<f64> = mag
        .iter()
        .zip(&sign)
        .map(|(m, s)| if *s < 0.0 { -m } else { *m })
        .collect();
    Tensor::from_vec(v, shape, dev).unwrap()
}

/// A constant operand on `like`'s device (a frozen weight: no gradient, nothing saved for one).
fn frozen(like: &Var, shape: &[usize], seed: u64) -> Var {
    Var::constant(signed(like.device(), shape, seed))
}

fn ids(dev: &Device, v: &[i32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, dev).unwrap()
}

/// Run `f` through gradcheck on every device with inputs made by `make`.
fn check(name: &str, make: impl Fn(&Device) -> Vec<Tensor>, f: impl Fn(&[Var]) -> Result<Var>) {
    for dev in test_devices().unwrap() {
        let inputs = make(&dev);
        let r = gradcheck(&f, &inputs, opts()).unwrap_or_else(|e| panic!("{name} on {dev}: {e}"));
        assert!(r.checked > 0, "{name} on {dev}: nothing checked");
    }
}

#[test]
fn unary_ops() {
    use UnaryOp::*;
    let positive = [Log, Sqrt, Rsqrt, Reciprocal];
    for op in [
        Neg, Abs, Exp, Log, Sqrt, Rsqrt, Sin, Cos, Tanh, Sigmoid, Relu, Gelu, GeluTanh, Silu,
        Square, Reciprocal, Erf, Expm1,
    ] {
        let pos = positive.contains(&op);
        check(
            op.name(),
            |d| {
                vec![if pos {
                    rnd(d, &[3, 4], 0.3, 2.0, 1)
                } else {
                    signed(d, &[3, 4], 1)
                }]
            },
            |v| v[0].unary(op),
        );
    }
    check(
        "leaky_relu",
        |d| vec![signed(d, &[7], 2)],
        |v| v[0].leaky_relu(0.1),
    );
    check(
        "clamp",
        |d| vec![signed(d, &[9], 3)],
        |v| v[0].clamp(-0.8, 0.9),
    );
    check(
        "powf",
        |d| vec![rnd(d, &[5], 0.5, 2.0, 4)],
        |v| v[0].powf(2.5),
    );
    // SwiGLU of the halves of the last dim, also through a strided input (a transposed view).
    check(
        "swiglu_halves",
        |d| vec![signed(d, &[3, 8], 8)],
        |v| v[0].swiglu_halves(),
    );
    check(
        "swiglu_halves of a view",
        |d| vec![signed(d, &[6, 2], 9)],
        |v| v[0].transpose(0, 1)?.swiglu_halves(),
    );
    check(
        "scalars",
        |d| vec![signed(d, &[2, 3], 5)],
        |v| {
            v[0].mul_scalar(3.0)?
                .add_scalar(1.5)?
                .div_scalar(-2.0)?
                .sub_scalar(0.5)
        },
    );
}

#[test]
fn binary_ops_with_broadcasting() {
    type Op = fn(&Var, &Var) -> Result<Var>;
    let ops: [(&str, Op, bool); 8] = [
        ("add", Var::add, false),
        ("swiglu", Var::swiglu, false),
        ("sub", Var::sub, false),
        ("mul", Var::mul, false),
        ("div", Var::div, true),
        ("maximum", Var::maximum, false),
        ("minimum", Var::minimum, false),
        ("pow", Var::pow, true),
    ];
    for (name, op, positive) in ops {
        for (sa, sb) in [
            (&[3, 4][..], &[3, 4][..]),
            (&[2, 1, 4], &[3, 1]),
            (&[4], &[2, 3, 4]),
            (&[], &[2, 2]),
        ] {
            check(
                name,
                |d| {
                    if positive {
                        vec![rnd(d, sa, 0.5, 2.0, 6), rnd(d, sb, 0.5, 2.0, 7)]
                    } else {
                        vec![signed(d, sa, 6), signed(d, sb, 7)]
                    }
                },
                |v| op(&v[0], &v[1]),
            );
        }
    }
    // The same Var on both sides and used twice: gradients must accumulate.
    check(
        "x*x+x",
        |d| vec![signed(d, &[5], 8)],
        |v| v[0].mul(&v[0])?.add(&v[0]),
    );
}

#[test]
fn select_and_masked_fill() {
    check(
        "select",
        |d| vec![signed(d, &[3, 4], 9), signed(d, &[4], 10)],
        |v| {
            let cond = Tensor::from_vec(vec![1.0f64, 0.0, 0.0, 1.0], &[4], v[0].device())?
                .broadcast_to(&[3, 4])?;
            Var::select(&cond, &v[0], &v[1])
        },
    );
    check(
        "masked_fill",
        |d| vec![signed(d, &[2, 3], 11)],
        |v| {
            let m = Tensor::from_vec(vec![0.0f64, 1.0, 0.0], &[3], v[0].device())?;
            v[0].masked_fill(&m, 7.0)
        },
    );
}

#[test]
fn matmul_and_linear() {
    for (sa, sb) in [
        (&[3, 4][..], &[4, 5][..]),
        (&[2, 3, 4], &[4, 2]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
        (&[4], &[4, 3]),
        (&[2, 4], &[4]),
        (&[4], &[4]),
    ] {
        check(
            "matmul",
            |d| vec![signed(d, sa, 12), signed(d, sb, 13)],
            |v| v[0].matmul(&v[1]),
        );
    }
    for act in [Activation::None, Activation::Relu] {
        check(
            "linear",
            |d| {
                vec![
                    signed(d, &[2, 3, 4], 14),
                    signed(d, &[5, 4], 15),
                    signed(d, &[5], 16),
                ]
            },
            |v| v[0].linear(&v[1], Some(&v[2]), act),
        );
        check(
            "linear_nobias",
            |d| vec![signed(d, &[3, 4], 17), signed(d, &[2, 4], 18)],
            |v| v[0].linear(&v[1], None, act),
        );
        // A frozen (constant) weight or operand: the input's gradient without the saved
        // activation the weight's gradient would need.
        check(
            "linear_frozen_weight",
            |d| vec![signed(d, &[3, 4], 19)],
            |v| v[0].linear(&frozen(&v[0], &[2, 4], 20), None, act),
        );
    }
    check(
        "matmul_frozen_right",
        |d| vec![signed(d, &[2, 3, 4], 21)],
        |v| v[0].matmul(&frozen(&v[0], &[4, 2], 22)),
    );
    check(
        "matmul_frozen_left",
        |d| vec![signed(d, &[4, 2], 23)],
        |v| frozen(&v[0], &[2, 3, 4], 24).matmul(&v[0]),
    );
}

#[test]
fn reductions() {
    for (axes, keep) in [(&[1][..], false), (&[0, 2][..], true), (&[][..], false)] {
        check(
            "sum",
            |d| vec![signed(d, &[2, 3, 4], 20)],
            |v| v[0].sum(axes, keep),
        );
        check(
            "mean",
            |d| vec![signed(d, &[2, 3, 4], 21)],
            |v| v[0].mean(axes, keep),
        );
        check(
            "max",
            |d| vec![signed(d, &[2, 3, 4], 22)],
            |v| v[0].max(axes, keep),
        );
        check(
            "min",
            |d| vec![signed(d, &[2, 3, 4], 23)],
            |v| v[0].min(axes, keep),
        );
        check(
            "logsumexp",
            |d| vec![signed(d, &[2, 3, 4], 24)],
            |v| v[0].logsumexp(axes, keep),
        );
        let correction = if axes.is_empty() { 0.0 } else { 1.0 };
        check(
            "var",
            |d| vec![signed(d, &[2, 3, 4], 25)],
            |v| v[0].var(axes, correction, keep),
        );
    }
    check(
        "sum_all",
        |d| vec![signed(d, &[3, 2], 26)],
        |v| v[0].sum_all(),
    );
    check(
        "mean_all",
        |d| vec![signed(d, &[3, 2], 27)],
        |v| v[0].mean_all(),
    );
    check(
        "max_all",
        |d| vec![signed(d, &[3, 2], 28)],
        |v| v[0].max_all(),
    );
}

#[test]
fn softmax_and_cross_entropy() {
    for dim in 0..2 {
        check(
            "softmax",
            |d| vec![signed(d, &[3, 5], 30)],
            |v| v[0].softmax(dim),
        );
        check(
            "log_softmax",
            |d| vec![signed(d, &[3, 5], 31)],
            |v| v[0].log_softmax(dim),
        );
    }
    for ignore in [None, Some(2)] {
        check(
            "cross_entropy",
            |d| vec![signed(d, &[4, 5], 32), ids(d, &[1, 2, 4, 0], &[4])],
            |v| v[0].cross_entropy(v[1].value(), ignore),
        );
    }
}

#[test]
fn norms() {
    check(
        "layer_norm",
        |d| {
            vec![
                signed(d, &[3, 2, 4], 40),
                signed(d, &[2, 4], 41),
                signed(d, &[2, 4], 42),
            ]
        },
        |v| v[0].layer_norm(&[2, 4], Some(&v[1]), Some(&v[2]), 1e-5),
    );
    check(
        "layer_norm_plain",
        |d| vec![signed(d, &[3, 6], 43)],
        |v| v[0].layer_norm(&[6], None, None, 1e-5),
    );
    check(
        "rms_norm",
        |d| vec![signed(d, &[4, 5], 44), signed(d, &[5], 45)],
        |v| v[0].rms_norm(&[5], Some(&v[1]), 1e-6),
    );
    for shape in [&[6, 3][..], &[2, 3, 2, 2]] {
        check(
            "batch_norm_train",
            |d| {
                vec![
                    signed(d, shape, 46),
                    signed(d, &[3], 47),
                    signed(d, &[3], 48),
                ]
            },
            |v| v[0].batch_norm_train(Some(&v[1]), Some(&v[2]), None, None, 0.1, 1e-5),
        );
    }
    check(
        "batch_norm_eval",
        |d| {
            vec![
                signed(d, &[2, 3, 2], 49),
                signed(d, &[3], 50),
                signed(d, &[3], 51),
            ]
        },
        |v| {
            let dev = v[0].device();
            let rm = Tensor::from_vec(vec![0.1f64, -0.2, 0.3], &[3], dev)?;
            let rv = Tensor::from_vec(vec![1.5f64, 0.5, 2.0], &[3], dev)?;
            v[0].batch_norm_eval(&rm, &rv, Some(&v[1]), Some(&v[2]), 1e-5)
        },
    );
}

#[test]
fn conv_and_pool() {
    let p = Conv2dParams {
        stride: (2, 1),
        padding: (1, 1),
        dilation: (1, 2),
        groups: 1,
    };
    check(
        "conv2d",
        |d| {
            vec![
                signed(d, &[2, 2, 5, 6], 60),
                signed(d, &[3, 2, 3, 2], 61),
                signed(d, &[3], 62),
            ]
        },
        |v| v[0].conv2d(&v[1], Some(&v[2]), p),
    );
    let g = Conv2dParams {
        groups: 2,
        ..Default::default()
    };
    check(
        "conv2d_groups",
        |d| vec![signed(d, &[1, 4, 4, 4], 63), signed(d, &[4, 2, 3, 3], 64)],
        |v| v[0].conv2d(&v[1], None, g),
    );
    let mut pp = Pool2dParams::new((2, 2));
    pp.padding = (1, 0);
    check(
        "max_pool2d",
        |d| vec![rnd(d, &[1, 2, 5, 4], -1.0, 1.0, 65)],
        |v| v[0].max_pool2d(pp),
    );
    check(
        "avg_pool2d",
        |d| vec![signed(d, &[2, 1, 5, 4], 66)],
        |v| v[0].avg_pool2d(pp, false),
    );
    // ceil_mode: partial last windows (6 -> 3 rows, 7 -> 3 columns; 2 and 2 when rounding down).
    let pc = Pool2dParams::new((3, 2)).stride((2, 3)).ceil_mode(true);
    check(
        "max_pool2d_ceil",
        |d| vec![rnd(d, &[1, 2, 6, 7], -1.0, 1.0, 68)],
        |v| v[0].max_pool2d(pc),
    );
    check(
        "avg_pool2d_ceil",
        |d| vec![signed(d, &[1, 2, 6, 7], 69)],
        |v| v[0].avg_pool2d(pc, true),
    );
    check(
        "adaptive_avg_pool2d",
        |d| vec![signed(d, &[1, 2, 5, 7], 67)],
        |v| v[0].adaptive_avg_pool2d((2, 3)),
    );
}

#[test]
fn indexing() {
    check(
        "embedding",
        |d| vec![signed(d, &[5, 3], 70), ids(d, &[4, 0, 4, 2], &[2, 2])],
        |v| v[0].embedding(v[1].value()),
    );
    check(
        "index_select",
        |d| vec![signed(d, &[3, 4], 71), ids(d, &[3, 3, 0], &[3])],
        |v| v[0].index_select(1, v[1].value()),
    );
    check(
        "gather",
        |d| vec![signed(d, &[3, 4], 72), ids(d, &[0, 3, 1, 1, 2, 2], &[3, 2])],
        |v| v[0].gather(1, v[1].value()),
    );
}

#[test]
fn views_and_shapes() {
    check(
        "reshape",
        |d| vec![signed(d, &[2, 6], 80)],
        |v| {
            v[0].transpose(0, 1)?
                .reshape(&[3, 4])?
                .mul(&v[0].reshape(&[3, 4])?)
        },
    );
    check(
        "permute",
        |d| vec![signed(d, &[2, 3, 4], 81)],
        |v| v[0].permute(&[2, 0, 1])?.contiguous(),
    );
    check(
        "narrow",
        |d| vec![signed(d, &[4, 5], 82)],
        |v| v[0].narrow(1, 1, 3),
    );
    check(
        "slice",
        |d| vec![signed(d, &[7, 3], 83)],
        |v| v[0].slice(0, 1, 7, 2),
    );
    check(
        "broadcast_to",
        |d| vec![signed(d, &[3, 1], 84)],
        |v| v[0].broadcast_to(&[2, 3, 4]),
    );
    check(
        "squeeze",
        |d| vec![signed(d, &[3, 1, 2], 85)],
        |v| v[0].squeeze(1)?.unsqueeze(0)?.flatten(1),
    );
    check(
        "concat",
        |d| vec![signed(d, &[2, 3], 86), signed(d, &[2, 1], 87)],
        |v| Var::concat(&[&v[0], &v[1], &v[0]], 1),
    );
    check(
        "stack",
        |d| vec![signed(d, &[2, 3], 88), signed(d, &[2, 3], 89)],
        |v| Var::stack(&[&v[0], &v[1]], 1),
    );
    check(
        "split",
        |d| vec![signed(d, &[5, 2], 90)],
        |v| {
            let parts = v[0].split(2, 0)?;
            parts[0]
                .mul(&parts[1])?
                .sum_all()?
                .add(&parts[2].sum_all()?)
        },
    );
    check(
        "narrow parts",
        // Views that overlap, along two dims, and the value also used whole: their gradients
        // are summed into one (the views' parts added to the whole's).
        |d| vec![signed(d, &[4, 5], 92)],
        |v| {
            let (a, b) = (v[0].narrow(1, 0, 3)?, v[0].narrow(1, 2, 3)?);
            let c = v[0].narrow(0, 1, 2)?;
            a.mul(&b)?
                .sum_all()?
                .add(&c.mul(&c)?.sum_all()?)?
                .add(&v[0].mul(&v[0])?.sum_all()?)
        },
    );
    check(
        "narrow tiles",
        // Views tiling the value along one dim, in no particular order: one concat.
        |d| vec![signed(d, &[3, 6], 93)],
        |v| {
            let (a, b) = (v[0].narrow(1, 4, 2)?, v[0].narrow(1, 0, 4)?);
            a.mul(&a)?.sum_all()?.add(&b.sum_all()?)
        },
    );
    check(
        "pad",
        |d| vec![signed(d, &[2, 3], 91)],
        |v| v[0].pad(&[(1, 2), (0, 1)], 0.5),
    );
}

#[test]
fn rope_attention_dropout() {
    check(
        "rope",
        |d| vec![signed(d, &[1, 3, 2, 4], 100)],
        |v| v[0].rope(2, 10000.0),
    );
    check(
        "rope halves with position ids",
        |d| vec![signed(d, &[2, 3, 2, 4], 102)],
        |v| {
            let ids = Tensor::from_vec(vec![5i32, 0, 9, 1, 1, 30], &[2, 3], v[0].device())?;
            v[0].rope_with(RopeStyle::Halves, RopePositions::Ids(ids), 500.0)
        },
    );
    for causal in [false, true] {
        check(
            "attention",
            |d| {
                vec![
                    signed(d, &[2, 3, 4], 101),
                    signed(d, &[2, 3, 4], 102),
                    signed(d, &[2, 3, 4], 103),
                ]
            },
            |v| Var::attention(&v[0], &v[1], &v[2], None, causal, None),
        );
    }
    // Composed, causal, fewer keys than queries: the first two queries see no key and give 0
    // with no gradient, as on the fused path (not NaN).
    check(
        "attention, queries that see no key",
        |d| {
            vec![
                signed(d, &[2, 5, 4], 108),
                signed(d, &[2, 3, 4], 109),
                signed(d, &[2, 3, 4], 110),
            ]
        },
        |v| {
            let o = Var::attention(&v[0], &v[1], &v[2], None, true, None)?;
            let rows = o.value().narrow(1, 0, 2)?.to_vec_f64()?;
            assert!(rows.iter().all(|&x| x == 0.0), "{rows:?}");
            Ok(o)
        },
    );
    // 4-D with at least FLASH_MIN_QUERIES queries: the fused kernel and its backward, with
    // grouped heads (4 query heads over 2 key/value heads) and fewer keys than queries.
    for causal in [false, true] {
        check(
            "flash attention",
            |d| {
                vec![
                    signed(d, &[1, 4, FLASH_MIN_QUERIES + 1, 4], 105),
                    signed(d, &[1, 2, FLASH_MIN_QUERIES - 2, 4], 106),
                    signed(d, &[1, 2, FLASH_MIN_QUERIES - 2, 4], 107),
                ]
            },
            |v| Var::flash_attention(&v[0], &v[1], &v[2], causal, Some(0.7)),
        );
    }
    check(
        "dropout",
        |d| vec![signed(d, &[4, 5], 104)],
        |v| v[0].dropout(0.3, &mut Generator::new(5)),
    );
}

#[test]
fn gradcheck_catches_a_wrong_gradient() {
    // x * detach(x): the recorded gradient is x, the true one 2x.
    for dev in test_devices().unwrap() {
        let x = signed(&dev, &[4], 110);
        let err = gradcheck(|v| v[0].mul(&v[0].detach()), &[x], opts())
            .unwrap_err()
            .to_string();
        assert!(err.contains("differ from finite differences"), "{err}");
    }
}

/// `Var::attention` takes the fused kernel for 4-D operands with enough queries: its values and
/// gradients equal the composed ops' (forced here by an all-zero mask) on every device.
#[test]
fn attention_fused_and_composed_agree() {
    use netcl_autograd::Tape;
    for dev in test_devices().unwrap() {
        let t = FLASH_MIN_QUERIES + 3;
        let shape = [2, 3, t, 8];
        let inputs: Vec<Tensor> = (0..3).map(|i| signed(&dev, &shape, 200 + i)).collect();
        let zeros = Tensor::zeros(&[t, t], DType::F64, &dev).unwrap();
        let run = |mask: Option<&Tensor>| {
            let tape = Tape::new();
            let v: Vec<Var> = inputs.iter().map(|x| tape.leaf(x).unwrap()).collect();
            // The fused forward: the streaming kernel or the register-blocked one.
            let forwards = || {
                netcl_kernels::thread_launches("attention_fwd")
                    + netcl_kernels::thread_launches("attention_fwd_blocked")
            };
            let before = forwards();
            let y = Var::attention(&v[0], &v[1], &v[2], mask, true, None).unwrap();
            let fused = forwards() > before;
            let loss = y.mul(&y).unwrap().sum_all().unwrap();
            let grads = tape.backward(&loss).unwrap();
            let mut vals = vec![y.value().to_vec_f64().unwrap()];
            vals.extend(
                v.iter()
                    .map(|x| grads.get(x).unwrap().to_vec_f64().unwrap()),
            );
            (fused, vals)
        };
        let (fused, a) = run(None);
        let (composed, b) = run(Some(&zeros));
        assert_eq!((fused, composed), (dev.is_opencl(), false), "{dev}");
        for (x, y) in a.iter().zip(&b) {
            for (p, q) in x.iter().zip(y) {
                assert!(
                    (p - q).abs() <= 1e-10 * (1.0 + q.abs()),
                    "{dev}: {p} vs {q}"
                );
            }
        }
    }
}
