//! Activation layers (ReLU, GELU, SiLU, Tanh, Sigmoid, LeakyReLU); ReLU can fuse into a preceding Linear.
use crate::module::Module;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_ops::{Activation, Result};
use serde_json::{json, Value};

macro_rules! activations {
    ($($name:ident => $method:ident, $fusable:expr;)*) => {
        $(
            #[doc = concat!("The `", stringify!($method), "` activation as a layer.")]
            #[derive(Clone, Copy, Debug, Default)]
            pub struct $name;

            impl Module for $name {
                fn forward(&self, _tape: &Tape, x: &Var) -> Result<Var> {
                    x.$method()
                }
                fn named_parameters(&self) -> Vec<(String, Parameter)> {
                    Vec::new()
                }
                fn describe(&self) -> Value {
                    json!({"type": stringify!($name)})
                }
                fn as_activation(&self) -> Option<Activation> {
                    $fusable
                }
            }
        )*
    };
}

activations!(
    ReLU => relu, Some(Activation::Relu);
    GELU => gelu, None;
    SiLU => silu, None;
    Tanh => tanh, None;
    Sigmoid => sigmoid, None;
);

/// `x` where positive, `slope·x` elsewhere.
#[derive(Clone, Copy, Debug)]
pub struct LeakyReLU {
    pub slope: f64,
}

impl Default for LeakyReLU {
    fn default() -> Self {
        LeakyReLU { slope: 0.01 }
    }
}

impl Module for LeakyReLU {
    fn forward(&self, _tape: &Tape, x: &Var) -> Result<Var> {
        x.leaky_relu(self.slope)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        Vec::new()
    }
    fn describe(&self) -> Value {
        json!({"type": "LeakyReLU", "slope": self.slope})
    }
}
