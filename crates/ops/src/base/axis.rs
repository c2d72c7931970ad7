//! A tensor's dims split into kept and reduced ones (reductions, softmax, norms), and power-of-two helpers for work-group sizes.
use crate::base::layout::{numel, strided_positions, KernelLayout};
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;
use netcl_core_memory::HostBuf;

/// A tensor's dims split into kept and reduced ones, each with its shape and input strides.
#[derive(Clone, Debug)]
pub(crate) struct AxisSplit {
    pub kept_shape: Vec<usize>,
    pub kept_strides: Vec<usize>,
    pub red_shape: Vec<usize>,
    pub red_strides: Vec<usize>,
}

impl AxisSplit {
    pub fn new(t: &Tensor, mask: &[bool]) -> AxisSplit {
        let mut s = AxisSplit {
            kept_shape: vec![],
            kept_strides: vec![],
            red_shape: vec![],
            red_strides: vec![],
        };
        for (d, &m) in mask.iter().enumerate() {
            let (sh, st) = if m {
                (&mut s.red_shape, &mut s.red_strides)
            } else {
                (&mut s.kept_shape, &mut s.kept_strides)
            };
            sh.push(t.shape[d]);
            st.push(t.strides[d]);
        }
        s
    }
    pub fn nout(&self) -> usize {
        numel(&self.kept_shape)
    }
    pub fn nred(&self) -> usize {
        numel(&self.red_shape)
    }
    /// The storage positions of output row `o`'s `nred` elements (in row-major order of the
    /// reduced dims), for a tensor whose first element lies at `offset`: host code reads a row
    /// where it lies instead of copying the tensor.
    pub fn row_positions(&self, offset: usize, o: usize) -> impl Iterator<Item = usize> + '_ {
        strided_positions(&self.red_shape, &self.red_strides, self.row_base(offset, o))
    }

    /// The storage position of output row `o`'s first element.
    pub fn row_base(&self, offset: usize, o: usize) -> usize {
        let mut rest = o;
        let mut base = offset;
        for (&n, &s) in self.kept_shape.iter().zip(&self.kept_strides).rev() {
            base += (rest % n.max(1)) * s;
            rest /= n.max(1);
        }
        base
    }

    /// For host tensors: the elements as `nout` rows of `nred` values in f64 (a counted buffer).
    pub fn host_rows(&self, t: &Tensor) -> Result<HostBuf<f64>> {
        let shape: Vec<usize> = self
            .kept_shape
            .iter()
            .chain(&self.red_shape)
            .copied()
            .collect();
        let strides: Vec<usize> = self
            .kept_strides
            .iter()
            .chain(&self.red_strides)
            .copied()
            .collect();
        t.host_view_f64(&shape, &strides)
    }
    /// Kernel layouts of the kept dims (with the tensor's offset) and of the reduced dims.
    pub fn layouts(&self, op: &str, offset: usize) -> Result<(KernelLayout, KernelLayout)> {
        Ok((
            KernelLayout::new(op, &self.kept_shape, &[(&self.kept_strides, offset)])?,
            KernelLayout::new(op, &self.red_shape, &[(&self.red_strides, 0)])?,
        ))
    }
}

/// Largest power of two not above `n` (n >= 1).
pub(crate) fn pow2_floor(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.max(1).leading_zeros())
}
