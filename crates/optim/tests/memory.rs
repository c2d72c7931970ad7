//! Memory of training, on every device, read from the pool's (or the host's) counters: frozen parameters get neither a gradient nor optimizer state, backward never computes a frozen weight's gradient, and an AdamW step allocates its moments once and no full-size temporary afterwards.
use netcl_autograd::{Parameter, Tape, Var};
use netcl_core_devices::test_devices;
use netcl_ops::{Activation, DType, Device, Generator, Tensor};
use netcl_optim::{AdamW, Optimizer};
use std::sync::Mutex;

/// The counters are process-wide: the tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes held now and the peak since the last reset, after the device's queued work.
fn memory(dev: &Device) -> (usize, usize) {
    dev.synchronize().unwrap();
    netcl_core_memory::held(dev).unwrap()
}

/// How much more than it held before `f` holds at its peak.
fn peak_rise(dev: &Device, f: impl FnOnce()) -> usize {
    let before = memory(dev).0;
    netcl_core_memory::reset_held_peak(dev).unwrap();
    f();
    memory(dev).1 - before
}

fn param(shape: &[usize], dev: &Device, g: &mut Generator) -> Parameter {
    Parameter::new(Tensor::randn(shape, DType::F32, dev, g).unwrap()).unwrap()
}

#[test]
fn frozen_parameters_get_no_gradient_and_no_state() {
    let _s = serial();
    for dev in test_devices().unwrap() {
        let mut g = Generator::new(1);
        // A first layer [512, 512] (1 MiB) much larger than the activations (16 KiB), frozen,
        // and a trainable [64, 512] one.
        let (w1, w2) = (
            param(&[512, 512], &dev, &mut g),
            param(&[64, 512], &dev, &mut g),
        );
        let x = Tensor::randn(&[8, 512], DType::F32, &dev, &mut g).unwrap();
        w1.set_requires_grad(false);
        // The optimizer is handed every parameter, frozen ones included.
        let mut opt = AdamW::new(vec![w1.clone(), w2.clone()], 1e-3);
        let step = |opt: &mut AdamW, frozen_input: bool| {
            let tape = Tape::new();
            let xv = if frozen_input {
                Var::from(&x)
            } else {
                tape.leaf(&x).unwrap()
            };
            let h = xv.linear(&tape.param(&w1), None, Activation::Relu).unwrap();
            let y = h.linear(&tape.param(&w2), None, Activation::None).unwrap();
            let loss = y.square().unwrap().sum_all().unwrap();
            tape.backward(&loss).unwrap();
            opt.step().unwrap();
            opt.zero_grad();
        };
        step(&mut opt, true);
        assert!(w1.grad().is_none(), "{dev}");
        let state = opt.state_tensors();
        assert_eq!(
            state.len(),
            2,
            "{dev}: m and v of the trainable weight only"
        );
        // Backward through the frozen layer with a tracked input computes dx, never dW1: its
        // peak stays below that of a trainable first layer (whose state already exists) by
        // at least dW1's 1 MiB.
        let frozen = peak_rise(&dev, || step(&mut opt, false));
        w1.set_requires_grad(true);
        let mut opt_all = AdamW::new(vec![w1.clone(), w2.clone()], 1e-3);
        step(&mut opt_all, false);
        let trainable = peak_rise(&dev, || step(&mut opt_all, false));
        assert!(
            frozen + 512 * 512 * 4 <= trainable,
            "{dev}: peak rise with the first layer frozen {frozen}, trainable {trainable}"
        );
    }
}

#[test]
fn adamw_steps_allocate_their_moments_once_and_no_full_size_temporary() {
    let _s = serial();
    for dev in test_devices().unwrap() {
        let mut g = Generator::new(2);
        let shapes: [&[usize]; 4] = [&[256, 64], &[64, 256], &[256], &[128, 128]];
        let params: Vec<Parameter> = shapes.iter().map(|s| param(s, &dev, &mut g)).collect();
        let bytes: usize = params.iter().map(|p| p.numel() * 4).sum();
        let smallest_matrix = 128 * 128 * 4;
        let mut opt = AdamW::new(params.clone(), 1e-3).weight_decay(0.1);
        let grads: Vec<Tensor> = params
            .iter()
            .map(|p| Tensor::randn(p.shape(), DType::F32, &dev, &mut g).unwrap())
            .collect();
        let mut rises = Vec::new();
        let mut held = Vec::new();
        for _ in 0..3 {
            for (p, gr) in params.iter().zip(&grads) {
                p.set_grad(Some(gr.clone())).unwrap();
            }
            rises.push(peak_rise(&dev, || opt.step().unwrap()));
            opt.zero_grad();
            held.push(memory(&dev).0);
        }
        // The first step allocates m and v (2 x the parameters) and small per-parameter counts.
        assert!(
            rises[0] >= 2 * bytes && rises[0] <= 2 * bytes + 64 * 1024,
            "{dev}: first step rose by {} for {} bytes of parameters",
            rises[0],
            bytes
        );
        // Later steps update in place: what they allocate is small next to any weight.
        for (i, &r) in rises.iter().enumerate().skip(1) {
            assert!(
                r < smallest_matrix / 4,
                "{dev}: step {i} allocated {r} bytes transiently"
            );
        }
        assert_eq!(held[1], held[2], "{dev}: a step keeps nothing new");
    }
}
