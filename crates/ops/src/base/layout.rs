//! Shapes and strides: contiguity, broadcasting, and the strided layout passed to kernels.
use crate::base::fastdiv::Div;
use netcl_core_devices::{Error, Result};

/// Most dims a kernel layout holds after merging (kernels/common.cl MAX_DIMS).
pub const MAX_DIMS: usize = 8;

/// Row-major strides (in elements) of a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1].max(1);
    }
    strides
}

pub fn numel(shape: &[usize]) -> usize {
    // Saturating: a count past usize fails where it is allocated, never wraps or panics.
    shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
}

/// The element count of `shape`, or an error naming `op` when it does not fit in memory.
pub fn checked_numel(op: &str, shape: &[usize], elem_size: usize) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|n| {
            n.checked_mul(elem_size)
                .is_some_and(|b| b <= isize::MAX as usize)
        })
        .ok_or_else(|| {
            Error::shape(
                op,
                format!("shape {shape:?} has more elements than memory can hold"),
            )
        })
}

/// True when `strides` walk `shape` row-major without gaps (size-1 dims may have any stride; empty tensors always are).
pub fn is_contiguous(shape: &[usize], strides: &[usize]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1;
    for d in (0..shape.len()).rev() {
        if shape[d] != 1 && strides[d] != expected {
            return false;
        }
        expected *= shape[d];
    }
    true
}

/// The elements of (`shape`, `strides`) from `offset` in row-major order as runs along the last
/// dim: (first position, length, step). A scalar is one run of one; an empty shape has none.
pub(crate) fn strided_runs<'a>(
    shape: &'a [usize],
    strides: &'a [usize],
    offset: usize,
) -> impl Iterator<Item = (usize, usize, usize)> + 'a {
    let (len, step, outer, outer_strides) = match (shape.split_last(), strides.split_last()) {
        (Some((&len, outer)), Some((&step, os))) => (len, step, outer, os),
        _ => (1, 0, shape, strides),
    };
    let any = numel(shape) > 0;
    strided_positions(outer, outer_strides, offset)
        .take_while(move |_| any)
        .map(move |at| (at, len, step))
}

/// Storage positions of the elements of (`shape`, `strides`) from `offset`, in row-major order.
pub(crate) fn strided_positions<'a>(
    shape: &'a [usize],
    strides: &'a [usize],
    offset: usize,
) -> impl Iterator<Item = usize> + 'a {
    let mut idx = vec![0usize; shape.len()];
    let mut pos = offset;
    (0..numel(shape)).map(move |_| {
        let here = pos;
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            pos += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            pos -= strides[d] * shape[d];
            idx[d] = 0;
        }
        here
    })
}

/// Error when an element of (`shape`, `strides`, `offset`) lies past the 32-bit kernel index.
pub(crate) fn check_reach(
    op: &str,
    shape: &[usize],
    strides: &[usize],
    offset: usize,
) -> Result<()> {
    let reach = shape
        .iter()
        .zip(strides)
        .try_fold(offset as u128, |acc, (&n, &s)| {
            (n > 0).then(|| acc + (n as u128 - 1) * s as u128)
        });
    if reach.is_some_and(|r| r > u32::MAX as u128) || offset > u32::MAX as usize {
        return Err(Error::shape(
            op,
            format!("{shape:?} reaches past the 32-bit kernel index"),
        ));
    }
    Ok(())
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let get = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (get(a, i), get(b, i)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            (x, y) => Err(Error::shape(
                op,
                format!("shapes {a:?} and {b:?} do not broadcast (dim {i}: {x} vs {y})"),
            )),
        })
        .collect()
}

/// Strides that view (`shape`, `strides`) as `target` (broadcast dims get stride 0).
pub fn broadcast_strides(
    op: &str,
    shape: &[usize],
    strides: &[usize],
    target: &[usize],
) -> Result<Vec<usize>> {
    if shape.len() > target.len() {
        return Err(Error::shape(
            op,
            format!("cannot broadcast {shape:?} to fewer dims {target:?}"),
        ));
    }
    let lead = target.len() - shape.len();
    (0..target.len())
        .map(|i| {
            if i < lead {
                return Ok(0);
            }
            match (shape[i - lead], target[i]) {
                (s, t) if s == t => Ok(strides[i - lead]),
                (1, _) => Ok(0),
                (s, t) => Err(Error::shape(
                    op,
                    format!("cannot broadcast {shape:?} to {target:?} (dim {i}: {s} vs {t})"),
                )),
            }
        })
        .collect()
}

/// The strided layout of up to three operands over one shape, as kernels/common.cl's `Layout`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelLayout {
    pub ndim: u32,
    pub shape: [u32; MAX_DIMS],
    pub stride: [[u32; MAX_DIMS]; 3],
    pub offset: [u32; 3],
    /// The extents as divisors.
    div: [Div; MAX_DIMS],
}

impl KernelLayout {
    /// Layout of `operands` (strides, element offset) over `shape`, with size-1 dims dropped and
    /// dims merged wherever every operand walks them as one.
    pub fn new(op: &str, shape: &[usize], operands: &[(&[usize], usize)]) -> Result<KernelLayout> {
        let dims = merged_dims(op, shape, operands)?;
        let offsets: Vec<usize> = operands.iter().map(|(_, off)| *off).collect();
        Ok(KernelLayout::from_dims(&dims, &offsets))
    }

    /// The layout of dims from [`merged_dims`] (extent, stride per operand) and the operands'
    /// element offsets.
    pub fn from_dims(dims: &[(u32, Vec<u32>)], offsets: &[usize]) -> KernelLayout {
        let mut l = KernelLayout {
            ndim: dims.len() as u32,
            shape: [1; MAX_DIMS],
            stride: [[0; MAX_DIMS]; 3],
            offset: [0; 3],
            div: [Div::new(1); MAX_DIMS],
        };
        for (i, (n, st)) in dims.iter().enumerate() {
            l.shape[i] = *n;
            l.div[i] = Div::new(*n);
            for (row, &s) in l.stride.iter_mut().zip(st.iter()) {
                row[i] = s;
            }
        }
        for (j, off) in offsets.iter().enumerate() {
            l.offset[j] = *off as u32;
        }
        l
    }
}

/// The dims of `shape` as kernels walk them for `operands` (strides, element offset): size-1
/// dims dropped, neighbours merged wherever every operand walks them as one; each entry is
/// (extent, stride per operand). Checks that every index fits the kernels' 32-bit arithmetic.
pub fn merged_dims(
    op: &str,
    shape: &[usize],
    operands: &[(&[usize], usize)],
) -> Result<Vec<(u32, Vec<u32>)>> {
    let mut dims: Vec<(usize, Vec<usize>)> = Vec::new();
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        let st: Vec<usize> = operands.iter().map(|(s, _)| s[d]).collect();
        if let Some(last) = dims.last_mut() {
            if last.1.iter().zip(&st).all(|(&l, &s)| l == s * shape[d]) {
                last.0 *= shape[d];
                last.1 = st;
                continue;
            }
        }
        dims.push((shape[d], st));
    }
    if dims.len() > MAX_DIMS {
        return Err(Error::shape(
            op,
            format!(
                "{shape:?} needs {} strided dims; kernels take {MAX_DIMS}",
                dims.len()
            ),
        ));
    }
    for (strides, off) in operands {
        check_reach(op, shape, strides, *off)?;
    }
    // Every extent and stride is at most the reach checked above.
    Ok(dims
        .into_iter()
        .map(|(n, st)| (n as u32, st.into_iter().map(|s| s as u32).collect()))
        .collect())
}

/// Whether runs of `w` consecutive elements lie side by side in every operand of `dims` (from
/// `merged_dims`; `offsets` per operand): the innermost dim has stride 1 everywhere and a
/// multiple of `w` elements, and every other stride and every offset is a multiple of `w`.
/// Kernels may then move `w` elements at a time from any element index that is a multiple of `w`.
pub fn runs_of(w: u32, dims: &[(u32, Vec<u32>)], offsets: &[usize]) -> bool {
    let Some(((inner, inner_strides), outer)) = dims.split_last() else {
        return false;
    };
    inner % w == 0
        && inner_strides.iter().all(|&s| s == 1)
        && outer.iter().all(|(_, st)| st.iter().all(|s| s % w == 0))
        && offsets.iter().all(|o| o % w as usize == 0)
}

/// `n` as a 32-bit kernel argument; an error naming `op` and `what` when it does not fit.
pub(crate) fn u32_arg(op: &str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n)
        .map_err(|_| Error::shape(op, format!("{what} {n} exceeds the 32-bit kernel index")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_contiguity() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert!(is_contiguous(&[2, 3, 4], &[12, 4, 1]));
        assert!(is_contiguous(&[2, 1, 4], &[4, 99, 1]));
        assert!(!is_contiguous(&[3, 2], &[1, 3]));
    }

    #[test]
    fn runs_cover_the_positions_in_order() {
        let views: [(&[usize], &[usize], usize); 6] = [
            (&[2, 3, 4], &[12, 4, 1], 0),
            (&[3, 2], &[1, 3], 5),
            (&[2, 1, 3], &[0, 9, 2], 1),
            (&[], &[], 7),
            (&[4, 0], &[1, 1], 0),
            (&[0, 4], &[4, 1], 0),
        ];
        for (shape, strides, offset) in views {
            let runs: Vec<usize> = strided_runs(shape, strides, offset)
                .flat_map(|(at, len, step)| (0..len).map(move |j| at + j * step))
                .collect();
            let each: Vec<usize> = strided_positions(shape, strides, offset).collect();
            assert_eq!(runs, each, "{shape:?} at {strides:?} from {offset}");
        }
    }

    #[test]
    fn broadcasting() {
        assert_eq!(
            broadcast_shapes("t", &[3, 1, 5], &[4, 1]).unwrap(),
            vec![3, 4, 5]
        );
        assert_eq!(broadcast_shapes("t", &[], &[2]).unwrap(), vec![2]);
        let e = broadcast_shapes("add", &[3, 2], &[4, 2])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("add") && e.contains("[3, 2]") && e.contains("[4, 2]"),
            "{e}"
        );
        assert_eq!(
            broadcast_strides("t", &[3, 1], &[1, 1], &[2, 3, 4]).unwrap(),
            vec![0, 1, 0]
        );
    }

    #[test]
    fn layouts_merge_dims() {
        let l = KernelLayout::new("t", &[2, 3, 4], &[(&[12, 4, 1], 0), (&[12, 4, 1], 5)]).unwrap();
        assert_eq!(
            (l.ndim, l.shape[0], l.stride[1][0], l.offset[1]),
            (1, 24, 1, 5)
        );
        let t = KernelLayout::new("t", &[2, 1, 3], &[(&[3, 3, 1], 0), (&[1, 7, 2], 0)]).unwrap();
        assert_eq!(
            (
                t.ndim,
                t.shape[0],
                t.shape[1],
                t.stride[1][0],
                t.stride[1][1]
            ),
            (2, 2, 3, 1, 2)
        );
    }
}
