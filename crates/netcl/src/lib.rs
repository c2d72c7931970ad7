//! netcl: deep learning on OpenCL (any vendor's GPU, CPUs through PoCL) with a host fallback.
#![doc = include_str!("../../../README.md")]
pub use netcl_autograd as autograd;
pub use netcl_core_devices as devices;
pub use netcl_core_memory as memory;
pub use netcl_data as data;
pub use netcl_distributed as distributed;
pub use netcl_kernels as kernels;
pub use netcl_models as models;
pub use netcl_nn as nn;
pub use netcl_ops as ops;
pub use netcl_optim as optim;
pub use netcl_profiling as profiling;

/// Helpers the Fashion-MNIST examples share (data loading, metering, the per-epoch record); not in the prelude.
pub mod train;

pub use netcl_core_devices::{DType, Device, DeviceInfo, DeviceKind, Error, Result};
pub use netcl_core_memory::{Pool, PoolStats};
pub use netcl_ops::{Generator, Tensor};

/// Everything a training script needs: `use netcl::prelude::*`.
pub mod prelude {
    pub use crate::{DType, Device, Error, Generator, Pool, Result, Tensor};
    pub use netcl_autograd::{gradcheck, GradcheckOptions, Parameter, Tape, Var};
    pub use netcl_data::{TextCorpus, TokenBatch, TokenBatcher, Tokenizer};
    pub use netcl_distributed::{Comm, DataParallel, DdpOptions, Group, ReduceOp};
    pub use netcl_models::{generate, KvCache, Llama, LlamaConfig, Sampler, Sampling};
    pub use netcl_nn::{
        checkpoint::SaveOptions, cross_entropy, cross_entropy_with, load_checkpoint, mse_loss,
        nll_loss, save_checkpoint, save_checkpoint_with, AvgPool2d, BatchNorm2d, Conv2d,
        CrossEntropyOptions, Dropout, Embedding, Flatten, Init, LayerNorm, LeakyReLU, Linear,
        MaxPool2d, Module, ReLU, RmsNorm, Sequential, SiLU, Sigmoid, Tanh, GELU,
    };
    pub use netcl_ops::{Activation, Conv2dParams, Pool2dParams};
    pub use netcl_optim::{
        clip_grad_norm, Adam, AdamW, ConstantLr, CosineWithWarmup, LrSchedule, Optimizer,
        ParamGroup, Sgd, StepLr,
    };
}
