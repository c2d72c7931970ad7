//! The decode kernels of kernels/decode.cl: argument order, grid shapes and the bytes each launch reads.
use super::{DecodeAttention, DecodeGemv, Epilogue, KvWrite};
use crate::base::acc::arg_acc;
use crate::base::checks::u32_arg;
use crate::base::device_errors::{code_of, record_arg};
use crate::base::host::dense;
use crate::base::launch::program_for;
use crate::base::rope_types::{RopeFreqs, RopeStyle};
use crate::base::tensor::Tensor;
use crate::matmul::matmul_tc::tensor_core_kind;
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::sources::DECODE;
use netcl_kernels::{program, Kernel};

/// `GemvArgs` of decode.cl: sizes and switches in one kernel argument (each argument set costs
/// host time on every launch, and a decode step is made of launches).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct GemvArgs {
    k: u32,
    b: u32,
    n0: u32,
    n1: u32,
    units: u32,
    mode: u32,
    team: u32,
    has_norm: u32,
    has_res: u32,
    hd: u32,
    smax: u32,
    has_pads: u32,
    halves: u32,
    use_table: u32,
    code: i32,
    /// Element offsets of w0, w1, w2 in their buffers.
    w_off: [u32; 3],
    has_bias: u32,
}

/// `GEMV_GROUP`, `GEMV_MAXB` and `ATT_GROUP` of decode.cl.
pub(super) const GEMV_GROUP: usize = 256;
pub(super) const GEMV_MAXB: usize = 4;
const ATT_GROUP: usize = 256;
/// decode_gemv_tc's work-items, units (with one warp a unit group's K) and batch rows a
/// work-group (`GT_*` of decode.cl).
const GT_GROUP: usize = 128;
const GT_UNITS: usize = 32;
const GT_ROWS: usize = 32;

/// How decode.cl's tensor-core GEMV takes a launch of `b` rows over `k` and `units` units with
/// weights at element offsets `w_off`: its build options and units a work-group, where it can:
/// more rows than one decode_gemv work-group takes (fewer read every weight about once anyway),
/// 16-bit dtypes on a device whose tensor-core probe passed, K a multiple of 32 and every weight
/// row 16-byte aligned. Where one warp a unit group would leave compute units idle, four warps
/// share each unit group's K (`GT_KSPLIT`).
fn tc_plan(
    device: &Device,
    dtype: DType,
    (b, k, units): (usize, usize, usize),
    w_off: &[u32; 3],
) -> Option<(String, usize)> {
    let tc = match dtype {
        DType::BF16 => "-DTC_BF16",
        DType::F16 => "-DTC_F16",
        _ => return None,
    };
    let fits = b > GEMV_MAXB
        && k.is_multiple_of(32)
        && w_off.iter().all(|o| o.is_multiple_of(8))
        && tensor_core_kind(device, dtype).is_some();
    if !fits {
        return None;
    }
    let groups = units.div_ceil(GT_UNITS) * b.div_ceil(GT_ROWS);
    let split = if groups < device.info().compute_units as usize {
        4
    } else {
        1
    };
    let options = format!("{} {tc} -DGT_KSPLIT={split}", dtype.build_option());
    Some((options, GT_UNITS / split))
}

/// A decode_gemv launch's sizes: its `GemvArgs` and its grid (work-groups along the units, batch
/// groups of `GEMV_MAXB` rows).
pub(super) struct GemvLaunch {
    pub(super) args: GemvArgs,
    pub(super) groups: usize,
    pub(super) batch_groups: usize,
}

/// What a decode GEMV's launch depends on beyond x's rows (B, K) and the weights' rows.
pub(super) struct GemvShape {
    pub(super) mode: u32,
    pub(super) has_norm: bool,
    pub(super) has_res: bool,
    pub(super) has_bias: bool,
    pub(super) w_off: [u32; 3],
    /// QKV: the caches' (S, hd), whether RoPE pairs halves, pads given, a frequency table given.
    pub(super) qkv: Option<(usize, usize, bool, bool, bool)>,
}

pub(super) fn gemv_launch(
    op: &str,
    (b, k): (usize, usize),
    ns: [usize; 3],
    s: GemvShape,
) -> Result<GemvLaunch> {
    let [n0, n1, n2] = ns;
    let units = match s.mode {
        0 => n0.div_ceil(2),
        1 => n0,
        _ => (n0 + n1 + n2) / 2,
    };
    // Work-items per unit, 32 to 256: about four (vector) loads of each row per work-item for
    // one group of batch rows, so that short and long rows alike keep enough loads in flight;
    // sixteen where several batch groups already fill the device with work-groups (measured in
    // netcl-bench --llama generate,generate_b32: docs/performance.md, Generation).
    let per_row = if k % 4 == 0 { k / 4 } else { k };
    let loads = if b > GEMV_MAXB { 16 } else { 4 };
    let team = (per_row / loads).next_power_of_two().clamp(32, GEMV_GROUP);
    let (smax, hd, halves, has_pads, use_table) = s.qkv.unwrap_or((1, 2, false, false, false));
    u32_arg(op, "elements", b * (n0 + n1 + n2).max(k))?;
    let args = GemvArgs {
        k: u32_arg(op, "K", k)?,
        b: u32_arg(op, "rows", b)?,
        n0: u32_arg(op, "N", n0)?,
        n1: u32_arg(op, "N", n1)?,
        units: u32_arg(op, "units", units)?,
        mode: s.mode,
        team: team as u32,
        has_norm: s.has_norm as u32,
        has_res: s.has_res as u32,
        hd: u32_arg(op, "head dim", hd)?,
        smax: u32_arg(op, "cache length", smax)?,
        has_pads: has_pads as u32,
        halves: halves as u32,
        use_table: use_table as u32,
        code: code_of("decode_qkv"),
        w_off: s.w_off,
        has_bias: s.has_bias as u32,
    };
    Ok(GemvLaunch {
        args,
        groups: units.div_ceil(GEMV_GROUP / team),
        batch_groups: b.div_ceil(GEMV_MAXB),
    })
}

/// Weights as the kernels read them: contiguous as they lie (rows of a stacked weight, say) where
/// their rows' 4-element loads stay aligned or the rows are loaded one element at a time (K not a
/// multiple of 4); other layouts copied dense. With their element offsets.
pub(super) fn kernel_weights(
    op: &str,
    k: usize,
    weights: &[&Tensor],
) -> Result<(Vec<Tensor>, [u32; 3])> {
    let k4 = k.is_multiple_of(4);
    let w: Vec<Tensor> = (weights.iter())
        .map(|t| match t.is_contiguous() && (t.offset % 4 == 0 || !k4) {
            true => Ok((*t).clone()),
            false => dense(t),
        })
        .collect::<Result<_>>()?;
    let mut w_off = [0; 3];
    for (o, t) in w_off.iter_mut().zip(&w) {
        *o = u32_arg(op, "weight offset", t.offset)?;
    }
    Ok((w, w_off))
}

/// The QKV epilogue's sizes and buffers: (S, hd, halves, pads, table) for `GemvShape::qkv`, the
/// dense position, pads and frequency table, and theta.
#[allow(clippy::type_complexity)]
pub(super) fn qkv_parts(
    kv: &KvWrite,
) -> Result<(
    (usize, usize, bool, bool, bool),
    Tensor,
    Option<Tensor>,
    Option<Tensor>,
    f64,
)> {
    let cs = &kv.k_cache.shape;
    let (theta, table) = match &kv.freqs {
        RopeFreqs::Theta(t) => (*t, None),
        RopeFreqs::Table(t) => (1.0, Some(dense(t)?)),
    };
    let pads = kv.pads.as_ref().map(dense).transpose()?;
    let sizes = (
        cs[2],
        cs[3],
        kv.style == RopeStyle::Halves,
        pads.is_some(),
        table.is_some(),
    );
    Ok((sizes, dense(&kv.pos)?, pads, table, theta))
}

pub(super) fn gemv(desc: &DecodeGemv, device: &Device) -> Result<Tensor> {
    let op = "decode_gemv";
    let x = dense(&desc.x)?;
    let (b, k) = (x.shape[0], x.shape[1]);
    let (w, w_off) = kernel_weights(op, k, &desc.weights.iter().collect::<Vec<_>>())?;
    let (n0, n1) = (w[0].shape[0], w.get(1).map_or(0, |t| t.shape[0]));
    let n2 = w.get(2).map_or(0, |t| t.shape[0]);
    let g = desc.norm.as_ref().map(|n| dense(&n.weight)).transpose()?;
    let res = match &desc.epilogue {
        Epilogue::Plain(Some(r)) => Some(dense(r)?),
        _ => None,
    };
    let bias = desc.bias.as_ref().map(dense).transpose()?;
    let qkv = match &desc.epilogue {
        Epilogue::Qkv(kv) => Some(qkv_parts(kv)?),
        _ => None,
    };
    let mode = match &desc.epilogue {
        Epilogue::Plain(_) => 0,
        Epilogue::SwiGlu => 1,
        Epilogue::Qkv(_) => 2,
    };
    let shape = GemvShape {
        mode,
        has_norm: g.is_some(),
        has_res: res.is_some(),
        has_bias: bias.is_some(),
        w_off,
        qkv: qkv.as_ref().map(|q| q.0),
    };
    let launch = gemv_launch(op, (b, k), [n0, n1, n2], shape)?;
    let out_cols = n0;
    let y = Tensor::alloc(&[b, out_cols], x.dtype, device)?;
    let tc = tc_plan(device, x.dtype, (b, k, launch.args.units as usize), &w_off);
    let (program, name) = match &tc {
        Some((options, _)) => (program(device, &DECODE, options)?, "decode_gemv_tc"),
        None => (program_for(device, &DECODE, x.dtype)?, "decode_gemv"),
    };
    let mut kern = Kernel::new(&program, name)?;
    let any = |t: Option<&Tensor>| t.unwrap_or(&x).mem();
    kern.arg_mem(y.mem()?)?
        .arg_mem(x.mem()?)?
        .arg_mem(any(g.as_ref())?)?
        .arg_mem(w[0].mem()?)?
        .arg_mem(any(w.get(1))?)?
        .arg_mem(any(w.get(2))?)?
        .arg_mem(any(res.as_ref())?)?
        .arg_mem(any(bias.as_ref())?)?;
    let mut theta = 1.0;
    match (&desc.epilogue, &qkv) {
        (Epilogue::Qkv(kv), Some((_, pos, pads, table, t))) => {
            theta = *t;
            kern.arg_mem(kv.k_cache.mem()?)?
                .arg_mem(kv.v_cache.mem()?)?
                .arg_mem(any(pads.as_ref())?)?
                .arg_mem(any(table.as_ref())?)?
                .arg_mem(pos.mem()?)?
                .arg_mem(record_arg(device)?)?;
        }
        _ => {
            for _ in 0..6 {
                kern.arg_mem(y.mem()?)?;
            }
        }
    }
    kern.arg(&launch.args)?;
    arg_acc(
        &mut kern,
        x.dtype,
        desc.norm.as_ref().map_or(0.0, |n| n.eps),
    )?;
    arg_acc(&mut kern, x.dtype, theta)?;
    // Every weight read once, x once per work-group, y (and the residual) once.
    let es = x.dtype.size();
    let bytes = ((n0 + n1 + n2) * k + 2 * b * out_cols) * es;
    kern.declare(bytes as u64, (2 * b * (n0 + n1 + n2) * k) as u64);
    match tc {
        Some((_, per_group)) => {
            let groups = (launch.args.units as usize).div_ceil(per_group) * b.div_ceil(GT_ROWS);
            kern.launch(&[groups * GT_GROUP], &[GT_GROUP])?
        }
        None => kern.launch(
            &[launch.groups * GEMV_GROUP, launch.batch_groups],
            &[GEMV_GROUP, 1],
        )?,
    };
    Ok(y)
}

pub(super) fn attention(desc: &DecodeAttention, device: &Device) -> Result<Tensor> {
    let op = "decode_attention";
    let q = dense(&desc.q)?;
    let cs = &desc.k_cache.shape;
    let (b, hkv, s, hd) = (cs[0], cs[1], cs[2], cs[3]);
    let h = desc.heads;
    u32_arg(op, "cache elements", b * hkv * s * hd)?;
    let pads = desc.pads.as_ref().map(dense).transpose()?;
    let pos = dense(&desc.pos)?;
    let o = Tensor::alloc(&[b, h * hd], q.dtype, device)?;
    let program = program_for(device, &DECODE, q.dtype)?;
    let mut kern = Kernel::new(&program, "decode_attention")?;
    kern.arg_mem(o.mem()?)?
        .arg_mem(q.mem()?)?
        .arg_mem(desc.k_cache.mem()?)?
        .arg_mem(desc.v_cache.mem()?)?
        .arg_mem(pads.as_ref().unwrap_or(&q).mem()?)?
        .arg_mem(pos.mem()?)?
        .arg_mem(record_arg(device)?)?
        .arg(&attention_sizes(cs, h, desc.window, pads.is_some())?)?;
    arg_acc(&mut kern, q.dtype, 1.0 / (hd as f64).sqrt())?;
    // Each query head reads its keys and values (grouped heads share them through the cache);
    // the profiler counts the whole cache, as the host does not know the position.
    let es = q.dtype.size();
    kern.declare(
        ((2 * b * hkv * s * hd + 2 * b * h * hd) * es) as u64,
        (4 * b * h * s * hd) as u64,
    );
    kern.launch(&[b * h * ATT_GROUP], &[ATT_GROUP])?;
    Ok(o)
}

/// decode_attention's eight sizes: H, Hkv, hd, S, pads given, error code, window (0: none), 0.
pub(super) fn attention_sizes(
    cache: &[usize],
    heads: usize,
    window: Option<usize>,
    has_pads: bool,
) -> Result<[u32; 8]> {
    let op = "decode_attention";
    Ok([
        u32_arg(op, "heads", heads)?,
        u32_arg(op, "kv heads", cache[1])?,
        u32_arg(op, "head dim", cache[3])?,
        u32_arg(op, "cache length", cache[2])?,
        has_pads as u32,
        code_of(op) as u32,
        u32_arg(op, "window", window.unwrap_or(0))?,
        0,
    ])
}
