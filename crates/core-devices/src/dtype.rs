//! Element types: what a tensor stores and how kernels are specialised for it.
use crate::{Error, Result};
use std::fmt;

/// The element type of a tensor. f16 and bf16 are stored as 16 bits and computed in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I32,
    U32,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Lower-case name, also the suffix of kernel names (`add_f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
        }
    }

    pub fn is_float(self) -> bool {
        !matches!(self, DType::I32 | DType::U32)
    }

    /// The `-D` option that specialises kernels/common.cl for this dtype.
    pub fn build_option(self) -> &'static str {
        match self {
            DType::F32 => "-DDT_F32",
            DType::F64 => "-DDT_F64",
            DType::F16 => "-DDT_F16",
            DType::BF16 => "-DDT_BF16",
            DType::I32 => "-DDT_I32",
            DType::U32 => "-DDT_U32",
        }
    }

    pub fn parse(s: &str) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| Error::invalid("DType::parse", format!("unknown dtype '{s}'")))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
