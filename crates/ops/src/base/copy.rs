//! Every strided copy on an OpenCL device (contiguous(), concat, dense kernel operands) as one launch of copy.cl's `strided_copy`, in words of four elements where the rows allow.
use crate::base::launch::{launch_1d, program_for};
use crate::base::layout::{merged_dims, runs_of, KernelLayout, MAX_DIMS};
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
    let program = program_for(&from.device, &COPY, from.dtype)?;
    let bytes = (2 * n * from.dtype.size()) as u64;
    if let Some((layout, words)) = word_layout(op, shape, &operands)? {
        return launch_1d(&program, "strided_copy_words", words, |k| {
            k.declare(bytes, 0);
            k.arg_mem(to.mem()?)?.arg_mem(from.mem()?)?.arg(&layout)?;
            Ok(())
        });
    }
    let layout = KernelLayout::new(op, shape, &operands)?;
    launch_1d(&program, "strided_copy", n, |k| {
        k.declare(bytes, 0);
        k.arg_mem(to.mem()?)?.arg_mem(from.mem()?)?.arg(&layout)?;
        Ok(())
    })
}

/// The layout in words of `WORD` elements (extents and strides divided by it) and the word
/// count, when runs of `WORD` elements lie side by side in both operands (`runs_of`).
fn word_layout(
    op: &str,
    shape: &[usize],
    operands: &[(&[usize], usize); 2],
) -> Result<Option<(KernelLayout, usize)>> {
    let dims = merged_dims(op, shape, operands)?;
    if !runs_of(WORD, &dims, &operands.map(|(_, off)| off)) {
        return Ok(None);
    }
    let mut l = KernelLayout {
        ndim: dims.len() as u32,
        shape: [1; MAX_DIMS],
        stride: [[0; MAX_DIMS]; 3],
        offset: [0; 3],
    };
    let last = dims.len() - 1;
    for (i, (extent, strides)) in dims.iter().enumerate() {
        l.shape[i] = if i == last { extent / WORD } else { *extent };
        for (row, &s) in l.stride.iter_mut().zip(strides) {
            row[i] = if i == last { 1 } else { s / WORD };
        }
    }
    for (j, (_, off)) in operands.iter().enumerate() {
        l.offset[j] = (off / WORD as usize) as u32;
    }
    let words = shape.iter().product::<usize>() / WORD as usize;
    Ok(Some((l, words)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_only_where_rows_are_dense_and_aligned() {
        // A (2, 3, 8) view of a (2, 5, 8) tensor from head 1, into a dense (2, 3, 8).
        let src: (&[usize], usize) = (&[40, 8, 1], 8);
        let dst: (&[usize], usize) = (&[24, 8, 1], 0);
        let (l, words) = word_layout("t", &[2, 3, 8], &[dst, src]).unwrap().unwrap();
        assert_eq!(words, 12);
        assert_eq!(l.ndim, 2);
        assert_eq!(&l.shape[..2], &[2, 6]);
        assert_eq!(&l.stride[0][..2], &[6, 1]);
        assert_eq!(&l.stride[1][..2], &[10, 1]);
        assert_eq!(&l.offset[..2], &[0, 2]);
        // An offset, a row length or an outer stride that is not a multiple of 4 elements,
        // or a strided innermost dim: element by element.
        let odd: (&[usize], usize) = (&[40, 8, 1], 6);
        assert!(word_layout("t", &[2, 3, 8], &[dst, odd]).unwrap().is_none());
        let short: (&[usize], usize) = (&[30, 6, 1], 0);
        let dst6: (&[usize], usize) = (&[18, 6, 1], 0);
        assert!(word_layout("t", &[2, 3, 6], &[dst6, short])
            .unwrap()
            .is_none());
        let rows: (&[usize], usize) = (&[60, 10, 1], 0);
        assert!(word_layout("t", &[2, 3, 8], &[dst, rows])
            .unwrap()
            .is_none());
        let transposed: (&[usize], usize) = (&[24, 1, 3], 0);
        assert!(word_layout("t", &[2, 3, 8], &[dst, transposed])
            .unwrap()
            .is_none());
    }
}
