//! Activation checkpointing: gradients equal those without it bit for bit (f32, bf16 autocast, dropout, nesting), the activations are really freed, and a recomputation that differs is an error.
use netcl_autograd::{autocast, checkpoint, Parameter, Tape, Var};
use netcl_core_devices::test_devices;
use netcl_ops::{DType, Device, Generator, Result, Tensor};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Mutex;

/// The memory test reads process-wide counters: the tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A segment with parameters, a dropout drawing from a shared generator, and a residual:
/// `x + dropout(tanh(x W1)) W2`.
#[derive(Clone)]
struct Segment {
    w1: Parameter,
    w2: Parameter,
    gen: Rc<RefCell<Generator>>,
    p: f64,
}

impl Segment {
    fn new(dim: usize, hidden: usize, dev: &Device, seed: u64, p: f64) -> Segment {
        let mut g = Generator::new(seed);
        let mut w = |r, c| {
            let t = Tensor::randn(&[r, c], DType::F32, dev, &mut g).unwrap();
            Parameter::new(t.mul_scalar(0.4).unwrap()).unwrap()
        };
        Segment {
            w1: w(dim, hidden),
            w2: w(hidden, dim),
            gen: Rc::new(RefCell::new(Generator::new(seed + 100))),
            p,
        }
    }

    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        let h = x.matmul(&tape.param(&self.w1))?.tanh()?;
        let h = h.dropout(self.p, &mut self.gen.borrow_mut())?;
        x.add(&h.matmul(&tape.param(&self.w2))?)
    }
}

/// How the segments of a pass run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Plain,
    Checkpointed,
    /// Each pair of segments in one checkpoint, the second also checkpointed inside it.
    Nested,
}

fn pass(tape: &Tape, segs: &[Segment], x: &Var, mode: Mode) -> Result<Var> {
    let mut h = x.clone();
    match mode {
        Mode::Plain => {
            for s in segs {
                h = s.forward(tape, &h)?;
            }
        }
        Mode::Checkpointed => {
            for s in segs {
                let s = s.clone();
                h = checkpoint(tape, &[h], move |t, xs| s.forward(t, &xs[0]))?;
            }
        }
        Mode::Nested => {
            for pair in segs.chunks(2) {
                let pair = pair.to_vec();
                h = checkpoint(tape, &[h], move |t, xs| {
                    let mut h = pair[0].forward(t, &xs[0])?;
                    if let Some(second) = pair.get(1).cloned() {
                        h = checkpoint(t, &[h], move |t, xs| second.forward(t, &xs[0]))?;
                    }
                    Ok(h)
                })?;
            }
        }
    }
    // A loss that weights every output element differently.
    let w = Tensor::arange(0.0, h.numel() as f64, 1.0, DType::F32, h.device())?
        .reshape(h.shape())?
        .mul_scalar(0.01)?
        .sin()?;
    h.mul(&Var::from(&w))?.sum_all()
}

/// Loss, the input's gradient and every parameter's gradient of one pass, as f32 bits.
fn run(dev: &Device, mode: Mode, cast: Option<DType>, p: f64) -> (Vec<u32>, Vec<Vec<u32>>) {
    let segs: Vec<Segment> = (0..4)
        .map(|i| Segment::new(8, 12, dev, 10 + i, p))
        .collect();
    let mut g = Generator::new(3);
    let x = Tensor::randn(&[2, 3, 8], DType::F32, dev, &mut g).unwrap();
    let tape = Tape::new();
    let xv = tape.leaf(&x).unwrap();
    let loss = match cast {
        Some(dt) => autocast(dt, || pass(&tape, &segs, &xv, mode)).unwrap(),
        None => pass(&tape, &segs, &xv, mode),
    }
    .unwrap();
    let grads = tape.backward(&loss).unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        let t = t.to_dtype(DType::F32).unwrap();
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    let mut all = vec![bits(grads.get(&xv).unwrap())];
    for s in &segs {
        all.push(bits(&s.w1.grad().unwrap()));
        all.push(bits(&s.w2.grad().unwrap()));
        // The forward drew once per segment, whatever the mode (the recomputation replays).
        let drawn = if p > 0.0 { 2 * 3 * 12 / 4 } else { 0 };
        assert_eq!(s.gen.borrow().counter(), drawn, "{dev} {mode:?}");
    }
    (bits(loss.value()), all)
}

#[test]
fn gradients_equal_those_without_checkpointing_bit_for_bit() {
    let _s = serial();
    for dev in test_devices().unwrap() {
        for (cast, p) in [(None, 0.0), (None, 0.25), (Some(DType::BF16), 0.25)] {
            let want = run(&dev, Mode::Plain, cast, p);
            for mode in [Mode::Checkpointed, Mode::Nested] {
                let got = run(&dev, mode, cast, p);
                assert_eq!(got.0, want.0, "{dev} {mode:?} {cast:?} p {p}: loss");
                for (i, (a, b)) in got.1.iter().zip(&want.1).enumerate() {
                    assert_eq!(a, b, "{dev} {mode:?} {cast:?} p {p}: gradient {i}");
                }
            }
        }
    }
}

#[test]
fn checkpointed_activations_are_freed_after_forward() {
    let _s = serial();
    for dev in test_devices().unwrap() {
        // Eight segments of [64, 256] activations (64 KiB each): without checkpointing each
        // keeps tanh's output, the dropout mask and product inputs; with it, only its input.
        let segs: Vec<Segment> = (0..8)
            .map(|i| Segment::new(256, 256, &dev, 20 + i, 0.1))
            .collect();
        let x = Tensor::randn(&[64, 256], DType::F32, &dev, &mut Generator::new(4)).unwrap();
        let mut held = Vec::new();
        for mode in [Mode::Plain, Mode::Checkpointed] {
            dev.synchronize().unwrap();
            let before = netcl_core_memory::held(&dev).unwrap().0;
            let tape = Tape::new();
            let loss = pass(&tape, &segs, &Var::from(&x), mode).unwrap();
            dev.synchronize().unwrap();
            held.push(
                netcl_core_memory::held(&dev)
                    .unwrap()
                    .0
                    .saturating_sub(before),
            );
            tape.backward(&loss).unwrap();
        }
        let act = 64 * 256 * 4;
        // Checkpointed: the eight segment inputs (seven new) and small tensors; plain: at least
        // three activations per segment more.
        assert!(
            held[1] <= 12 * act && held[0] >= held[1] + 16 * act,
            "{dev}: bytes held after forward: plain {}, checkpointed {}",
            held[0],
            held[1]
        );
    }
}

#[test]
fn a_recomputation_that_differs_is_an_error() {
    let _s = serial();
    let dev = Device::host();
    let w = Parameter::new(Tensor::ones(&[4], DType::F32, &dev).unwrap()).unwrap();
    let x = Tensor::ones(&[4], DType::F32, &dev).unwrap();
    // The second call draws a mask of another size.
    let calls = Rc::new(RefCell::new(0usize));
    let gen = Rc::new(RefCell::new(Generator::new(1)));
    let (c, g, wc) = (calls.clone(), gen.clone(), w.clone());
    let tape = Tape::new();
    let y = checkpoint(&tape, &[Var::from(&x)], move |t, xs| {
        *c.borrow_mut() += 1;
        let n = if *c.borrow() == 1 { 4 } else { 40 };
        let _ = Tensor::rand(&[n], DType::F32, &Device::host(), &mut g.borrow_mut())?;
        xs[0].mul(&t.param(&wc))?.sum_all()
    })
    .unwrap();
    let err = tape.backward(&y).unwrap_err().to_string();
    assert!(err.contains("random draw"), "{err}");
    assert_eq!(*calls.borrow(), 2);
    assert!(w.grad().is_none(), "no gradient after a failed backward");

    // Outside a recording tape the function just runs, and nothing is recorded.
    let eval = Tape::no_grad();
    let y = checkpoint(&eval, &[Var::from(&x)], |_, xs| xs[0].exp()).unwrap();
    assert!(!y.is_tracked() && eval.is_empty());
}
