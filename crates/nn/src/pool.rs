//! Pooling and reshaping layers: MaxPool2d, AvgPool2d, Flatten.
use crate::module::Module;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_ops::{Pool2dParams, Result};
use serde_json::{json, Value};

fn pool_json(kind: &str, p: &Pool2dParams) -> Value {
    json!({"type": kind, "kernel": [p.kernel.0, p.kernel.1], "stride": [p.stride.0, p.stride.1], "padding": [p.padding.0, p.padding.1]})
}

/// Max pooling over windows (stride = kernel unless set).
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

/// Average pooling (padding excluded from the count).
pub struct AvgPool2d(pub Pool2dParams);

impl AvgPool2d {
    pub fn new(kernel: usize) -> AvgPool2d {
        AvgPool2d(Pool2dParams::new((kernel, kernel)))
    }
}

impl Module for AvgPool2d {
    fn forward(&self, _tape: &Tape, x: &Var) -> Result<Var> {
        x.avg_pool2d(self.0, false)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        Vec::new()
    }
    fn describe(&self) -> Value {
        pool_json("AvgPool2d", &self.0)
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
