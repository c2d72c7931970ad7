//! A checkpoint saved by a data-parallel group resumes on fewer devices (one, and two) and on the same group, continuing the group's trajectory within the reduction-order tolerance.
use netcl_autograd::{Tape, Var};
use netcl_core_devices::{opencl_test_devices, Device, Error, Result};
use netcl_distributed::{DataParallel, DdpOptions, Group};
use netcl_nn::{load_checkpoint, mse_loss, Module, Sequential};
use netcl_optim::{Optimizer, Sgd};
use std::path::Path;

mod support;
use support::equivalence::*;

/// Steps before the checkpoint; as many follow it.
const HALF: usize = 10;

/// Steps `from..to` on this rank of a group (its rows of each whole batch), or on one device
/// (`ddp` None, the whole batch): SGD with momentum.
fn steps(
    model: &Sequential,
    opt: &mut Sgd,
    mut ddp: Option<&mut DataParallel<'_>>,
    from: usize,
    to: usize,
) -> Result<()> {
    let device = model.parameters()[0].value().device().clone();
    for s in from..to {
        let (x, y) = batch(s, BATCH)?;
        match ddp.as_deref_mut() {
            Some(d) => ddp_step(d, model, (&x, &y), 1.0)?,
            None => {
                let tape = Tape::new();
                let pred = model.forward(&tape, &Var::from(x.to_device(&device)?))?;
                let loss = mse_loss(&pred, &Var::from(y.to_device(&device)?))?;
                tape.backward(&loss)?;
            }
        }
        opt.step()?;
        opt.zero_grad();
    }
    Ok(())
}

/// Training on `group` from the checkpoint at `resume` (else from scratch, saving one at `save`
/// after `HALF` steps) to `2 HALF` steps: rank 0's parameters.
fn group_run(group: &Group, resume: Option<&Path>, save: Option<&Path>) -> Result<Vec<Vec<f32>>> {
    let ranks = group.run(|comm| {
        // Replicas start apart (DataParallel starts every rank from rank 0's parameters).
        let model = mlp(comm.device(), 7 + comm.rank() as u64)?;
        let mut opt = Sgd::new(model.parameters(), 0.1).momentum(0.9);
        let mut from = 0;
        if let Some(path) = resume {
            from = load_checkpoint(path, &model, Some(&mut opt))?.step as usize;
        }
        let mut ddp = DataParallel::new(comm, &model, DdpOptions::default())?;
        if let Some(path) = save {
            steps(&model, &mut opt, Some(&mut ddp), 0, HALF)?;
            ddp.save_checkpoint(path, &model, Some(&opt), HALF as u64, serde_json::json!({}))?;
            from = HALF;
        }
        steps(&model, &mut opt, Some(&mut ddp), from, 2 * HALF)?;
        params(&model)
    })?;
    Ok(ranks.into_iter().next().unwrap_or_default())
}

#[test]
fn a_group_checkpoint_resumes_on_fewer_devices() -> Result<()> {
    let mut devices = vec![Device::host()];
    devices.extend(opencl_test_devices()?);
    if devices.len() < 3 {
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("netcl-ddp-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::invalid("test", e.to_string()))?;
    let path = dir.join("ckpt");
    let all = Group::new(devices.clone())?;
    let whole = group_run(&all, None, Some(&path))?;

    // One device, the whole batch, from the group's checkpoint (a model made from another seed).
    let one = &devices[devices.len() - 1];
    let model = mlp(one, 99)?;
    let mut opt = Sgd::new(model.parameters(), 0.1).momentum(0.9);
    let from = load_checkpoint(&path, &model, Some(&mut opt))?.step as usize;
    assert_eq!(from, HALF);
    steps(&model, &mut opt, None, from, 2 * HALF)?;
    let d = max_diff(&whole, &params(&model)?);
    eprintln!("{} ranks -> 1 device: max difference {d:e}", devices.len());
    assert!(
        d <= TOL,
        "resumed on one device: max difference {d} > {TOL}"
    );

    // Two devices, and the same group again.
    let two = group_run(&Group::new(devices[1..3].to_vec())?, Some(&path), None)?;
    let d = max_diff(&whole, &two);
    eprintln!("{} ranks -> 2 devices: max difference {d:e}", devices.len());
    assert!(
        d <= TOL,
        "resumed on two devices: max difference {d} > {TOL}"
    );
    let again = group_run(&all, Some(&path), None)?;
    assert!(max_diff(&whole, &again) <= TOL);
    // Without the checkpoint's momentum the trajectory is another one: the test can tell.
    let model = mlp(one, 99)?;
    let mut opt = Sgd::new(model.parameters(), 0.1).momentum(0.9);
    load_checkpoint(&path, &model, None)?;
    steps(&model, &mut opt, None, HALF, 2 * HALF)?;
    assert!(max_diff(&whole, &params(&model)?) > 100.0 * TOL);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
