//! Backward rules of max_pool2d, avg_pool2d and adaptive_avg_pool2d.
use crate::tape::{record, Var};
use netcl_ops::{Pool2dParams, Result, Tensor};

impl Var {
    /// Max pooling (NCHW); the gradient goes to the arg-max of each window.
    #[track_caller]
    pub fn max_pool2d(&self, params: Pool2dParams) -> Result<Var> {
        let (y, idx) = self.value().max_pool2d(params)?;
        let shape = self.shape().to_vec();
        record("max_pool2d", &[self], y, move |g, _| {
            Ok(vec![Some(Tensor::max_pool2d_backward(
                g, &idx, &shape, params,
            )?)])
        })
    }

    /// Average pooling (NCHW).
    #[track_caller]
    pub fn avg_pool2d(&self, params: Pool2dParams, count_include_pad: bool) -> Result<Var> {
        let y = self.value().avg_pool2d(params, count_include_pad)?;
        let shape = self.shape().to_vec();
        record("avg_pool2d", &[self], y, move |g, _| {
            Ok(vec![Some(Tensor::avg_pool2d_backward(
                g,
                &shape,
                params,
                count_include_pad,
            )?)])
        })
    }

    /// Adaptive average pooling to `output` (oh, ow).
    #[track_caller]
    pub fn adaptive_avg_pool2d(&self, output: (usize, usize)) -> Result<Var> {
        let y = self.value().adaptive_avg_pool2d(output)?;
        let shape = self.shape().to_vec();
        record("adaptive_avg_pool2d", &[self], y, move |g, _| {
            Ok(vec![Some(Tensor::adaptive_avg_pool2d_backward(g, &shape)?)])
        })
    }
}
