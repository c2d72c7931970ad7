//! netcl-autotune's calibration of the GEMM planner's tensor-core cost model: every candidate tiling timed (device time) on a reference set of products, the tilings fastest somewhere kept, each one's per-tile fixed cost and rate fitted by least squares over the set.
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::{plan_tuning, PlanTuning, TcTile, TileCost, WgChoice, WgTile};
use netcl_ops::gemm::{tiles_time, GemmKernel};
use netcl_ops::{Generator, MatmulOptions, Tensor};
use netcl_profiling::Profiler;

/// The tilings tried: widths and depths of matmul_wg.cl, one work-group a tile or 1 to 2
/// persistent ones per compute unit (2 only where two fit), or one a tile with a loading
/// warpgroup.
fn candidates() -> Vec<WgTile> {
    let shapes = [
        (256, 4),
        (256, 3),
        (128, 5),
        (128, 4),
        (128, 3),
        (64, 4),
        (64, 5),
    ];
    let mut v = Vec::new();
    for (tbn, stages) in shapes.into_iter().chain([(128, 6), (64, 6)]) {
        let kinds = [(0, false), (1, false), (2, false), (0, true)];
        for (persistent, ws) in kinds {
            let t = WgTile {
                tbn,
                stages,
                persistent,
                ws,
            };
            if t.valid() && persistent as usize <= resident(t) {
                v.push(t);
            }
        }
    }
    v
}

/// Work-groups of `t` one compute unit holds at once (Hopper: 228 KiB of local memory a unit).
fn resident(t: WgTile) -> usize {
    (228 * 1024 / t.shared_bytes()).max(1)
}

/// The reference products (m, n, k, layout): squares of 2048 to 8192 (nn), and a 1B-class
/// Llama step's forward (nt), input (nn) and weight gradients (tn) over 8192 tokens.
fn reference() -> Vec<(usize, usize, usize, &'static str)> {
    let mut v: Vec<_> = [2048, 4096, 8192]
        .iter()
        .map(|&n| (n, n, n, "nn"))
        .collect();
    let t = 8192;
    for (out, inn) in [
        (2048, 2048),
        (256, 2048),
        (5632, 2048),
        (2048, 5632),
        (32000, 2048),
    ] {
        v.extend([
            (t, out, inn, "nt"),
            (t, inn, out, "nn"),
            (out, inn, t, "tn"),
        ]);
    }
    v
}

/// bf16 operands of a reference product in its layout (nt: B = Wᵀ of a row-major W; tn: A = Yᵀ
/// of a row-major Y).
fn operands(
    dev: &Device,
    gen: &mut Generator,
    (m, n, k, layout): (usize, usize, usize, &str),
) -> Result<(Tensor, Tensor)> {
    let mut bf16 =
        |shape: &[usize]| Tensor::randn(shape, DType::F32, dev, gen)?.to_dtype(DType::BF16);
    let a = match layout {
        "tn" => bf16(&[k, m])?.transpose(0, 1)?,
        _ => bf16(&[m, k])?,
    };
    let b = match layout {
        "nt" => bf16(&[n, k])?.transpose(0, 1)?,
        _ => bf16(&[k, n])?,
    };
    Ok((a, b))
}

/// Seconds of device time of kernel `name` per call of `f` (the median of 5 calls after 2, from
/// the profiler's events: the host's share of a call is not the tiles' cost).
fn device_time(dev: &Device, name: &str, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..2 {
        f()?;
    }
    dev.synchronize()?;
    let p = Profiler::start();
    for _ in 0..5 {
        f()?;
    }
    dev.synchronize()?;
    let profile = p.stop();
    let mut ns: Vec<u64> = profile
        .kernels_named(name)
        .filter_map(|k| k.device_ns())
        .collect();
    ns.sort_unstable();
    match ns.get(ns.len() / 2) {
        Some(&t) => Ok(t as f64 * 1e-9),
        None => Err(netcl_core_devices::Error::invalid(
            "netcl-autotune",
            format!("no {name} kernel was profiled"),
        )),
    }
}

/// The cost of tiles of `rows` x `cols` at `per_cu` work-groups a compute unit fitted to `runs`
/// ((m, n, k) and seconds) by least squares of relative error: None where it does not fit.
fn fit(
    runs: &[((usize, usize, usize), f64)],
    (rows, cols): (usize, usize),
    cus: usize,
    per_cu: usize,
) -> Option<TileCost> {
    let slots = cus * per_cu;
    // t = w f + w x r, w the waves, x a tile's flops, r 1 / rate a slot (µs a flop).
    let (mut s11, mut s12, mut s22, mut b1, mut b2) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &((m, n, k), secs) in runs {
        let w = (m.div_ceil(rows) * n.div_ceil(cols)).div_ceil(slots) as f64;
        let (a1, a2, t) = (w, w * 2.0 * (rows * cols * k) as f64, secs * 1e6);
        let wt = 1.0 / (t * t);
        s11 += wt * a1 * a1;
        s12 += wt * a1 * a2;
        s22 += wt * a2 * a2;
        b1 += wt * a1 * t;
        b2 += wt * a2 * t;
    }
    let det = s11 * s22 - s12 * s12;
    if det.abs() < f64::MIN_POSITIVE {
        return None;
    }
    let fixed = ((b1 * s22 - b2 * s12) / det).max(0.0);
    let r = (s11 * b2 - s12 * b1) / det;
    (r > 0.0).then(|| TileCost {
        tflops: slots as f64 / r / 1e6,
        fixed_us: fixed,
        per_cu: per_cu as u32,
    })
}

/// The planner's tensor-core data measured on `dev`: the wgmma tilings fastest on some reference
/// product (at most six, the most often fastest first) with their fitted costs, the mma.sync
/// tiling's cost, and TF32's rate against bf16's. None where the device has no tensor cores.
pub fn sweep(dev: &Device, gen: &mut Generator) -> Result<Option<PlanTuning>> {
    let cus = dev.info().compute_units as usize;
    let mut tuning = (*plan_tuning(dev)).clone();
    println!("calibrating the GEMM planner's tensor-core costs on {dev} ({cus} compute units)");
    let products = reference();
    let tc = TcTile::DEFAULT;
    let mut kinds: Vec<(Option<WgTile>, MatmulOptions<'static>)> = vec![(
        None,
        MatmulOptions {
            tc_tile: Some(tc),
            ..Default::default()
        },
    )];
    for tile in candidates() {
        let opts = MatmulOptions {
            wg_tile: Some(tile),
            ..Default::default()
        };
        kinds.push((Some(tile), opts));
    }
    // times[i][j]: candidate i on product j (None where it does not run it); wins[i]: products
    // candidate i is the fastest wgmma tiling of.
    let mut times: Vec<Vec<Option<f64>>> = vec![Vec::new(); kinds.len()];
    let mut wins = vec![0usize; kinds.len()];
    for &p in &products {
        let (a, b) = operands(dev, gen, p)?;
        for (i, (tile, opts)) in kinds.iter().enumerate() {
            let plan = a.matmul_plan(&b, *opts)?;
            let runs = match (&plan.kernel, tile) {
                (GemmKernel::Wgmma { tile: t, .. }, Some(w)) => t == w,
                (GemmKernel::MmaSync { .. }, None) => true,
                _ => false,
            };
            let name = if tile.is_some() {
                "matmul_wg"
            } else {
                "matmul_tc"
            };
            let t = match runs && plan.split.is_none() {
                true => Some(device_time(dev, name, || {
                    a.matmul_with(&b, *opts).map(|_| ())
                })?),
                false => None,
            };
            times[i].push(t);
        }
        let best = (1..kinds.len())
            .filter_map(|i| times[i].last().copied().flatten().map(|t| (i, t)))
            .min_by(|x, y| x.1.total_cmp(&y.1));
        if let Some((i, t)) = best {
            wins[i] += 1;
            let flops = 2.0 * (p.0 * p.1 * p.2) as f64;
            println!(
                "  {}x{}x{} {}: fastest {:?} {:.1} TF/s",
                p.0,
                p.1,
                p.2,
                p.3,
                kinds[i].0,
                flops / t / 1e12
            );
        }
    }
    let runs_of = |i: usize| -> Vec<((usize, usize, usize), f64)> {
        (products.iter().zip(&times[i]))
            .filter_map(|(&(m, n, k, _), t)| t.map(|t| ((m, n, k), t)))
            .collect()
    };
    if runs_of(0).is_empty() {
        println!("no tensor cores on {dev}: nothing to calibrate");
        return Ok(None);
    }
    if let Some(c) = fit(&runs_of(0), (tc.rows(), tc.cols()), cus, 1) {
        println!("  mma.sync {}x{}: {c:?}", tc.rows(), tc.cols());
        tuning.tc_cost = c;
    }
    let mut kept: Vec<(usize, WgChoice)> = Vec::new();
    for (i, (tile, _)) in kinds.iter().enumerate() {
        let Some(tile) = *tile else { continue };
        let per_cu = match tile.persistent {
            0 => resident(tile),
            p => p as usize,
        };
        let Some(cost) = fit(&runs_of(i), (WgTile::ROWS, tile.tbn as usize), cus, per_cu) else {
            continue;
        };
        println!(
            "  wgmma {tile:?}: {cost:?}, fastest for {} products",
            wins[i]
        );
        if wins[i] > 0 {
            kept.push((wins[i], WgChoice { tile, cost }));
        }
    }
    kept.sort_by_key(|k| std::cmp::Reverse(k.0));
    if !kept.is_empty() {
        tuning.wg = kept.into_iter().take(6).map(|k| k.1).collect();
        tuning.tf32_ratio = tf32_ratio(dev, gen, tuning.wg[0].tile)?.unwrap_or(tuning.tf32_ratio);
        // How close the planner's model comes to the fastest measured tiling on each product.
        for (j, &(m, n, k, layout)) in products.iter().enumerate() {
            let model =
                |c: &WgChoice| tiles_time(cus, (m, n, k, 1), (128, c.tile.tbn as usize), c.cost);
            let chosen = tuning
                .wg
                .iter()
                .min_by(|x, y| model(x).total_cmp(&model(y)));
            let measured = |tile: WgTile| {
                kinds
                    .iter()
                    .position(|(t, _)| *t == Some(tile))
                    .and_then(|i| times[i][j])
            };
            let best = (1..kinds.len())
                .filter_map(|i| times[i][j])
                .fold(f64::MAX, f64::min);
            if let Some(t) = chosen.and_then(|c| measured(c.tile)) {
                println!(
                    "  {m}x{n}x{k} {layout}: the model's tiling at {:.2} of the fastest",
                    best / t
                );
            }
        }
    }
    println!(
        "planner data: {}",
        serde_json::to_string(&tuning).unwrap_or_default()
    );
    Ok(Some(tuning))
}

/// TF32's rate against bf16's in `tile` at 4096³.
fn tf32_ratio(dev: &Device, gen: &mut Generator, tile: WgTile) -> Result<Option<f64>> {
    let n = 4096;
    let a = Tensor::randn(&[n, n], DType::F32, dev, gen)?;
    let b = Tensor::randn(&[n, n], DType::F32, dev, gen)?.transpose(0, 1)?;
    let opts = MatmulOptions {
        wg_tile: Some(tile),
        ..Default::default()
    };
    let (ah, bh) = (a.to_dtype(DType::BF16)?, b.to_dtype(DType::BF16)?);
    let t16 = device_time(dev, "matmul_wg", || ah.matmul_with(&bh, opts).map(|_| ()))?;
    netcl_ops::set_device_float32_matmul_precision(dev, Some(netcl_ops::MatmulPrecision::High));
    let runs_tf32 = matches!(a.matmul_plan(&b, opts)?.kernel, GemmKernel::Wgmma { .. });
    let t32 = device_time(dev, "matmul_wg", || a.matmul_with(&b, opts).map(|_| ()));
    netcl_ops::set_device_float32_matmul_precision(dev, None);
    let t32 = t32?;
    println!("  TF32 / bf16 rate in {tile:?}: {:.3}", t16 / t32);
    Ok(runs_tf32.then_some(t16 / t32))
}
