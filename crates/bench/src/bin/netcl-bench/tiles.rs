//! The `tiles` suite of netcl-bench: the MLP step's products (batch 256 through 784-1024-1024-10) and the CNN step's per-image convolution products, with the dispatcher's own choice and with each candidate GEMM tile, to tune the choice for small products.
use crate::Runner;
use netcl_core_devices::{Device, Result};
use netcl_kernels::GemmTile;
use netcl_ops::MatmulOptions;

impl Runner {
    /// Each product as the MLP's Linear layers run it: forward `x Wᵀ + b`, input gradient
    /// `dY W`, weight gradient `dYᵀ X`; first as dispatched, then under each tile.
    pub(crate) fn tiles(&mut self) -> Result<()> {
        let tile = |bm, bn, wm, wn| GemmTile::new(bm, bn, 16, wm, wn);
        let tiles = [
            tile(128, 128, 8, 8),
            tile(64, 128, 4, 8),
            tile(128, 64, 8, 4),
            tile(64, 64, 4, 4),
            tile(64, 64, 8, 8),
            tile(32, 64, 4, 4),
            tile(64, 32, 4, 4),
            tile(32, 64, 2, 4),
            tile(32, 32, 2, 2),
            tile(32, 32, 4, 4),
        ];
        // (name, M, N, K, weight-like operand transposed as x Wᵀ, A read transposed, batch of B:
        // the CNN's convolutions, one weight against each image's columns)
        let shapes = [
            ("fwd_256x1024x784", 256, 1024, 784, true, false, 1),
            ("fwd_256x1024x1024", 256, 1024, 1024, true, false, 1),
            ("fwd_256x10x1024", 256, 10, 1024, true, false, 1),
            ("dx_256x1024x1024", 256, 1024, 1024, false, false, 1),
            ("dw_1024x1024x256", 1024, 1024, 256, false, true, 1),
            ("dw_1024x784x256", 1024, 784, 256, false, true, 1),
            ("dw_10x1024x256", 10, 1024, 256, false, true, 1),
            ("conv1_32x784x9_b128", 32, 784, 9, false, false, 128),
            ("conv2_64x196x288_b128", 64, 196, 288, false, false, 128),
            ("conv2dx_288x196x64_b128", 288, 196, 64, false, true, 128),
        ];
        for (name, m, n, k, wt, at, batch) in shapes {
            let a = if at {
                self.randn(&[k, m])?.transpose(0, 1)?
            } else {
                self.randn(&[m, k])?
            };
            let b = if wt {
                self.randn(&[n, k])?.transpose(0, 1)?
            } else if batch > 1 {
                self.randn(&[batch, k, n])?
            } else {
                self.randn(&[k, n])?
            };
            let bias = self.randn(&[n])?;
            let flops = 2.0 * (m * n * k * batch) as f64;
            let with = |tile| MatmulOptions {
                bias: wt.then_some(&bias),
                tile,
                ..Default::default()
            };
            let dev = self.dev.clone();
            let report = |label: String, tile| -> Result<()> {
                let us = device_us(&dev, || a.matmul_with(&b, with(tile)).map(|_| ()))?;
                println!(
                    "tiles        {label:<36} {us:>8.1} us {:>8.2} TF/s",
                    flops / us / 1e6
                );
                Ok(())
            };
            report(format!("{name}_dispatched"), None)?;
            for t in tiles {
                if t.check(&self.dev, 4).is_ok() {
                    report(
                        format!("{name}_{}x{}_{}x{}", t.bm, t.bn, t.wm, t.wn),
                        Some(t),
                    )?;
                }
            }
        }
        Ok(())
    }
}

/// Device time of one call of `f` (its kernels' summed device times, from the profiler), the
/// median of five rounds of ten calls after a warm-up: the host's enqueue time, which bounds
/// products this small when timed from the host, left out.
fn device_us(dev: &Device, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut rounds = Vec::new();
    for _ in 0..5 {
        dev.synchronize()?;
        let p = netcl_profiling::Profiler::start();
        for _ in 0..10 {
            f()?;
        }
        dev.synchronize()?;
        let ns: u64 = p.stop().kernels.iter().filter_map(|k| k.device_ns()).sum();
        rounds.push(ns as f64 / 10.0 / 1e3);
    }
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[2])
}
