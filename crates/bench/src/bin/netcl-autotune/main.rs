//! netcl-autotune: measures GEMM tile candidates (f32, and the tensor-core tiling where the device has tensor cores) and calibrates the GEMM planner's tensor-core costs on the chosen device, and writes them into the user's tuning table.
mod plan;
use netcl_bench::{check_flags, device_from_args, flag_value, time_per_call};
use netcl_core_devices::{DType, Device, DeviceKind, Result};
use netcl_kernels::tuning::{builtin_table, user_table_path, TuningEntry, TuningTable};
use netcl_kernels::{gemm_tile, GemmTile, PlanTuning, TcTile};
use netcl_ops::{has_tensor_cores, Generator, MatmulOptions, Tensor, TensorCoreKind};

const USAGE: &str = "netcl-autotune [--device SPEC] [--size N] [--only f32|tc|plan]
  Times GEMM tile candidates at N^3 (default 2048): f32 tiles, and on devices with tensor cores
  the mma.sync tiling (bf16 products A x B and A x B^T, then A^T x B for the K step of
  products whose A is M-contiguous), then calibrates the planner's tensor-core cost model
  (every wgmma tiling over whole waves at two depths of K: fixed cost, rate, work-groups per
  compute unit). Writes the results into the user's tuning table.";

fn main() -> Result<()> {
    // The program name first, as check_flags expects.
    let mut args = vec!["netcl-autotune".to_string()];
    args.extend(netcl_core_devices::utf8_args("netcl-autotune")?);
    if !check_flags(
        &args,
        "netcl-autotune",
        &["--device", "--size", "--only"],
        USAGE,
    )? {
        return Ok(());
    }
    let dev = device_from_args(&args)?;
    let n: usize = flag_value(&args, "--size")
        .and_then(|s| s.parse().ok())
        .unwrap_or(2048);
    let only = flag_value(&args, "--only");
    let mut gen = Generator::new(1);
    let gemm = match only {
        Some("tc") | Some("plan") => None,
        _ => f32_sweep(&dev, n, &mut gen)?,
    };
    let tc = match only {
        Some("f32") | Some("plan") => None,
        _ if has_tensor_cores(&dev, TensorCoreKind::Bf16) => tc_sweep(&dev, n, &mut gen)?,
        _ => {
            println!("no tensor cores on {dev}: no tensor-core tiling to tune");
            None
        }
    };
    if tc.is_some() {
        // The planner's costs are measured in the tiling just chosen.
        save(&dev, gemm, tc, None)?;
        netcl_kernels::tuning::reset_tuning();
    }
    let planned = match only {
        Some("f32") | Some("tc") => None,
        _ => plan::sweep(&dev, &mut gen)?,
    };
    if gemm.is_none() && tc.is_none() && planned.is_none() {
        println!("nothing measured on {dev}: the tuning table is unchanged");
        return Ok(());
    }
    save(&dev, gemm, tc, planned)
}

/// Seconds per call of `run`, or `None` (reported) where it fails.
fn timed(dev: &Device, what: &str, run: impl FnMut() -> Result<()>) -> Option<f64> {
    match time_per_call(dev, 2, 3, 3, run) {
        Ok(s) => Some(s),
        Err(e) => {
            println!("  {what}: {e}");
            None
        }
    }
}

/// The fastest f32 tile at `n`^3.
fn f32_sweep(dev: &Device, n: usize, gen: &mut Generator) -> Result<Option<GemmTile>> {
    let a = Tensor::randn(&[n, n], DType::F32, dev, gen)?;
    let b = Tensor::randn(&[n, n], DType::F32, dev, gen)?;
    let mut best: Option<(f64, GemmTile)> = None;
    println!("autotuning f32 GEMM {n}^3 on {dev}");
    // GPUs: large tiles over 64..256 work-items. CPUs (PoCL runs a work-group as a loop on one
    // thread): smaller tiles and work-groups, so that both cores get several groups.
    let cpu = dev.info().kind == DeviceKind::Cpu;
    let (tiles, items, blocks): (&[u32], std::ops::RangeInclusive<u32>, &[u32]) = if cpu {
        (&[16, 32, 64], 4..=64, &[2, 4, 8])
    } else {
        (&[64, 128], 64..=256, &[4, 8])
    };
    for &bm in tiles {
        for &bn in tiles {
            for bk in [8u32, 16, 32] {
                for &wm in blocks {
                    for &wn in blocks {
                        let tile = GemmTile { bm, bn, bk, wm, wn };
                        if bm % wm != 0 || bn % wn != 0 {
                            continue;
                        }
                        let threads = (bm / wm) * (bn / wn);
                        if tile.check(dev, 4).is_err() || !items.contains(&threads) {
                            continue;
                        }
                        if cpu && (bm != bn || wm != wn) {
                            // Square tiles only on CPUs: each build costs PoCL about a second.
                            continue;
                        }
                        let opts = MatmulOptions {
                            tile: Some(tile),
                            ..Default::default()
                        };
                        let what = format!("{tile:?}");
                        let Some(secs) = timed(dev, &what, || a.matmul_with(&b, opts).map(|_| ()))
                        else {
                            continue;
                        };
                        let tflops = 2.0 * (n as f64).powi(3) / secs / 1e12;
                        println!("  {what}: {tflops:.3} TFLOP/s");
                        if best.is_none_or(|(t, _)| tflops > t) {
                            best = Some((tflops, tile));
                        }
                    }
                }
            }
        }
    }
    if let Some((tflops, tile)) = best {
        println!("best f32 {tile:?}: {tflops:.2} TFLOP/s");
    }
    Ok(best.map(|b| b.1))
}

/// The fastest tensor-core tiling at `n`^3 in bf16 (TF32 and f16 products take it too): warp
/// grids, K steps and staging timed over A x B and A x B^T (the forward's and input gradients'
/// layouts), then the K step of products whose A is M-contiguous (weight gradients) timed over
/// A^T x B.
fn tc_sweep(dev: &Device, n: usize, gen: &mut Generator) -> Result<Option<TcTile>> {
    let bf16 =
        |g: &mut Generator| Tensor::randn(&[n, n], DType::F32, dev, g)?.to_dtype(DType::BF16);
    let (a, b) = (bf16(gen)?, bf16(gen)?);
    let bt = b.transpose(0, 1)?;
    let at = a.transpose(0, 1)?;
    let flops = 2.0 * (n as f64).powi(3);
    let time = |tile: TcTile, pairs: &[(&Tensor, &Tensor)]| -> Option<f64> {
        let opts = MatmulOptions {
            tc_tile: Some(tile),
            ..Default::default()
        };
        let mut total = 0.0;
        for (x, y) in pairs {
            let what = format!("{tile:?}");
            total += timed(dev, &what, || x.matmul_with(y, opts).map(|_| ()))?;
        }
        Some(total / pairs.len() as f64)
    };
    println!("autotuning the bf16 tensor-core GEMM {n}^3 on {dev}");
    let grids = [
        (2, 2, 4, 8),
        (2, 2, 4, 4),
        (2, 2, 2, 8),
        (4, 2, 2, 8),
        (2, 4, 4, 4),
        (4, 2, 4, 8),
    ];
    let mut best: Option<(f64, TcTile)> = None;
    for (warps_m, warps_n, mi, nj) in grids {
        for (kw, stages) in [(32, 0), (16, 0), (16, 2)] {
            let tile = TcTile::uniform(warps_m, warps_n, mi, nj, kw, stages);
            if tile.check(dev).is_err() {
                continue;
            }
            let Some(secs) = time(tile, &[(&a, &b), (&a, &bt)]) else {
                continue;
            };
            println!("  {tile:?}: {:.1} TFLOP/s", flops / secs / 1e12);
            if best.is_none_or(|(s, _)| secs < s) {
                best = Some((secs, tile));
            }
        }
    }
    let Some((_, mut tile)) = best else {
        return Ok(None);
    };
    // The K step where A is M-contiguous (swizzled tiles), for the best grid.
    let mut best_mn: Option<(f64, u32)> = None;
    for kw_mn in [16, 32] {
        let t = TcTile { kw_mn, ..tile };
        if t.check(dev).is_err() {
            continue;
        }
        if let Some(secs) = time(t, &[(&at, &b)]) {
            println!(
                "  A^T x B, {kw_mn} words of K: {:.1} TFLOP/s",
                flops / secs / 1e12
            );
            if best_mn.is_none_or(|(s, _)| secs < s) {
                best_mn = Some((secs, kw_mn));
            }
        }
    }
    if let Some((_, kw_mn)) = best_mn {
        tile.kw_mn = kw_mn;
    }
    println!("best tensor-core tiling {tile:?}");
    Ok(Some(tile))
}

/// Writes `dev`'s entry of the user's tuning table: the measured tiles, and for what was not
/// measured the entry's earlier values.
fn save(
    dev: &Device,
    gemm: Option<GemmTile>,
    tc: Option<TcTile>,
    planned: Option<PlanTuning>,
) -> Result<()> {
    let Some(path) = user_table_path() else {
        println!("no cache directory (NETCL_TUNING / NETCL_CACHE_DIR / HOME): not saved");
        return Ok(());
    };
    let mut table = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| TuningTable::parse(&t, &path.display().to_string()).ok())
        .unwrap_or(TuningTable {
            schema: netcl_kernels::tuning::SCHEMA,
            note: None,
            devices: Vec::new(),
        });
    let name = dev.info().name.clone();
    let old = table.devices.iter().find(|e| e.pattern == name).cloned();
    table.devices.retain(|e| e.pattern != name);
    table.devices.insert(
        0,
        TuningEntry {
            pattern: name,
            driver: Some(dev.info().driver_version.clone()),
            // What was not measured keeps this device's earlier entry (an entry needs an f32
            // tile: without one, the tile in force now).
            gemm: gemm
                .or(old.as_ref().map(|e| e.gemm))
                .unwrap_or_else(|| gemm_tile(dev)),
            tc: tc.or(old.as_ref().and_then(|e| e.tc)),
            plan: planned.or(old.and_then(|e| e.plan)),
        },
    );
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| netcl_core_devices::Error::io(dir.display().to_string(), e))?;
    }
    let text = serde_json::to_string_pretty(&table).expect("a tuning table serialises");
    std::fs::write(&path, text)
        .map_err(|e| netcl_core_devices::Error::io(path.display().to_string(), e))?;
    println!(
        "wrote {} (shipped defaults: {} entries)",
        path.display(),
        builtin_table().devices.len()
    );
    Ok(())
}
