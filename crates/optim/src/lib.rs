//! netcl-optim: SGD, Adam and AdamW (one multi-tensor fused update kernel for all parameters, parameter groups, state save/load), gradient-norm clipping and learning-rate schedules.
mod adam;
mod clip;
mod device_state;
mod grad_scaler;
mod groups;
mod optimizer;
mod schedule;
mod sgd;
mod state;

pub use adam::{Adam, AdamW};
pub use clip::{clip_grad_norm, clip_grad_norm_of, clip_grad_norm_on_device, grad_norm};
pub use grad_scaler::GradScaler;
pub use groups::ParamGroup;
pub use optimizer::Optimizer;
pub use schedule::{ConstantLr, CosineWithWarmup, LrSchedule, StepLr};
pub use sgd::Sgd;
