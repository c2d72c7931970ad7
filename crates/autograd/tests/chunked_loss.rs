//! The chunked language-model loss against the unchunked one (linear + cross_entropy) on every device: loss, input and weight gradients for untied and tied heads, ragged last chunks, ignored rows, a frozen head and bf16 autocast; the automatic rule; peak memory holds one chunk's logits.
use netcl_autograd::{autocast, loss_chunk_rows, Parameter, Tape, Var, LOSS_CHUNK_ELEMENTS};
use netcl_core_devices::test_devices;
use netcl_ops::{Activation, DType, Device, Generator, Result, Tensor};
use std::sync::Mutex;

/// The peak-memory test reads process-wide counters: the tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Targets in [0, vocab) with every 5th row `ignore` when given.
fn targets(n: usize, vocab: usize, ignore: Option<i32>, dev: &Device) -> Tensor {
    let v: Vec<i32> = (0..n)
        .map(|i| match ignore {
            Some(ig) if i % 5 == 2 => ig,
            _ => ((i * 7 + i * i * 3) % vocab) as i32,
        })
        .collect();
    Tensor::from_vec(v, &[n], dev).unwrap()
}

/// Loss, dX and dW as f64 from one pass: the head's product and the loss chunked (`Some(rows)`)
/// or as linear + cross_entropy (`None`). With `tied`, the head is also the table the inputs
/// are looked up in (dW sums both uses); `frozen` makes the head a constant.
#[allow(clippy::too_many_arguments)]
fn pass(
    x: &Tensor,
    w: &Parameter,
    t: &Tensor,
    ignore: Option<i32>,
    chunk: Option<usize>,
    tied: bool,
    cast: Option<DType>,
) -> (f64, Vec<f64>, Option<Vec<f64>>) {
    w.zero_grad();
    let tape = Tape::new();
    let xv = tape.leaf(x).unwrap();
    let f = || -> Result<Var> {
        let wv = tape.param(w);
        let h = if tied {
            let ids = Tensor::from_vec(
                (0..x.shape()[0] as i32)
                    .map(|i| i * 3 % w.shape()[0] as i32)
                    .collect(),
                &[x.shape()[0]],
                x.device(),
            )?;
            xv.add(&wv.embedding(&ids)?.tanh()?)?
        } else {
            xv.clone()
        };
        match chunk {
            Some(rows) => h.linear_cross_entropy(&wv, t, ignore, Some(rows)),
            None => h
                .linear(&wv, None, Activation::None)?
                .cross_entropy(t, ignore),
        }
    };
    let loss = match cast {
        Some(dt) => autocast(dt, f).unwrap(),
        None => f(),
    }
    .unwrap();
    let grads = tape.backward(&loss).unwrap();
    (
        loss.item().unwrap(),
        grads.get(&xv).unwrap().to_vec_f64().unwrap(),
        w.grad().map(|g| g.to_vec_f64().unwrap()),
    )
}

/// Largest |a - b| over the largest |b| (at least 1).
fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1f64, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn chunked_loss_equals_the_unchunked_loss_and_gradients() {
    let _s = serial();
    // 23 rows in chunks of 4 and 7 (last chunks of 3 and 2 rows), a vocabulary of 37: every
    // difference within 1e-6 of the largest value in f32 (the weight gradient's sums over rows
    // run in another order), within 4e-3 (one bf16 ulp) under bf16 autocast (each chunk's
    // product is rounded to bf16 on its own where products are written in bf16 before
    // widening). One chunk of all the rows is the unchunked computation, bit for bit.
    for dev in test_devices().unwrap() {
        let mut g = Generator::new(9);
        let (n, d, v) = (23, 16, 37);
        let x = Tensor::randn(&[n, d], DType::F32, &dev, &mut g).unwrap();
        let w = Tensor::randn(&[v, d], DType::F32, &dev, &mut g)
            .unwrap()
            .mul_scalar(0.3)
            .unwrap();
        let w = Parameter::new(w).unwrap();
        for (cast, tol) in [(None, 1e-6), (Some(DType::BF16), 4e-3)] {
            for (tied, ignore) in [(false, None), (true, None), (false, Some(-100))] {
                let t = targets(n, v, ignore, &dev);
                let want = pass(&x, &w, &t, ignore, None, tied, cast);
                for rows in [4, 7, 64] {
                    let got = pass(&x, &w, &t, ignore, Some(rows), tied, cast);
                    let what = format!("{dev} {cast:?} tied {tied} ignore {ignore:?} rows {rows}");
                    assert!(
                        (got.0 - want.0).abs() <= tol * want.0.abs(),
                        "{what}: loss {} vs {}",
                        got.0,
                        want.0
                    );
                    let ex = rel_err(&got.1, &want.1);
                    assert!(ex <= tol, "{what}: dx off by {ex}");
                    let ew = rel_err(got.2.as_ref().unwrap(), want.2.as_ref().unwrap());
                    assert!(ew <= tol, "{what}: dW off by {ew}");
                    if rows >= n {
                        assert!(got == want, "{what}: one chunk differs from the whole");
                    }
                }
            }
        }
        // A frozen head: the input's gradient alone.
        w.set_requires_grad(false);
        let t = targets(n, v, None, &dev);
        let want = pass(&x, &w, &t, None, None, false, None);
        let got = pass(&x, &w, &t, None, Some(5), false, None);
        assert!(got.2.is_none() && want.2.is_none());
        assert!(rel_err(&got.1, &want.1) <= 1e-6, "{dev}: frozen head dx");
    }
}

#[test]
fn the_automatic_rule_chunks_large_logits() {
    assert_eq!(loss_chunk_rows(8 * 128, 32000), None);
    // 2^26 / 32000 = 2097 rows, rounded down to whole 64-row groups; 523 of 128256 likewise.
    assert_eq!(loss_chunk_rows(8192, 32000), Some(2048));
    assert_eq!(loss_chunk_rows(4096, 128256), Some(512));
    // Below 64 rows a chunk keeps what fits.
    assert_eq!(loss_chunk_rows(64, LOSS_CHUNK_ELEMENTS / 40), Some(40));
    assert_eq!(loss_chunk_rows(2, LOSS_CHUNK_ELEMENTS), Some(1));
    // Bad input is an error, not a panic.
    let dev = Device::host();
    let x = Var::from(Tensor::zeros(&[4, 8], DType::F32, &dev).unwrap());
    let w = Var::from(Tensor::zeros(&[10, 8], DType::F32, &dev).unwrap());
    let t = Tensor::from_vec(vec![1i32, 2, 3, 4], &[4], &dev).unwrap();
    assert!(x.linear_cross_entropy(&w, &t, None, Some(0)).is_err());
    let short = Tensor::from_vec(vec![1i32, 2], &[2], &dev).unwrap();
    assert!(x.linear_cross_entropy(&w, &short, None, Some(2)).is_err());
    let w9 = Var::from(Tensor::zeros(&[10, 9], DType::F32, &dev).unwrap());
    assert!(x.linear_cross_entropy(&w9, &t, None, Some(2)).is_err());
}

#[test]
fn chunks_hold_one_chunk_of_logits_at_a_time() {
    let _s = serial();
    for dev in test_devices().unwrap() {
        let mut g = Generator::new(2);
        let (n, d, v) = (64, 16, 1024);
        let x = Tensor::randn(&[n, d], DType::F32, &dev, &mut g).unwrap();
        let w = Parameter::new(Tensor::randn(&[v, d], DType::F32, &dev, &mut g).unwrap()).unwrap();
        let t = targets(n, v, None, &dev);
        let mut rise = Vec::new();
        for chunk in [None, Some(8)] {
            dev.synchronize().unwrap();
            let before = netcl_core_memory::held(&dev).unwrap().0;
            netcl_core_memory::reset_held_peak(&dev).unwrap();
            pass(&x, &w, &t, None, chunk, false, None);
            dev.synchronize().unwrap();
            rise.push(netcl_core_memory::held(&dev).unwrap().1 - before);
        }
        // Whole: the logits and their gradient (256 KiB each) at once; chunked: 32 KiB each.
        let logits = n * v * 4;
        assert!(
            rise[1] + logits < rise[0],
            "{dev}: peak rise unchunked {} chunked {}",
            rise[0],
            rise[1]
        );
    }
}
