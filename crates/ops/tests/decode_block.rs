//! decode_block on every device: the same values as its five decode ops run in turn on that device (bit for bit), close to the host's, over several steps (its counters reset between launches), with GQA, biases, pads, a window, batch groups and RoPE tables; and its shape errors.
use netcl_core_devices::test_devices;
use netcl_ops::testing::{check_close, random_tensor, tolerance};
use netcl_ops::{DType, DecodeBlock, Device, KvWrite, RmsScale, RopeFreqs, RopeStyle, Tensor};

/// A block's sizes and switches.
#[derive(Clone, Copy)]
struct Case {
    b: usize,
    d: usize,
    heads: usize,
    hkv: usize,
    hd: usize,
    f: usize,
    s: usize,
    biases: bool,
    pads: bool,
    window: Option<usize>,
    halves: bool,
    table: bool,
    /// The first of the three steps' positions.
    at: i32,
}

fn rand(shape: &[usize], seed: u64, dtype: DType, dev: &Device) -> Tensor {
    let t = random_tensor(DType::F32, shape, -1.0, 1.0, seed);
    t.to_dtype(dtype).unwrap().to_device(dev).unwrap()
}

/// The block of `c` on `dev` in `dtype`, its caches fresh (the same values on every device).
fn block(c: Case, dtype: DType, dev: &Device) -> DecodeBlock {
    let r = |shape: &[usize], seed| rand(shape, seed, dtype, dev);
    let norm = |seed| RmsScale {
        weight: random_tensor(DType::F32, &[c.d], 0.5, 1.5, seed)
            .to_dtype(dtype)
            .unwrap()
            .to_device(dev)
            .unwrap(),
        eps: 1e-5,
    };
    let (qd, kvd) = (c.heads * c.hd, c.hkv * c.hd);
    let bias = |n, seed| c.biases.then(|| r(&[n], seed));
    let freqs = match c.table {
        true => {
            let inv: Vec<f32> = (0..c.hd / 2)
                .map(|i| 1.0 / 500f32.powf(2.0 * i as f32 / c.hd as f32))
                .collect();
            let acc = netcl_ops::acc_dtype(dtype);
            let t = Tensor::from_vec(inv, &[c.hd / 2], dev).unwrap();
            RopeFreqs::Table(t.to_dtype(acc).unwrap())
        }
        false => RopeFreqs::Theta(10000.0),
    };
    let pads = (0..c.b).map(|i| (i % 3) as i32).collect();
    DecodeBlock {
        attention_norm: norm(1),
        wq: r(&[qd, c.d], 2),
        wk: r(&[kvd, c.d], 3),
        wv: r(&[kvd, c.d], 4),
        qkv_bias: bias(qd + 2 * kvd, 5),
        kv: KvWrite {
            k_cache: r(&[c.b, c.hkv, c.s, c.hd], 6),
            v_cache: r(&[c.b, c.hkv, c.s, c.hd], 7),
            pos: Tensor::from_vec(vec![0i32], &[1], dev).unwrap(),
            pads: c.pads.then(|| Tensor::from_vec(pads, &[c.b], dev).unwrap()),
            style: if c.halves {
                RopeStyle::Halves
            } else {
                RopeStyle::Interleaved
            },
            freqs,
        },
        heads: c.heads,
        window: c.window,
        wo: r(&[c.d, qd], 8),
        wo_bias: bias(c.d, 9),
        ffn_norm: norm(10),
        gate: r(&[c.f, c.d], 11),
        up: r(&[c.f, c.d], 12),
        gate_up_bias: bias(2 * c.f, 13),
        down: r(&[c.d, c.f], 14),
        down_bias: bias(c.d, 15),
    }
}

/// The five decode ops in turn.
fn composed(x: &Tensor, b: &DecodeBlock) -> Tensor {
    let kv = &b.kv;
    let q = x
        .decode_qkv_biased(
            Some(&b.attention_norm),
            [&b.wq, &b.wk, &b.wv],
            b.qkv_bias.as_ref(),
            kv,
        )
        .unwrap();
    let o = q
        .decode_attention_window(
            &kv.k_cache,
            &kv.v_cache,
            &kv.pos,
            kv.pads.as_ref(),
            b.heads,
            b.window,
        )
        .unwrap();
    let h = o
        .decode_linear_biased(None, &b.wo, b.wo_bias.as_ref(), Some(x))
        .unwrap();
    let s = h
        .decode_swiglu_biased(Some(&b.ffn_norm), &b.gate, &b.up, b.gate_up_bias.as_ref())
        .unwrap();
    s.decode_linear_biased(None, &b.down, b.down_bias.as_ref(), Some(&h))
        .unwrap()
}

/// Steps at three positions from `c.at` through the block and through its ops (own caches each): the
/// outputs and caches after each step.
fn steps(c: Case, dtype: DType, dev: &Device, fused: bool) -> Vec<Vec<f64>> {
    let blk = block(c, dtype, dev);
    let mut out = Vec::new();
    for (i, at) in (c.at..c.at + 3).enumerate() {
        blk.kv.pos.fill_(at as f64).unwrap();
        let x = rand(&[c.b, c.d], 20 + i as u64, dtype, dev);
        let y = match fused {
            true => x.decode_block(&blk).unwrap(),
            false => composed(&x, &blk),
        };
        out.push(y.to_vec_f64().unwrap());
    }
    out.push(blk.kv.k_cache.to_vec_f64().unwrap());
    out.push(blk.kv.v_cache.to_vec_f64().unwrap());
    out
}

const CASES: [Case; 4] = [
    // Llama-like: GQA, halves, no biases.
    Case {
        b: 1,
        d: 32,
        heads: 4,
        hkv: 2,
        hd: 8,
        f: 40,
        s: 8,
        biases: false,
        pads: false,
        window: None,
        halves: true,
        table: false,
        at: 3,
    },
    // Qwen2/Mistral-like: biases, pads, a window, two batch groups (of 8 rows), a RoPE table.
    Case {
        b: 9,
        d: 24,
        heads: 6,
        hkv: 3,
        hd: 4,
        f: 36,
        s: 9,
        biases: true,
        pads: true,
        window: Some(2),
        halves: false,
        table: true,
        at: 3,
    },
    // A cache long enough for the attention to run in parts (their sums combined): close to the
    // ops, not bit for bit.
    Case {
        b: 2,
        d: 16,
        heads: 2,
        hkv: 2,
        hd: 8,
        f: 20,
        s: 200,
        biases: false,
        pads: true,
        window: None,
        halves: true,
        table: false,
        at: 150,
    },
    // Rows not a multiple of 4 (element-wise loads), one kv head.
    Case {
        b: 2,
        d: 18,
        heads: 3,
        hkv: 1,
        hd: 6,
        f: 27,
        s: 7,
        biases: true,
        pads: false,
        window: None,
        halves: true,
        table: false,
        at: 3,
    },
];

#[test]
fn decode_block_equals_its_ops_on_every_device() {
    let host = Device::host();
    for (ci, &c) in CASES.iter().enumerate() {
        let want = steps(c, DType::F32, &host, false);
        for dev in test_devices().unwrap() {
            for dtype in [DType::F32, DType::BF16] {
                let what = format!("case {ci} on {dev} in {dtype}");
                let fused = steps(c, dtype, &dev, true);
                let ops = steps(c, dtype, &dev, false);
                let close = |got: &[Vec<f64>], want: &[Vec<f64>], what: &str| {
                    for (g, w) in got.iter().zip(want) {
                        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                        check_close(g, w, tolerance(dtype), scale, what).unwrap();
                    }
                };
                match c.s <= 64 || dev.is_host() {
                    true => assert!(fused == ops, "{what}: the block differs from its ops"),
                    false => close(&fused, &ops, &format!("{what}, block against ops")),
                }
                if dtype == DType::F32 {
                    close(&fused, &want, &what);
                }
            }
        }
    }
}

#[test]
fn decode_block_shape_errors_name_the_op() {
    let host = Device::host();
    let c = CASES[0];
    for dev in test_devices().unwrap() {
        let mut blk = block(c, DType::F32, &dev);
        let x = rand(&[c.b, c.d], 1, DType::F32, &dev);
        blk.down = rand(&[c.d + 1, c.f], 2, DType::F32, &dev);
        let e = x.decode_block(&blk).unwrap_err().to_string();
        assert!(e.contains("decode_block") && e.contains("down"), "{e}");
        let mut blk = block(c, DType::F32, &dev);
        blk.wo_bias = Some(rand(&[c.d + 2], 3, DType::F32, &dev));
        let e = x.decode_block(&blk).unwrap_err().to_string();
        assert!(e.contains("decode_block") && e.contains("bias"), "{e}");
        if dev.is_opencl() {
            let e = x
                .decode_block(&block(c, DType::F32, &host))
                .unwrap_err()
                .to_string();
            assert!(e.contains("decode_block"), "{e}");
        }
    }
}
