//! The training-step workloads of the bench runner: MLP 784-1024-1024-10 and a small CNN (one Adam step each) and Llama shapes (one AdamW step, and KV-cache generation); benches/reference/torch_bench.py builds the same models.
use netcl_autograd::{Tape, Var};
use netcl_core_devices::{DType, Device, Result};
use netcl_core_memory::Pool;
use netcl_nn::{cross_entropy, Conv2d, Flatten, Linear, MaxPool2d, Module, ReLU, Sequential};
use netcl_ops::{Conv2dParams, Generator, Tensor};
use netcl_optim::{Adam, Optimizer};

/// A model, its optimizer and one fixed batch on a device.
pub struct TrainStep {
    pub model: Sequential,
    pub opt: Adam,
    pub x: Tensor,
    pub y: Tensor,
}

impl TrainStep {
    /// MLP 784-1024-1024-10, batch 256, Adam lr 1e-3.
    pub fn mlp(dev: &Device, gen: &mut Generator) -> Result<TrainStep> {
        let model = Sequential::new()
            .with(Linear::new(784, 1024, dev, gen)?)
            .with(ReLU)
            .with(Linear::new(1024, 1024, dev, gen)?)
            .with(ReLU)
            .with(Linear::new(1024, 10, dev, gen)?);
        TrainStep::new(model, &[256, 784], dev, gen)
    }

    /// conv 1→32 (3x3, pad 1) + ReLU + maxpool 2, conv 32→64 + ReLU + maxpool 2, linear
    /// 3136→128 + ReLU, linear 128→10; batch 128 of 28x28, Adam lr 1e-3.
    pub fn cnn(dev: &Device, gen: &mut Generator) -> Result<TrainStep> {
        let p = Conv2dParams {
            padding: (1, 1),
            ..Default::default()
        };
        let model = Sequential::new()
            .with(Conv2d::new(1, 32, 3, p, dev, gen)?)
            .with(ReLU)
            .with(MaxPool2d::new(2))
            .with(Conv2d::new(32, 64, 3, p, dev, gen)?)
            .with(ReLU)
            .with(MaxPool2d::new(2))
            .with(Flatten)
            .with(Linear::new(64 * 7 * 7, 128, dev, gen)?)
            .with(ReLU)
            .with(Linear::new(128, 10, dev, gen)?);
        TrainStep::new(model, &[128, 1, 28, 28], dev, gen)
    }

    fn new(
        model: Sequential,
        x_shape: &[usize],
        dev: &Device,
        gen: &mut Generator,
    ) -> Result<TrainStep> {
        let x = Tensor::randn(x_shape, DType::F32, dev, gen)?;
        let labels: Vec<i32> = (0..x_shape[0] as i32).map(|i| (i * 7) % 10).collect();
        let y = Tensor::from_vec(labels, &[x_shape[0]], dev)?;
        let opt = Adam::new(model.parameters(), 1e-3);
        Ok(TrainStep { model, opt, x, y })
    }

    /// forward, loss, backward, Adam update, zero_grad (nothing read back).
    pub fn step(&mut self) -> Result<()> {
        let tape = Tape::new();
        let logits = self.model.forward(&tape, &Var::from(&self.x))?;
        let loss = cross_entropy(&logits, &self.y)?;
        tape.backward(&loss)?;
        self.opt.step()?;
        self.opt.zero_grad();
        Ok(())
    }

    /// Driver allocations per step over `steps` steady-state steps (after warm-up).
    pub fn driver_allocations_per_step(&mut self, dev: &Device, steps: usize) -> Result<f64> {
        if dev.is_host() {
            return Ok(0.0);
        }
        let pool = Pool::of(dev)?;
        let before = pool.stats().driver_allocations;
        for _ in 0..steps {
            self.step()?;
        }
        dev.synchronize()?;
        Ok((pool.stats().driver_allocations - before) as f64 / steps as f64)
    }
}

/// A Llama of a given shape with AdamW and one fixed batch of random tokens.
pub struct LlamaStep {
    pub model: netcl_models::Llama,
    pub opt: netcl_optim::AdamW,
    pub x: Tensor,
    pub y: Tensor,
    /// Forward under `autocast` to this dtype (mixed precision; f32 master weights), if set.
    pub autocast: Option<DType>,
}

impl LlamaStep {
    /// `cfg` (vocab, dims) with batch `b` of context `t` (= cfg.max_seq_len), AdamW lr 3e-4 over
    /// every parameter, or over LoRA adapters only when `lora` is given.
    pub fn new(
        cfg: netcl_models::LlamaConfig,
        b: usize,
        lora: Option<&netcl_nn::LoraConfig>,
        dev: &Device,
        gen: &mut Generator,
    ) -> Result<LlamaStep> {
        let mut model = netcl_models::Llama::new(cfg, dev, gen)?;
        if let Some(l) = lora {
            model.add_lora(l, gen)?;
        }
        LlamaStep::from_model(model, b, dev)
    }

    /// `model` (its trainable parameters under AdamW lr 3e-4) with batch `b` of context
    /// `t` (= its max_seq_len) of fixed random tokens on `dev`.
    pub fn from_model(model: netcl_models::Llama, b: usize, dev: &Device) -> Result<LlamaStep> {
        let t = model.config.max_seq_len;
        let v = model.config.vocab_size as u64;
        let mut s = 11u64;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % v) as i32
        };
        let tokens: Vec<i32> = (0..b * (t + 1)).map(|_| next()).collect();
        let x: Vec<i32> = (0..b)
            .flat_map(|r| tokens[r * (t + 1)..r * (t + 1) + t].to_vec())
            .collect();
        let y: Vec<i32> = (0..b)
            .flat_map(|r| tokens[r * (t + 1) + 1..(r + 1) * (t + 1)].to_vec())
            .collect();
        let opt = netcl_optim::AdamW::new(model.trainable_parameters(), 3e-4).weight_decay(0.1);
        Ok(LlamaStep {
            x: Tensor::from_vec(x, &[b, t], dev)?,
            y: Tensor::from_vec(y, &[b, t], dev)?,
            model,
            opt,
            autocast: None,
        })
    }

    /// forward (under autocast when set), loss, backward, AdamW update, zero_grad (nothing read
    /// back).
    pub fn step(&mut self) -> Result<()> {
        let tape = Tape::new();
        let loss = match self.autocast {
            Some(dt) => netcl_autograd::autocast(dt, || self.model.loss(&tape, &self.x, &self.y))??,
            None => self.model.loss(&tape, &self.x, &self.y)?,
        };
        tape.backward(&loss)?;
        self.opt.step()?;
        self.opt.zero_grad();
        Ok(())
    }
}
