//! Every strided copy on an OpenCL device (contiguous(), concat, dense kernel operands) as one launch of copy.cl's `strided_copy`, in words of four elements where the rows allow.
use crate::base::launch::{launch_1d, program_for};
use crate::base::layout::{merged_dims, runs_of, KernelLayout};
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;
use netcl_kernels::sources::COPY;

/// Elements per word of `strided_copy_words`.
const WORD: u32 = 4;

/// Copies the view (`shape`, `src` strides and offset) of `from` into `to` at (`dst` strides and
/// offset): one work-item per element, or (`strided_copy_words`) per word of four elements when
/// both sides' innermost (merged) dim is dense and every row starts at a multiple of four
/// elements, which reads and writes 16 bytes at a time in f32 and indexes a quarter as often.
pub(crate) fn strided_copy(
    op: &str,
    (to, dst): (&Tensor, (&[usize], usize)),
    (from, src): (&Tensor, (&[usize], usize)),
    shape: &[usize],
) -> Result<()> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    let operands = [dst, src];
    let dims = merged_dims(op, shape, &operands)?;
    let offsets = [dst.1, src.1];
    let program = program_for(&from.device, &COPY, from.dtype)?;
    let bytes = (2 * n * from.dtype.size()) as u64;
    let (name, layout, items) = match runs_of(WORD, &dims, &offsets) {
        true => (
            "strided_copy_words",
            words(&dims, &offsets),
            n / WORD as usize,
        ),
        false => ("strided_copy", KernelLayout::from_dims(&dims, &offsets), n),
    };
    launch_1d(&program, name, items, |k| {
        k.declare(bytes, 0);
        k.arg_mem(to.mem()?)?.arg_mem(from.mem()?)?.arg(&layout)?;
        Ok(())
    })
}

/// The layout of `dims` (from `merged_dims`, where `runs_of(WORD)` holds) counted in words of
/// `WORD` elements: the innermost extent, the other strides and the offsets divided by it.
fn words(dims: &[(u32, Vec<u32>)], offsets: &[usize]) -> KernelLayout {
    let last = dims.len() - 1;
    let dims: Vec<(u32, Vec<u32>)> = (dims.iter().enumerate())
        .map(|(i, (extent, strides))| match i == last {
            true => (extent / WORD, strides.clone()),
            false => (*extent, strides.iter().map(|s| s / WORD).collect()),
        })
        .collect();
    let offsets: Vec<usize> = offsets.iter().map(|o| o / WORD as usize).collect();
    KernelLayout::from_dims(&dims, &offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word layout of a copy from `src` into `dst` over `shape`, when it has one.
    fn word_layout(
        shape: &[usize],
        dst: (&[usize], usize),
        src: (&[usize], usize),
    ) -> Option<KernelLayout> {
        let dims = merged_dims("t", shape, &[dst, src]).unwrap();
        let offsets = [dst.1, src.1];
        runs_of(WORD, &dims, &offsets).then(|| words(&dims, &offsets))
    }

    #[test]
    fn words_only_where_rows_are_dense_and_aligned() {
        // A (2, 3, 8) view of a (2, 5, 8) tensor from row 1, into a dense (2, 3, 8).
        let src: (&[usize], usize) = (&[40, 8, 1], 8);
        let dst: (&[usize], usize) = (&[24, 8, 1], 0);
        let l = word_layout(&[2, 3, 8], dst, src).unwrap();
        assert_eq!(l.ndim, 2);
        assert_eq!(&l.shape[..2], &[2, 6]);
        assert_eq!(&l.stride[0][..2], &[6, 1]);
        assert_eq!(&l.stride[1][..2], &[10, 1]);
        assert_eq!(&l.offset[..2], &[0, 2]);
        // An offset, a row length or an outer stride that is not a multiple of 4 elements,
        // or a strided innermost dim: element by element.
        assert!(word_layout(&[2, 3, 8], dst, (&[40, 8, 1], 6)).is_none());
        assert!(word_layout(&[2, 3, 6], (&[18, 6, 1], 0), (&[30, 6, 1], 0)).is_none());
        assert!(word_layout(&[2, 3, 8], dst, (&[60, 10, 1], 0)).is_none());
        assert!(word_layout(&[2, 3, 8], dst, (&[24, 1, 3], 0)).is_none());
    }
}
