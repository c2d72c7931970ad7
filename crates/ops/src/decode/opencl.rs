//! The decode kernels of kernels/decode.cl: argument order, grid shapes and the bytes each launch reads.
use super::{DecodeAttention, DecodeGemv, Epilogue};
use crate::base::acc::arg_acc;
use crate::base::checks::u32_arg;
use crate::base::device_errors::{code_of, record_arg};
use crate::base::host::dense;
use crate::base::launch::program_for;
use crate::base::rope_types::{RopeFreqs, RopeStyle};
use crate::base::tensor::Tensor;
use netcl_core_devices::{Device, Result};
use netcl_kernels::sources::DECODE;
use netcl_kernels::Kernel;

/// `GemvArgs` of decode.cl: sizes and switches in one kernel argument (each argument set costs
/// host time on every launch, and a decode step is made of launches).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GemvArgs {
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
const GEMV_GROUP: usize = 256;
const GEMV_MAXB: usize = 4;
const ATT_GROUP: usize = 256;

pub(super) fn gemv(desc: &DecodeGemv, device: &Device) -> Result<Tensor> {
    let op = "decode_gemv";
    let x = dense(&desc.x)?;
    // Contiguous weights as they lie (rows of a stacked weight, say) where their rows' 4-element
    // loads stay aligned or the rows are loaded one element at a time (K not a multiple of 4);
    // other layouts copied dense.
    let k4 = desc.x.shape[1].is_multiple_of(4);
    let w: Vec<Tensor> = (desc.weights.iter())
        .map(|t| match t.is_contiguous() && (t.offset % 4 == 0 || !k4) {
            true => Ok(t.clone()),
            false => dense(t),
        })
        .collect::<Result<_>>()?;
    let mut w_off = [0; 3];
    for (o, t) in w_off.iter_mut().zip(&w) {
        *o = u32_arg(op, "weight offset", t.offset)?;
    }
    let (b, k) = (x.shape[0], x.shape[1]);
    let (n0, n1) = (w[0].shape[0], w.get(1).map_or(0, |t| t.shape[0]));
    let n2 = w.get(2).map_or(0, |t| t.shape[0]);
    let g = desc.norm.as_ref().map(|n| dense(&n.weight)).transpose()?;
    // Mode, units and the QKV-only arguments: caches, pads, frequencies, hd, S, at, style.
    let (mode, units, out_cols) = match &desc.epilogue {
        Epilogue::Plain(_) => (0u32, n0.div_ceil(2), n0),
        Epilogue::SwiGlu => (1, n0, n0),
        Epilogue::Qkv(_) => (2, (n0 + n1 + n2) / 2, n0),
    };
    let y = Tensor::alloc(&[b, out_cols], x.dtype, device)?;
    let res = match &desc.epilogue {
        Epilogue::Plain(Some(r)) => Some(dense(r)?),
        _ => None,
    };
    let program = program_for(device, &DECODE, x.dtype)?;
    let mut kern = Kernel::new(&program, "decode_gemv")?;
    let any = |t: Option<&Tensor>| t.unwrap_or(&x).mem();
    kern.arg_mem(y.mem()?)?
        .arg_mem(x.mem()?)?
        .arg_mem(any(g.as_ref())?)?
        .arg_mem(w[0].mem()?)?
        .arg_mem(any(w.get(1))?)?
        .arg_mem(any(w.get(2))?)?
        .arg_mem(any(res.as_ref())?)?;
    let bias = desc.bias.as_ref().map(dense).transpose()?;
    kern.arg_mem(any(bias.as_ref())?)?;
    let mut args = GemvArgs {
        k: u32_arg(op, "K", k)?,
        b: u32_arg(op, "rows", b)?,
        n0: u32_arg(op, "N", n0)?,
        n1: u32_arg(op, "N", n1)?,
        units: u32_arg(op, "units", units)?,
        mode,
        team: 0,
        has_norm: g.is_some() as u32,
        has_res: res.is_some() as u32,
        hd: 2,
        smax: 1,
        has_pads: 0,
        halves: 0,
        use_table: 0,
        code: code_of("decode_qkv"),
        w_off,
        has_bias: bias.is_some() as u32,
    };
    let (mut theta, mut table, mut pads, mut step) = (1.0, None, None, None);
    match &desc.epilogue {
        Epilogue::Qkv(kv) => {
            let cs = &kv.k_cache.shape;
            args.hd = u32_arg(op, "head dim", cs[3])?;
            args.smax = u32_arg(op, "cache length", cs[2])?;
            step = Some(dense(&kv.pos)?);
            args.halves = (kv.style == RopeStyle::Halves) as u32;
            match &kv.freqs {
                RopeFreqs::Theta(t) => theta = *t,
                RopeFreqs::Table(t) => table = Some(dense(t)?),
            }
            pads = kv.pads.as_ref().map(dense).transpose()?;
            kern.arg_mem(kv.k_cache.mem()?)?
                .arg_mem(kv.v_cache.mem()?)?;
        }
        _ => {
            kern.arg_mem(y.mem()?)?.arg_mem(y.mem()?)?;
        }
    }
    args.has_pads = pads.is_some() as u32;
    args.use_table = table.is_some() as u32;
    // Work-items per unit: about four (vector) loads of each row per work-item, 32 to 256, so
    // that short and long rows alike keep enough loads in flight.
    let per_row = if k % 4 == 0 { k / 4 } else { k };
    let team = (per_row / 4).next_power_of_two().clamp(32, GEMV_GROUP);
    args.team = team as u32;
    kern.arg_mem(any(pads.as_ref())?)?
        .arg_mem(any(table.as_ref())?)?;
    match &step {
        Some(p) => kern.arg_mem(p.mem()?)?.arg_mem(record_arg(device)?)?,
        None => kern.arg_mem(y.mem()?)?.arg_mem(y.mem()?)?,
    };
    kern.arg(&args)?;
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
    let groups = units.div_ceil(GEMV_GROUP / team);
    u32_arg(op, "elements", b * (n0 + n1 + n2).max(k))?;
    kern.launch(
        &[groups * GEMV_GROUP, b.div_ceil(GEMV_MAXB)],
        &[GEMV_GROUP, 1],
    )?;
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
        .arg(&[
            u32_arg(op, "heads", h)?,
            u32_arg(op, "kv heads", hkv)?,
            u32_arg(op, "head dim", hd)?,
            u32_arg(op, "cache length", s)?,
            pads.is_some() as u32,
            code_of(op) as u32,
            u32_arg(op, "window", desc.window.unwrap_or(0))?,
            0,
        ])?;
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
