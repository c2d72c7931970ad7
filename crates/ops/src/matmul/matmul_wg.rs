//! Launches kernels/matmul_wg.cl (Hopper's wgmma through sm_90a PTX; bf16, f16 and TF32) in the planner's tiling, and probes which devices and kinds run it exactly; the generated wgmma wrapper.
use super::opencl::Gemm;
use super::plan::TcOperand;
use super::precision::TensorCoreKind;
use super::probes::{probed, Exact, Probes};
use super::source::matmul_source;
use super::tensor_cores;
use crate::base::tensor::Tensor;
use crate::fused::activation::Activation;
use crate::fused::expr::Class;
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::sources::MATMUL_WG;
use netcl_kernels::{program, Source, WgTile};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Whether `device` runs matmul_wg.cl for `kind` in `tile` with exact results: probed once per
/// device, kind and tiling on NVIDIA OpenCL devices whose PTX targets sm_90 ([`Config::wgmma`](netcl_core_devices::Config::wgmma),
/// `NETCL_WGMMA=0`, turns it off).
pub(crate) fn runs(device: &Device, kind: TensorCoreKind, tile: WgTile) -> bool {
    static PROBES: Probes<(usize, TensorCoreKind, WgTile)> = OnceLock::new();
    let enabled = netcl_core_devices::Config::get().wgmma;
    probed(
        &PROBES,
        (device.ordinal(), kind, tile),
        device,
        enabled,
        || {
            // After mma.sync's probe: a device without working tensor cores has no wgmma either.
            if !super::matmul_tc::has_tensor_cores(device, kind) {
                return Ok(false);
            }
            probe(device, kind, tile)
                .map_err(|e| format!("wgmma ({kind:?}, {tile:?}) unavailable on {device}: {e}"))
        },
    )
}

/// `g` through matmul_wg.cl in `tile`, its tiles in bands of `raster` rows of tiles, its
/// operands in `forms`.
pub(super) fn launch(
    kind: TensorCoreKind,
    tile: WgTile,
    raster: u32,
    forms: [TcOperand; 2],
    g: &Gemm<'_>,
) -> Result<()> {
    launch_in(kind, tile, raster, forms, g, None)
}

/// `launch` in `groups` work-groups where given (the probe's: one persistent work-group looping
/// over every tile), else as `tile` says.
fn launch_in(
    kind: TensorCoreKind,
    tile: WgTile,
    raster: u32,
    forms: [TcOperand; 2],
    g: &Gemm<'_>,
    groups: Option<usize>,
) -> Result<()> {
    if !tile.valid() {
        return Err(Error::invalid(
            "matmul",
            format!("wgmma tiling {tile:?} does not build (64, 128 or 256 columns, 3-5 stages)"),
        ));
    }
    let (a, bt) = tensor_cores::operands(g, forms)?;
    let a_mn = forms[0] == TcOperand::Mn;
    let flags = [
        (a_mn, " -DA_MN"),
        (forms[1] == TcOperand::Mn, " -DB_KN"),
        (g.out.dtype != kind.dtype(), " -DC_F32"),
    ];
    let flags: String = flags.iter().filter(|f| f.0).map(|f| f.1).collect();
    let source = wg_source(kind, tile.tbn as usize, g.activation);
    let options = format!(
        "{} {} {}{flags}",
        kind.dtype().build_option(),
        kind.define(),
        tile.options()
    );
    let program = program(&g.out.device, &source, &options)?;
    let mut kern = tensor_cores::kernel(kind, &program, "matmul_wg", g, (&a, &bt), a_mn)?;
    let batches = g.batches();
    kern.arg(&(batches as u32))?.arg(&raster)?;
    let (m, _, n) = g.dims();
    let tiles = m.div_ceil(WgTile::ROWS) * n.div_ceil(tile.tbn as usize) * batches;
    let cus = g.out.device.info().compute_units as usize;
    let groups = groups.unwrap_or_else(|| tile.groups(tiles, cus));
    kern.launch(&[groups * tile.group(), 1, 1], &[tile.group(), 1, 1])
}

/// Small integers make every product and sum exact: the device must match the host bit for bit
/// (ragged M, N and K, B read both K- and N-contiguous, several K steps) in `tile` (in bands of
/// two rows of tiles), launched as it would be and, persistent, as one work-group looping over
/// every tile; then over a K of 16 steps or more written in f32 (the ring wraps several times,
/// as a warp-specialised tiling's stages are handed back and forth).
fn probe(device: &Device, kind: TensorCoreKind, tile: WgTile) -> Result<bool> {
    let e = Exact::new(136, 264, 200);
    let dtype = kind.dtype();
    let a = e.a_on(device, dtype, true)?;
    let b_kn = e.b_on(device, dtype, true)?;
    let b_k = e.b_on(device, dtype, false)?;
    let sixteen = kind != TensorCoreKind::Tf32;
    for (b, b_form) in [(&b_kn, TcOperand::Mn), (&b_k, TcOperand::KRows)] {
        // TF32 reads K-major operands only: row-major B is copied.
        let b_form = match (b_form, sixteen) {
            (TcOperand::Mn, false) => TcOperand::Copy,
            (f, _) => f,
        };
        let launches: &[Option<usize>] = match tile.persistent {
            0 => &[None],
            _ => &[None, Some(1)],
        };
        for &groups in launches {
            let forms = [TcOperand::KRows, b_form];
            let what = format!("B {b_form:?}, {groups:?} groups");
            exact(kind, tile, forms, (&e, &a, b, dtype), groups, &what)?;
        }
    }
    let long = Exact::new(136, 72, 1000);
    let (a, b) = (
        long.a_on(device, dtype, true)?,
        long.b_on(device, dtype, false)?,
    );
    let forms = [TcOperand::KRows, TcOperand::KRows];
    exact(
        kind,
        tile,
        forms,
        (&long, &a, &b, DType::F32),
        None,
        "K 1000, f32 out",
    )?;
    Ok(true)
}

/// `e`'s product of `a` and `b` into a new `out` tensor through `tile`: an error naming `what`
/// unless every value equals the host's.
fn exact(
    kind: TensorCoreKind,
    tile: WgTile,
    forms: [TcOperand; 2],
    (e, a, b, out): (&Exact, &Tensor, &Tensor, DType),
    groups: Option<usize>,
    what: &str,
) -> Result<()> {
    // Not a product of small integers: a tile left unwritten shows.
    let c = Tensor::full(&[e.m, e.n], 0.5, out, &a.device)?;
    launch_in(kind, tile, 2, forms, &Gemm::plain(&c, a, b), groups)?;
    let got = c.to_vec_f64()?;
    if got == e.want {
        return Ok(());
    }
    let wrong = got.iter().zip(&e.want).filter(|(g, w)| g != w).count();
    Err(Error::invalid(
        "matmul_wg probe",
        format!(
            "{wrong} of {} values differ from the host's ({what})",
            got.len()
        ),
    ))
}

/// matmul_wg.cl for `kind` and `act`, after the generated wgmma wrapper for `tbn` columns (built
/// once per kind, tile width and activation).
pub(crate) fn wg_source(kind: TensorCoreKind, tbn: usize, act: Activation) -> Source {
    let base = matmul_source(MATMUL_WG, act, Class::of(kind.dtype()));
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
            kernels: base.kernels,
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
        "// Generated by netcl-ops matmul/matmul_wg.rs: one m64n{tbn}k{k} wgmma ({ty} inputs, f32 sums).\n\
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
