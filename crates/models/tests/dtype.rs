//! Llama::to_dtype on every device: bf16 weights are the f32 weights rounded, the logits stay within bf16's rounding of the f32 model's, greedy generation runs on them, and integer dtypes and LoRA adapters are errors.
use netcl_autograd::Tape;
use netcl_core_devices::test_devices;
use netcl_models::{generate, Llama, LlamaConfig, Sampler, Sampling};
use netcl_nn::{LoraConfig, Module};
use netcl_ops::{DType, Generator, Tensor};

#[test]
fn bf16_weights_are_the_f32_weights_rounded() {
    let cfg = LlamaConfig::tiny(50);
    for dev in test_devices().unwrap() {
        let model = Llama::new(cfg.clone(), &dev, &mut Generator::new(3)).unwrap();
        let half = model.to_dtype(DType::BF16).unwrap();
        assert_eq!(half.config.dtype, DType::BF16);
        let f32s = |m: &Llama| -> Vec<(String, Vec<f32>)> {
            (m.named_parameters().into_iter())
                .map(|(n, p)| (n, p.value().to_dtype(DType::F32).unwrap().to_vec().unwrap()))
                .collect()
        };
        let rounded: Vec<(String, Vec<f32>)> = (model.named_parameters().into_iter())
            .map(|(n, p)| {
                let r = p.value().to_dtype(DType::BF16).unwrap();
                (n, r.to_dtype(DType::F32).unwrap().to_vec().unwrap())
            })
            .collect();
        assert!(
            f32s(&half) == rounded,
            "{dev}: bf16 weights differ from the rounded f32 ones"
        );
        // And back: f32 weights holding the bf16 values exactly.
        assert!(
            f32s(&half.to_dtype(DType::F32).unwrap()) == rounded,
            "{dev}"
        );

        let seq: Vec<i32> = (0..16).map(|i| (i * 7 + 3) % 50).collect();
        let x = Tensor::from_vec(seq, &[2, 8], &dev).unwrap();
        let tape = Tape::no_grad();
        let logits = |m: &Llama| -> Vec<f32> {
            let l = m.logits(&tape, &x, None, None, None).unwrap();
            l.value().to_dtype(DType::F32).unwrap().to_vec().unwrap()
        };
        let (want, got) = (logits(&model), logits(&half));
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        // bf16 keeps 8 bits of mantissa: a few units of 2^-8 of the logits' scale.
        assert!(
            worst <= 0.05 * scale,
            "{dev}: worst {worst} at scale {scale}"
        );

        let mut s = Sampler::new(Sampling::Greedy, 0).unwrap();
        let out = generate(&half, &[vec![1, 2, 3]], 5, &mut s, None, |_, _| Ok(())).unwrap();
        assert_eq!(out[0].len(), 5, "{dev}");
    }
}

#[test]
fn integer_dtypes_and_adapters_are_errors() {
    let dev = netcl_ops::Device::host();
    let mut model = Llama::new(LlamaConfig::tiny(50), &dev, &mut Generator::new(3)).unwrap();
    let err = |m: &Llama, d| m.to_dtype(d).err().expect("an error").to_string();
    let e = err(&model, DType::I32);
    assert!(e.contains("Llama::to_dtype") && e.contains("i32"), "{e}");
    model
        .add_lora(&LoraConfig::default(), &mut Generator::new(4))
        .unwrap();
    let e = err(&model, DType::BF16);
    assert!(e.contains("lora") || e.contains("LoRA"), "{e}");
}
