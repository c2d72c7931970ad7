//! netcl-autograd: tape autograd (Var ops record backward rules, laid out file for file like netcl-ops), parameters, and gradcheck.
mod anomaly;
mod attention;
mod autocast;
mod binary;
mod checkpoint;
mod conv;
mod dropout;
mod gradcheck;
mod index;
mod matmul;
mod norm;
mod param;
mod parts;
mod pool;
mod reduce;
mod rope;
mod shape;
mod softmax;
mod tape;
mod unary;
mod views;

pub use attention::FLASH_MIN_QUERIES;
pub use autocast::{autocast, autocast_dtype};
pub use checkpoint::checkpoint;
pub use gradcheck::{gradcheck, GradcheckOptions, GradcheckReport};
pub use param::{GradBuffers, Parameter};
pub use tape::{Gradients, Tape, Var};
