//! netcl-nn: the Module trait, layers, seeded initialisation, losses and checkpoints.
mod activation;
mod atomic_file;
pub mod checkpoint;
mod conv;
mod dropout;
mod embedding;
pub mod init;
mod linear;
mod lora;
pub mod loss;
mod module;
mod norm;
mod npz;
mod pool;
mod state;
mod tensor_io;

pub use activation::{LeakyReLU, ReLU, SiLU, Sigmoid, Tanh, GELU};
pub use conv::Conv2d;
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use init::Init;
pub use linear::Linear;
pub use lora::{LoraAdapter, LoraConfig};
pub use loss::{cross_entropy, cross_entropy_with, mse_loss, nll_loss, CrossEntropyOptions};
pub use module::{in_layer, type_name, Context, Module, Sequential};
pub use norm::{BatchNorm2d, LayerNorm, RmsNorm};
pub use pool::{AvgPool2d, Flatten, MaxPool2d};
pub use state::{
    load_checkpoint, load_optimizer, read_optimizer, save_checkpoint, save_checkpoint_with,
    save_optimizer, OptimizerState,
};
pub use tensor_io::{load_npz, load_safetensors, save_npz, save_safetensors, SafetensorsFile};
