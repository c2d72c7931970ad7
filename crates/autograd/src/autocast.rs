//! Autocast (mixed precision): inside `autocast(dtype, f)`, matrix products and linear layers compute in bf16 or f16 (tensor cores where the device has them) and return that dtype, as PyTorch's autocast does; fused attention computes in it too; losses return f32, binary ops promote mixed float operands to the wider dtype, and the parameters stay f32.
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
/// `Var::linear` multiply `dtype` copies of their f32 operands into `dtype` products (the
/// activations downstream stay in `dtype`: SwiGLU, RoPE, attention read and write it, and each
/// activation's gradient comes back in its dtype), `Var::flash_attention` of f32 operands computes
/// in `dtype` and returns f32, a binary op of f32 and `dtype` operands computes in f32, and
/// cross-entropy returns an f32 loss. The gradients of the f32 parameters (the master weights)
/// are f32. Nest-safe: the previous policy returns when `f` ends. With f16, scale the loss
/// (netcl-optim's `GradScaler`) so small gradients do not flush to zero.
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

/// The dtype a product of operands of `dtypes` computes in under the current policy: the
/// autocast dtype inside an autocast region when every operand is f32 or already in it, else
/// None (compute as given).
pub(crate) fn product_dtype(dtypes: &[DType]) -> Option<DType> {
    let dt = autocast_dtype()?;
    dtypes
        .iter()
        .all(|&d| d == DType::F32 || d == dt)
        .then_some(dt)
}

/// Runs `f` under exactly the policy `dtype` (None: off), restoring the previous one after: a
/// recomputation (checkpoint.rs) sees the policy its forward ran under.
pub(crate) fn with_autocast<R>(dtype: Option<DType>, f: impl FnOnce() -> R) -> R {
    let _restore = Restore(AUTOCAST.with(|a| a.replace(dtype)));
    f()
}
