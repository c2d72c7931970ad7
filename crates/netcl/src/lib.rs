//! netcl: deep learning on OpenCL (any vendor's GPU, CPUs through PoCL) with a host fallback.
#![doc = include_str!("../../../README.md")]
pub use netcl_autograd as autograd;
pub use netcl_core_devices as devices;
/// The debug mode: `NETCL_DEBUG=nan|sync`, [`debug::detect_anomaly`] and [`debug::DebugGuard`].
pub use netcl_core_devices::debug;
pub use netcl_core_memory as memory;
pub use netcl_data as data;
pub use netcl_distributed as distributed;
pub use netcl_graph as graph;
pub use netcl_kernels as kernels;
pub use netcl_models as models;
pub use netcl_nn as nn;
pub use netcl_ops as ops;
pub use netcl_optim as optim;
pub use netcl_profiling as profiling;

/// Helpers the Fashion-MNIST examples share (data loading, metering, the per-epoch record); not in the prelude.
pub mod cli;
pub mod train;

/// `--precision f32|bf16|f16` of training scripts (in the prelude).
pub mod precision;

pub use netcl_core_devices::{Config, DType, Device, DeviceInfo, DeviceKind, Error, Result};
pub use netcl_core_memory::{Pool, PoolStats};
pub use netcl_ops::{Generator, Tensor};

/// The guide (`docs/guide/`, one page per topic), compiled only for doctests so that
/// `cargo test -p netcl --doc` runs every code block of every page.
#[cfg(doctest)]
pub mod guide {
    #[doc = include_str!("../../../docs/guide/first-training-loop.md")]
    pub mod first_training_loop {}
    #[doc = include_str!("../../../docs/guide/devices.md")]
    pub mod devices {}
    #[doc = include_str!("../../../docs/guide/tensors.md")]
    pub mod tensors {}
    #[doc = include_str!("../../../docs/guide/autograd.md")]
    pub mod autograd {}
    #[doc = include_str!("../../../docs/guide/custom-ops.md")]
    pub mod custom_ops {}
    #[doc = include_str!("../../../docs/guide/checkpoints.md")]
    pub mod checkpoints {}
    #[doc = include_str!("../../../docs/guide/profiling.md")]
    pub mod profiling {}
    #[doc = include_str!("../../../docs/guide/llama.md")]
    pub mod llama {}
    #[doc = include_str!("../../../docs/guide/model-families.md")]
    pub mod model_families {}
    #[doc = include_str!("../../../docs/guide/performance.md")]
    pub mod performance {}
    #[doc = include_str!("../../../docs/guide/debugging.md")]
    pub mod debugging {}
    #[doc = include_str!("../../../docs/guide/data-parallel.md")]
    pub mod data_parallel {}
    #[doc = include_str!("../../../docs/guide/graphs.md")]
    pub mod graphs {}
}

/// Everything a training script needs: `use netcl::prelude::*`.
///
/// The main types carry a runnable example here (each runs on the host device as a doctest);
/// the guide in `docs/guide/` goes through them topic by topic.
pub mod prelude {
    pub use crate::precision::Precision;
    pub use crate::{DType, Error, Generator, Pool, Result};
    pub use netcl_autograd::{autocast, gradcheck, GradcheckOptions};
    pub use netcl_data::{TextCorpus, TokenBatch, TokenBatcher, Tokenizer};
    pub use netcl_distributed::{Comm, DataParallel, DdpOptions, Group, ReduceOp};
    pub use netcl_graph::{Capture, Graph};
    pub use netcl_models::{generate_until, KvCache, Sampler, Sampling, StopStrings};
    pub use netcl_nn::{
        checkpoint::SaveOptions, cross_entropy, cross_entropy_with, mse_loss, nll_loss,
        save_checkpoint_with, AvgPool2d, BatchNorm2d, CrossEntropyOptions, Dropout, Embedding,
        Flatten, Init, LayerNorm, LeakyReLU, MaxPool2d, ReLU, RmsNorm, SiLU, Sigmoid, Tanh, GELU,
    };
    pub use netcl_ops::{
        set_float32_matmul_precision, Activation, Conv2dParams, MatmulPrecision, Pool2dParams,
    };
    pub use netcl_optim::{
        clip_grad_norm, ConstantLr, CosineWithWarmup, GradScaler, LrSchedule, ParamGroup, StepLr,
    };

    /// # Example
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let host = Device::host(); // always there, ordinal 0
    /// let dev = Device::best()?; // NETCL_DEVICE, else a GPU, else any OpenCL device, else the host
    /// println!("running on {}", dev.label());
    /// for d in Device::all() {
    ///     println!("{} ({:?})", d.spec(), d.kind()); // `host`, `opencl:0:0`, ...
    /// }
    /// assert_eq!(Device::parse("host")?, host);
    /// let t = Tensor::ones(&[2, 2], DType::F32, &host)?.to_device(&dev)?;
    /// assert_eq!(t.device(), &dev);
    /// # Ok::<(), Error>(())
    /// ```
    pub use crate::Device;

    /// # Example
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let dev = Device::host();
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &dev)?;
    /// let b = Tensor::ones(&[3], DType::F32, &dev)?;
    /// let c = a.add(&b)?.relu()?; // broadcasts [3] over [2, 3]
    /// assert_eq!(c.to_vec::<f32>()?, [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    /// let at = a.transpose(0, 1)?; // a view: no copy
    /// assert!(at.shares_storage(&a));
    /// let p = a.matmul(&at)?; // [2, 3] x [3, 2]
    /// assert_eq!(p.to_vec::<f32>()?, [14.0, 32.0, 32.0, 77.0]);
    /// assert_eq!(a.sum(&[1], false)?.to_vec::<f32>()?, [6.0, 15.0]);
    /// let r = Tensor::randn(&[4, 4], DType::F32, &dev, &mut Generator::new(0))?;
    /// assert_eq!(r.to_dtype(DType::BF16)?.dtype(), DType::BF16);
    /// # Ok::<(), Error>(())
    /// ```
    pub use crate::Tensor;

    /// # Example
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let dev = Device::host();
    /// let w = Parameter::new(Tensor::from_vec(vec![3.0f32], &[1], &dev)?)?;
    /// let tape = Tape::new();
    /// let x = tape.leaf(&Tensor::from_vec(vec![2.0f32], &[1], &dev)?)?;
    /// let y = tape.param(&w).mul(&x)?.mul(&x)?.sum_all()?; // w x^2
    /// let grads = tape.backward(&y)?;
    /// assert_eq!(w.grad().unwrap().to_vec::<f32>()?, [4.0]); // x^2 into the parameter
    /// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [12.0]); // 2 w x for the leaf
    /// assert!(tape.is_empty()); // backward consumed the graph
    /// assert!(!Tape::no_grad().param(&w).is_tracked()); // inference records nothing
    /// # Ok::<(), Error>(())
    /// ```
    pub use netcl_autograd::Tape;

    /// # Example
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let dev = Device::host();
    /// let tape = Tape::new();
    /// let x = tape.leaf(&Tensor::from_vec(vec![-1.0f32, 0.5, 2.0], &[3], &dev)?)?;
    /// let c = Var::from(Tensor::full(&[3], 2.0, DType::F32, &dev)?); // a constant
    /// let y = x.mul(&c)?.sigmoid()?.mean_all()?; // every op on a Var is recorded
    /// assert!(y.is_tracked() && !c.is_tracked());
    /// assert_eq!(y.shape(), &[] as &[usize]);
    /// let v = y.item()?; // one read from the device
    /// assert!(v > 0.5 && v < 1.0);
    /// let frozen = y.detach(); // the value, cut off from the tape
    /// assert!(!frozen.is_tracked());
    /// # Ok::<(), Error>(())
    /// ```
    pub use netcl_autograd::Var;

    /// # Example
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let dev = Device::host();
    /// let p = Parameter::new(Tensor::zeros(&[2], DType::F32, &dev)?)?;
    /// p.assign(&Tensor::from_vec(vec![1.0f32, -1.0], &[2], &dev)?)?; // in place
    /// let tape = Tape::new();
    /// tape.backward(&tape.param(&p).square()?.sum_all()?)?;
    /// assert_eq!(p.grad().unwrap().to_vec::<f32>()?, [2.0, -2.0]);
    /// p.zero_grad();
    /// p.set_requires_grad(false); // frozen: a constant on every tape, no optimizer state
    /// assert!(!Tape::new().param(&p).is_tracked());
    /// # Ok::<(), Error>(())
    /// ```
    pub use netcl_autograd::Parameter;

    /// # Example
    ///
    /// A layer of your own: a residual block around two Linears.
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// struct Residual {
    ///     a: Linear,
    ///     b: Linear,
    /// }
    ///
    /// impl Module for Residual {
    ///     fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
    ///         let h = self.a.forward(tape, x)?.gelu()?;
    ///         x.add(&self.b.forward(tape, &h)?)
    ///     }
    ///     fn named_parameters(&self) -> Vec<(String, Parameter)> {
    ///         let mut v = Vec::new();
    ///         for (prefix, layer) in [("a", &self.a), ("b", &self.b)] {
    ///             for (n, p) in layer.named_parameters() {
    ///                 v.push((format!("{prefix}.{n}"), p));
    ///             }
    ///         }
    ///         v
    ///     }
    ///     fn describe(&self) -> serde_json::Value {
    ///         serde_json::json!({"type": "Residual", "a": self.a.describe(), "b": self.b.describe()})
    ///     }
    /// }
    ///
    /// let dev = Device::host();
    /// let mut g = Generator::new(0);
    /// let block = Residual {
    ///     a: Linear::new(8, 32, &dev, &mut g)?,
    ///     b: Linear::new(32, 8, &dev, &mut g)?,
    /// };
    /// let model = Sequential::new().with(block).with(Linear::new(8, 2, &dev, &mut g)?);
    /// let y = model.forward(&Tape::no_grad(), &Var::from(Tensor::ones(&[4, 8], DType::F32, &dev)?))?;
    /// assert_eq!(y.shape(), &[4, 2]);
    /// assert_eq!(model.named_parameters()[0].0, "0.a.weight");
    /// # Ok::<(), Error>(())
    /// ```
    pub use netcl_nn::Module;

    /// # Example
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let dev = Device::host();
    /// let mut g = Generator::new(0);
    /// let mut model = Sequential::new()
    ///     .with(Linear::new(4, 8, &dev, &mut g)?)
    ///     .with(ReLU) // runs inside the Linear's GEMM
    ///     .with(Dropout::new(0.1, 7)?)
    ///     .with(Linear::new(8, 3, &dev, &mut g)?);
    /// let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    /// assert_eq!(names, ["0.weight", "0.bias", "3.weight", "3.bias"]);
    /// assert_eq!(model.num_parameters(), 4 * 8 + 8 + 8 * 3 + 3);
    /// model.eval(); // dropout off
    /// let y = model.forward(&Tape::no_grad(), &Var::from(Tensor::ones(&[2, 4], DType::F32, &dev)?))?;
    /// assert_eq!(y.shape(), &[2, 3]);
    /// assert_eq!(model.describe()["layers"][1]["type"], "ReLU");
    /// # Ok::<(), Error>(())
    /// ```
    pub use netcl_nn::Sequential;

    /// # Example
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let dev = Device::host();
    /// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2], &dev)?; // [out, in]
    /// let b = Tensor::from_vec(vec![0.0f32, 0.0, -10.0], &[3], &dev)?;
    /// let layer = Linear::from_weights(w, Some(b))?;
    /// let x = Var::from(Tensor::from_vec(vec![2.0f32, 3.0], &[1, 2], &dev)?);
    /// let y = layer.forward(&Tape::no_grad(), &x)?; // x Wᵀ + b
    /// assert_eq!(y.value().to_vec::<f32>()?, [2.0, 3.0, -5.0]);
    /// // PyTorch's default initialisation, f32:
    /// let fresh = Linear::new(2, 3, &dev, &mut Generator::new(0))?;
    /// assert_eq!(fresh.weight.shape(), &[3, 2]);
    /// # Ok::<(), Error>(())
    /// ```
    pub use netcl_nn::Linear;

    /// # Example
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let dev = Device::host();
    /// let mut g = Generator::new(0);
    /// let params = Conv2dParams { stride: (2, 2), padding: (1, 1), ..Conv2dParams::default() };
    /// let conv = Conv2d::new(3, 8, 3, params, &dev, &mut g)?; // 3 -> 8 channels, 3x3
    /// let x = Var::from(Tensor::randn(&[2, 3, 16, 16], DType::F32, &dev, &mut g)?); // NCHW
    /// let tape = Tape::new();
    /// let y = conv.forward(&tape, &x)?;
    /// assert_eq!(y.shape(), &[2, 8, 8, 8]);
    /// tape.backward(&y.sum_all()?)?;
    /// assert_eq!(conv.weight.grad().unwrap().shape(), &[8, 3, 3, 3]);
    /// # Ok::<(), Error>(())
    /// ```
    pub use netcl_nn::Conv2d;

    /// # Example
    ///
    /// Each optimizer (here SGD with momentum, Adam and AdamW behind `dyn Optimizer`) fits
    /// `w` to a target; `step` updates all parameters of a group in one kernel.
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let dev = Device::host();
    /// let target = Tensor::from_vec(vec![1.0f32, -2.0, 0.5], &[3], &dev)?;
    /// let optimizers: [fn(Vec<Parameter>) -> Box<dyn Optimizer>; 3] = [
    ///     |p| Box::new(Sgd::new(p, 0.1).momentum(0.9)),
    ///     |p| Box::new(Adam::new(p, 0.1)),
    ///     |p| Box::new(AdamW::new(p, 0.1).weight_decay(0.0)),
    /// ];
    /// for make in optimizers {
    ///     let w = Parameter::new(Tensor::zeros(&[3], DType::F32, &dev)?)?;
    ///     let mut opt = make(vec![w.clone()]);
    ///     for _ in 0..200 {
    ///         let tape = Tape::new();
    ///         let loss = mse_loss(&tape.param(&w), &Var::from(&target))?;
    ///         tape.backward(&loss)?;
    ///         opt.step()?;
    ///         opt.zero_grad();
    ///     }
    ///     let got = w.value().to_vec::<f32>()?;
    ///     assert!(got.iter().zip([1.0, -2.0, 0.5]).all(|(a, b)| (a - b).abs() < 1e-2), "{got:?}");
    ///     opt.set_lr(opt.lr() * 0.5); // what the LR schedules do each step
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub use netcl_optim::Optimizer;

    /// Adam; example on [`Optimizer`].
    pub use netcl_optim::Adam;
    /// AdamW; example on [`Optimizer`].
    pub use netcl_optim::AdamW;
    /// SGD (PyTorch's `torch.optim.SGD`); example on [`Optimizer`].
    pub use netcl_optim::Sgd;

    /// Restores what [`save_checkpoint`] saved; example there.
    pub use netcl_nn::load_checkpoint;
    /// # Example
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let dev = Device::host();
    /// let mut g = Generator::new(0);
    /// let model = Sequential::new().with(Linear::new(2, 2, &dev, &mut g)?);
    /// let opt = Sgd::new(model.parameters(), 0.1);
    /// let path = std::env::temp_dir().join(format!("netcl-doc-{}/ckpt", std::process::id()));
    /// save_checkpoint(&path, &model, Some(&opt), 5, serde_json::json!({"note": "hi"}))?;
    ///
    /// let other = Sequential::new().with(Linear::new(2, 2, &dev, &mut Generator::new(1))?);
    /// let info = load_checkpoint(&path, &other, None)?; // checks names, shapes, dtypes, SHA-256
    /// assert_eq!((info.step, info.extra["note"].as_str()), (5, Some("hi")));
    /// let (a, b) = (&model.parameters()[0], &other.parameters()[0]);
    /// assert_eq!(a.value().to_vec::<f32>()?, b.value().to_vec::<f32>()?);
    /// std::fs::remove_dir_all(path.parent().unwrap()).ok();
    /// # Ok::<(), Error>(())
    /// ```
    pub use netcl_nn::save_checkpoint;

    /// Generation with a KV cache; example on [`Llama`].
    pub use netcl_models::generate;
    /// # Example
    ///
    /// A tiny Llama: next-token loss and a gradient step, then greedy generation through the
    /// KV cache.
    ///
    /// ```
    /// use netcl::prelude::*;
    ///
    /// let dev = Device::host();
    /// let mut g = Generator::new(0);
    /// let cfg = LlamaConfig {
    ///     dim: 16, n_layers: 1, n_heads: 2, n_kv_heads: 1, hidden_dim: 32, max_seq_len: 16,
    ///     ..LlamaConfig::llama_15m(32) // llama2.c's 15M shape, vocabulary 32
    /// };
    /// let model = Llama::new(cfg, &dev, &mut g)?;
    /// let ids = Tensor::from_vec(vec![1i32, 5, 9, 2], &[1, 4], &dev)?; // [B, T]
    /// let targets = Tensor::from_vec(vec![5i32, 9, 2, 7], &[1, 4], &dev)?;
    /// let tape = Tape::new();
    /// let loss = model.loss(&tape, &ids, &targets)?;
    /// tape.backward(&loss)?;
    /// let mut opt = AdamW::new(model.trainable_parameters(), 1e-3);
    /// opt.step()?;
    ///
    /// let mut sampler = Sampler::new(Sampling::Greedy, 0)?;
    /// let mut streamed = Vec::new();
    /// let out = generate(&model, &[vec![1, 5]], 6, &mut sampler, None, |_row, t| {
    ///     streamed.push(t);
    ///     Ok(())
    /// })?;
    /// assert_eq!(out[0], streamed);
    /// assert_eq!(out[0].len(), 6);
    /// # Ok::<(), Error>(())
    /// ```
    pub use netcl_models::Llama;
    /// The shape of a [`Llama`] (example there).
    pub use netcl_models::LlamaConfig;
}
