//! Pooling and reshaping layers: MaxPool2d, AvgPool2d, Flatten.
use crate::module::Module;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_ops::{Pool2dParams, Result};
use serde_json::{json, Value};

fn pool_json(kind: &str, p: &Pool2dParams) -> Value {
    json!({
        "type": kind,
        "kernel": [p.kernel.0, p.kernel.1],
        "stride": [p.stride.0, p.stride.1],
        "padding": [p.padding.0, p.padding.1],
        "dilation": [p.dilation.0, p.dilation.1],
        "ceil_mode": p.ceil_mode,
    })
}

/// Max pooling over windows (stride = kernel unless set), e.g.
/// `MaxPool2d(Pool2dParams::new((3, 3)).stride((2, 2)).padding((1, 1)).ceil_mode(true))`.
pub struct MaxPool2d(pub Pool2dParams);

impl MaxPool2d {
    pub fn new(kernel: usize) -> MaxPool2d {
        MaxPool2d(Pool2dParams::new((kernel, kernel)))
    }
}

impl Module for MaxPool2d {
    fn forward(&self, _tape: &Tape, x: &Var) -> Result<Var> {
        x.max_pool2d(self.0)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        Vec::new()
    }
    fn describe(&self) -> Value {
        pool_json("MaxPool2d", &self.0)
    }
}

/// Average pooling; as PyTorch's `AvgPool2d`, padding counts in the divisor unless
/// `count_include_pad` is false.
pub struct AvgPool2d {
    pub params: Pool2dParams,
    pub count_include_pad: bool,
}

impl AvgPool2d {
    /// A `kernel` x `kernel` window at stride `kernel`.
    pub fn new(kernel: usize) -> AvgPool2d {
        AvgPool2d::with(Pool2dParams::new((kernel, kernel)))
    }

    /// Any window (stride, padding, ceil_mode), counting padding in the divisor.
    pub fn with(params: Pool2dParams) -> AvgPool2d {
        AvgPool2d {
            params,
            count_include_pad: true,
        }
    }

    /// This layer dividing by the taps inside the input only (`false`) or by the padded window.
    pub fn count_include_pad(self, count_include_pad: bool) -> AvgPool2d {
        AvgPool2d {
            count_include_pad,
            ..self
        }
    }
}

impl Module for AvgPool2d {
    fn forward(&self, _tape: &Tape, x: &Var) -> Result<Var> {
        x.avg_pool2d(self.params, self.count_include_pad)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        Vec::new()
    }
    fn describe(&self) -> Value {
        let mut v = pool_json("AvgPool2d", &self.params);
        v["count_include_pad"] = json!(self.count_include_pad);
        v
    }
}

/// Merge all dims after the first: (N, ...) -> (N, prod).
#[derive(Clone, Copy, Debug, Default)]
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, _tape: &Tape, x: &Var) -> Result<Var> {
        x.flatten(1)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        Vec::new()
    }
    fn describe(&self) -> Value {
        json!({"type": "Flatten"})
    }
}
