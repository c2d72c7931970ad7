//! The OpenCL sort: a bitonic network on (key, position) pairs (kernels/sort.cl), chunks sorted in local memory and merged by global passes.
use super::SortStable;
use crate::base::axis::pow2_floor;
use crate::base::checks::u32_arg;
use crate::base::launch::{launch_1d, launch_groups, program_for};
use crate::base::layout::check_reach;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::sources::SORT;
use netcl_kernels::Kernel;

/// Work-items per work-group of the chunk kernel (fewer where the device runs smaller groups).
const GROUP: usize = 256;
/// Pairs one work-item of the chunk kernel holds in local memory: chunks of `4 * group` pairs
/// (1024 with groups of 256, 8 KiB of local memory).
const PAIRS_PER_ITEM: usize = 4;
/// Bytes of local memory per pair (key and position).
const PAIR_BYTES: usize = 8;

/// The network's length for `n` keys: the next power of two, at least one chunk.
fn padded_len(n: usize, chunk: usize) -> usize {
    n.next_power_of_two().max(chunk)
}

/// The chunk kernel of `device` and its work-group: the largest power of two up to [`GROUP`]
/// that the kernel runs with and whose chunk fits the device's local memory.
fn chunk_kernel(device: &Device) -> Result<(Kernel, usize)> {
    let k = Kernel::new(&program_for(device, &SORT, DType::I32)?, "sort_chunks")?;
    let local = device.info().local_mem_bytes as usize;
    let mut group = GROUP.min(pow2_floor(k.max_work_group_size()));
    while group > 1 && PAIRS_PER_ITEM * group * PAIR_BYTES > local {
        group /= 2;
    }
    Ok((k, group))
}

/// The sort on `dev`: keys and positions in two `p`-long scratch tensors, of which the first `n`
/// entries are the result (the padding sorts last).
pub(super) fn sort_stable(desc: &SortStable, dev: &Device) -> Result<(Tensor, Tensor)> {
    let op = "sort_stable";
    let x = &desc.x;
    let n = x.shape[0];
    let (keys, pos) = if n == 0 {
        (
            Tensor::alloc(&[0], DType::I32, dev)?,
            Tensor::alloc(&[0], DType::I32, dev)?,
        )
    } else {
        check_reach(op, &x.shape, &x.strides, x.offset)?;
        let (mut chunks, group) = chunk_kernel(dev)?;
        let chunk = PAIRS_PER_ITEM * group;
        let p = padded_len(n, chunk);
        // Scratch keys (p) and positions (p).
        let keys = Tensor::alloc(&[p], DType::I32, dev)?;
        let pos = Tensor::alloc(&[p], DType::I32, dev)?;
        let (xo, xs) = (
            u32_arg(op, "offset", x.offset)?,
            u32_arg(op, "stride", x.strides[0])?,
        );
        let n32 = u32_arg(op, "length", n)?;
        // Reads and writes of keys and positions (stage 0 reads x once instead).
        let bytes = (2 * PAIR_BYTES * p) as u64;
        let mut run_chunks = |stage: usize| -> Result<()> {
            chunks
                .arg_mem(keys.mem()?)?
                .arg_mem(pos.mem()?)?
                .arg_mem(x.mem()?)?
                .arg(&xo)?
                .arg(&xs)?
                .arg(&n32)?
                .arg(&u32_arg(op, "stage", stage)?)?
                .arg_local(chunk * 4)?
                .arg_local(chunk * 4)?
                .declare(bytes, 0);
            launch_groups(op, &mut chunks, p / chunk, group)
        };
        run_chunks(0)?;
        let program = program_for(dev, &SORT, DType::I32)?;
        let mut k = 2 * chunk;
        while k <= p {
            let mut j = k / 2;
            while j >= chunk {
                let (k32, j32) = (u32_arg(op, "stage", k)?, u32_arg(op, "stride", j)?);
                launch_1d(&program, "sort_merge", p / 2, |m| {
                    m.arg_mem(keys.mem()?)?
                        .arg_mem(pos.mem()?)?
                        .arg(&k32)?
                        .arg(&j32)?
                        .declare(bytes, 0);
                    Ok(())
                })?;
                j /= 2;
            }
            run_chunks(k)?;
            k *= 2;
        }
        (keys, pos)
    };
    Ok((keys.narrow(0, 0, n)?, pos.narrow(0, 0, n)?))
}
