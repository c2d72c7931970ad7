//! The launcher of kernels/decode_block.cl: a Llama block's decode step as one persistent kernel, its stages' sizes from decode.cl's launches, and when it runs.
use super::block::DecodeBlockOp;
use super::opencl::{
    attention_sizes, gemv_launch, kernel_weights, qkv_parts, GemvArgs, GemvLaunch, GemvShape,
    GEMV_GROUP, GEMV_MAXB,
};
use crate::base::acc::arg_acc;
use crate::base::checks::u32_arg;
use crate::base::device_errors::record_arg;
use crate::base::host::dense;
use crate::base::launch::program_for;
use crate::base::tensor::Tensor;
use netcl_core_devices::{Device, Result};
use netcl_kernels::sources::DECODE_BLOCK;
use netcl_kernels::Kernel;

/// `BlockArgs` of decode.cl.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct BlockArgs {
    st: [GemvArgs; 4],
    att: [u32; 8],
    tiles: [u32; 5],
    per: [u32; 5],
    count: [u32; 5],
    groups: [u32; 5],
    off: [u32; 4],
    nsplit: u32,
    off_part: u32,
}

/// Keys of a row and head per attention part in decode_block at the longest cache (the parts
/// split the keys present at each step evenly), and the most parts.
const KEYS_PER_PART: usize = 64;
const MAX_PARTS: usize = 16;

/// ACC words of one part's record in decode_block (decode.cl's ATT_PART_STRIDE): its max, sum
/// and hd values, in whole 128-byte lines.
fn part_stride(hd: usize) -> usize {
    (hd + 2).next_multiple_of(32)
}

/// Elements each part of decode_block's scratch buffer is rounded up to, so that no two parts
/// share a cache line (a stage's reads of one part never fetch a line another stage writes).
const SCRATCH_ALIGN: usize = 64;

/// The largest block (weight bytes) decode_block runs as one persistent kernel: past it the five
/// kernels' full grids read the weights faster than the persistent tiles (docs/performance.md).
const PERSISTENT_MAX_BYTES: usize = 32 << 20;

/// Whether `desc` runs as one persistent kernel on `device` (else as its five kernels): on by
/// `Config::decode_block` for one batch group (at most `GEMV_MAXB` rows) and blocks of at most
/// `PERSISTENT_MAX_BYTES`, except on PoCL releases other than 3.x, whose compilers abort on the
/// kernel (PoCL 5.0: an assertion in its work-group compiler).
fn persistent_block(desc: &DecodeBlockOp, device: &Device) -> bool {
    let info = device.info();
    let pocl = info.platform.contains("Portable Computing Language");
    let b = &desc.block;
    let weights = [&b.wq, &b.wk, &b.wv, &b.wo, &b.gate, &b.up, &b.down];
    let bytes: usize = weights.iter().map(|w| w.numel() * w.dtype.size()).sum();
    let small = desc.x.shape[0] <= GEMV_MAXB && bytes <= PERSISTENT_MAX_BYTES;
    crate::Config::get().decode_block
        && small
        && (!pocl || info.platform_version.contains("PoCL 3."))
}

pub(super) fn block(desc: &DecodeBlockOp, device: &Device) -> Result<Tensor> {
    if !persistent_block(desc, device) {
        return super::reference::block(desc);
    }
    let op = "decode_block";
    let blk = &desc.block;
    let x = dense(&desc.x)?;
    let (b, d) = (x.shape[0], x.shape[1]);
    let (qd, kvd) = (blk.wq.shape[0], blk.wk.shape[0]);
    let f = blk.gate.shape[0];
    let (wqkv, qkv_off) = kernel_weights(op, d, &[&blk.wq, &blk.wk, &blk.wv])?;
    let (wo, o_off) = kernel_weights(op, qd, &[&blk.wo])?;
    let (w13, ffn_off) = kernel_weights(op, d, &[&blk.gate, &blk.up])?;
    let (w2, down_off) = kernel_weights(op, f, &[&blk.down])?;
    let kv = &blk.kv;
    let (sizes, pos, pads, table, theta) = qkv_parts(kv)?;
    let bias = |t: &Option<Tensor>| t.as_ref().map(dense).transpose();
    let biases = [
        bias(&blk.qkv_bias)?,
        bias(&blk.wo_bias)?,
        bias(&blk.gate_up_bias)?,
        bias(&blk.down_bias)?,
    ];
    let shape = |i: usize, mode, has_norm, has_res, w_off| GemvShape {
        mode,
        has_norm,
        has_res,
        has_bias: biases[i].is_some(),
        w_off,
        qkv: (mode == 2).then_some(sizes),
    };
    let stages = [
        gemv_launch(
            op,
            (b, d),
            [qd, kvd, kvd],
            shape(0, 2, true, false, qkv_off),
        )?,
        gemv_launch(op, (b, qd), [d, 0, 0], shape(1, 0, false, true, o_off))?,
        gemv_launch(op, (b, d), [f, f, 0], shape(2, 1, true, false, ffn_off))?,
        gemv_launch(op, (b, f), [d, 0, 0], shape(3, 0, false, true, down_off))?,
    ];
    let tiles_of = |l: &GemvLaunch| l.groups * l.batch_groups;
    let (smax, hd) = (kv.k_cache.shape[2], kv.k_cache.shape[3]);
    let nsplit = smax.div_ceil(KEYS_PER_PART).clamp(1, MAX_PARTS);
    let count = [
        tiles_of(&stages[0]),
        b * blk.heads * nsplit,
        tiles_of(&stages[1]),
        tiles_of(&stages[2]),
        tiles_of(&stages[3]),
    ];
    let groups = [
        stages[0].groups,
        1,
        stages[1].groups,
        stages[2].groups,
        stages[3].groups,
    ];
    // As many work-groups as stay resident (a few per compute unit); a GEMV stage's tiles in
    // runs that give each about one ticket (the attention's parts one a ticket).
    let resident = 4 * device.info().compute_units.max(1) as usize;
    let per = std::array::from_fn(|stage| match stage {
        1 => 1,
        _ => count[stage].div_ceil(resident).max(1),
    });
    let tickets: [usize; 5] = std::array::from_fn(|stage| count[stage].div_ceil(per[stage]));
    let part = |n: usize| (b * n).next_multiple_of(SCRATCH_ALIGN);
    let off = [0, part(qd), 2 * part(qd), 2 * part(qd) + part(d)];
    let scratch = Tensor::alloc(&[off[3] + part(f)], x.dtype, device)?;
    let args = BlockArgs {
        st: stages.each_ref().map(|l| l.args),
        att: attention_sizes(&kv.k_cache.shape, blk.heads, blk.window, pads.is_some())?,
        tiles: tickets.map(|t| t as u32),
        per: per.map(|p| p as u32),
        count: count.map(|c| c as u32),
        groups: groups.map(|g| g as u32),
        off: off.map(|o| o as u32),
        nsplit: nsplit as u32,
        off_part: u32_arg(op, "heads", (b * blk.heads).next_multiple_of(32))?,
    };
    let work = Tensor::alloc(
        &[args.off_part as usize + b * blk.heads * nsplit * part_stride(hd)],
        crate::acc_dtype(x.dtype),
        device,
    )?;
    u32_arg(op, "attention records", work.numel())?;
    u32_arg(op, "tiles", count.iter().sum::<usize>())?;
    u32_arg(op, "scratch elements", scratch.numel())?;
    let out = Tensor::alloc(&[b, d], x.dtype, device)?;
    let norms = [
        dense(&blk.attention_norm.weight)?,
        dense(&blk.ffn_norm.weight)?,
    ];
    let program = program_for(device, &DECODE_BLOCK, x.dtype)?;
    let mut kern = Kernel::new(&program, "decode_block")?;
    let any = |t: Option<&Tensor>| t.unwrap_or(&x).mem();
    kern.arg_mem(out.mem()?)?
        .arg_mem(scratch.mem()?)?
        .arg_mem(work.mem()?)?
        .arg_mem(x.mem()?)?
        .arg_mem(norms[0].mem()?)?
        .arg_mem(wqkv[0].mem()?)?
        .arg_mem(wqkv[1].mem()?)?
        .arg_mem(wqkv[2].mem()?)?
        .arg_mem(any(biases[0].as_ref())?)?
        .arg_mem(wo[0].mem()?)?
        .arg_mem(any(biases[1].as_ref())?)?
        .arg_mem(norms[1].mem()?)?
        .arg_mem(w13[0].mem()?)?
        .arg_mem(w13[1].mem()?)?
        .arg_mem(any(biases[2].as_ref())?)?
        .arg_mem(w2[0].mem()?)?
        .arg_mem(any(biases[3].as_ref())?)?
        .arg_mem(kv.k_cache.mem()?)?
        .arg_mem(kv.v_cache.mem()?)?
        .arg_mem(any(pads.as_ref())?)?
        .arg_mem(any(table.as_ref())?)?
        .arg_mem(pos.mem()?)?
        .arg_mem(record_arg(device)?)?
        .arg(&args)?;
    for v in [
        blk.attention_norm.eps,
        blk.ffn_norm.eps,
        theta,
        1.0 / (hd as f64).sqrt(),
    ] {
        arg_acc(&mut kern, x.dtype, v)?;
    }
    let es = x.dtype.size();
    let weights = (qd + 2 * kvd) * d + 2 * qd * d + 3 * f * d;
    let cache = 2 * b * kv.k_cache.shape[1] * kv.k_cache.shape[2] * kv.k_cache.shape[3];
    kern.declare(
        ((weights + cache + 4 * b * d) * es) as u64,
        (2 * b * weights) as u64,
    );
    // Oclgrind's race check does not follow the counters' ordering between work-groups: there
    // one work-group runs every ticket.
    let checker = device.info().platform.contains("Oclgrind");
    let launched = match checker {
        true => 1,
        false => resident.min(tickets.iter().sum::<usize>()).max(1),
    };
    kern.launch(&[launched * GEMV_GROUP], &[GEMV_GROUP])?;
    Ok(out)
}
