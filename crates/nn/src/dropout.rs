//! Dropout layer: active in training mode with its own seeded generator, the identity in evaluation mode.
use crate::module::Module;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_ops::{Error, Generator, Result};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

/// Dropout as a layer: in training mode it zeroes each element with probability `p` and scales
/// the rest by `1 / (1 - p)`, drawing from its own seeded generator (so a run is reproducible);
/// in evaluation mode ([`Module::eval`]) it is the identity. A clone draws from the same
/// generator (a handle, as a recomputing checkpoint needs).
#[derive(Clone)]
pub struct Dropout {
    pub p: f64,
    gen: Arc<Mutex<Generator>>,
    training: bool,
}

impl Dropout {
    /// Drop probability `p` in [0, 1], masks drawn from a generator seeded with `seed`.
    pub fn new(p: f64, seed: u64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(
                "Dropout",
                format!("drop probability {p} is not in [0, 1]"),
            ));
        }
        Ok(Dropout {
            p,
            gen: Arc::new(Mutex::new(Generator::new(seed))),
            training: true,
        })
    }
}

impl Module for Dropout {
    fn forward(&self, _tape: &Tape, x: &Var) -> Result<Var> {
        if !self.training || self.p == 0.0 {
            return Ok(x.clone());
        }
        let mut gen = self.gen.lock().unwrap_or_else(|e| e.into_inner());
        x.dropout(self.p, &mut gen)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        Vec::new()
    }
    fn set_training(&mut self, on: bool) {
        self.training = on;
    }
    fn describe(&self) -> Value {
        json!({"type": "Dropout", "p": self.p})
    }
}
