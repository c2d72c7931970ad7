//! The decode kernels of kernels/decode.cl: argument order, grid shapes and the bytes each launch reads.
use super::{DecodeAttention, DecodeGemv, Epilogue};
use crate::base::acc::arg_acc;
use crate::base::checks::u32_arg;
use crate::base::host::dense;
use crate::base::launch::program_for;
use crate::base::tensor::Tensor;
use crate::rope::{RopeFreqs, RopeStyle};
use netcl_core_devices::{Device, Result};
use netcl_kernels::sources::DECODE;
use netcl_kernels::Kernel;

/// `GEMV_TEAM * GEMV_UNITS`, `GEMV_UNITS`, `GEMV_MAXB` and `ATT_GROUP` of decode.cl.
const GEMV_GROUP: usize = 128;
const GEMV_UNITS: usize = 4;
const GEMV_MAXB: usize = 4;
const ATT_GROUP: usize = 128;

pub(super) fn gemv(desc: &DecodeGemv, device: &Device) -> Result<Tensor> {
    let op = "decode_gemv";
    let x = dense(&desc.x)?;
    let w: Vec<Tensor> = desc.weights.iter().map(dense).collect::<Result<_>>()?;
    let (b, k) = (x.shape[0], x.shape[1]);
    let (n0, n1) = (w[0].shape[0], w.get(1).map_or(0, |t| t.shape[0]));
    let n2 = w.get(2).map_or(0, |t| t.shape[0]);
    let g = desc.norm.as_ref().map(|n| dense(&n.weight)).transpose()?;
    // Mode, units and the QKV-only arguments: caches, pads, frequencies, hd, S, at, style.
    let (mode, units, out_cols) = match &desc.epilogue {
        Epilogue::Plain(_) => (0, n0.div_ceil(2), n0),
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
    let (mut hd, mut smax, mut at, mut halves, mut theta) = (2usize, 1usize, 0usize, 0i32, 1.0);
    let mut table = None;
    let mut pads = None;
    match &desc.epilogue {
        Epilogue::Qkv(kv) => {
            let cs = &kv.k_cache.shape;
            (hd, smax, at) = (cs[3], cs[2], kv.at);
            halves = (kv.style == RopeStyle::Halves) as i32;
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
    kern.arg_mem(any(pads.as_ref())?)?
        .arg_mem(any(table.as_ref())?)?
        .arg(&u32_arg(op, "K", k)?)?
        .arg(&u32_arg(op, "rows", b)?)?
        .arg(&u32_arg(op, "N", n0)?)?
        .arg(&u32_arg(op, "N", n1)?)?
        .arg(&u32_arg(op, "units", units)?)?
        .arg(&(mode as i32))?
        .arg(&(g.is_some() as i32))?
        .arg(&(res.is_some() as i32))?;
    arg_acc(
        &mut kern,
        x.dtype,
        desc.norm.as_ref().map_or(0.0, |n| n.eps),
    )?;
    kern.arg(&u32_arg(op, "head dim", hd)?)?
        .arg(&u32_arg(op, "cache length", smax)?)?
        .arg(&u32_arg(op, "position", at)?)?
        .arg(&(pads.is_some() as i32))?
        .arg(&halves)?
        .arg(&(table.is_some() as i32))?;
    arg_acc(&mut kern, x.dtype, theta)?;
    // Every weight read once, x once per work-group, y (and the residual) once.
    let es = x.dtype.size();
    let bytes = ((n0 + n1 + n2) * k + 2 * b * out_cols) * es;
    kern.declare(bytes as u64, (2 * b * (n0 + n1 + n2) * k) as u64);
    let groups = units.div_ceil(GEMV_UNITS);
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
    let o = Tensor::alloc(&[b, h * hd], q.dtype, device)?;
    let program = program_for(device, &DECODE, q.dtype)?;
    let mut kern = Kernel::new(&program, "decode_attention")?;
    kern.arg_mem(o.mem()?)?
        .arg_mem(q.mem()?)?
        .arg_mem(desc.k_cache.mem()?)?
        .arg_mem(desc.v_cache.mem()?)?
        .arg_mem(pads.as_ref().unwrap_or(&q).mem()?)?
        .arg(&u32_arg(op, "heads", h)?)?
        .arg(&u32_arg(op, "kv heads", hkv)?)?
        .arg(&u32_arg(op, "head dim", hd)?)?
        .arg(&u32_arg(op, "cache length", s)?)?
        .arg(&u32_arg(op, "keys", desc.len)?)?
        .arg(&(pads.is_some() as i32))?;
    arg_acc(&mut kern, q.dtype, 1.0 / (hd as f64).sqrt())?;
    // Each query head reads its keys and values (grouped heads share them through the cache).
    let es = q.dtype.size();
    kern.declare(
        ((2 * b * hkv * desc.len * hd + 2 * b * h * hd) * es) as u64,
        (4 * b * h * desc.len * hd) as u64,
    );
    kern.launch(&[b * h * ATT_GROUP], &[ATT_GROUP])?;
    Ok(o)
}
