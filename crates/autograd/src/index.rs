//! Backward rules of embedding, index_select and gather (deterministic scatter-adds in the op library).
use crate::tape::{record, Var};
use netcl_ops::{Result, Tensor};

impl Var {
    /// Rows of this (V, D) table for integer `ids` (any shape): (..., D).
    #[track_caller]
    pub fn embedding(&self, ids: &Tensor) -> Result<Var> {
        let y = self.value().embedding(ids)?;
        let (ids, v) = (ids.clone(), self.shape()[0]);
        record("embedding", &[self], y, move |g, _| {
            Ok(vec![Some(Tensor::embedding_backward(g, &ids, v)?)])
        })
    }

    /// Entries `idx` (1-D, I32) along `dim`.
    #[track_caller]
    pub fn index_select(&self, dim: usize, idx: &Tensor) -> Result<Var> {
        let y = self.value().index_select(dim, idx)?;
        let (idx, shape) = (idx.clone(), self.shape().to_vec());
        record("index_select", &[self], y, move |g, _| {
            Ok(vec![Some(Tensor::index_select_backward(
                g, dim, &idx, &shape,
            )?)])
        })
    }

    /// `out[i][j] = x[i][idx[i][j]]` along `dim` (torch.gather).
    #[track_caller]
    pub fn gather(&self, dim: usize, idx: &Tensor) -> Result<Var> {
        let y = self.value().gather(dim, idx)?;
        let (idx, shape) = (idx.clone(), self.shape().to_vec());
        record("gather", &[self], y, move |g, _| {
            Ok(vec![Some(Tensor::gather_backward(g, dim, &idx, &shape)?)])
        })
    }
}
