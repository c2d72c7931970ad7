//! What large Llamas train with, on every device at tiny shapes: per-block activation checkpointing gives the loss and every gradient of no checkpointing bit for bit (every block or every other one; f32 and bf16 autocast; LoRA adapters with dropout); the chunked loss equals the whole one (tied and untied heads); LoRA over a bf16 base learns; memory_estimate predicts the pool's peak.
use netcl_autograd::{autocast, Tape, Var};
use netcl_core_devices::test_devices;
use netcl_models::{Llama, LlamaConfig};
use netcl_nn::{LoraConfig, Module};
use netcl_ops::{DType, Device, Generator, Tensor};
use std::sync::Mutex;

/// The memory test reads process-wide counters: the tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// LoRA adapters of `rank` (alpha twice it) with `dropout` on `targets`.
fn adapters(rank: usize, dropout: f64, targets: &[&str]) -> LoraConfig {
    LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        dropout,
        targets: targets.iter().map(|t| t.to_string()).collect(),
    }
}

/// A tiny Llama (untied head), checkpointing every `every`-th block; with `lora`, adapters with
/// dropout on every projection and non-zero `B` (the same values for every call).
fn model(dev: &Device, every: usize, lora: bool) -> Llama {
    model_with(dev, every, lora, false)
}

fn model_with(dev: &Device, every: usize, lora: bool, tied: bool) -> Llama {
    let cfg = LlamaConfig {
        n_layers: 3,
        tied_embeddings: tied,
        ..LlamaConfig::tiny(40)
    };
    let mut g = Generator::new(5);
    let mut m = Llama::new(cfg, dev, &mut g)
        .unwrap()
        .with_checkpointing(every);
    if lora {
        m.add_lora(&adapters(2, 0.2, &["all-linear"]), &mut g)
            .unwrap();
        for (_, p) in m.lora_parameters() {
            let v = Tensor::randn(p.shape(), p.dtype(), dev, &mut g).unwrap();
            p.assign(&v.mul_scalar(0.1).unwrap()).unwrap();
        }
    }
    m
}

/// `m`'s training loss on `tape`, under autocast to `cast` when given.
fn loss(m: &Llama, tape: &Tape, x: &Tensor, y: &Tensor, cast: Option<DType>) -> Var {
    match cast {
        Some(dt) => autocast(dt, || m.loss(tape, x, y)).unwrap(),
        None => m.loss(tape, x, y),
    }
    .unwrap()
}

/// The loss and every trainable parameter's gradient (as f32 bits) of one training pass.
fn pass(m: &Llama, cast: Option<DType>, dev: &Device) -> Vec<Vec<u32>> {
    let v: Vec<i32> = (0..34).map(|i| (i * 7 + i * i) % 40).collect();
    let x = Tensor::from_vec([&v[..16], &v[17..33]].concat(), &[2, 16], dev).unwrap();
    let y = Tensor::from_vec([&v[1..17], &v[18..34]].concat(), &[2, 16], dev).unwrap();
    let tape = Tape::new();
    let loss = loss(m, &tape, &x, &y, cast);
    tape.backward(&loss).unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        let t = t.to_dtype(DType::F32).unwrap();
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    let mut out = vec![bits(loss.value())];
    for (name, p) in m.named_parameters() {
        if p.requires_grad() {
            let g = p.grad().unwrap_or_else(|| panic!("{name} has no gradient"));
            out.push(bits(&g));
        }
    }
    out
}

#[test]
fn checkpointed_blocks_give_the_same_gradients_bit_for_bit() {
    let _s = serial();
    for dev in test_devices().unwrap() {
        for (cast, lora) in [
            (None, false),
            (Some(DType::BF16), false),
            (Some(DType::BF16), true),
        ] {
            let want = pass(&model(&dev, 0, lora), cast, &dev);
            for every in [1, 2] {
                let got = pass(&model(&dev, every, lora), cast, &dev);
                assert_eq!(got.len(), want.len());
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    let what = if i == 0 { "loss" } else { "a gradient" };
                    assert!(
                        a == b,
                        "{dev} {cast:?} lora {lora} every {every}: {what} differs (#{i})"
                    );
                }
            }
        }
    }
}

#[test]
fn the_chunked_loss_equals_the_whole_one() {
    let _s = serial();
    // Chunks of 5 rows of the 32 (a last chunk of 2) against whole logits (this size's
    // automatic choice): within 1e-6 of the largest value (the head's gradient sums its rows
    // in another order).
    for dev in test_devices().unwrap() {
        for tied in [false, true] {
            let whole = model_with(&dev, 0, false, tied);
            let mut chunked = model_with(&dev, 0, false, tied);
            chunked.loss_chunk_rows = Some(5);
            let (a, b) = (pass(&chunked, None, &dev), pass(&whole, None, &dev));
            for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                let f = |v: &[u32]| {
                    v.iter()
                        .map(|&u| f32::from_bits(u) as f64)
                        .collect::<Vec<_>>()
                };
                let (a, b) = (f(a), f(b));
                let scale = b.iter().fold(1f64, |m, v| m.max(v.abs()));
                let err = a
                    .iter()
                    .zip(&b)
                    .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
                assert!(err <= 1e-6 * scale, "{dev} tied {tied}: #{i} off by {err}");
            }
        }
    }
}

#[test]
fn lora_over_a_bf16_base_learns_with_f32_adapters() {
    let _s = serial();
    for dev in test_devices().unwrap() {
        let cfg = LlamaConfig {
            dtype: DType::BF16,
            ..LlamaConfig::tiny(40)
        };
        let mut g = Generator::new(8);
        let mut m = Llama::new(cfg, &dev, &mut g).unwrap().with_checkpointing(1);
        // The frozen (tied) head at std 0.5, not 0.02: at dim 16 the initial one bounds the
        // logits to a few tenths, so no adapter could fit the batch.
        let table = &m.tok_embeddings.weight;
        table
            .assign(&table.value().mul_scalar(25.0).unwrap())
            .unwrap();
        m.add_lora(&adapters(4, 0.0, &["all-linear"]), &mut g)
            .unwrap();
        let frozen: Vec<(String, Vec<f64>)> = m
            .named_parameters()
            .into_iter()
            .filter(|(_, p)| !p.requires_grad())
            .map(|(n, p)| (n, p.value().to_vec_f64().unwrap()))
            .collect();
        assert!(frozen.iter().all(|(n, _)| !n.contains("lora_")));
        let adapters = m.trainable_parameters();
        assert_eq!(
            adapters.len(),
            2 * 7 * 2,
            "A and B on 7 projections, 2 layers"
        );
        assert!(adapters.iter().all(|p| p.dtype() == DType::F32));
        let mut opt = netcl_optim::AdamW::new(adapters, 1e-2).weight_decay(0.0);
        let v: Vec<i32> = (0..34).map(|i| (i * 7 + i * i) % 40).collect();
        let x = Tensor::from_vec(v[..32].to_vec(), &[2, 16], &dev).unwrap();
        let y = Tensor::from_vec(v[1..33].to_vec(), &[2, 16], &dev).unwrap();
        let mut losses = Vec::new();
        for _ in 0..12 {
            let tape = Tape::new();
            let loss = loss(&m, &tape, &x, &y, Some(DType::BF16));
            tape.backward(&loss).unwrap();
            netcl_optim::Optimizer::step(&mut opt).unwrap();
            netcl_optim::Optimizer::zero_grad(&mut opt);
            losses.push(loss.item().unwrap());
        }
        assert!(
            losses[11] < 0.7 * losses[0],
            "{dev}: LoRA over a bf16 base does not learn: {losses:?}"
        );
        // The optimizer's state is f32, and the bf16 base kept every bit.
        let state = netcl_optim::Optimizer::state_tensors(&opt);
        assert_eq!(state.len(), 2 * 2 * 7 * 2, "{dev}: m and v per adapter");
        assert!(state.iter().all(|(_, t)| t.dtype() == DType::F32));
        for (name, before) in frozen {
            let p = m
                .named_parameters()
                .into_iter()
                .find(|(n, _)| *n == name)
                .unwrap()
                .1;
            assert_eq!(p.dtype(), DType::BF16, "{dev}: {name}");
            assert!(p.grad().is_none(), "{dev}: {name} has a gradient");
            assert_eq!(
                p.value().to_vec_f64().unwrap(),
                before,
                "{dev}: {name} changed"
            );
        }
    }
}

/// Bytes held now and the peak since the last reset, after the device's queued work.
fn memory(dev: &Device) -> (usize, usize) {
    dev.synchronize().unwrap();
    netcl_core_memory::held(dev).unwrap()
}

/// One case of the estimate: autocast, checkpointing, tied head, batch, LoRA (rank, dropout,
/// all-linear), weights' dtype, forced loss chunk.
type Case = (
    Option<DType>,
    usize,
    bool,
    usize,
    Option<(usize, f64, bool)>,
    DType,
    Option<usize>,
);

#[test]
fn memory_estimate_predicts_the_pools_peak() {
    let _s = serial();
    // The peak of the second AdamW step (moments allocated) measured from before the model
    // existed, against the estimate: within 15% (the walk models every tensor a step keeps;
    // what it does not model are an op's short-lived internals).
    let cases: [Case; 6] = [
        (None, 0, true, 8, None, DType::F32, None),
        (Some(DType::BF16), 1, true, 8, None, DType::F32, None),
        (Some(DType::BF16), 0, false, 4, None, DType::F32, Some(16)),
        (Some(DType::F16), 2, false, 4, None, DType::F32, None),
        (
            Some(DType::BF16),
            1,
            true,
            8,
            Some((4, 0.05, true)),
            DType::BF16,
            None,
        ),
        (
            Some(DType::BF16),
            0,
            false,
            4,
            Some((4, 0.1, false)),
            DType::F32,
            None,
        ),
    ];
    // OpenCL devices: the estimate is of a device pool's peak; the host also counts its reference
    // ops' internal buffers (f64 copies, packed operands), which no pool holds.
    for dev in test_devices()
        .unwrap()
        .into_iter()
        .filter(|d| d.is_opencl())
    {
        for (cast, every, tied, b, with_lora, dtype, chunk) in cases {
            let what =
                format!("{dev} {cast:?} every {every} tied {tied} B{b} {with_lora:?} {dtype}");
            let cfg = LlamaConfig {
                dim: 64,
                n_layers: 2,
                n_heads: 4,
                n_kv_heads: 2,
                hidden_dim: 160,
                max_seq_len: 16,
                tied_embeddings: tied,
                dtype,
                ..LlamaConfig::llama_15m(512)
            };
            let base = memory(&dev).0;
            let mut g = Generator::new(1);
            let mut m = Llama::new(cfg, &dev, &mut g)
                .unwrap()
                .with_checkpointing(every);
            m.loss_chunk_rows = chunk;
            if let Some((rank, dropout, all)) = with_lora {
                let targets: &[&str] = if all { &["all-linear"] } else { &["q", "v"] };
                m.add_lora(&adapters(rank, dropout, targets), &mut g)
                    .unwrap();
            }
            let mut opt = netcl_optim::AdamW::new(m.trainable_parameters(), 1e-3);
            let t = 16;
            let v: Vec<i32> = (0..b * t).map(|i| (i * 7 % 512) as i32).collect();
            let x = Tensor::from_vec(v.clone(), &[b, t], &dev).unwrap();
            let y: Vec<i32> = v.iter().map(|i| (i + 1) % 512).collect();
            let y = Tensor::from_vec(y, &[b, t], &dev).unwrap();
            let mut peak = 0;
            for _ in 0..2 {
                netcl_core_memory::reset_held_peak(&dev).unwrap();
                let tape = Tape::new();
                let loss = loss(&m, &tape, &x, &y, cast);
                tape.backward(&loss).unwrap();
                netcl_optim::Optimizer::step(&mut opt).unwrap();
                netcl_optim::Optimizer::zero_grad(&mut opt);
                drop(loss);
                peak = memory(&dev).1 - base;
            }
            let est = m.memory_estimate(b, t, cast, every);
            let ratio = est as f64 / peak as f64;
            assert!(
                (0.85..=1.15).contains(&ratio),
                "{what}: estimate {est} B, measured peak {peak} B"
            );
        }
    }
}
