//! ZeRO-1 and bf16 gradient communication: a sharded AdamW equals the unsharded one on 2 and 3 ranks (OpenCL relay, host path), with clipping and a gradient scaler that overflows on one rank only; bf16 all-reduced gradients equal the host rounding of the f32 sum of each rank's bf16 gradient, bit for bit.
use netcl_core_devices::{opencl_test_devices, DType, Device, Result};
use netcl_distributed::{shard_path, Comm, DataParallel, DdpOptions, Group};
use netcl_nn::checkpoint::json_path;
use netcl_nn::Module;
use netcl_ops::Tensor;
use netcl_optim::{clip_grad_norm_of, AdamW, GradScaler, Optimizer, ParamGroup};
use std::path::Path;
use std::sync::Mutex;

mod support;
use support::equivalence::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Groups to test on: every OpenCL test device (2 or 3 ranks, the relay), and the host beside
/// OpenCL devices (the host path).
fn groups() -> Result<Vec<(String, Group)>> {
    let cl = opencl_test_devices()?;
    let mut out = Vec::new();
    if cl.len() >= 2 {
        out.push((format!("{} opencl", cl.len()), Group::new(cl.clone())?));
    }
    let mut mixed = vec![Device::host()];
    mixed.extend(cl.into_iter().take(2));
    out.push((
        format!("host + {} opencl", mixed.len() - 1),
        Group::new(mixed)?,
    ));
    Ok(out)
}

/// AdamW with weight decay on matrices only (parameter groups: the inner optimizer's order is
/// not the buffer's).
fn make(ps: Vec<netcl_autograd::Parameter>) -> AdamW {
    let (mats, vecs): (Vec<_>, Vec<_>) = ps.into_iter().partition(|p| p.shape().len() > 1);
    AdamW::new(mats, 3e-3)
        .weight_decay(0.1)
        .add_group(vecs, ParamGroup::new().weight_decay(0.0))
}

/// Eight AdamW steps (weight decay on matrices only), sharded or not, with `clip` the gradients
/// clipped to that norm: the parameters after.
fn train_adamw(comm: &Comm, sharded: bool, clip: Option<f64>) -> Result<Vec<Vec<f32>>> {
    let model = mlp(comm.device(), 7 + comm.rank() as u64)?;
    let options = DdpOptions {
        bucket_bytes: 512,
        ..Default::default()
    };
    let mut ddp = DataParallel::new(comm, &model, options)?;
    let mut opt: Box<dyn Optimizer + '_> = if sharded {
        let z = ddp.shard_optimizer(|ps| Ok(make(ps)))?;
        let owned = z.owned().len();
        let total = z.params().len();
        assert!(
            owned < total || comm.size() == 1,
            "rank {} owns all",
            comm.rank()
        );
        Box::new(z)
    } else {
        Box::new(make(model.parameters()))
    };
    for s in 0..8 {
        let (x, y) = batch(s, BATCH)?;
        ddp_step(&mut ddp, &model, (&x, &y), 1.0)?;
        if sharded && comm.size() > 1 {
            // Only the owned parameters keep a (reduced) gradient.
            let with: usize = opt.params().iter().filter(|p| p.grad().is_some()).count();
            assert!(with < opt.params().len(), "rank {}: {with}", comm.rank());
        }
        if let Some(max) = clip {
            let norm = clip_grad_norm_of(opt.as_ref(), max)?;
            assert!(norm > max, "step {s}: norm {norm} is not clipped to {max}");
        }
        opt.step()?;
        opt.zero_grad();
    }
    if sharded && comm.size() > 1 {
        // State names give the parameter's position among all (groups reorder the inner
        // optimizer's): each names a parameter of its shape.
        for (name, t) in opt.state_tensors() {
            let g: usize = name.rsplit_once('.').unwrap().1.parse().unwrap();
            assert_eq!(t.shape(), opt.params()[g].shape(), "{name}");
        }
    }
    // The moments are sharded: this rank holds state for its parameters only.
    let held: usize = opt.state_tensors().iter().map(|(_, t)| t.numel()).sum();
    let all: usize = model.parameters().iter().map(|p| p.numel()).sum();
    if sharded && comm.size() > 1 {
        assert!(
            held < 2 * all,
            "rank {}: {held} state elements",
            comm.rank()
        );
    } else {
        assert_eq!(held, 2 * all);
    }
    params(&model)
}

#[test]
fn sharded_adamw_equals_unsharded() -> Result<()> {
    let _turn = serial();
    for (name, group) in groups()? {
        let plain = group.run(|c| train_adamw(c, false, None))?;
        let sharded = group.run(|c| train_adamw(c, true, None))?;
        for (r, p) in sharded.iter().enumerate() {
            assert!(p == &sharded[0], "{name}: rank {r} differs from rank 0");
        }
        let d = max_diff(&plain[0], &sharded[0]);
        eprintln!("{name}: max |sharded - unsharded| = {d:e}");
        // The same kernel on the same values where every rank is the same kind of device; with
        // the host beside GPUs each shard steps on its own rank's device (rounding may differ
        // from rank 0's, which stepped everything unsharded).
        let ds = group.devices();
        let exact = ds.iter().all(|d| d.info().name == ds[0].info().name);
        assert!(
            d == 0.0 || !exact && d < TOL,
            "{name}: sharded differs from unsharded by {d}"
        );
        // Clipped: the norm over every rank's shard (summed in another order than one
        // device's, so within rounding).
        let plain = group.run(|c| train_adamw(c, false, Some(0.05)))?;
        let sharded = group.run(|c| train_adamw(c, true, Some(0.05)))?;
        for (r, p) in sharded.iter().enumerate() {
            assert!(
                p == &sharded[0],
                "{name}: clipped, rank {r} differs from rank 0"
            );
        }
        let d = max_diff(&plain[0], &sharded[0]);
        eprintln!("{name}: clipped, max |sharded - unsharded| = {d:e}");
        assert!(
            d < TOL,
            "{name}: clipped, sharded differs from unsharded by {d}"
        );
    }
    Ok(())
}

/// Sharded AdamW for 8 steps, saving a checkpoint after 4 and 6 at `save`, or resuming from
/// the one at `resume`: rank 0's parameters.
fn zero_run(comm: &Comm, save: Option<&Path>, resume: Option<&Path>) -> Result<Vec<Vec<f32>>> {
    let model = mlp(
        comm.device(),
        7 + 100 * u64::from(resume.is_some()) + comm.rank() as u64,
    )?;
    let options = DdpOptions {
        bucket_bytes: 512,
        ..Default::default()
    };
    let mut ddp = DataParallel::new(comm, &model, options)?;
    let mut opt = ddp.shard_optimizer(|ps| Ok(make(ps)))?;
    let mut from = 0;
    if let Some(path) = resume {
        from = ddp.load_checkpoint(path, &model, Some(&mut opt))?.step as usize;
    }
    for s in from..8 {
        let (x, y) = batch(s, BATCH)?;
        ddp_step(&mut ddp, &model, (&x, &y), 1.0)?;
        opt.step()?;
        opt.zero_grad();
        if let Some(path) = save.filter(|_| s + 1 == 4 || s + 1 == 6) {
            let step = (s + 1) as u64;
            ddp.save_checkpoint(path, &model, Some(&opt), step, serde_json::json!({}))?;
        }
    }
    params(&model)
}

#[test]
fn a_sharded_checkpoint_resumes_the_same_trajectory() -> Result<()> {
    let _turn = serial();
    let dir = std::env::temp_dir().join(format!("netcl-zero-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let all = groups()?;
    let mut straights = Vec::new();
    for (i, (name, group)) in all.iter().enumerate() {
        let path = dir.join(format!("ckpt{i}"));
        let straight = group.run(|c| zero_run(c, Some(&path), None))?;
        // Each rank but 0 keeps the shard of the last save only, beside rank 0's checkpoint.
        for r in 1..group.size() {
            let shard = |step| json_path(shard_path(&path, r, step)).exists();
            assert!(shard(6), "{name}: rank {r}'s shard");
            assert!(!shard(4), "{name}: rank {r}'s shard of the earlier save");
        }
        let resumed = group.run(|c| zero_run(c, None, Some(&path)))?;
        let d = max_diff(&straight[0], &resumed[0]);
        eprintln!("{name}: resumed at step 6 vs straight: {d:e}");
        assert!(d == 0.0, "{name}: the resumed run differs by {d}");
        straights.push(straight);
    }
    // On a group of another size (more ranks, fewer, one device) the shards are cut anew: the
    // trajectory goes on within reduction-order rounding.
    let cl = opencl_test_devices()?;
    let single = Group::new(vec![cl[0].clone()])?;
    let mut others: Vec<(&str, &Group)> = vec![("1 opencl", &single)];
    others.extend(all.iter().map(|(n, g)| (n.as_str(), g)));
    for (i, (saved_by, group)) in all.iter().enumerate() {
        let path = dir.join(format!("ckpt{i}"));
        for (name, other) in others.iter().filter(|(_, o)| o.size() != group.size()) {
            let resumed = other.run(|c| zero_run(c, None, Some(&path)))?;
            for (r, p) in resumed.iter().enumerate() {
                assert!(p == &resumed[0], "{name}: rank {r} differs from rank 0");
            }
            let d = max_diff(&straights[i][0], &resumed[0]);
            eprintln!("saved by {saved_by}, resumed on {name}: {d:e}");
            assert!(
                d < TOL,
                "saved by {saved_by}, resumed on {name}: differs by {d}"
            );
        }
    }
    // An optimizer that is not sharded cannot take several ranks' shards: an error on every rank.
    let (_, big) = all.iter().max_by_key(|(_, g)| g.size()).expect("a group");
    let path = dir.join(format!("ckpt{}", all.len() - 1));
    let errs = single.run(|c| {
        let model = mlp(c.device(), 7)?;
        let ddp = DataParallel::new(c, &model, DdpOptions::default())?;
        let mut opt = make(model.parameters());
        Ok(ddp.load_checkpoint(&path, &model, Some(&mut opt)).map(drop))
    })?;
    let want = format!("the state of {} ranks", big.size());
    assert!(
        errs.iter()
            .all(|e| e.as_ref().is_err_and(|e| e.to_string().contains(&want))),
        "{errs:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// One sharded step under a gradient scaler where the last rank's first owned gradient is made
/// infinite: whether each rank stepped, and whether its parameters changed.
fn overflow_on_one_rank(comm: &Comm) -> Result<(bool, bool)> {
    let model = mlp(comm.device(), 7)?;
    let options = DdpOptions {
        bucket_bytes: 512,
        ..Default::default()
    };
    let mut ddp = DataParallel::new(comm, &model, options)?;
    let mut opt = ddp.shard_optimizer(|ps| Ok(AdamW::new(ps, 3e-3)))?;
    let mut scaler = GradScaler::new(1024.0)?;
    let before = params(&model)?;
    let (x, y) = batch(0, BATCH)?;
    ddp_step(&mut ddp, &model, (&x, &y), 1024.0)?;
    if comm.rank() + 1 == comm.size() {
        let p = opt.params()[opt.owned().start].clone();
        let inf = Tensor::full(p.shape(), f64::INFINITY, p.dtype(), p.device())?;
        p.set_grad(Some(inf))?;
    }
    let stepped = scaler.step(&mut opt)?;
    Ok((stepped, params(&model)? != before))
}

#[test]
fn a_sharded_overflow_skips_the_step_on_every_rank() -> Result<()> {
    let _turn = serial();
    for (name, group) in groups()? {
        let got = group.run(overflow_on_one_rank)?;
        assert!(
            got.iter().all(|&(stepped, changed)| !stepped && !changed),
            "{name}: (stepped, changed) per rank {got:?}"
        );
    }
    Ok(())
}

/// Each rank's own gradient, its share of the batch, and the gradient after the bf16
/// all-reduce.
fn bf16_gradients(comm: &Comm) -> Result<(Vec<f32>, f32, Vec<f32>)> {
    let model = mlp(comm.device(), 7)?;
    let options = DdpOptions {
        bucket_bytes: 512,
        comm_dtype: DType::BF16,
        weights: Some((1..=comm.size()).map(|r| r as f64).collect()),
        ..Default::default()
    };
    let mut ddp = DataParallel::new(comm, &model, options)?;
    let flat = |m: &dyn Module| -> Result<Vec<f32>> {
        let mut v = Vec::new();
        for p in m.parameters().iter().rev() {
            v.extend(p.grad().expect("a gradient").to_vec::<f32>()?);
        }
        Ok(v)
    };
    let (x, y) = batch(3, BATCH)?;
    let rows = ddp.shard_range(BATCH);
    let share = rows.len() as f32 / BATCH as f32;
    // The local gradient of this rank's mean loss, without communication.
    ddp.no_sync(|d| ddp_step(d, &model, (&x, &y), 1.0))?;
    let local = flat(&model)?;
    for p in model.parameters() {
        p.zero_grad();
    }
    ddp_step(&mut ddp, &model, (&x, &y), 1.0)?;
    Ok((local, share, flat(&model)?))
}

#[test]
fn bf16_communication_rounds_once_after_an_f32_sum() -> Result<()> {
    let _turn = serial();
    let round = |x: f32| half::bf16::from_f32(x).to_f32();
    for (name, group) in groups()? {
        let got = group.run(bf16_gradients)?;
        let n = got[0].0.len();
        let want: Vec<f32> = (0..n)
            .map(|i| {
                let mut acc = got[0].1 * round(got[0].0[i]);
                for (local, share, _) in &got[1..] {
                    acc += share * round(local[i]);
                }
                round(acc)
            })
            .collect();
        let mut f32_sum_diff = 0f32;
        for (r, (_, _, reduced)) in got.iter().enumerate() {
            assert_eq!(reduced, &want, "{name}: rank {r}");
        }
        // Against the f32 sum: within a few bf16 steps (2^-8) of the gradient's magnitude.
        let exact: Vec<f32> = (0..n)
            .map(|i| got.iter().map(|(l, s, _)| s * l[i]).sum())
            .collect();
        let scale = exact.iter().fold(0f32, |m, x| m.max(x.abs()));
        for i in 0..n {
            f32_sum_diff = f32_sum_diff.max((exact[i] - want[i]).abs() / scale);
        }
        eprintln!("{name}: bf16 wire vs f32 sum: max difference {f32_sum_diff:e} of the largest");
        assert!(f32_sum_diff < 3.0 / 256.0, "{name}: {f32_sum_diff}");
    }
    Ok(())
}
