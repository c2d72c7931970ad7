//! Every GEMM plan variant a device takes multiplies small integers exactly against the host, in every layout and dtype it serves, with bias, activation and row sums: products chosen to reach each kernel, tiling and split, the plan each took checked, and the variants a device must have reached asserted.
use netcl_core_devices::{test_devices, DeviceKind};
use netcl_kernels::{plan_tuning, WgTile};
use netcl_ops::gemm::GemmKernel;
use netcl_ops::{
    set_device_float32_matmul_precision, Activation, DType, Device, GemmTile, MatmulOptions,
    MatmulPrecision, Tensor,
};
use std::collections::BTreeSet;

/// Small integers (-2..=2) from `seed`: every product and sum is exact in f32.
fn ints(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + seed * 13 + (i / 97) * 3) % 5) as f32 - 2.0)
        .collect()
}

/// One product: batch, (m, n, k), operand dtype, output dtype, A stored (K, M), B stored (N, K).
struct Case {
    batch: Vec<usize>,
    dims: (usize, usize, usize),
    dtype: DType,
    out: DType,
    ta: bool,
    tb: bool,
}

impl Case {
    fn new(dims: (usize, usize, usize), dtype: DType, out: DType) -> Case {
        Case {
            batch: vec![],
            dims,
            dtype,
            out,
            ta: false,
            tb: false,
        }
    }

    fn t(mut self, ta: bool, tb: bool) -> Case {
        (self.ta, self.tb) = (ta, tb);
        self
    }

    fn batched(mut self, batch: &[usize]) -> Case {
        self.batch = batch.to_vec();
        self
    }

    /// The operand (rows, cols) in `dtype` on `dev`, stored transposed and viewed back when `t`.
    fn operand(
        &self,
        dev: &Device,
        dtype: DType,
        (rows, cols): (usize, usize),
        t: bool,
        seed: usize,
    ) -> Tensor {
        let n = self.batch.iter().product::<usize>() * rows * cols;
        let mut shape = self.batch.clone();
        shape.extend(if t { [cols, rows] } else { [rows, cols] });
        let x = Tensor::from_vec(ints(n, seed), &shape, &Device::host())
            .and_then(|x| x.to_dtype(dtype))
            .and_then(|x| x.to_device(dev))
            .unwrap();
        let nd = shape.len();
        if t {
            x.transpose(nd - 2, nd - 1).unwrap()
        } else {
            x
        }
    }

    /// Runs the product with bias and ReLU (and A's row sums where `sums`) under `opts` on `dev`,
    /// asserts it equals the host's exact f32 result rounded once to the output dtype (to the
    /// operands' dtype first where the plan computes narrow and widens), and returns the plan's
    /// kernel variant.
    fn check(&self, dev: &Device, opts: MatmulOptions<'_>, sums: bool) -> String {
        let (m, n, k) = self.dims;
        let host = Device::host();
        let relu = Activation::Relu;
        let run = |d: &Device, dtype: DType, out: DType, opts: MatmulOptions<'_>| {
            let a = self.operand(d, dtype, (m, k), self.ta, 1);
            let b = self.operand(d, dtype, (k, n), self.tb, 2);
            let bias = Tensor::from_vec(ints(n, 3), &[n], &host)
                .and_then(|b| b.to_dtype(out))
                .and_then(|b| b.to_device(d))
                .unwrap();
            let opts = MatmulOptions {
                bias: Some(&bias),
                activation: relu,
                out_dtype: (out != dtype).then_some(out),
                ..opts
            };
            let plan = a.matmul_plan(&b, opts).unwrap();
            let (y, s) = match sums {
                true => {
                    let (y, s) = a.matmul_with_row_sums(&b, opts).unwrap();
                    (y, Some(s.to_vec_f64().unwrap()))
                }
                false => (a.matmul_with(&b, opts).unwrap(), None),
            };
            (plan, y, s)
        };
        let (plan, got, got_sums) = run(dev, self.dtype, self.out, opts);
        let (_, exact, want_sums) = run(&host, DType::F32, DType::F32, MatmulOptions::default());
        let want = match plan.widen {
            true => exact
                .to_dtype(self.dtype)
                .and_then(|y| y.to_dtype(self.out)),
            false => exact.to_dtype(self.out),
        };
        let (got, want) = (
            got.to_vec_f64().unwrap(),
            want.unwrap().to_vec_f64().unwrap(),
        );
        let what = format!(
            "{:?} {m}x{n}x{k} {} -> {} (ta {}, tb {}) on {dev}: {plan}",
            self.batch, self.dtype, self.out, self.ta, self.tb
        );
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(
            bad.is_none(),
            "{what}: first difference at {:?}",
            bad.map(|i| (i, got[i], want[i]))
        );
        assert_eq!(got_sums, want_sums, "{what}: row sums");
        let mut variant = match &plan.kernel {
            GemmKernel::Host => "host",
            GemmKernel::Cpu { .. } => "cpu",
            GemmKernel::Gemv(_) => "gemv",
            GemmKernel::Tiled { .. } => "tiled",
            GemmKernel::Async { .. } => "async",
            GemmKernel::MmaSync { .. } => "mma.sync",
            GemmKernel::Wgmma { .. } => "wgmma",
        }
        .to_string();
        if plan.split.is_some() {
            variant += "+split";
        }
        variant
    }
}

#[test]
fn every_plan_variant_is_exact_against_the_host() {
    let (f32, bf16, f16) = (DType::F32, DType::BF16, DType::F16);
    for dev in test_devices().unwrap().iter().filter(|d| d.is_opencl()) {
        let mut seen = BTreeSet::new();
        let mut see = |v: String| {
            seen.insert(v);
        };
        // The portable and CPU kernels, skinny products on either side, a forced tile with a
        // strip, and split K, in f32 and (the portable kernel) bf16.
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            see(Case::new((70, 90, 50), f32, f32)
                .t(ta, tb)
                .check(dev, Default::default(), true));
            see(Case::new((3, 200, 64), f32, f32)
                .t(ta, tb)
                .check(dev, Default::default(), true));
            see(Case::new((200, 5, 64), f32, f32)
                .t(ta, tb)
                .check(dev, Default::default(), false));
        }
        // Skinny 16-bit products (f32 ones go to the CPU kernels on CPU devices).
        for (ta, tb) in [(false, false), (true, true)] {
            see(Case::new((3, 200, 64), bf16, bf16).t(ta, tb).check(
                dev,
                Default::default(),
                false,
            ));
            see(Case::new((200, 5, 64), f16, f16)
                .t(ta, tb)
                .check(dev, Default::default(), false));
        }
        let strip = MatmulOptions {
            tile: Some(GemmTile::new(32, 32, 8, 4, 4)),
            ..Default::default()
        };
        see(Case::new((40, 70, 24), f32, f32)
            .batched(&[2])
            .check(dev, strip, true));
        see(Case::new((32, 40, 2048), bf16, bf16).check(dev, Default::default(), false));
        see(Case::new((32, 40, 2048), bf16, f32).t(true, true).check(
            dev,
            Default::default(),
            false,
        ));
        see(Case::new((48, 40, 64), f16, f16)
            .batched(&[2])
            .check(dev, Default::default(), false));
        // The pipelined f32 kernel's small and large tiles (A stored M-contiguous).
        see(Case::new((256, 256, 64), f32, f32).t(true, false).check(
            dev,
            Default::default(),
            true,
        ));
        see(Case::new((2048, 2048, 32), f32, f32).t(true, false).check(
            dev,
            Default::default(),
            true,
        ));
        // Tensor cores: every layout, 16-bit and f32 outputs, a batch; a long K over few tiles
        // (split); each wgmma tiling of the device's tuning, one work-group a tile and
        // persistent; TF32.
        for dtype in [bf16, f16] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                for out in [dtype, f32] {
                    let c = Case::new((136, 264, 200), dtype, out)
                        .t(ta, tb)
                        .batched(&[2]);
                    see(c.check(dev, Default::default(), false));
                }
            }
            see(Case::new((128, 256, 4096), dtype, dtype).check(dev, Default::default(), false));
        }
        for choice in &plan_tuning(dev).wg {
            // Each chosen shape one work-group a tile, persistent, and with a loading warpgroup.
            let forms = [(0, false), (1, false), (0, true)];
            let tiles = forms.map(|(persistent, ws)| WgTile {
                persistent,
                ws,
                ..choice.tile
            });
            for tile in tiles.into_iter().filter(|t| t.valid()) {
                let opts = MatmulOptions {
                    wg_tile: Some(tile),
                    ..Default::default()
                };
                let c = Case::new((300, 520, 136), bf16, f32)
                    .batched(&[3])
                    .t(true, false);
                see(c.check(dev, opts, false));
            }
        }
        set_device_float32_matmul_precision(dev, Some(MatmulPrecision::High));
        see(Case::new((136, 264, 200), f32, f32).t(false, true).check(
            dev,
            Default::default(),
            false,
        ));
        set_device_float32_matmul_precision(dev, None);
        eprintln!("{dev}: {seen:?}");
        let want: &[&str] = match dev.kind() {
            DeviceKind::Cpu => &["cpu", "gemv", "tiled"],
            _ => &["gemv", "tiled"],
        };
        for v in want {
            assert!(seen.contains(*v), "{dev} reached {seen:?}, not {v}");
        }
        assert!(
            seen.iter().any(|v| v.ends_with("+split")),
            "{dev} reached {seen:?}, no split"
        );
        if netcl_ops::has_tensor_cores(dev, netcl_ops::TensorCoreKind::Bf16) {
            assert!(
                seen.contains("wgmma") || seen.contains("mma.sync"),
                "{dev}: {seen:?}"
            );
        }
    }
}
