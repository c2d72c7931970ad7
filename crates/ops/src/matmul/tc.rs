//! Tensor-core GEMM through inline PTX `mma.sync` (kernels/matmul_tc.cl), or `wgmma` where wg.rs finds it: the f32 precision policy (exact f32 or TF32), which devices have tensor cores (a probe with an exact-result check, cached per device), and the launch.
use super::wg::{has_wgmma, wg_source, wg_tile, WgTile};
use super::{matmul_source, MatmulOptions};
use crate::base::layout::{
    broadcast_strides, check_reach, contiguous_strides, numel, KernelLayout,
};
use crate::base::tensor::Tensor;
use crate::fused::expr::Class;
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::sources::MATMUL_TC;
use netcl_kernels::{program, tc_tile, Kernel, TcTile};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// How f32 matrix products may be computed (PyTorch's `set_float32_matmul_precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// Exact f32 multiply-adds (the default).
    Highest,
    /// TF32 tensor cores where the device has them (inputs cut to 10 mantissa bits: rounded to
    /// nearest through mma.sync, truncated by Hopper's wgmma; f32 accumulation: about 1e-3
    /// relative error); exact f32 elsewhere.
    High,
}

impl FromStr for MatmulPrecision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "highest" => Ok(MatmulPrecision::Highest),
            "high" => Ok(MatmulPrecision::High),
            _ => Err(Error::invalid(
                "matmul precision",
                format!("{s:?} is not `highest` or `high`"),
            )),
        }
    }
}

const UNSET: u8 = 0;
static GLOBAL: AtomicU8 = AtomicU8::new(UNSET);

fn encode(p: MatmulPrecision) -> u8 {
    match p {
        MatmulPrecision::Highest => 1,
        MatmulPrecision::High => 2,
    }
}

fn per_device() -> &'static Mutex<HashMap<usize, MatmulPrecision>> {
    static MAP: OnceLock<Mutex<HashMap<usize, MatmulPrecision>>> = OnceLock::new();
    MAP.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Sets the process-wide f32 matmul precision (the default is `NETCL_MATMUL_PRECISION`, else
/// `Highest`). A device's own setting, if any, takes precedence.
pub fn set_float32_matmul_precision(p: MatmulPrecision) {
    GLOBAL.store(encode(p), Ordering::Relaxed);
}

/// The process-wide f32 matmul precision: as set, else `NETCL_MATMUL_PRECISION` (`highest` or
/// `high`; anything else is reported once on stderr and ignored), else `Highest`.
pub fn float32_matmul_precision() -> MatmulPrecision {
    match GLOBAL.load(Ordering::Relaxed) {
        1 => MatmulPrecision::Highest,
        2 => MatmulPrecision::High,
        _ => {
            static ENV: OnceLock<MatmulPrecision> = OnceLock::new();
            *ENV.get_or_init(|| match std::env::var("NETCL_MATMUL_PRECISION") {
                Ok(v) => v.parse().unwrap_or_else(|e| {
                    eprintln!("netcl: NETCL_MATMUL_PRECISION ignored: {e}");
                    MatmulPrecision::Highest
                }),
                Err(_) => MatmulPrecision::Highest,
            })
        }
    }
}

/// Sets (or with `None` clears) `device`'s own f32 matmul precision.
pub fn set_device_float32_matmul_precision(device: &Device, p: Option<MatmulPrecision>) {
    let mut map = per_device().lock().unwrap_or_else(|e| e.into_inner());
    match p {
        Some(p) => map.insert(device.ordinal(), p),
        None => map.remove(&device.ordinal()),
    };
}

/// The f32 matmul precision in force on `device`: its own setting, else the process-wide one.
pub fn device_float32_matmul_precision(device: &Device) -> MatmulPrecision {
    let map = per_device().lock().unwrap_or_else(|e| e.into_inner());
    map.get(&device.ordinal())
        .copied()
        .unwrap_or_else(float32_matmul_precision)
}

/// A tensor-core instruction family of matmul_tc.cl.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorCoreKind {
    /// f32 storage, TF32 inputs (m16n8k8).
    Tf32,
    /// bf16 storage and inputs (m16n8k16).
    Bf16,
    /// f16 storage and inputs (m16n8k16).
    F16,
}

impl TensorCoreKind {
    pub(crate) fn dtype(self) -> DType {
        match self {
            TensorCoreKind::Tf32 => DType::F32,
            TensorCoreKind::Bf16 => DType::BF16,
            TensorCoreKind::F16 => DType::F16,
        }
    }

    fn define(self) -> &'static str {
        match self {
            TensorCoreKind::Tf32 => "-DTC_TF32",
            TensorCoreKind::Bf16 => "-DTC_BF16",
            TensorCoreKind::F16 => "-DTC_F16",
        }
    }
}

/// Whether `device` runs matmul_tc.cl for `kind` with exact results: probed once per device and
/// kind (NVIDIA OpenCL devices only, as the kernel is PTX; `NETCL_TENSOR_CORES=0` turns it off).
pub fn has_tensor_cores(device: &Device, kind: TensorCoreKind) -> bool {
    static PROBES: Probes<(usize, TensorCoreKind)> = OnceLock::new();
    let enabled = std::env::var("NETCL_TENSOR_CORES").map_or(true, |v| v != "0");
    probed(&PROBES, (device.ordinal(), kind), device, enabled, || {
        probe(device, kind)
            .map_err(|e| format!("tensor cores ({kind:?}) unavailable on {device}: {e}"))
    })
}

/// Cached probe results, by key.
pub(crate) type Probes<K> = OnceLock<Mutex<HashMap<K, bool>>>;

/// `probe`'s result for `key`, run once per key where `enabled` on NVIDIA OpenCL devices (whose
/// compiler takes the inline PTX of matmul_tc.cl and matmul_async.cl) and cached; false elsewhere
/// and when the probe fails (its message logged).
pub(crate) fn probed<K: Copy + Eq + std::hash::Hash>(
    cache: &'static Probes<K>,
    key: K,
    device: &Device,
    enabled: bool,
    probe: impl FnOnce() -> std::result::Result<bool, String>,
) -> bool {
    let map = cache.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(&ok) = map.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return ok;
    }
    let eligible = enabled
        && device.is_opencl()
        && device
            .info()
            .extensions
            .contains("cl_nv_device_attribute_query");
    let ok = eligible
        && probe().unwrap_or_else(|e| {
            log::info!("{e}");
            false
        });
    map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ok);
    ok
}

/// The tensor-core kind a `dtype` product on `device` uses now, if any.
pub(crate) fn tensor_core_kind(device: &Device, dtype: DType) -> Option<TensorCoreKind> {
    let kind = match dtype {
        DType::F32 if device_float32_matmul_precision(device) == MatmulPrecision::High => {
            TensorCoreKind::Tf32
        }
        DType::BF16 => TensorCoreKind::Bf16,
        DType::F16 => TensorCoreKind::F16,
        _ => return None,
    };
    has_tensor_cores(device, kind).then_some(kind)
}

/// Small integers make every product and sum exact in each input format and in f32: the device
/// must match the host bit for bit (ragged M, N, K over two K steps, B transposed); mma.sync
/// itself (matmul_wg.cl's probe asks for this one first).
fn probe(device: &Device, kind: TensorCoreKind) -> Result<bool> {
    let (m, n, k) = (40usize, 24usize, 70usize);
    let av: Vec<f32> = (0..m * k).map(|i| ((i * 7 + 3) % 5) as f32 - 2.0).collect();
    let bv: Vec<f32> = (0..n * k).map(|i| ((i * 3 + 1) % 5) as f32 - 2.0).collect();
    let host = Device::host();
    let put = |v: &[f32], shape: &[usize]| -> Result<Tensor> {
        Tensor::from_vec(v.to_vec(), shape, &host)?
            .to_dtype(kind.dtype())?
            .to_device(device)
    };
    let a = put(&av, &[m, k])?;
    let b = put(&bv, &[n, k])?.transpose(0, 1)?; // (k, n) with K contiguous
    let out = Tensor::alloc(&[m, n], kind.dtype(), device)?;
    launch_with(kind, &out, &a, &b, &[], MatmulOptions::default(), None)?;
    let got = out.to_vec_f64()?;
    let want = (0..m * n).map(|i| {
        let (r, c) = (i / n, i % n);
        (0..k).map(|j| av[r * k + j] * bv[c * k + j]).sum::<f32>() as f64
    });
    Ok(got.iter().zip(want).all(|(&g, w)| g == w))
}

/// Whether `t` (..., rows, K) has K-contiguous rows of `kp` elements, each row and batch 16 bytes
/// aligned (`q` elements).
fn k_aligned(t: &Tensor, kp: usize, q: usize) -> bool {
    let nd = t.ndim();
    t.strides[nd - 1] == 1
        && t.shape[nd - 1] == kp
        && t.offset.is_multiple_of(q)
        && t.strides[..nd - 1].iter().all(|s| s.is_multiple_of(q))
}

/// Whether dim `contig` of `t` is contiguous with a multiple of 8 elements and every other stride
/// and the offset are 16 bytes apart (`q` elements): matmul_tc.cl's A_MN / B_KN operands.
fn mn_aligned(t: &Tensor, contig: usize, q: usize) -> bool {
    t.strides[contig] == 1
        && t.shape[contig].is_multiple_of(8)
        && t.offset.is_multiple_of(q)
        && (t.strides.iter().enumerate()).all(|(d, s)| d == contig || s.is_multiple_of(q))
}

/// `t` (..., rows, K) with K-contiguous rows of `kp` elements, each row and batch 16 bytes aligned
/// (`q` elements): itself when it is so, else a copy (zero-padded along K where K is not a
/// multiple of `q`).
fn k_rows(t: &Tensor, kp: usize, q: usize) -> Result<Tensor> {
    let nd = t.ndim();
    if k_aligned(t, kp, q) {
        return Ok(t.clone());
    }
    if t.shape[nd - 1] == kp && !t.is_contiguous() {
        // Only the layout is wrong (a transposed operand of a backward product): a fresh copy,
        // tiled where the view is a transpose.
        return t.contiguous();
    }
    t.pad(&[(0, kp - t.shape[nd - 1])], 0.0)
}

/// `out (batch, M, N) = act(a (..., M, K) x b (..., K, N) + bias)` on tensor cores, batch dims
/// broadcast to `batch`: through matmul_wg.cl (wgmma) where the device runs it, else matmul_tc.cl
/// (mma.sync; or where the autotuner asks for a tiling of it).
pub(crate) fn launch(
    kind: TensorCoreKind,
    out: &Tensor,
    a: &Tensor,
    b: &Tensor,
    batch: &[usize],
    opts: MatmulOptions<'_>,
) -> Result<()> {
    let (na, nb) = (a.ndim(), b.ndim());
    let (m, n) = (a.shape[na - 2], b.shape[nb - 1]);
    let device = &out.device;
    let cus = device.info().compute_units as usize;
    let wg = (opts.tc_tile.is_none() && has_wgmma(device, kind))
        .then(|| wg_tile(m, n, numel(batch), cus));
    launch_with(kind, out, a, b, batch, opts, wg)
}

/// `launch` through matmul_wg.cl in tiling `wg` when given, else matmul_tc.cl. Operands whose
/// rows are not K-contiguous and aligned (nor, 16-bit, M- resp. N-contiguous) go through a copy.
pub(crate) fn launch_with(
    kind: TensorCoreKind,
    out: &Tensor,
    a: &Tensor,
    b: &Tensor,
    batch: &[usize],
    opts: MatmulOptions<'_>,
    wg: Option<WgTile>,
) -> Result<()> {
    let op = "matmul";
    let (na, nb) = (a.ndim(), b.ndim());
    let (m, k, n) = (a.shape[na - 2], a.shape[na - 1], b.shape[nb - 1]);
    let q = 16 / kind.dtype().size();
    let kp = k.next_multiple_of(q);
    // 16-bit operands whose M (N) dim is contiguous are read as they lie (ldmatrix.trans), the
    // rest as K-contiguous rows (a copy where they are not).
    let wide = kind != TensorCoreKind::Tf32 && kp == k;
    let a_mn = wide && !k_aligned(a, kp, q) && mn_aligned(a, na - 2, q);
    let a = if a_mn { a.clone() } else { k_rows(a, kp, q)? };
    let b_t = b.transpose(nb - 2, nb - 1)?;
    let b_kn = wide && !k_aligned(&b_t, kp, q) && mn_aligned(b, nb - 1, q);
    // B transposed, (..., N, K) with K contiguous; or B itself when N-contiguous.
    let bt = if b_kn {
        b.clone()
    } else {
        k_rows(&b_t, kp, q)?
    };
    let tile = match opts.tc_tile {
        Some(t) => t.check(&out.device).map(|_| t)?,
        None => tc_tile(&out.device),
    };
    let mut operands = Vec::new();
    for t in [&a, &bt] {
        let nd = t.ndim();
        check_reach(op, &t.shape, &t.strides, t.offset)?;
        operands.push(broadcast_strides(
            op,
            &t.shape[..nd - 2],
            &t.strides[..nd - 2],
            batch,
        )?);
    }
    let so: Vec<usize> = contiguous_strides(batch)
        .iter()
        .map(|s| s * m * n)
        .collect();
    let layout = KernelLayout::new(
        op,
        batch,
        &[
            (&so, 0),
            (&operands[0], a.offset),
            (&operands[1], bt.offset),
        ],
    )?;
    let aligned = wg.is_none() && m % tile.rows() == 0 && n % tile.cols() == 0;
    let c_f32 = out.dtype != kind.dtype();
    let flags = [
        (aligned, " -DALIGNED"),
        (a_mn, " -DA_MN"),
        (b_kn, " -DB_KN"),
        (c_f32, " -DC_F32"),
    ];
    let flags: String = flags.iter().filter(|f| f.0).map(|f| f.1).collect();
    let (source, name, tiling) = match wg {
        Some(t) => (
            wg_source(kind, t.tbn, opts.activation),
            "matmul_wg",
            t.options(),
        ),
        None => (
            matmul_source(MATMUL_TC, opts.activation, Class::of(kind.dtype())),
            "matmul_tc",
            format!("{} -DTC_KERNEL=matmul_tc", tile.options(a_mn)),
        ),
    };
    let options = format!(
        "{} {} {tiling}{flags}",
        kind.dtype().build_option(),
        kind.define(),
    );
    let mut kern = Kernel::new(&program(&out.device, &source, &options)?, name)?;
    kern.arg_mem(out.mem()?)?
        .arg_mem(a.mem()?)?
        .arg_mem(bt.mem()?)?
        .arg_mem(opts.bias.map_or_else(|| out.mem(), |t| t.mem())?)?
        .arg(&layout)?;
    // The stride between A's rows (A_MN: between its K rows), and B's likewise.
    let sam = a.strides[if a_mn { na - 1 } else { na - 2 }];
    let sbn = bt.strides[nb - 2];
    for v in [m, n, kp, sam, sbn, opts.bias.is_some() as usize] {
        kern.arg(&(v as u32))?;
    }
    let batches = numel(batch);
    let elems = batches * (m * k + k * n + m * n) + opts.bias.map_or(0, |_| n);
    kern.declare(
        (elems * kind.dtype().size()) as u64,
        2 * (batches * m * n * k) as u64,
    );
    let (rows, cols, group) = match wg {
        Some(t) => (WgTile::ROWS, t.tbn, WgTile::GROUP),
        None => (tile.rows(), tile.cols(), tile.group()),
    };
    kern.launch(
        &[n.div_ceil(cols) * group, m.div_ceil(rows), batches],
        &[group, 1, 1],
    )
}

/// Output tiles of matmul_tc.cl's work-groups for an `m` x `n` product on `device` (`tile` when
/// given, else the device's tiling).
pub(crate) fn tiles(device: &Device, tile: Option<TcTile>, m: usize, n: usize) -> usize {
    let t = tile.unwrap_or_else(|| tc_tile(device));
    m.div_ceil(t.rows()) * n.div_ceil(t.cols())
}
