//! Shared pieces of the bench runner and the autotuner: device choice from the command line and wall-clock timing of enqueued work.
use netcl_core_devices::{Device, Error, Result};

pub mod clblast;
pub mod train;
use std::time::Instant;

/// The device named by `--device SPEC` in `args`, else `NETCL_DEVICE`/the best one.
pub fn device_from_args(args: &[String]) -> Result<Device> {
    match args.iter().position(|a| a == "--device") {
        Some(i) if i + 1 < args.len() => Device::parse(&args[i + 1]),
        _ => Device::best(),
    }
}

/// Checks `args` (the program name first) against `flags`, each taking one value: `Ok(false)`
/// after printing `usage` for `--help`/`-h`, an error naming `program` for an unknown flag or a
/// flag without its value, else `Ok(true)`.
pub fn check_flags(args: &[String], program: &str, flags: &[&str], usage: &str) -> Result<bool> {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "--help" || a == "-h" {
            println!("{usage}");
            return Ok(false);
        }
        if !flags.contains(&a.as_str()) {
            return Err(Error::invalid(
                program,
                format!("unknown argument {a:?}; flags: {}", flags.join(", ")),
            ));
        }
        if it.next().is_none() {
            return Err(Error::invalid(program, format!("{a} needs a value")));
        }
    }
    Ok(true)
}

/// The value after `flag` in `args`.
pub fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.as_str())
}

/// Median seconds per call of `f` over `reps` timed batches of `iters` calls (after `warmup`
/// calls), synchronising the device around each batch so that device time is included.
pub fn time_per_call(
    device: &Device,
    warmup: usize,
    iters: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    device.synchronize()?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        device.synchronize()?;
        samples.push(t.elapsed().as_secs_f64() / iters as f64);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    Ok(samples[samples.len() / 2])
}
