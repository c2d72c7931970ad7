//! The OpenCL reductions (reduce.cl): a work-item per output (`*_col`), or work-groups per output (`*_wg`) with a merge kernel (`*_merge`) when each output is split over several.
use super::{Reduce, ReduceOp};
use crate::base::acc::arg_acc;
use crate::base::axis::{pow2_floor, AxisSplit};
use crate::base::checks::u32_arg;
use crate::base::launch::program_for;
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, DeviceKind, Error, Result};
use netcl_kernels::sources::REDUCE;
use netcl_kernels::Kernel;

/// How a device reduction is laid out over work-items.
enum Plan {
    /// One work-item per output.
    Col,
    /// Work-groups of `group` items, `nsplit` per output over chunks of `chunk` reduced elements.
    Groups {
        group: usize,
        nsplit: usize,
        chunk: usize,
    },
}

fn plan(device: &Device, nout: usize, nred: usize, red_contiguous: bool) -> Plan {
    // Short reductions, or many outputs whose reduced elements are far apart (adjacent work-items
    // then read adjacent kept elements): one work-item per output. A CPU runs a work-group's
    // items as a loop, so there a work-item per output reads memory in order (adjacent outputs,
    // or its own contiguous run) from a few dozen outputs on (docs/performance.md, CPU).
    let cpu = device.kind() == DeviceKind::Cpu;
    let many = if cpu { 64 } else { 4096 };
    if nred <= 16 || (nout >= many && (cpu || !red_contiguous)) || (nout >= 65536 && nred <= 64) {
        return Plan::Col;
    }
    let group = 256.min(pow2_floor(device.info().max_work_group_size));
    // Few outputs over many elements: split each output over several work-groups (two kernels).
    let target_groups = 1024;
    let mut nsplit = 1;
    if nout < target_groups / 2 {
        nsplit = (target_groups / nout)
            .min(nred / (group * 16))
            .clamp(1, 1024);
    }
    let chunk = nred.div_ceil(nsplit);
    let nsplit = nred.div_ceil(chunk.max(1)).max(1);
    Plan::Groups {
        group,
        nsplit,
        chunk,
    }
}

/// On a CPU device, the trailing reduced axes of a float sum over few outputs whose elements
/// also lie in other reduced axes, where those trailing axes are dense in memory and at least 64
/// elements long: summed first (a work-item per run reads it in order) instead of work-groups
/// walking every element's position.
fn inner_first(device: &Device, desc: &Reduce, nout: usize) -> Option<Vec<usize>> {
    let (x, mask) = (&desc.x, &desc.mask);
    if device.kind() != DeviceKind::Cpu
        || desc.op != ReduceOp::Sum
        || !x.dtype.is_float()
        || nout >= 4096
    {
        return None;
    }
    let first = (0..mask.len()).rev().take_while(|&d| mask[d]).last()?;
    let inner: Vec<usize> = (first..mask.len()).collect();
    let dense = inner.iter().rev().try_fold(1, |want, &d| {
        (x.strides[d] == want || x.shape[d] == 1).then(|| want * x.shape[d])
    })?;
    let more = mask[..first].iter().any(|&m| m);
    (more && dense >= 64).then_some(inner)
}

/// The reduction on an OpenCL device, laid out by [`plan`].
pub(super) fn reduce(desc: &Reduce, device: &Device) -> Result<Tensor> {
    let Reduce {
        x,
        op,
        mask,
        out_shape,
    } = desc;
    let (op, name) = (*op, op.name());
    let split = AxisSplit::new(x, mask);
    let (nout, nred) = (split.nout(), split.nred());
    let out_dtype = op.out_dtype(x.dtype);
    if let Some(inner) = (nout > 0)
        .then(|| inner_first(device, desc, nout))
        .flatten()
    {
        // A sum over outer axes and a long contiguous inner run (a convolution's bias gradient
        // over N, H and W): the runs first, a work-item each, then the few partial sums.
        let outer: Vec<usize> = (0..inner[0]).filter(|&d| mask[d]).collect();
        return x.sum(&inner, true)?.sum(&outer, true)?.reshape(out_shape);
    }
    let (lk, lr) = split.layouts(name, x.offset)?;
    let nred32 = u32_arg(name, "reduced extent", nred)?;
    let nout32 = u32_arg(name, "output count", nout)?;
    let out = Tensor::alloc(out_shape, out_dtype, device)?;
    if nout == 0 {
        return Ok(out);
    }
    let program = program_for(device, &REDUCE, x.dtype)?;
    let red_contiguous = lr.ndim == 0 || lr.stride[0][lr.ndim as usize - 1] == 1;
    // Every input element read and combined once, every output written once.
    let bytes = nout * nred * x.dtype.size() + nout * out_dtype.size();
    let work = (bytes as u64, (nout * nred) as u64);
    match plan(device, nout, nred, red_contiguous) {
        Plan::Col => {
            let mut k = Kernel::new(&program, &format!("{name}_col"))?;
            k.arg_mem(out.mem()?)?
                .arg_mem(x.mem()?)?
                .arg(&lk)?
                .arg(&lr)?
                .arg(&nred32)?;
            arg_acc(&mut k, x.dtype, op.param())?;
            k.arg(&nout32)?.declare(work.0, work.1);
            let group = 256.min(pow2_floor(k.max_work_group_size()));
            k.launch(&[nout], &[group])
        }
        Plan::Groups {
            group,
            nsplit,
            chunk,
        } => {
            let groups = nout
                .checked_mul(nsplit)
                .filter(|&g| g.checked_mul(group).is_some_and(|n| n <= u32::MAX as usize))
                .ok_or_else(|| {
                    Error::shape(name, format!("{nout} outputs need too many work-groups"))
                })?;
            let mut k = Kernel::new(&program, &format!("{name}_wg"))?;
            let group = group.min(pow2_floor(k.max_work_group_size()));
            // Partial states are at most 4 accumulators: 32 bytes each is enough.
            let part = if nsplit > 1 {
                Some(Tensor::alloc(&[groups * 8], DType::U32, device)?)
            } else {
                None
            };
            let mut merge = match &part {
                Some(_) => Some(Kernel::new(&program, &format!("{name}_merge"))?),
                None => None,
            };
            let mgroup = merge
                .as_ref()
                .map_or(group, |m| group.min(pow2_floor(m.max_work_group_size())));
            k.arg_mem(out.mem()?)?
                .arg_mem(part.as_ref().unwrap_or(x).mem()?)?
                .arg_mem(x.mem()?)?
                .arg(&lk)?
                .arg(&lr)?
                .arg(&nred32)?
                .arg(&u32_arg(name, "chunk", chunk)?)?
                .arg(&(nsplit as u32))?;
            arg_acc(&mut k, x.dtype, op.param())?;
            if let (Some(m), Some(p)) = (merge.as_mut(), part.as_ref()) {
                m.arg_mem(out.mem()?)?
                    .arg_mem(p.mem()?)?
                    .arg(&(nsplit as u32))?
                    .arg(&nred32)?;
                arg_acc(m, x.dtype, op.param())?;
            }
            k.declare(work.0, work.1)
                .launch(&[groups * group], &[group])?;
            match merge.as_mut() {
                Some(m) => m.launch(&[nout * mgroup], &[mgroup]),
                None => Ok(()),
            }
        }
    }?;
    Ok(out)
}
