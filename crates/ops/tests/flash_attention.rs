//! Fused attention (forward, lse, backward; causal or not, grouped heads, strided inputs, every float dtype) against a naive f64 attention with the full probability matrix, and finite differences, on every device.
use netcl_core_devices::{test_devices, Config};
use netcl_ops::testing::{random_tensor, Cases};
use netcl_ops::{DType, Device, Tensor};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

mod attention_support;
use attention_support::{head_dim_64_cases, Case};

#[test]
fn flash_attention_matches_naive_attention_on_every_device() {
    let devices = test_devices().unwrap();
    let mut c = Cases::new(0xF1A5);
    for case in 0..48 {
        let dtype = FLOATS[case % 4];
        let (b, hkv, rep) = (1 + c.below(2), 1 + c.below(2), 1 + c.below(3));
        let h = hkv * rep;
        // Up to 64 the register-blocked backward, above it the streaming kernels.
        let d = [4, 8, 12, 16, 32, 64, 96, 128][c.below(8)];
        // Lengths across the 64-query and 32-key tiles; causal with fewer keys than queries too.
        let tq = [1, 3, 17, 64, 65, 70][c.below(6)];
        let tk = [1, 5, 32, 33, 64, 70][c.below(6)].max(if c.below(4) == 0 { 1 } else { tq });
        let causal = c.below(3) != 0;
        let scale = if c.below(2) == 0 { None } else { Some(0.3) };
        let transposed = [c.below(2) == 0, c.below(2) == 0, c.below(2) == 0];
        let seed = 1000 * case as u64;
        let dims = [b, h, hkv, tq, tk, d];
        Case {
            dtype,
            dims,
            causal,
            scale,
            transposed,
            seed,
            compute: None,
        }
        .check(&devices);
    }
}

/// Head dim 64, the Llama shapes' (the register-blocked forward and backward on devices whose local
/// memory holds their tiles): dq from the scores' gradients and a GEMM, then from its own kernel
/// (`Config::attention_ds` off, the path of shapes whose scores' gradients exceed their budget).
/// While the switch is off, other tests of this binary running meanwhile take that path too;
/// both paths are checked against the naive attention.
#[test]
fn head_dim_64_blocks_match_naive_attention_with_either_dq() {
    let devices = test_devices().unwrap();
    head_dim_64_cases(&devices);
    let before = Config::get().attention_ds;
    Config::update(|c| c.attention_ds = false);
    head_dim_64_cases(&devices);
    Config::update(|c| c.attention_ds = before);
}

/// The shapes the tensor-core kernels take on GPUs that have them (16-bit, head dims 16 to 128 in
/// steps of 16), with lengths across their 64-row blocks, grouped heads, causal with fewer keys
/// than queries (queries that see no key) and more, one and two batches; in 16-bit storage and as f32 operands
/// computing in 16 bits (autocast); other devices run their own kernels.
#[test]
fn tensor_core_attention_shapes_match_naive_attention() {
    let devices = test_devices().unwrap();
    let lengths = [(64, 64), (65, 130), (130, 65), (1, 70), (128, 128), (70, 1)];
    for (n, dtype) in [DType::BF16, DType::F16].into_iter().enumerate() {
        for (m, d) in [16, 48, 64, 80, 128].into_iter().enumerate() {
            let (tq, tk) = lengths[(3 * n + m) % lengths.len()];
            for causal in [true, false] {
                let seed = (100 * n + 10 * m + causal as usize) as u64;
                let dims = [1 + n, 4, 2, tq, tk, d];
                let transposed = [true, causal, false];
                // A negative scale takes another kernel where the tensor-core one needs it positive.
                let scale = (!causal).then_some(if m == 1 { -0.3 } else { 0.3 });
                // 16-bit operands, then f32 ones computing in 16 bits.
                for (dtype, compute) in [(dtype, None), (DType::F32, Some(dtype))] {
                    let case = Case {
                        dtype,
                        dims,
                        causal,
                        scale,
                        transposed,
                        seed,
                        compute,
                    };
                    case.check(&devices);
                }
            }
        }
    }
}

/// sum(out * g) of the fused forward, in f64 on `dev`.
fn loss(q: &Tensor, k: &Tensor, v: &Tensor, g: &[f64], causal: bool) -> f64 {
    let (out, _) = Tensor::flash_attention(q, k, v, causal, None).unwrap();
    let o = out.to_vec_f64().unwrap();
    o.iter().zip(g).map(|(a, b)| a * b).sum()
}

#[test]
fn flash_attention_backward_matches_finite_differences() {
    for dev in test_devices().unwrap() {
        if !dev.info().fp64 {
            continue;
        }
        let (b, h, hkv, tq, tk, d) = (1, 4, 2, 5, 7, 8);
        let mk = |shape: &[usize], seed| {
            random_tensor(DType::F64, shape, -1.0, 1.0, seed)
                .to_device(&dev)
                .unwrap()
        };
        let (q, k, v) = (
            mk(&[b, h, tq, d], 1),
            mk(&[b, hkv, tk, d], 2),
            mk(&[b, hkv, tk, d], 3),
        );
        let g = mk(&[b, h, tq, d], 4);
        let gv = g.to_vec_f64().unwrap();
        let (out, lse) = Tensor::flash_attention(&q, &k, &v, true, None).unwrap();
        let grads =
            Tensor::flash_attention_backward(&q, &k, &v, &out, &lse, &g, true, None).unwrap();
        for (which, t, grad) in [(0, &q, &grads.0), (1, &k, &grads.1), (2, &v, &grads.2)] {
            let base = t.to_vec_f64().unwrap();
            let analytic = grad.to_vec_f64().unwrap();
            for idx in [0, base.len() / 3, base.len() - 1] {
                let bumped = |delta: f64| {
                    let mut x = base.clone();
                    x[idx] += delta;
                    let t2 = Tensor::from_vec(x, t.shape(), &dev).unwrap();
                    let (q2, k2, v2) = match which {
                        0 => (&t2, &k, &v),
                        1 => (&q, &t2, &v),
                        _ => (&q, &k, &t2),
                    };
                    loss(q2, k2, v2, &gv, true)
                };
                let numeric = (bumped(1e-6) - bumped(-1e-6)) / 2e-6;
                assert!(
                    (numeric - analytic[idx]).abs() <= 1e-6 * (1.0 + numeric.abs()),
                    "{dev}: input {which} element {idx}: analytic {} vs numeric {numeric}",
                    analytic[idx]
                );
            }
        }
    }
}

#[test]
fn bad_operands_are_errors_naming_the_shapes() {
    let dev = Device::host();
    let t = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &dev).unwrap();
    let q = t(&[1, 4, 3, 8]);
    let err = |r: Result<(Tensor, Tensor), netcl_ops::Error>| r.err().unwrap().to_string();
    let e = err(Tensor::flash_attention(
        &q,
        &t(&[1, 3, 3, 8]),
        &t(&[1, 3, 3, 8]),
        true,
        None,
    ));
    assert!(
        e.contains("4 query heads") && e.contains("3 key/value heads"),
        "{e}"
    );
    let e = err(Tensor::flash_attention(
        &t(&[1, 1, 3, 6]),
        &t(&[1, 1, 3, 6]),
        &t(&[1, 1, 3, 6]),
        false,
        None,
    ));
    assert!(e.contains("head dim 6"), "{e}");
    let e = err(Tensor::flash_attention(
        &t(&[4, 3, 8]),
        &t(&[4, 3, 8]),
        &t(&[4, 3, 8]),
        false,
        None,
    ));
    assert!(e.contains("[4, 3, 8]"), "{e}");
    let bf = Some(DType::BF16);
    let e = Tensor::flash_attention_in(&q, &q, &q, false, None, Some(DType::F64))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("f32 operands cannot compute in f64"), "{e}");
    let h = q.to_dtype(DType::F16).unwrap();
    let e = Tensor::flash_attention_in(&h, &h, &h, false, None, bf)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("f16 operands cannot compute in bf16"), "{e}");
    let f64q = Tensor::zeros(&[1, 4, 3, 8], DType::F64, &dev).unwrap();
    assert!(
        Tensor::flash_attention(&f64q, &t(&[1, 2, 3, 8]), &t(&[1, 2, 3, 8]), true, None).is_err()
    );
    assert!(!Tensor::flash_attention_supports(
        &q,
        &t(&[1, 3, 3, 8]),
        &t(&[1, 3, 3, 8])
    ));
    assert!(Tensor::flash_attention_supports(
        &q,
        &t(&[1, 2, 5, 8]),
        &t(&[1, 2, 5, 8])
    ));
}
