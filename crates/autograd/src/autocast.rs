//! Autocast (mixed precision): inside `autocast(dtype, f)`, matrix products, linear layers and fused attention of f32 values compute in bf16 or f16 (tensor cores where the device has them) and return f32; norms, softmax, losses, reductions and the parameters stay f32.
use netcl_ops::{DType, Error, Result};
use std::cell::Cell;

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Restores the previous policy when the region ends, also on early return or panic.
struct Restore(Option<DType>);

impl Drop for Restore {
    fn drop(&mut self) {
        AUTOCAST.with(|a| a.set(self.0));
    }
}

/// Runs `f` with autocast to `dtype` (`BF16` or `F16`) on this thread: `Var::matmul` and
/// `Var::linear` multiply `dtype` copies of their f32 operands into f32 products, and
/// `Var::flash_attention` computes in `dtype` and returns f32; their gradients, computed the same
/// way, reach the f32 parameters (the master weights). Everything else computes in f32.
/// Nest-safe: the previous policy returns when `f` ends. With f16, scale the loss (netcl-optim's
/// `GradScaler`) so small gradients do not flush to zero.
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> R) -> Result<R> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(Error::dtype(
            "autocast",
            format!("autocast computes in bf16 or f16, not {dtype}"),
        ));
    }
    let _restore = Restore(AUTOCAST.with(|a| a.replace(Some(dtype))));
    Ok(f())
}

/// The autocast dtype in force on this thread, if any.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(|a| a.get())
}

/// The dtype a product of `dtype` operands computes in under the current policy: the autocast
/// dtype for f32 operands inside an autocast region, else None (compute as given).
pub(crate) fn product_dtype(dtype: DType) -> Option<DType> {
    (dtype == DType::F32).then(autocast_dtype).flatten()
}
