//! netcl-autotune: measures GEMM tile candidates on the chosen device and writes the best into the user's tuning table.
use netcl_bench::{check_flags, device_from_args, flag_value, time_per_call};
use netcl_core_devices::{DType, DeviceKind, Result};
use netcl_kernels::tuning::{builtin_table, user_table_path, TuningEntry, TuningTable};
use netcl_kernels::GemmTile;
use netcl_ops::{Generator, MatmulOptions, Tensor};

const USAGE: &str = "netcl-autotune [--device SPEC] [--size N]
  Times GEMM tile candidates at N^3 (default 2048) and writes the best into the user's tuning table.";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if !check_flags(&args, "netcl-autotune", &["--device", "--size"], USAGE)? {
        return Ok(());
    }
    let dev = device_from_args(&args)?;
    let n: usize = flag_value(&args, "--size")
        .and_then(|s| s.parse().ok())
        .unwrap_or(2048);
    let mut gen = Generator::new(1);
    let a = Tensor::randn(&[n, n], DType::F32, &dev, &mut gen)?;
    let b = Tensor::randn(&[n, n], DType::F32, &dev, &mut gen)?;
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
                        if tile.check(&dev, 4).is_err() || !items.contains(&threads) {
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
                        let run = || a.matmul_with(&b, opts).map(|_| ());
                        let secs = match time_per_call(&dev, 2, 3, 3, run) {
                            Ok(s) => s,
                            Err(e) => {
                                println!("  {tile:?}: {e}");
                                continue;
                            }
                        };
                        let tflops = 2.0 * (n as f64).powi(3) / secs / 1e12;
                        println!("  {tile:?}: {tflops:.3} TFLOP/s");
                        if best.is_none_or(|(t, _)| tflops > t) {
                            best = Some((tflops, tile));
                        }
                    }
                }
            }
        }
    }
    let Some((tflops, tile)) = best else {
        println!("no tile ran on {dev}");
        return Ok(());
    };
    println!("best {tile:?}: {tflops:.2} TFLOP/s");
    let Some(path) = user_table_path() else {
        println!("no cache directory (NETCL_TUNING / NETCL_CACHE_DIR / HOME): not saved");
        return Ok(());
    };
    let mut table = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| TuningTable::parse(&t, &path.display().to_string()).ok())
        .unwrap_or(TuningTable {
            schema: 1,
            note: None,
            devices: Vec::new(),
        });
    let name = dev.info().name.clone();
    table.devices.retain(|e| e.pattern != name);
    table.devices.insert(
        0,
        TuningEntry {
            pattern: name,
            driver: Some(dev.info().driver_version.clone()),
            gemm: tile,
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
