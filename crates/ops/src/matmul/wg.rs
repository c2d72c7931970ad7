//! Hopper's wgmma for tensor-core products, bf16, f16 and TF32 (kernels/matmul_wg.cl, sm_90a PTX): which devices run it (a probe with an exact-result check, cached per device), its tiling, and its generated wgmma wrapper.
use super::tc::{probed, Probes, TensorCoreKind};
use crate::base::tensor::Tensor;
use crate::fused::activation::Activation;
use crate::fused::expr::Class;
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::sources::MATMUL_WG;
use netcl_kernels::Source;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// matmul_wg.cl's tiling: 128 x `tbn` outputs a work-group, a ring of `stages` K tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WgTile {
    pub tbn: usize,
    pub stages: usize,
}

impl WgTile {
    pub const ROWS: usize = 128;
    pub const GROUP: usize = 256;

    /// Local memory the work-group declares: the stages (128 + tbn rows of 128 bytes each) and
    /// 1 KiB to align them.
    pub fn shared_bytes(self) -> usize {
        self.stages * (Self::ROWS + self.tbn) * 128 + 1024
    }

    /// The -D options of the tiling.
    pub fn options(self) -> String {
        format!(
            "-DTBN={} -DSTAGES={} -DSM90A_SHARED={}",
            self.tbn,
            self.stages,
            self.shared_bytes()
        )
    }
}

/// The tiling for an `m` x `n` product over `batches` on a device of `cus` compute units: 128 x 256
/// tiles in four stages (193 KiB of local memory) where they make two waves or more, else 128 x
/// 128 tiles in five (161 KiB), faster wherever fewer tiles would leave compute units idle (H100,
/// docs/performance.md). `NETCL_WG_TILE=tbn,stages` fixes it, for measurements.
pub(crate) fn wg_tile(m: usize, n: usize, batches: usize, cus: usize) -> WgTile {
    static FIXED: OnceLock<Option<WgTile>> = OnceLock::new();
    let fixed = FIXED.get_or_init(|| {
        let v = std::env::var("NETCL_WG_TILE").ok()?;
        let (n, s) = v.split_once(',')?;
        let t = WgTile {
            tbn: n.trim().parse().ok()?,
            stages: s.trim().parse().ok()?,
        };
        let ok = [128, 256].contains(&t.tbn) && (3..=5).contains(&t.stages);
        if !ok {
            eprintln!("netcl: NETCL_WG_TILE={v} ignored: takes 128 or 256 columns, 3 to 5 stages");
        }
        ok.then_some(t)
    });
    let wide = m.div_ceil(WgTile::ROWS) * n.div_ceil(256) * batches >= 2 * cus;
    fixed.unwrap_or(if wide {
        WgTile {
            tbn: 256,
            stages: 4,
        }
    } else {
        WgTile {
            tbn: 128,
            stages: 5,
        }
    })
}

/// Whether `device` runs matmul_wg.cl for `kind` with exact results: probed once
/// per device and kind on NVIDIA OpenCL devices whose PTX targets sm_90 (`NETCL_WGMMA=0` turns
/// it off).
pub(crate) fn has_wgmma(device: &Device, kind: TensorCoreKind) -> bool {
    static PROBES: Probes<(usize, TensorCoreKind)> = OnceLock::new();
    static ENABLED: OnceLock<bool> = OnceLock::new();
    let enabled = *ENABLED.get_or_init(|| std::env::var("NETCL_WGMMA").map_or(true, |v| v != "0"));
    probed(&PROBES, (device.ordinal(), kind), device, enabled, || {
        // After mma.sync's probe: a device without working tensor cores has no wgmma either.
        if !super::tc::has_tensor_cores(device, kind) {
            return Ok(false);
        }
        probe(device, kind).map_err(|e| format!("wgmma ({kind:?}) unavailable on {device}: {e}"))
    })
}

/// Small integers make every product and sum exact: the device must match the host bit for bit
/// (ragged M, N and K, B read both K- and N-contiguous, several K steps, both tilings).
fn probe(device: &Device, kind: TensorCoreKind) -> Result<bool> {
    let (m, n, k) = (136usize, 264usize, 200usize);
    let av: Vec<f32> = (0..m * k).map(|i| ((i * 7 + 3) % 5) as f32 - 2.0).collect();
    let bv: Vec<f32> = (0..k * n).map(|i| ((i * 3 + 1) % 5) as f32 - 2.0).collect();
    let host = Device::host();
    let dtype = kind.dtype();
    let put = |v: &[f32], shape: &[usize]| -> Result<Tensor> {
        Tensor::from_vec(v.to_vec(), shape, &host)?
            .to_dtype(dtype)?
            .to_device(device)
    };
    let a = put(&av, &[m, k])?;
    let b_kn = put(&bv, &[k, n])?;
    let b_k = b_kn.transpose(0, 1)?.contiguous()?.transpose(0, 1)?;
    let want: Vec<f64> = (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            (0..k).map(|j| av[r * k + j] * bv[j * n + c]).sum::<f32>() as f64
        })
        .collect();
    for (tbn, stages) in [(128, 5), (256, 4)] {
        for b in [&b_kn, &b_k] {
            let out = Tensor::alloc(&[m, n], dtype, device)?;
            let tile = Some(WgTile { tbn, stages });
            super::tc::launch_with(kind, &out, &a, b, &[], Default::default(), tile)?;
            if out.to_vec_f64()? != want {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// matmul_wg.cl for `kind` and `act`, after the generated wgmma wrapper for `tbn` columns (built
/// once per kind, tile width and activation).
pub(crate) fn wg_source(kind: TensorCoreKind, tbn: usize, act: Activation) -> Source {
    let base = super::matmul_source(MATMUL_WG, act, Class::of(kind.dtype()));
    type Key = (&'static str, TensorCoreKind, usize);
    static SOURCES: OnceLock<Mutex<HashMap<Key, Source>>> = OnceLock::new();
    let sources = SOURCES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = sources.lock().unwrap_or_else(|p| p.into_inner());
    *map.entry((base.name, kind, tbn)).or_insert_with(|| {
        let text = format!("{}{}", wgmma_wrapper(kind.dtype(), tbn), base.text);
        // Leaked once per key: the program cache refers to it for the process's life.
        Source {
            name: Box::leak(format!("n{tbn}_{}", base.name).into_boxed_str()),
            text: Box::leak(text.into_boxed_str()),
        }
    })
}

/// `wgmma(d, da, db)`: d (this work-item's `tbn / 2` f32 of a 64 x `tbn` accumulator) += A
/// (64 x 32 bytes of K, descriptor da) x B (32 bytes of K x `tbn`, descriptor db), issued
/// asynchronously; 16-bit operands transposed (M- resp. N-major) under A_MN / B_KN (TF32 takes
/// K-major operands only).
fn wgmma_wrapper(dtype: DType, tbn: usize) -> String {
    let (ty, k, trans) = match dtype {
        DType::BF16 => ("bf16", 16, ", \" WG_TA \", \" WG_TB \""),
        DType::F16 => ("f16", 16, ", \" WG_TA \", \" WG_TB \""),
        _ => ("tf32", 8, ""),
    };
    let regs = tbn / 2;
    let list: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    format!(
        "// Generated by netcl-ops matmul/wg.rs: one m64n{tbn}k{k} wgmma ({ty} inputs, f32 sums).\n\
         #ifdef A_MN\n#define WG_TA \"1\"\n#else\n#define WG_TA \"0\"\n#endif\n\
         #ifdef B_KN\n#define WG_TB \"1\"\n#else\n#define WG_TB \"0\"\n#endif\n\
         inline void wgmma(float* d, ulong da, ulong db) {{\n\
         __asm__ volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{s}, 0;\\n\
         //sm90a: wgmma.mma_async.sync.aligned.m64n{tbn}k{k}.f32.{ty}.{ty} {{{}}}, %{regs}, %{r1}, p, 1, 1{trans};\\n}}\\n\"\n\
         : {}\n: \"l\"(da), \"l\"(db), \"r\"(1) : \"memory\");\n}}\n",
        list.join(","),
        outs.join(", "),
        s = regs + 2,
        r1 = regs + 1,
    )
}
