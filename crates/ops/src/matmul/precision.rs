//! The f32 matmul precision policy (PyTorch's `set_float32_matmul_precision`: exact f32 or TF32 tensor cores), per process and per device, and the tensor-core kinds.
use netcl_core_devices::{Config, DType, Device};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

pub use netcl_core_devices::MatmulPrecision;

fn per_device() -> &'static Mutex<HashMap<usize, MatmulPrecision>> {
    static MAP: OnceLock<Mutex<HashMap<usize, MatmulPrecision>>> = OnceLock::new();
    MAP.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Sets the process-wide f32 matmul precision: [`Config::matmul_precision`], whose default is
/// `NETCL_MATMUL_PRECISION`, else `Highest`. A device's own setting, if any, takes precedence.
pub fn set_float32_matmul_precision(p: MatmulPrecision) {
    Config::update(|c| c.matmul_precision = p);
}

/// The process-wide f32 matmul precision: [`Config::matmul_precision`] (as set, else
/// `NETCL_MATMUL_PRECISION`: `highest` or `high`, anything else reported on stderr and ignored,
/// else `Highest`).
pub fn float32_matmul_precision() -> MatmulPrecision {
    Config::get().matmul_precision
}

/// Sets (or with `None` clears) `device`'s own f32 matmul precision.
pub fn set_device_float32_matmul_precision(device: &Device, p: Option<MatmulPrecision>) {
    let mut map = per_device().lock().unwrap_or_else(|e| e.into_inner());
    match p {
        Some(p) => map.insert(device.ordinal(), p),
        None => map.remove(&device.ordinal()),
    };
}

/// The f32 matmul precision in force on `device`: its own setting, else the process-wide one.
pub fn device_float32_matmul_precision(device: &Device) -> MatmulPrecision {
    let map = per_device().lock().unwrap_or_else(|e| e.into_inner());
    map.get(&device.ordinal())
        .copied()
        .unwrap_or_else(float32_matmul_precision)
}

/// A tensor-core instruction family of matmul_tc.cl.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorCoreKind {
    /// f32 storage, TF32 inputs (m16n8k8).
    Tf32,
    /// bf16 storage and inputs (m16n8k16).
    Bf16,
    /// f16 storage and inputs (m16n8k16).
    F16,
}

impl TensorCoreKind {
    pub(crate) fn dtype(self) -> DType {
        match self {
            TensorCoreKind::Tf32 => DType::F32,
            TensorCoreKind::Bf16 => DType::BF16,
            TensorCoreKind::F16 => DType::F16,
        }
    }

    /// The build option selecting the kind in matmul_tc.cl, matmul_wg.cl and attention_tc.cl.
    pub(crate) fn define(self) -> &'static str {
        match self {
            TensorCoreKind::Tf32 => "-DTC_TF32",
            TensorCoreKind::Bf16 => "-DTC_BF16",
            TensorCoreKind::F16 => "-DTC_F16",
        }
    }
}
