//! The base tier: the tensor and its storage, layouts, launches, checks, the dispatcher, and the helpers every op family shares.
#[macro_use]
pub(crate) mod element;
pub(crate) mod acc;
pub(crate) mod axis;
pub(crate) mod checks;
pub(crate) mod copy;
pub(crate) mod device_errors;
pub(crate) mod fastdiv;
#[macro_use]
pub(crate) mod dispatch;
mod display;
pub(crate) mod generator;
pub(crate) mod host;
pub(crate) mod index_checks;
pub(crate) mod launch;
pub mod layout;
pub(crate) mod norm_params;
pub(crate) mod read_async;
pub(crate) mod rope_types;
pub(crate) mod rows;
pub(crate) mod tensor;
pub(crate) mod transpose;
mod views;
pub(crate) mod window;
