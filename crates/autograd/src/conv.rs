//! Backward rule of conv2d: data, weight and bias gradients through the op library's backward ops.
use crate::tape::{record, Var};
use netcl_ops::{Conv2dParams, Result, Tensor};

impl Var {
    /// 2-D convolution (NCHW): x (N, Cin, H, W), weight (Cout, Cin/groups, kh, kw), bias (Cout).
    #[track_caller]
    pub fn conv2d(&self, weight: &Var, bias: Option<&Var>, params: Conv2dParams) -> Result<Var> {
        let y = self
            .value()
            .conv2d(weight.value(), bias.map(|b| b.value()), params)?;
        let (x, w) = (self.value().clone(), weight.value().clone());
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        record("conv2d", &inputs, y, move |g, need| {
            let dx = if need[0] {
                Some(Tensor::conv2d_backward_input(g, &w, x.shape(), params)?)
            } else {
                None
            };
            let dw = if need[1] {
                Some(Tensor::conv2d_backward_weight(g, &x, w.shape(), params)?)
            } else {
                None
            };
            let mut grads = vec![dx, dw];
            if need.len() > 2 {
                grads.push(if need[2] {
                    Some(Tensor::conv2d_backward_bias(g)?)
                } else {
                    None
                });
            }
            Ok(grads)
        })
    }
}
