//! Register-resident row kernels (kernels/common.cl `ROW_*`): the plan shared by softmax, layer/rms norm and cross-entropy.
use crate::base::axis::pow2_floor;
use crate::base::launch::launch_groups;
use crate::base::layout::{is_contiguous, KernelLayout};
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::{program, Kernel, Source};

/// Work-items per work-group of the row kernels.
const GROUP: usize = 256;
/// Values per work-item the plan aims for; short rows get fewer, long rows up to [`MAX_VPT`].
const TARGET_VPT: usize = 16;
/// Most values one work-item holds in registers.
const MAX_VPT: usize = 32;
/// Longest row the row kernels take (where the device runs work-groups of [`GROUP`]).
pub(crate) const MAX_ROW: usize = GROUP * MAX_VPT;

/// How a row kernel spreads rows of `n` elements over work-items: a team of `team` work-items
/// per row (`group / team` rows per work-group), each holding `nv` units of `v` consecutive
/// elements (`-DROW_V=v -DROW_NV=nv`), so VPT = v * nv values in registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowPlan {
    pub v: usize,
    pub nv: usize,
    pub team: usize,
    pub group: usize,
}

impl RowPlan {
    /// The plan for rows of `n` elements on `device`; `aligned` when every row starts at a
    /// multiple of 4 elements (then rows with n a multiple of 4 use 4-wide loads). None when
    /// n is 0 or longer than one work-group holds.
    ///
    /// Teams are powers of two, at most the work-group and, where the row has that many units,
    /// at least 128 bytes of f32 wide (coalesced loads); VPT is the next power of two (1 to 32)
    /// that fits the row in its team, aiming at [`TARGET_VPT`].
    pub fn new(device: &Device, n: usize, aligned: bool) -> Option<RowPlan> {
        RowPlan::with_group(
            GROUP.min(pow2_floor(device.info().max_work_group_size)),
            n,
            aligned,
        )
    }

    /// [`RowPlan::new`] for work-groups of at most `group` (a power of two) work-items.
    fn with_group(group: usize, n: usize, aligned: bool) -> Option<RowPlan> {
        let v = if aligned && n.is_multiple_of(4) { 4 } else { 1 };
        let units = n / v;
        if n == 0 || units > group * (MAX_VPT / v) {
            return None;
        }
        let widest = (32 / v).min(units.next_power_of_two()).min(group);
        let team = units
            .div_ceil(TARGET_VPT / v)
            .next_power_of_two()
            .clamp(widest, group);
        let nv = units.div_ceil(team).next_power_of_two();
        Some(RowPlan { v, nv, team, group })
    }

    /// Build options: the dtype's and the plan's.
    pub fn options(&self, dtype: DType) -> String {
        format!(
            "{} -DROW_V={} -DROW_NV={}",
            dtype.build_option(),
            self.v,
            self.nv
        )
    }

    /// The plan for rows of `n` and its kernel `name` from `source`, or None when no plan fits
    /// or the device cannot run the kernel with the plan's work-group (callers then take their
    /// general kernels).
    pub(crate) fn kernel(
        device: &Device,
        n: usize,
        aligned: bool,
        source: &Source,
        dtype: DType,
        name: &str,
    ) -> Result<Option<(RowPlan, Kernel)>> {
        RowPlan::kernel_with(device, n, aligned, source, (dtype, ""), name)
    }

    /// [`RowPlan::kernel`] with `extra` build options after the dtype's and the plan's.
    pub(crate) fn kernel_with(
        device: &Device,
        n: usize,
        aligned: bool,
        source: &Source,
        (dtype, extra): (DType, &str),
        name: &str,
    ) -> Result<Option<(RowPlan, Kernel)>> {
        let Some(plan) = RowPlan::new(device, n, aligned) else {
            return Ok(None);
        };
        let options = plan.options(dtype) + extra;
        let k = Kernel::new(&program(device, source, &options)?, name)?;
        Ok((k.max_work_group_size() >= plan.group).then_some((plan, k)))
    }

    /// Sets the kernel arguments `n, rows, team` (u32, in that order).
    pub(crate) fn args(&self, k: &mut Kernel, n: u32, rows: u32) -> Result<()> {
        k.arg(&n)?.arg(&rows)?.arg(&(self.team as u32))?;
        Ok(())
    }

    /// Launches `k` (arguments set) over `rows` rows.
    pub(crate) fn launch(&self, op: &str, k: &mut Kernel, rows: usize) -> Result<()> {
        launch_groups(op, k, rows.div_ceil(self.group / self.team), self.group)
    }
}

/// Row starts of operands over one `shape` (strides, element offset; at most three) whose rows
/// are the dims in `mask`: the kernel layout of the kept dims (operand k at component k of
/// `layout_offsets`) and whether every row of every operand starts at a multiple of 4 elements.
/// None when the rows of some operand are not contiguous (callers take their general kernels).
pub(crate) fn row_starts(
    op: &str,
    shape: &[usize],
    mask: &[bool],
    operands: &[(&[usize], usize)],
) -> Result<Option<(KernelLayout, bool)>> {
    let pick = |v: &[usize], red: bool| -> Vec<usize> {
        v.iter()
            .zip(mask)
            .filter(|&(_, &m)| m == red)
            .map(|(&x, _)| x)
            .collect()
    };
    let (kept, red) = (pick(shape, false), pick(shape, true));
    let mut kept_strides = Vec::with_capacity(operands.len());
    let mut aligned = true;
    for &(strides, offset) in operands {
        if !is_contiguous(&red, &pick(strides, true)) {
            return Ok(None);
        }
        let ks = pick(strides, false);
        aligned &= starts_aligned(offset, &kept, &ks);
        kept_strides.push((ks, offset));
    }
    let ops: Vec<(&[usize], usize)> = kept_strides.iter().map(|(s, o)| (&s[..], *o)).collect();
    Ok(Some((KernelLayout::new(op, &kept, &ops)?, aligned)))
}

/// Whether every element offset `offset + sum(i_d * strides[d])` of `shape` is a multiple of 4
/// (dims of extent 1 do not move).
pub(crate) fn starts_aligned(offset: usize, shape: &[usize], strides: &[usize]) -> bool {
    offset.is_multiple_of(4)
        && shape
            .iter()
            .zip(strides)
            .all(|(&n, &s)| n <= 1 || s.is_multiple_of(4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_rows_up_to_the_limit() {
        let plan = |n, aligned| RowPlan::with_group(GROUP, n, aligned);
        let p = |v, nv, team| {
            Some(RowPlan {
                v,
                nv,
                team,
                group: GROUP,
            })
        };
        assert_eq!(plan(0, true), None);
        assert_eq!(plan(1, true), p(1, 1, 1));
        assert_eq!(plan(3, false), p(1, 1, 4));
        assert_eq!(plan(255, false), p(1, 8, 32));
        assert_eq!(plan(256, true), p(4, 4, 16));
        assert_eq!(plan(256, false), p(1, 8, 32));
        assert_eq!(plan(1000, true), p(4, 4, 64));
        assert_eq!(plan(4096, true), p(4, 4, 256));
        assert_eq!(plan(4097, true), p(1, 32, 256));
        assert_eq!(plan(8192, true), p(4, 8, 256));
        assert_eq!(plan(8192, false), p(1, 32, 256));
        assert_eq!(plan(MAX_ROW, false).map(|p| p.nv), Some(MAX_VPT));
        assert_eq!(plan(MAX_ROW + 1, false), None);
        assert_eq!(RowPlan::with_group(64, 2049, false), None);
        assert_eq!(RowPlan::with_group(1, 1, false).map(|p| p.team), Some(1));
        for group in [1, 64, GROUP] {
            for n in 1..=group * MAX_VPT {
                for aligned in [false, true] {
                    let q = RowPlan::with_group(group, n, aligned).unwrap();
                    assert!(
                        q.team * q.nv * q.v >= n && q.v * q.nv <= MAX_VPT,
                        "{n}: {q:?}"
                    );
                    assert!(
                        q.team <= q.group && q.group.is_multiple_of(q.team),
                        "{n}: {q:?}"
                    );
                    assert!(
                        q.nv.is_power_of_two() && q.team.is_power_of_two(),
                        "{n}: {q:?}"
                    );
                    assert_eq!(q.v == 4, aligned && n % 4 == 0, "{n}: {q:?}");
                }
            }
        }
    }

    #[test]
    fn alignment_of_row_starts() {
        assert!(starts_aligned(8, &[3, 1], &[4, 7]));
        assert!(!starts_aligned(2, &[3], &[4]));
        assert!(!starts_aligned(0, &[3], &[6]));
        assert!(starts_aligned(0, &[1], &[6]));
    }

    #[test]
    fn row_starts_of_several_operands() {
        // [2, 3, 4] rows over the last dim: a contiguous operand with others at offsets 8, 4
        // and 1, one with rows 5 apart (blocks 20 apart), and one whose rows are strided.
        let (shape, mask) = ([2, 3, 4], [false, false, true]);
        let dense: (&[usize], usize) = (&[12, 4, 1], 0);
        let starts = |ops: &[(&[usize], usize)]| row_starts("t", &shape, &mask, ops).unwrap();
        let (l, aligned) = starts(&[dense, (&[20, 5, 1], 8)]).unwrap();
        assert!(!aligned);
        assert_eq!((l.ndim, l.offset), (2, [0, 8, 0]));
        assert_eq!(
            (l.shape[..2].to_vec(), l.stride[1][..2].to_vec()),
            (vec![2, 3], vec![20, 5])
        );
        assert!(starts(&[dense, (&[12, 4, 1], 4)]).unwrap().1);
        assert!(!starts(&[dense, (&[12, 4, 1], 1)]).unwrap().1);
        assert!(starts(&[dense, (&[1, 2, 6], 0)]).is_none());
        // Rows of one element are contiguous whatever their stride.
        let one = row_starts("t", &[3, 1], &[false, true], &[(&[1, 3], 0)]).unwrap();
        assert!(one.is_some_and(|(_, a)| !a));
    }
}
