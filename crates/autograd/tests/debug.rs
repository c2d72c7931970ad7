//! The debug mode on every device: anomaly detection names the op that made the first NaN/Inf (forward or backward), its shapes and the line in this file; `NETCL_DEBUG=nan` turns it on; off, nothing is checked; sync mode reports a kernel's bad index at the op.
use netcl_autograd::{Tape, Var};
use netcl_core_devices::debug::{detect_anomaly, DebugGuard};
use netcl_core_devices::{test_devices, Device, Error};
use netcl_ops::{DType, Result, Tensor};

/// The end of this file's path as `Location::caller` names it (`crates/autograd/tests/debug.rs`).
const THIS_FILE: &str = "tests/debug.rs";

/// Whether the environment turns a mode on for the whole run (then "off" cannot be tested).
fn env_debug() -> bool {
    std::env::var_os("NETCL_DEBUG").is_some()
}

/// A small net whose log meets negative values: x (2, 3) @ w (3, 4), tanh, then log. The log's
/// line is returned with the result so a test can look for it in the error.
fn net_with_log_of_negatives(dev: &Device) -> Result<(Result<Var>, u32)> {
    let tape = Tape::new();
    let x = Var::constant(Tensor::from_vec(
        vec![1.0f32, -2.0, 0.5, 0.25, 1.5, -1.0],
        &[2, 3],
        dev,
    )?);
    let w = tape.leaf(&Tensor::from_vec(
        (0..12).map(|i| i as f32 / 6.0 - 1.0).collect(),
        &[3, 4],
        dev,
    )?)?;
    let h = x.matmul(&w)?.tanh()?.mul_scalar(3.0)?;
    let line = line!() + 1;
    let y = h.log();
    Ok((y, line))
}

fn non_finite(e: &Error) -> (&str, &str) {
    match e {
        Error::NonFinite { op, msg } => (op, msg),
        other => panic!("expected Error::NonFinite, got {other}"),
    }
}

#[test]
fn forward_nan_is_reported_at_the_op_that_made_it() {
    for dev in test_devices().unwrap() {
        let (y, line) = detect_anomaly(|| net_with_log_of_negatives(&dev)).unwrap();
        let e = y.unwrap_err();
        let (op, msg) = non_finite(&e);
        assert_eq!(op, "log", "{dev}: {e}");
        assert!(msg.contains("output f32 [2, 4]"), "{dev}: {e}");
        assert!(msg.contains("Inputs: input 0 f32 [2, 4]"), "{dev}: {e}");
        assert!(msg.contains("its inputs are finite"), "{dev}: {e}");
        assert!(msg.contains("the first NaN"), "{dev}: {e}");
        assert!(
            msg.contains(&format!("{THIS_FILE}:{line}:")),
            "{dev}: the site should be line {line} of this file: {e}"
        );

        if !env_debug() {
            // Off: the same net runs and its NaNs go on.
            let (y, _) = net_with_log_of_negatives(&dev).unwrap();
            let v = y.unwrap().value().to_vec_f64().unwrap();
            assert!(v.iter().any(|x| x.is_nan()), "{dev}: {v:?}");
        }
    }
}

#[test]
fn an_input_that_already_held_nan_is_named() {
    for dev in test_devices().unwrap() {
        let _guard = DebugGuard::anomaly();
        let tape = Tape::new();
        let x = tape
            .leaf(&Tensor::from_vec(vec![1.0f32, f32::NAN, 2.0], &[3], &dev).unwrap())
            .unwrap();
        let e = x.mul_scalar(2.0).unwrap_err();
        let (op, msg) = non_finite(&e);
        assert!(op.contains("mul"), "{dev}: {e}");
        assert!(msg.contains("input 0 already held NaN/Inf"), "{dev}: {e}");
        assert!(msg.contains("the first NaN at [1]"), "{dev}: {e}");
    }
}

/// sqrt(0) is finite, its gradient 1 / (2 sqrt(0)) is not: only backward sees an infinity.
fn sqrt_then_backward(dev: &Device) -> (Result<()>, u32) {
    let tape = Tape::new();
    let x = tape
        .leaf(&Tensor::from_vec(vec![4.0f32, 0.0, 1.0, 9.0, 0.25, 16.0], &[2, 3], dev).unwrap())
        .unwrap();
    let line = line!() + 1;
    let s = x.sqrt().unwrap();
    let loss = s.mul_scalar(0.5).unwrap().sum_all().unwrap();
    assert!(loss.item().unwrap().is_finite());
    (tape.backward(&loss).map(drop), line)
}

#[test]
fn backward_inf_is_reported_at_the_backward_op() {
    for dev in test_devices().unwrap() {
        let (r, line) = detect_anomaly(|| sqrt_then_backward(&dev));
        let e = r.unwrap_err();
        let (op, msg) = non_finite(&e);
        assert_eq!(op, "backward of sqrt", "{dev}: {e}");
        assert!(
            msg.contains("gradient for input 0 (f32 [2, 3])"),
            "{dev}: {e}"
        );
        assert!(msg.contains("the first inf at [0, 1]"), "{dev}: {e}");
        assert!(
            msg.contains("the output's gradient is finite"),
            "{dev}: {e}"
        );
        assert!(
            msg.contains(&format!("{THIS_FILE}:{line}:")),
            "{dev}: the site should be line {line} of this file: {e}"
        );

        if !env_debug() {
            let (r, _) = sqrt_then_backward(&dev);
            r.unwrap();
        }
    }
}

/// Run by `netcl_debug_nan_turns_checks_on` in a child process with `NETCL_DEBUG=nan`.
#[test]
#[ignore = "run in a child process with NETCL_DEBUG=nan"]
fn child_log_of_negatives_fails_without_a_guard() {
    assert_eq!(std::env::var("NETCL_DEBUG").as_deref(), Ok("nan"));
    let dev = Device::host();
    let (y, _) = net_with_log_of_negatives(&dev).unwrap();
    assert_eq!(non_finite(&y.unwrap_err()).0, "log");
}

#[test]
fn netcl_debug_nan_turns_checks_on() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_log_of_negatives_fails_without_a_guard",
            "--ignored",
        ])
        .env("NETCL_DEBUG", "nan")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

/// With sync launches, an out-of-range index found by the kernel (more indices than the host
/// pre-check reads) is the error of the op whose kernel found it; without, of the next read.
#[test]
fn sync_mode_reports_a_kernel_index_error_at_the_op() {
    let n = netcl_ops::INDEX_CHECK_LIMIT + 1;
    for dev in test_devices()
        .unwrap()
        .into_iter()
        .filter(Device::is_opencl)
    {
        let table = Var::constant(Tensor::zeros(&[4, 2], DType::F32, &dev).unwrap());
        let mut ids = vec![1i32; n];
        ids[n - 3] = 7;
        let ids = Tensor::from_vec(ids, &[n], &dev).unwrap();

        let e = {
            let _sync = DebugGuard::sync();
            table.embedding(&ids).unwrap_err()
        };
        let msg = e.to_string();
        assert!(msg.starts_with("embedding:"), "{dev}: {msg}");
        assert!(
            msg.contains(&format!("index 7 at position {}", n - 3)),
            "{dev}: {msg}"
        );
        assert!(msg.contains("right after its launch"), "{dev}: {msg}");

        if !env_debug() {
            let y = table.embedding(&ids).unwrap();
            let e = y.value().to_vec_f64().unwrap_err().to_string();
            assert!(e.contains("at the next read"), "{dev}: {e}");
        }
    }
}
