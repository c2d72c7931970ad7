//! A tensor's dims split into kept and reduced ones (reductions, softmax, norms), and power-of-two helpers for work-group sizes.
use crate::base::layout::{numel, KernelLayout};
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;

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
    /// For host tensors: the elements as `nout` rows of `nred` values in f64.
    pub fn host_rows(&self, t: &Tensor) -> Option<Vec<f64>> {
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
        t.host_view(&shape, &strides).map(|d| d.to_f64())
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
