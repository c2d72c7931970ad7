//! The fused attention kernels of kernels/attention.cl: tile sizes fitted to the device's local memory, the geometry argument, launches.
use super::{Dims, FlashAttention, FlashAttentionBackward};
use crate::base::acc::{acc_dtype, arg_acc};
use crate::base::checks::u32_arg;
use crate::base::launch::launch_groups;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::sources::ATTENTION;
use netcl_kernels::{program, Kernel, Program};
use std::sync::Arc;

/// Queries per work-group of the forward and dq kernels (`BQ`): one per work-item.
const BQ: usize = 64;

/// `AttnGeom` of kernels/attention.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct AttnGeom {
    batch: u32,
    heads: u32,
    kv_heads: u32,
    tq: u32,
    tk: u32,
    causal: u32,
    offset: i32,
    /// Offset and strides over (b, h, t) of q, k, v, o (or the output's gradient), and o in
    /// the backward.
    views: [[u32; 4]; 5],
}

/// Offset and element strides over (b, h, t) of a 4-D tensor: `[offset, sb, sh, st]`; an
/// error when an element it reaches lies past the kernels' 32-bit indices.
fn view(op: &str, t: &Tensor) -> Result<[u32; 4]> {
    let (s, n) = (t.strides(), t.shape());
    let reach = (0..3).fold(t.offset() + n[3], |r, i| {
        r.saturating_add((n[i].max(1) - 1).saturating_mul(s[i]))
    });
    u32_arg(op, "element index", reach)?;
    Ok([
        u32_arg(op, "offset", t.offset())?,
        u32_arg(op, "stride", s[0])?,
        u32_arg(op, "stride", s[1])?,
        u32_arg(op, "stride", s[2])?,
    ])
}

/// `t` with a dense last dim (the kernels read rows of D as vectors): itself, or a copy.
fn rows_dense(t: &Tensor) -> Result<Tensor> {
    if t.strides()[3] == 1 {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

/// The program for `dtype` and head dim `d`, with tiles that fit the device's local memory.
/// Every kernel runs a work-item per query (forward, dq) or key (dk, dv), `BQ` to a group.
fn attention_program(device: &Device, dtype: DType, d: usize) -> Result<Arc<Program>> {
    let esz = acc_dtype(dtype).size() / 4;
    // Key tiles of the forward/dq kernels and query tiles of the dk/dv kernels: two of 8 KiB of
    // f32 (32 rows at D = 64), 4 to 32 rows.
    let tile = (2048 / (d * esz)).clamp(4, 32);
    let need = 2 * tile * d * 4 * esz + 2 * tile * 4 * esz;
    let local = device.info().local_mem_bytes as usize;
    if need > local {
        return Err(Error::device(
            "flash_attention",
            format!("head dim {d} in {dtype} needs {need} B of local memory; {device} has {local}"),
        ));
    }
    let options = format!(
        "{} -DHEAD_DIM={d} -DBQ={BQ} -DBK={tile} -DBKV={BQ} -DBQT={tile}",
        dtype.build_option()
    );
    program(device, &ATTENTION, &options)
}

impl Dims {
    fn geom(&self, op: &str, views: [[u32; 4]; 5]) -> Result<AttnGeom> {
        Ok(AttnGeom {
            batch: u32_arg(op, "batch", self.b)?,
            heads: u32_arg(op, "heads", self.h)?,
            kv_heads: u32_arg(op, "kv heads", self.hkv)?,
            tq: u32_arg(op, "queries", self.tq)?,
            tk: u32_arg(op, "keys", self.tk)?,
            causal: self.causal as u32,
            offset: self.tk as i32 - self.tq as i32,
            views,
        })
    }

    /// A new (B, T, heads, D) tensor returned as its (B, heads, T, D) view; an error when it
    /// has more elements than the kernels' 32-bit indices reach.
    fn t_major(&self, t: usize, heads: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        u32_arg(
            "flash_attention",
            "output elements",
            self.b * t * heads * self.d,
        )?;
        Tensor::alloc(&[self.b, t, heads, self.d], dtype, device)?.transpose(1, 2)
    }

    /// Multiply-adds of one pass over the visible (query, key) pairs, times 2 (flops).
    fn pair_flops(&self) -> u64 {
        let pairs: usize = if self.causal {
            (0..self.tq).map(|i| self.visible(i)).sum()
        } else {
            self.tq * self.tk
        };
        (2 * self.b * self.h * pairs * self.d) as u64
    }
}

/// Launches `k` over one work-group per `per` rows of each of `bh` (batch, head) pairs.
fn launch(op: &str, k: &mut Kernel, bh: usize, rows: usize, per: usize) -> Result<()> {
    launch_groups(op, k, bh * rows.div_ceil(per), per)
}

pub(super) fn forward(desc: &FlashAttention, device: &Device) -> Result<(Tensor, Tensor)> {
    let op = "flash_attention";
    let d = &desc.dims;
    let (q, k, v) = (
        rows_dense(&desc.q)?,
        rows_dense(&desc.k)?,
        rows_dense(&desc.v)?,
    );
    let dtype = q.dtype();
    let out = d.t_major(d.tq, d.h, dtype, device)?;
    let lse = Tensor::alloc(&[d.b, d.h, d.tq], acc_dtype(dtype), device)?;
    let program = attention_program(device, dtype, d.d)?;
    let views = [
        view(op, &q)?,
        view(op, &k)?,
        view(op, &v)?,
        view(op, &out)?,
        [0; 4],
    ];
    let geom = d.geom(op, views)?;
    let mut kern = Kernel::new(&program, "attention_fwd")?;
    let bytes = (q.numel() + k.numel() + v.numel() + out.numel()) * dtype.size();
    kern.declare(bytes as u64, 2 * d.pair_flops());
    kern.arg_mem(out.mem()?)?
        .arg_mem(lse.mem()?)?
        .arg_mem(q.mem()?)?
        .arg_mem(k.mem()?)?
        .arg_mem(v.mem()?)?
        .arg(&geom)?;
    arg_acc(&mut kern, dtype, d.scale)?;
    launch(op, &mut kern, d.b * d.h, d.tq, BQ)?;
    Ok((out, lse))
}

pub(super) fn backward(
    desc: &FlashAttentionBackward,
    device: &Device,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "flash_attention_backward";
    let d = &desc.dims;
    let dense = |t: &Tensor| rows_dense(t);
    let (q, k, v) = (dense(&desc.q)?, dense(&desc.k)?, dense(&desc.v)?);
    let (out, grad, lse) = (
        dense(&desc.out)?,
        dense(&desc.grad)?,
        crate::base::host::dense(&desc.lse)?,
    );
    let dtype = q.dtype();
    let program = attention_program(device, dtype, d.d)?;
    let views = [
        view(op, &q)?,
        view(op, &k)?,
        view(op, &v)?,
        view(op, &grad)?,
        view(op, &out)?,
    ];
    let geom = d.geom(op, views)?;
    let dq = d.t_major(d.tq, d.h, dtype, device)?;
    let delta = Tensor::alloc(&[d.b, d.h, d.tq], acc_dtype(dtype), device)?;
    let bytes =
        |ts: &[&Tensor]| (ts.iter().map(|t| t.numel()).sum::<usize>() * dtype.size()) as u64;
    let mut kern = Kernel::new(&program, "attention_bwd_dq")?;
    kern.declare(bytes(&[&q, &k, &v, &grad, &out, &dq]), 3 * d.pair_flops());
    kern.arg_mem(dq.mem()?)?
        .arg_mem(delta.mem()?)?
        .arg_mem(q.mem()?)?
        .arg_mem(k.mem()?)?
        .arg_mem(v.mem()?)?
        .arg_mem(grad.mem()?)?
        .arg_mem(out.mem()?)?
        .arg_mem(lse.mem()?)?
        .arg(&geom)?;
    arg_acc(&mut kern, dtype, d.scale)?;
    launch(op, &mut kern, d.b * d.h, d.tq, BQ)?;
    // dk needs three products per visible pair (score, its gradient, the update), dv two.
    let key_grad = |name: &str, products: u64| -> Result<Tensor> {
        let out = d.t_major(d.tk, d.hkv, dtype, device)?;
        let mut kern = Kernel::new(&program, name)?;
        kern.declare(bytes(&[&q, &k, &v, &grad, &out]), products * d.pair_flops());
        kern.arg_mem(out.mem()?)?
            .arg_mem(q.mem()?)?
            .arg_mem(k.mem()?)?
            .arg_mem(v.mem()?)?
            .arg_mem(grad.mem()?)?
            .arg_mem(lse.mem()?)?
            .arg_mem(delta.mem()?)?
            .arg(&geom)?;
        arg_acc(&mut kern, dtype, d.scale)?;
        launch(op, &mut kern, d.b * d.hkv, d.tk, BQ)?;
        Ok(out)
    };
    let dk = key_grad("attention_bwd_dk", 3)?;
    let dv = key_grad("attention_bwd_dv", 2)?;
    Ok((dq, dk, dv))
}
