//! Training precision for scripts and the examples' `--precision f32|bf16|f16`: f32, or autocast to bf16 / f16 (f16 with loss scaling), with the master weights in f32.
use netcl_autograd::autocast;
use netcl_core_devices::{DType, Error, Result};
use netcl_optim::GradScaler;

/// How a training step computes: `F32` throughout, or its matrix products (and what follows
/// them) in bf16 or f16 through [`autocast`] while parameters stay f32. f16 needs loss scaling
/// ([`Precision::scaler`]); bf16 has f32's range and does not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    #[default]
    F32,
    Bf16,
    F16,
}

impl Precision {
    /// `f32`, `bf16` or `f16` (an error naming the choices otherwise).
    pub fn parse(s: &str) -> Result<Precision> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            "f16" => Ok(Precision::F16),
            other => Err(Error::invalid(
                "--precision",
                format!("{other:?} is not a precision; use f32, bf16 or f16"),
            )),
        }
    }

    /// The name `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// The dtype products compute in: f32, bf16 or f16 (also the dtype a frozen LoRA base can
    /// be stored in).
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
        }
    }

    /// The autocast dtype, None for f32.
    pub fn autocast_dtype(self) -> Option<DType> {
        (self != Precision::F32).then(|| self.dtype())
    }

    /// Runs a forward pass `f` in this precision (inside autocast for bf16 and f16).
    pub fn forward<R>(self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        match self.autocast_dtype() {
            Some(dt) => autocast(dt, f)?,
            None => f(),
        }
    }

    /// The loss scaler this precision needs: PyTorch's defaults for f16, None otherwise.
    pub fn scaler(self) -> Option<GradScaler> {
        (self == Precision::F16).then(GradScaler::default)
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Lets command lines take `--precision f32|bf16|f16` directly.
impl std::str::FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Precision> {
        Precision::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_are_errors() {
        for p in [Precision::F32, Precision::Bf16, Precision::F16] {
            assert_eq!(Precision::parse(p.name()).unwrap(), p);
        }
        assert!(Precision::parse("fp8").is_err());
        assert_eq!(Precision::F32.autocast_dtype(), None);
        assert!(Precision::F16.scaler().is_some() && Precision::Bf16.scaler().is_none());
    }
}
