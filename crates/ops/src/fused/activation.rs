//! The activation a GEMM epilogue applies: none, or a unary op whose table row allows it.
use crate::fused::expr::UnaryOp;
use netcl_core_devices::{Error, Result};

/// The activation applied by the matmul epilogue: none, or a unary op whose table row is marked
/// `epilogue` (`unary_table.rs` generates the constants `Activation::Relu`, `Activation::Gelu`,
/// ... and the epilogue's OpenCL function comes from the same row).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Activation(pub(crate) Option<UnaryOp>);

#[allow(non_upper_case_globals)]
impl Activation {
    /// No activation: the epilogue only adds the bias.
    pub const None: Activation = Activation(None);

    /// The epilogue applying `op`; an error unless `op`'s table row is marked `epilogue`.
    pub fn new(op: UnaryOp) -> Result<Activation> {
        if op.epilogue() {
            Ok(Activation(Some(op)))
        } else {
            Err(Error::invalid(
                "matmul",
                format!("{} is not an epilogue activation", op.name()),
            ))
        }
    }

    /// The unary op applied, if any.
    pub fn op(self) -> Option<UnaryOp> {
        self.0
    }

    /// `None`, then every epilogue op in table order.
    pub fn all() -> Vec<Activation> {
        let ops = UnaryOp::ALL.iter().filter(|op| op.epilogue());
        std::iter::once(Activation::None)
            .chain(ops.map(|&op| Activation(Some(op))))
            .collect()
    }

    pub(crate) fn host(self, v: f64) -> f64 {
        self.0.map_or(v, |op| op.host(v))
    }
}

impl std::fmt::Debug for Activation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            None => f.write_str("None"),
            Some(op) => write!(f, "{op:?}"),
        }
    }
}
