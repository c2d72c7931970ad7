//! Stable sort of 1-D i32 tensors (sorted keys and the permutation): a bitonic network on (key, position) pairs on OpenCL devices (kernels/sort.cl), a stable sort on the host.
use crate::base::axis::pow2_floor;
use crate::base::checks::{need_i32, u32_arg};
use crate::base::launch::{launch_1d, launch_groups, program_for};
use crate::base::layout::check_reach;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Error, Result};
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

/// The stable order of `v`: (sorted keys, positions).
fn host_sort(v: &[i32]) -> (Vec<i32>, Vec<i32>) {
    let mut perm: Vec<i32> = (0..v.len() as i32).collect();
    perm.sort_by_key(|&i| v[i as usize]);
    (perm.iter().map(|&i| v[i as usize]).collect(), perm)
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

/// Device sort: keys and positions in two `p`-long scratch tensors, of which the first `n`
/// entries are the result (the padding sorts last).
fn device_sort(x: &Tensor, n: usize) -> Result<(Tensor, Tensor)> {
    let op = "sort_stable";
    let dev = &x.device;
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

impl Tensor {
    /// This 1-D i32 tensor's keys in ascending order and the i32 permutation that sorts them
    /// (`sorted[r] == self[perm[r]]`), equal keys in ascending position: a stable sort, as
    /// `torch.sort(x, stable=True)`. Any stride; the results are contiguous. Deterministic: the
    /// result is the one stable order on every device and run.
    ///
    /// OpenCL: a bitonic network on (key, position) pairs padded to `p`, the next power of two
    /// at least one chunk of `c` pairs (`c = 1024` where the device runs work-groups of 256).
    /// One kernel sorts each chunk in local memory; each further merge stage `k = 2c, 4c, .., p`
    /// runs its strides of a chunk or more as one global pass each and the smaller strides in
    /// one local-memory kernel. Launches: `1 + s(s+3)/2` for `s = log2(p / c)`: 1 up to n = 1024,
    /// 3 at 2048, 6 at 4096, 10 at 8192, 15 at 16384, 28 at 65536 (none for n = 0). Work:
    /// `O(p log^2 p)` compare-exchanges, of which the global passes move `16 p` bytes each.
    pub fn sort_stable(&self) -> Result<(Tensor, Tensor)> {
        let op = "sort_stable";
        let _span = netcl_profiling::span(op);
        need_i32(op, self)?;
        if self.ndim() != 1 {
            return Err(Error::shape(
                op,
                format!("keys must be 1-D, got shape {:?}", self.shape),
            ));
        }
        let n = self.shape[0];
        if n > i32::MAX as usize {
            return Err(Error::shape(
                op,
                format!("{n} keys exceed the i32 positions of the permutation"),
            ));
        }
        if self.device.is_host() {
            let (keys, perm) = host_sort(&self.to_vec::<i32>()?);
            let h = Device::host();
            return Ok((
                Tensor::from_vec(keys, &[n], &h)?,
                Tensor::from_vec(perm, &[n], &h)?,
            ));
        }
        device_sort(self, n)
    }

    /// The permutation of [`Tensor::sort_stable`] alone: positions of this 1-D i32 tensor's keys
    /// in ascending order, ties in ascending position (`torch.argsort(x, stable=True)`).
    pub fn argsort_stable(&self) -> Result<Tensor> {
        Ok(self.sort_stable()?.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_sort_is_stable() {
        let (k, p) = host_sort(&[3, -1, 3, 0, -1, i32::MAX, i32::MIN]);
        assert_eq!(k, vec![i32::MIN, -1, -1, 0, 3, 3, i32::MAX]);
        assert_eq!(p, vec![6, 1, 4, 3, 0, 2, 5]);
    }
}
