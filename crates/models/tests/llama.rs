//! Llama on every device: KV-cache decoding equals the full forward, batched padded generation equals one prompt at a time, a tiny model learns, parameter gradients match finite differences in f64, bad input is an error, training resumes exactly (its stacked weights still joined).
use netcl_autograd::Tape;
use netcl_core_devices::test_devices;
use netcl_models::{
    generate, generate_until, KvCache, Llama, LlamaConfig, RopeScaling, Sampler, Sampling,
};
use netcl_nn::{load_checkpoint, save_checkpoint, Module};
use netcl_ops::{DType, Device, Generator, RopeStyle, Tensor};
use netcl_optim::{AdamW, Optimizer};

fn ids(v: &[i32], b: usize, dev: &Device) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[b, v.len() / b], dev).unwrap()
}

fn tokens(n: usize, vocab: usize, seed: usize) -> Vec<i32> {
    (0..n)
        .map(|i| ((i * 7 + seed * 13 + i * i) % vocab) as i32)
        .collect()
}

#[test]
fn cache_decoding_gives_the_full_forward_logits() {
    const T: usize = 24;
    for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
        let cfg = LlamaConfig {
            rope_style: style,
            ..LlamaConfig::tiny(50)
        };
        for dev in test_devices().unwrap() {
            let model = Llama::new(cfg.clone(), &dev, &mut Generator::new(1)).unwrap();
            let seq = tokens(2 * T, 50, 3);
            let tape = Tape::no_grad();
            let full = model
                .logits(&tape, &ids(&seq, 2, &dev), None, None, None)
                .unwrap();
            let full = full.value().to_vec::<f32>().unwrap();
            let cache = KvCache::new(&cfg, 2, &dev).unwrap();
            // Prefill 4 positions, then 17 at once (the fused attention kernel over the cache,
            // causal offset 4), then one at a time (composed); the full forward is fused too.
            let mut got = vec![0f32; full.len()];
            let mut at = 0;
            for len in [4, 17, 1, 1, 1] {
                let step: Vec<i32> = (0..2)
                    .flat_map(|b| seq[b * T + at..b * T + at + len].to_vec())
                    .collect();
                let l = model
                    .logits(&tape, &ids(&step, 2, &dev), None, Some(&cache), None)
                    .unwrap();
                let l = l.value().to_vec::<f32>().unwrap();
                for b in 0..2 {
                    for p in 0..len {
                        let src = (b * len + p) * 50;
                        let dst = (b * T + at + p) * 50;
                        got[dst..dst + 50].copy_from_slice(&l[src..src + 50]);
                    }
                }
                at += len;
            }
            assert_eq!(cache.len(), at);
            for b in 0..2 {
                for p in 0..at {
                    for v in 0..50 {
                        let i = (b * T + p) * 50 + v;
                        assert!(
                            (got[i] - full[i]).abs() <= 1e-4 * (1.0 + full[i].abs()),
                            "{dev} {style:?} row {b} pos {p}: {} vs {}",
                            got[i],
                            full[i]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn fused_decoding_gives_the_full_forward_logits() {
    // Both RoPE pairings, and Llama 3's scaled frequency table; grouped heads (4 over 2).
    const T: usize = 12;
    let scaled = Some(RopeScaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8,
    });
    let configs = [
        (RopeStyle::Interleaved, None),
        (RopeStyle::Halves, None),
        (RopeStyle::Halves, scaled),
    ];
    for (style, scaling) in configs {
        let scaled = scaling.is_some();
        let cfg = LlamaConfig {
            rope_style: style,
            rope_scaling: scaling,
            ..LlamaConfig::tiny(50)
        };
        for dev in test_devices().unwrap() {
            let model = Llama::new(cfg.clone(), &dev, &mut Generator::new(4)).unwrap();
            assert!(model.decode_supported());
            let seq = tokens(2 * T, 50, 5);
            let tape = Tape::no_grad();
            let full = model
                .logits(&tape, &ids(&seq, 2, &dev), None, None, None)
                .unwrap()
                .value()
                .to_vec::<f32>()
                .unwrap();
            // Prefill 3 positions, then one token per row at a time through the decode kernels.
            let cache = KvCache::new(&cfg, 2, &dev).unwrap();
            let prefill: Vec<i32> = (0..2)
                .flat_map(|b| seq[b * T..b * T + 3].to_vec())
                .collect();
            model
                .logits(&tape, &ids(&prefill, 2, &dev), None, Some(&cache), None)
                .unwrap();
            for p in 3..T {
                let step = Tensor::from_vec(vec![seq[p], seq[T + p]], &[2], &dev).unwrap();
                let got = model.decode(&step, &cache, None).unwrap();
                assert_eq!(got.shape(), [2, 50]);
                let got = got.to_vec::<f32>().unwrap();
                for b in 0..2 {
                    for v in 0..50 {
                        let want = full[(b * T + p) * 50 + v];
                        let g = got[b * 50 + v];
                        assert!(
                            (g - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{dev} {style:?} scaled {scaled} row {b} pos {p} token {v}: {g} vs {want}"
                        );
                    }
                }
            }
            assert_eq!(cache.len(), T);
            // Bad input: ids of another batch, and a full cache.
            let one = Tensor::from_vec(vec![1i32], &[1], &dev).unwrap();
            let e = model.decode(&one, &cache, None).unwrap_err().to_string();
            assert!(e.contains("I32 [2]"), "{e}");
        }
    }
}

#[test]
fn a_replayed_decode_step_gives_the_eager_steps_logits() {
    // Two caches fed the same tokens: one decoded eagerly, one by a captured step replayed for
    // each later token; padded rows (the position comes from the device at each replay).
    const T: usize = 9;
    let cfg = LlamaConfig::tiny(50);
    for dev in test_devices()
        .unwrap()
        .into_iter()
        .filter(|d| d.is_opencl())
    {
        let model = Llama::new(cfg.clone(), &dev, &mut Generator::new(6)).unwrap();
        let seq = tokens(2 * T, 50, 8);
        let tape = Tape::no_grad();
        let pads = Tensor::from_vec(vec![0i32, 1], &[2], &dev).unwrap();
        let caches = [(); 2].map(|_| KvCache::new(&cfg, 2, &dev).unwrap());
        for cache in &caches {
            let prefill: Vec<i32> = (0..2)
                .flat_map(|b| seq[b * T..b * T + 2].to_vec())
                .collect();
            model
                .logits(&tape, &ids(&prefill, 2, &dev), None, Some(cache), None)
                .unwrap();
        }
        let step = |p: usize| Tensor::from_vec(vec![seq[p], seq[T + p]], &[2], &dev).unwrap();
        let eager = model.decode(&step(2), &caches[0], Some(&pads)).unwrap();
        let (mut graph, first) = model
            .capture_decode(&step(2), &caches[1], Some(&pads))
            .unwrap();
        // A layer is one persistent decode_block kernel, or its five kernels where the device
        // takes them instead (PoCL 5).
        let kernels = graph.graph().stats().kernels;
        let per_layer = (kernels - 3) / cfg.n_layers;
        assert!(
            kernels == per_layer * cfg.n_layers + 3 && [1, 5].contains(&per_layer),
            "{kernels} kernels for {} layers",
            cfg.n_layers
        );
        let same = |a: &Tensor, b: &Tensor, p: usize| {
            assert_eq!(
                a.to_vec::<f32>().unwrap(),
                b.to_vec::<f32>().unwrap(),
                "{dev} position {p}"
            )
        };
        same(&eager, &first, 2);
        for p in 3..T {
            let eager = model.decode(&step(p), &caches[0], Some(&pads)).unwrap();
            let replayed = graph.step(&step(p), &caches[1]).unwrap();
            same(&eager, &replayed, p);
        }
        assert_eq!(caches[1].len(), T);
        assert_eq!(caches[1].position().to_vec::<i32>().unwrap(), [T as i32]);
        let e = graph.step(&step(1), &caches[0]).unwrap_err().to_string();
        assert!(e.contains("not the one"), "{e}");
    }
}

#[test]
fn batched_padded_generation_equals_one_prompt_at_a_time() {
    let cfg = LlamaConfig::tiny(40);
    for dev in test_devices().unwrap() {
        let model = Llama::new(cfg.clone(), &dev, &mut Generator::new(2)).unwrap();
        let prompts = vec![vec![5u32, 9, 2, 30, 1], vec![7u32, 3]];
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                let mut s = Sampler::new(Sampling::Greedy, 0).unwrap();
                generate(&model, std::slice::from_ref(p), 6, &mut s, None, |_, _| {
                    Ok(())
                })
                .unwrap()
                .remove(0)
            })
            .collect();
        let mut streamed = vec![Vec::new(); 2];
        let mut s = Sampler::new(Sampling::Greedy, 0).unwrap();
        let both = generate(&model, &prompts, 6, &mut s, None, |r, t| {
            streamed[r].push(t);
            Ok(())
        })
        .unwrap();
        assert_eq!(both, alone, "{dev}");
        assert_eq!(streamed, both, "{dev}: tokens are streamed as they come");
        // Seeded sampling is reproducible.
        let sampling = Sampling::Random {
            temperature: 0.9,
            top_k: 10,
            top_p: 0.9,
        };
        let run = |seed| {
            let mut s = Sampler::new(sampling, seed).unwrap();
            generate(&model, &prompts, 8, &mut s, None, |_, _| Ok(())).unwrap()
        };
        assert_eq!(run(7), run(7), "{dev}");
        // Restricted to the first 6 ids (a tokenizer smaller than the embedding): every chosen
        // id is below 6, greedy (on the device) and sampled; the greedy pick is the restricted
        // logits' argmax.
        for sampling in [Sampling::Greedy, sampling] {
            let mut s = Sampler::new(sampling, 3).unwrap().restricted_to(6).unwrap();
            let out = generate(&model, &prompts, 8, &mut s, None, |_, _| Ok(())).unwrap();
            assert!(out.iter().flatten().all(|&t| t < 6), "{dev}: {out:?}");
        }
        let tape = Tape::no_grad();
        let logits = model
            .logits(&tape, &ids(&[7, 3], 1, &dev), None, None, None)
            .unwrap()
            .value()
            .to_vec::<f32>()
            .unwrap();
        let last = &logits[40..46];
        let want = (0..6).max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a)));
        let mut s = Sampler::new(Sampling::Greedy, 0)
            .unwrap()
            .restricted_to(6)
            .unwrap();
        let got = generate(&model, &[vec![7u32, 3]], 1, &mut s, None, |_, _| Ok(())).unwrap();
        assert_eq!(Some(got[0][0] as usize), want, "{dev}");
        assert!(Sampler::new(Sampling::Greedy, 0)
            .unwrap()
            .restricted_to(0)
            .is_err());
        // A row finished by its callback (a stop string) gets no more tokens; the other row
        // goes on with the same tokens as before.
        let mut s = Sampler::new(Sampling::Greedy, 0).unwrap();
        let mut n = 0;
        let first_two = generate_until(&model, &prompts, 6, &mut s, None, |r, _| {
            n += usize::from(r == 0);
            Ok(r == 0 && n == 2)
        })
        .unwrap();
        assert_eq!(first_two[0], both[0][..2], "{dev}");
        assert_eq!(first_two[1], both[1], "{dev}");
        // -n 0 and a prompt at max_seq_len give empty rows; an empty prompt is an error.
        let mut s = Sampler::new(Sampling::Greedy, 0).unwrap();
        let none = generate(&model, &prompts, 0, &mut s, None, |_, _| Ok(())).unwrap();
        assert_eq!(none, vec![Vec::<u32>::new(); 2]);
        let full = vec![vec![1u32; cfg.max_seq_len]];
        let at_end = generate(&model, &full, 4, &mut s, None, |_, _| Ok(())).unwrap();
        assert_eq!(at_end, vec![Vec::<u32>::new()]);
        let empty = generate(&model, &[vec![3], vec![]], 4, &mut s, None, |_, _| Ok(()));
        assert!(empty
            .unwrap_err()
            .to_string()
            .contains("prompt 1 has no tokens"));
    }
}

#[test]
fn a_tiny_llama_learns_a_sequence() {
    let cfg = LlamaConfig {
        max_seq_len: 16,
        ..LlamaConfig::tiny(16)
    };
    for dev in test_devices().unwrap() {
        let model = Llama::new(cfg.clone(), &dev, &mut Generator::new(3)).unwrap();
        let mut opt = AdamW::new(model.parameters(), 1e-2).weight_decay(0.0);
        // A fixed permutation of the vocabulary, repeated: each token predicts the next.
        let perm = [3, 11, 0, 7, 14, 2, 9, 5, 12, 1, 15, 6, 10, 4, 13, 8];
        let seq: Vec<i32> = (0..4 * 13)
            .map(|i| perm[(i % 4 * 3 + i / 4) % 16])
            .collect();
        let (x, y): (Vec<i32>, Vec<i32>) = (0..4)
            .flat_map(|b| (0..12).map(move |t| (b, t)))
            .map(|(b, t)| (seq[b * 13 + t], seq[b * 13 + t + 1]))
            .unzip();
        let (x, y) = (ids(&x, 4, &dev), ids(&y, 4, &dev));
        let mut losses = Vec::new();
        for _ in 0..60 {
            let tape = Tape::new();
            let loss = model.loss(&tape, &x, &y).unwrap();
            losses.push(loss.item().unwrap());
            tape.backward(&loss).unwrap();
            opt.step().unwrap();
            opt.zero_grad();
        }
        let (first, last) = (losses[0], *losses.last().unwrap());
        assert!(
            (first - (16f64).ln()).abs() < 0.3,
            "{dev}: starts near ln(16): {first}"
        );
        assert!(last < 0.25 * first, "{dev}: loss {first} -> {last}");
    }
}

#[test]
fn parameter_gradients_match_finite_differences_in_f64() {
    let cfg = LlamaConfig {
        dim: 8,
        n_heads: 2,
        n_kv_heads: 1,
        hidden_dim: 12,
        max_seq_len: 8,
        tied_embeddings: false,
        dtype: DType::F64,
        ..LlamaConfig::tiny(11)
    };
    for dev in test_devices().unwrap() {
        if !dev.info().fp64 {
            continue;
        }
        let model = Llama::new(cfg.clone(), &dev, &mut Generator::new(4)).unwrap();
        // Larger weights than the N(0, 0.02) init, so every path contributes.
        for (_, p) in model.named_parameters() {
            let t = p.value().mul_scalar(20.0).unwrap();
            p.assign(&t).unwrap();
        }
        let x = ids(&[1, 5, 9, 2, 7, 3], 2, &dev);
        let y = ids(&[5, 9, 2, 7, 3, 10], 2, &dev);
        let tape = Tape::new();
        tape.backward(&model.loss(&tape, &x, &y).unwrap()).unwrap();
        let loss_at = || {
            model
                .loss(&Tape::no_grad(), &x, &y)
                .unwrap()
                .item()
                .unwrap()
        };
        let mut checked = 0;
        for (name, p) in model.named_parameters() {
            let g = p.grad().unwrap().to_vec_f64().unwrap();
            let v = p.value().to_vec_f64().unwrap();
            for i in [0, v.len() / 2, v.len() - 1] {
                let h = 1e-5;
                let set = |d: f64| {
                    let mut w = v.clone();
                    w[i] += d;
                    p.assign(&Tensor::from_vec(w, p.shape(), &dev).unwrap())
                        .unwrap();
                };
                set(h);
                let up = loss_at();
                set(-h);
                let down = loss_at();
                set(0.0);
                let fd = (up - down) / (2.0 * h);
                assert!(
                    (fd - g[i]).abs() <= 1e-6 + 1e-4 * fd.abs(),
                    "{dev} {name}[{i}]: backward {} vs finite difference {fd}",
                    g[i]
                );
                checked += 1;
            }
        }
        assert!(checked >= 3 * 20);
    }
}

#[test]
fn bad_input_is_an_error_naming_the_value() {
    let cfg = LlamaConfig::tiny(20);
    let dev = Device::host();
    let model = Llama::new(cfg.clone(), &dev, &mut Generator::new(5)).unwrap();
    let mut s = Sampler::new(Sampling::Greedy, 0).unwrap();
    let err = |r: netcl_ops::Result<Vec<Vec<u32>>>| r.unwrap_err().to_string();
    let long = vec![vec![1u32; 33]];
    assert!(err(generate(&model, &long, 1, &mut s, None, |_, _| Ok(()))).contains("33"));
    assert!(
        err(generate(&model, &[vec![]], 1, &mut s, None, |_, _| Ok(())))
            .contains("at least one token")
    );
    assert!(err(generate(
        &model,
        &[vec![3, 20]],
        1,
        &mut s,
        None,
        |_, _| Ok(())
    ))
    .contains("token 20"));
    let e = model
        .logits(&Tape::no_grad(), &ids(&[1, 25], 1, &dev), None, None, None)
        .unwrap_err();
    assert!(e.to_string().contains("25"), "{e}");
    let cache = KvCache::new(&cfg, 1, &dev).unwrap();
    let e = model
        .logits(
            &Tape::no_grad(),
            &ids(&[1; 40], 1, &dev),
            None,
            Some(&cache),
            None,
        )
        .unwrap_err();
    assert!(e.to_string().contains("max_seq_len 32"), "{e}");
    assert!(Sampler::new(
        Sampling::Random {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0
        },
        0
    )
    .is_err());
    let bad = LlamaConfig {
        n_kv_heads: 3,
        ..cfg.clone()
    };
    let e = Llama::new(bad, &dev, &mut Generator::new(0))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("n_kv_heads 3"), "{e}");
    // A checkpoint of another config.
    let dir = std::env::temp_dir().join(format!("netcl-llama-{}", std::process::id()));
    save_checkpoint(dir.join("a"), &model, None, 0, serde_json::json!({})).unwrap();
    let other = Llama::new(LlamaConfig { dim: 24, ..cfg }, &dev, &mut Generator::new(0)).unwrap();
    let e = load_checkpoint(dir.join("a"), &other, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tok_embeddings.weight") && e.contains("[20, 16]"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _: Option<&dyn Optimizer> = None;
}

#[test]
fn training_resumed_from_a_checkpoint_follows_the_same_losses() {
    let cfg = LlamaConfig {
        max_seq_len: 8,
        ..LlamaConfig::tiny(16)
    };
    let dir = std::env::temp_dir().join(format!("netcl-llama-resume-{}", std::process::id()));
    for dev in test_devices().unwrap() {
        let x = ids(&tokens(16, 16, 1), 2, &dev);
        let y = ids(&tokens(16, 16, 2), 2, &dev);
        let fresh = || {
            let m = Llama::new(cfg.clone(), &dev, &mut Generator::new(9)).unwrap();
            let o = AdamW::new(m.parameters(), 3e-3).weight_decay(0.1);
            (m, o)
        };
        let step = |m: &Llama, o: &mut AdamW| {
            let tape = Tape::new();
            let loss = m.loss(&tape, &x, &y).unwrap();
            let l = loss.item().unwrap();
            tape.backward(&loss).unwrap();
            o.step().unwrap();
            o.zero_grad();
            l
        };
        let (m, mut o) = fresh();
        let straight: Vec<f64> = (0..6).map(|_| step(&m, &mut o)).collect();
        let (m, mut o) = fresh();
        let mut resumed: Vec<f64> = (0..3).map(|_| step(&m, &mut o)).collect();
        save_checkpoint(dir.join("c"), &m, Some(&o), 3, serde_json::json!({})).unwrap();
        drop((m, o));
        let (m, mut o) = Llama::new(cfg.clone(), &dev, &mut Generator::new(77))
            .map(|m| {
                let o = AdamW::new(m.parameters(), 3e-3).weight_decay(0.1);
                (m, o)
            })
            .unwrap();
        load_checkpoint(dir.join("c"), &m, Some(&mut o)).unwrap();
        resumed.extend((0..3).map(|_| step(&m, &mut o)));
        assert_eq!(
            straight, resumed,
            "{dev}: bit-identical losses after resume"
        );
        // The stacked products' weights still lie side by side (joined without a copy) after
        // a load and AdamW's updates.
        for b in &m.layers {
            let (a, f) = (&b.attention, &b.feed_forward);
            let qkv = [&a.wq, &a.wk, &a.wv].map(|l| l.weight.value());
            assert!(Tensor::joined(&qkv, 0).is_some(), "{dev}: wq, wk, wv");
            let up = f.w3.as_ref().unwrap();
            let gate_up = [&f.w1, up].map(|l| l.weight.value());
            assert!(Tensor::joined(&gate_up, 0).is_some(), "{dev}: w1, w3");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
