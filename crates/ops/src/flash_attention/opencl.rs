//! The fused attention kernels of kernels/attention.cl: tile sizes fitted to the device's local memory, the geometry argument, launches.
use super::{Dims, FlashAttention, FlashAttentionBackward};
use crate::base::acc::{acc_dtype, arg_acc};
use crate::base::checks::u32_arg;
use crate::base::host::dense;
use crate::base::launch::launch_groups;
use crate::base::tensor::Tensor;
use crate::matmul::matmul_tc::tensor_core_kind;
use netcl_core_devices::{DType, Device, Error, Result};
use netcl_kernels::sources::{ATTENTION, ATTENTION_TC};
use netcl_kernels::{program, Kernel, Program};
use std::sync::Arc;

/// Queries per work-group of the forward and dq kernels (`BQ`): one per work-item.
const BQ: usize = 64;

/// `TB` and `TG` of attention.cl's register-blocked backward: rows per block, work-items.
const BLOCK_ROWS: usize = 32;
const BLOCK_GROUP: usize = 128;

/// Whether the register-blocked kernels (forward and backward) take head dim `d` in `dtype` on `device`: d <= 64 and
/// its tiles (four blocks of rows, two of probabilities) in local memory.
fn blocked_fits(device: &Device, dtype: DType, d: usize) -> bool {
    let rows = 4 * BLOCK_ROWS * (d + 4) + 2 * BLOCK_ROWS * (BLOCK_ROWS + 4) + 2 * BLOCK_ROWS;
    let need = (rows + BLOCK_GROUP) * acc_dtype(dtype).size();
    d <= 64 && need as u64 <= device.info().local_mem_bytes
}

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
    /// The sliding window (0: none).
    window: i32,
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

/// The tensor-core program (kernels/attention_tc.cl) where it takes this problem: products in
/// bf16 or f16 (`compute`) on a device whose tensor-core probe passed, over operands of that dtype
/// or f32 (`io`: read and written as f32), head dims 16 to 128 in steps of 16, every view's offset
/// and strides multiples of 8 elements, a positive scale (the forward scales the scores' maximum
/// once). [`Config::attention_tc`](netcl_core_devices::Config::attention_tc) (`NETCL_ATTENTION_TC=0`) turns it off.
fn tensor_core_program(
    device: &Device,
    io: DType,
    compute: DType,
    dims: &Dims,
    views: &[[u32; 4]],
) -> Result<Option<Arc<Program>>> {
    let d = dims.d;
    let on = netcl_core_devices::Config::get().attention_tc;
    let tc = match compute {
        DType::BF16 => "-DTC_BF16",
        DType::F16 => "-DTC_F16",
        _ => return Ok(None),
    };
    let fits = on
        && (io == compute || io == DType::F32)
        && d.is_multiple_of(16)
        && (16..=128).contains(&d)
        && dims.scale > 0.0
        && dims.scale.is_finite()
        && views.iter().flatten().all(|x| x.is_multiple_of(8))
        && tensor_core_kind(device, compute).is_some();
    if !fits {
        return Ok(None);
    }
    let options = format!(
        "{} {tc} -DHEAD_DIM={d} -DMT_F={}",
        io.build_option(),
        tc_forward_tiles(d)
    );
    program(device, &ATTENTION_TC, &options).map(Some)
}

/// Row tiles of 16 each warp of attention_tc.cl's forward owns at head dim `d` (a work-group takes
/// 64 times as many rows): two up to 64, where their accumulators still fit the registers.
fn tc_forward_tiles(d: usize) -> usize {
    if d <= 64 {
        2
    } else {
        1
    }
}

/// Whether the register-blocked backward takes dq from the scores' gradients (B, H, Tq, Tk),
/// written by the dk/dv kernel and multiplied by k as one GEMM: f32 and f64 (the gradients in
/// the operands' dtype) up to 512 MiB of them (the Llama-110M shape, B 16, H 12, T 512: 192 MiB,
/// where the GEMM beats the dq kernel; netcl-bench's attention suite). [`Config::attention_ds`](netcl_core_devices::Config::attention_ds)
/// (`NETCL_ATTENTION_DS=0`) turns it off.
fn scores_fit(d: &Dims, dtype: DType) -> bool {
    let on = netcl_core_devices::Config::get().attention_ds;
    let bytes = d.b * d.h * d.tq * d.tk * dtype.size();
    on && matches!(dtype, DType::F32 | DType::F64) && bytes <= 512 << 20
}

/// Work-items of attention_tc.cl's work-groups.
const TC_GROUP: usize = 128;
/// Rows per work-group and work-items of attention_tc.cl's backward kernels.
const TC_BLOCK: (usize, usize) = (64, TC_GROUP);

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
            window: self.window.unwrap_or(0) as i32,
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
            (0..self.tq).map(|i| self.visible(i) - self.first(i)).sum()
        } else {
            self.tq * self.tk
        };
        (2 * self.b * self.h * pairs * self.d) as u64
    }
}

/// What every attention kernel takes besides its buffers: the program, the geometry, the sizes
/// (scale, visible pairs) and the dtype.
struct Kernels<'a> {
    op: &'static str,
    program: Arc<Program>,
    geom: AttnGeom,
    d: &'a Dims,
    dtype: DType,
}

impl Kernels<'_> {
    /// Runs kernel `name` on `bufs` (its buffer arguments in order), then the geometry and the
    /// scale: `rows` of each of `pairs` (batch, head) pairs, `per_group` rows to a work-group of
    /// `group` work-items. Declares the buffers' bytes and `products` passes over the visible
    /// pairs.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        name: &str,
        (bufs, flags): (&[&Tensor], &[u32]),
        products: u64,
        pairs: usize,
        rows: usize,
        (per_group, group): (usize, usize),
    ) -> Result<()> {
        let mut k = Kernel::new(&self.program, name)?;
        let bytes: usize = bufs.iter().map(|t| t.numel() * t.dtype().size()).sum();
        k.declare(bytes as u64, products * self.d.pair_flops());
        for t in bufs {
            k.arg_mem(t.mem()?)?;
        }
        for f in flags {
            k.arg(f)?;
        }
        k.arg(&self.geom)?;
        arg_acc(&mut k, self.dtype, self.d.scale)?;
        launch_groups(self.op, &mut k, pairs * rows.div_ceil(per_group), group)
    }
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
    // The output is made dense below, so the operands' views decide the tensor-core path.
    let operands = [view(op, &q)?, view(op, &k)?, view(op, &v)?];
    let compute = d.compute.unwrap_or(dtype);
    let tc = match d.window {
        None => tensor_core_program(device, dtype, compute, d, &operands)?,
        Some(_) => None, // attention_tc.cl has no window
    };
    if tc.is_none() && d.compute.is_some() {
        return super::narrowed_forward(desc);
    }
    let out = d.t_major(d.tq, d.h, dtype, device)?;
    let lse = Tensor::alloc(&[d.b, d.h, d.tq], acc_dtype(dtype), device)?;
    let [qv, kv, vv] = operands;
    let views = [qv, kv, vv, view(op, &out)?, [0; 4]];
    // The blocked forward's output tile leaves a quarter of its work-items idle at head dim 48,
    // where the streaming kernel is faster (netcl-bench's attention suite): only at 64.
    let (program, name, block) = match tc {
        Some(p) => (
            p,
            "attention_fwd_tc",
            (64 * tc_forward_tiles(d.d), TC_GROUP),
        ),
        None if d.d == 64 && blocked_fits(device, dtype, d.d) => (
            attention_program(device, dtype, d.d)?,
            "attention_fwd_blocked",
            (BLOCK_ROWS, BLOCK_GROUP),
        ),
        None => (
            attention_program(device, dtype, d.d)?,
            "attention_fwd",
            (BQ, BQ),
        ),
    };
    let kernels = Kernels {
        op,
        program,
        geom: d.geom(op, views)?,
        d,
        dtype,
    };
    kernels.run(
        name,
        (&[&out, &lse, &q, &k, &v], &[]),
        2,
        d.b * d.h,
        d.tq,
        block,
    )?;
    Ok((out, lse))
}

pub(super) fn backward(
    desc: &FlashAttentionBackward,
    device: &Device,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "flash_attention_backward";
    let d = &desc.dims;
    let (q, k, v) = (
        rows_dense(&desc.q)?,
        rows_dense(&desc.k)?,
        rows_dense(&desc.v)?,
    );
    let (out, grad, lse) = (
        rows_dense(&desc.out)?,
        rows_dense(&desc.grad)?,
        dense(&desc.lse)?,
    );
    let dtype = q.dtype();
    let views = [
        view(op, &q)?,
        view(op, &k)?,
        view(op, &v)?,
        view(op, &grad)?,
        view(op, &out)?,
    ];
    let tc = match d.window {
        None => tensor_core_program(device, dtype, d.compute.unwrap_or(dtype), d, &views)?,
        Some(_) => None,
    };
    if tc.is_none() && d.compute.is_some() {
        return super::narrowed_backward(desc);
    }
    let kernels = Kernels {
        op,
        program: match &tc {
            Some(p) => p.clone(),
            None => attention_program(device, dtype, d.d)?,
        },
        geom: d.geom(op, views)?,
        d,
        dtype,
    };
    let delta = Tensor::alloc(&[d.b, d.h, d.tq], acc_dtype(dtype), device)?;
    let key_grad = || d.t_major(d.tk, d.hkv, dtype, device);
    let rest = [&q, &k, &v, &grad, &lse, &delta];
    // dq (and delta) through its own kernel.
    let dq_kernel = |name: &str, block: (usize, usize)| -> Result<Tensor> {
        let dq = d.t_major(d.tq, d.h, dtype, device)?;
        let bufs = [&dq, &delta, &q, &k, &v, &grad, &out, &lse];
        kernels.run(name, (&bufs, &[]), 3, d.b * d.h, d.tq, block)?;
        Ok(dq)
    };
    // Tensor cores or register-blocked: dq (and delta), then dk and dv in one kernel (five
    // products per visible pair: two scores, the probability's and the gradient's updates, dq's).
    let paired = match tc {
        Some(_) => Some(("attention_bwd_dq_tc", "attention_bwd_dkdv_tc", TC_BLOCK)),
        None if blocked_fits(device, dtype, d.d) => Some((
            "attention_bwd_dq_blocked",
            "attention_bwd_dkdv",
            (BLOCK_ROWS, BLOCK_GROUP),
        )),
        None => None,
    };
    if let Some((dq_name, dkdv_name, block)) = paired {
        let (dk, dv) = (key_grad()?, key_grad()?);
        let mut bufs = vec![&dk, &dv];
        bufs.extend(rest);
        if tc.is_none() && scores_fit(d, dtype) {
            // delta, then dk, dv and the scores' gradients ds, then dq = ds k as one batched
            // GEMM: four products per visible pair in the kernel (two scores, two updates) and
            // one dense product, where dq's own kernel recomputes both scores.
            let ds = Tensor::alloc(&[d.b, d.h, d.tq, d.tk], dtype, device)?;
            kernels.run(
                "attention_bwd_delta",
                (&[&delta, &grad, &out], &[]),
                0,
                d.b * d.h,
                d.tq,
                block,
            )?;
            bufs.push(&ds);
            kernels.run(dkdv_name, (&bufs, &[1]), 4, d.b * d.hkv, d.tk, block)?;
            let rep = d.h / d.hkv;
            let ds = ds.reshape(&[d.b, d.hkv, rep, d.tq, d.tk])?;
            // Causal: a query's row of ds is zero past its last visible key (tk - tq further on).
            let lower = d.causal.then_some(d.tk as isize - d.tq as isize);
            let opts = crate::matmul::MatmulOptions {
                lower,
                ..Default::default()
            };
            let dq = ds.matmul_with(&k.unsqueeze(2)?, opts)?;
            return Ok((dq.reshape(&[d.b, d.h, d.tq, d.d])?, dk, dv));
        }
        let dq = dq_kernel(dq_name, block)?;
        let flags: &[u32] = match tc {
            Some(_) => &[],
            None => {
                // attention_bwd_dkdv's ds and want_ds: none wanted (delta stands in).
                bufs.push(&delta);
                &[0]
            }
        };
        kernels.run(dkdv_name, (&bufs, flags), 4, d.b * d.hkv, d.tk, block)?;
        return Ok((dq, dk, dv));
    }
    let dq = dq_kernel("attention_bwd_dq", (BQ, BQ))?;
    // dk needs three products per visible pair (score, its gradient, the update), dv two.
    let one = |name: &str, products: u64| -> Result<Tensor> {
        let t = key_grad()?;
        let mut bufs = vec![&t];
        bufs.extend(rest);
        kernels.run(name, (&bufs, &[]), products, d.b * d.hkv, d.tk, (BQ, BQ))?;
        Ok(t)
    };
    let dk = one("attention_bwd_dk", 3)?;
    let dv = one("attention_bwd_dv", 2)?;
    Ok((dq, dk, dv))
}
