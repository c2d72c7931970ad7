//! A product on an OpenCL device: its problem, the device's capabilities, the plan (printed once under `NETCL_DEBUG=gemm`), and the plan carried out: operand copies, the kernel's launch, the split's sum and the widening.
use super::plan::{plan, DeviceCaps, GemmKernel, GemmPlan, GemmProblem, Operand, OperandLayout};
use super::precision::{device_float32_matmul_precision, MatmulPrecision};
use super::{
    matmul_async, matmul_cpu, matmul_gemv, matmul_parts, matmul_tc, matmul_tiled, matmul_wg,
};
use super::{Matmul, Product};
use crate::base::layout::{check_reach, contiguous_strides, numel, KernelLayout};
use crate::base::tensor::Tensor;
use crate::fused::activation::Activation;
use netcl_core_devices::{debug, DType, Device, Error, Result};
use netcl_kernels::tuning_generation;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

/// The product of `desc` on the OpenCL device `device`, as its plan says.
pub(super) fn matmul(desc: &Matmul<'_>, device: &Device) -> Result<Product> {
    let problem = problem_of(desc, device);
    let plan = cached_plan(device, problem)?;
    execute(&plan, desc, device)
}

/// The plan of `problem` on `device`, made once per device, problem and tuning (a product's
/// host cost is its kernel launches; a training step repeats the same problems), printed when
/// made under `NETCL_DEBUG=gemm`.
fn cached_plan(device: &Device, problem: GemmProblem) -> Result<GemmPlan> {
    type Plans = HashMap<(usize, GemmProblem), (u64, GemmPlan)>;
    static PLANS: OnceLock<Mutex<Plans>> = OnceLock::new();
    let generation = tuning_generation();
    let plans = PLANS.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (device.ordinal(), problem);
    if let Some((g, p)) = plans.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        if *g == generation {
            return Ok(p.clone());
        }
    }
    let problem = &key.1;
    let made = plan(&DeviceCaps::of(device, problem), problem);
    if debug::gemm_plans()? {
        print_once(device, problem, &made);
    }
    let mut plans = plans.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded: a run of ever new shapes (generation at growing lengths) plans them again.
    if plans.len() >= 4096 {
        plans.clear();
    }
    plans.insert(key, (generation, made.clone()));
    Ok(made)
}

/// The planner's view of `desc` on `device`. Offsets are kept modulo 16 elements: plans depend on
/// their alignment only, and views at other offsets (a head, a chunk) then share a cached plan.
pub(super) fn problem_of(desc: &Matmul<'_>, device: &Device) -> GemmProblem {
    let (m, k, n) = desc.dims;
    let (a, b) = (&desc.a, &desc.b);
    let (na, nb) = (a.ndim(), b.ndim());
    let out_dtype = desc.opts.out_dtype.unwrap_or(a.dtype);
    GemmProblem {
        m,
        n,
        k,
        batch: desc.batch.clone(),
        a: OperandLayout {
            strides: [a.strides[na - 2], a.strides[na - 1]],
            batch_strides: desc.sa.clone(),
            offset: a.offset % 16,
        },
        b: OperandLayout {
            strides: [b.strides[nb - 2], b.strides[nb - 1]],
            batch_strides: desc.sb.clone(),
            offset: b.offset % 16,
        },
        dtype: a.dtype,
        out_dtype,
        tf32: a.dtype == DType::F32
            && !device.is_host()
            && device_float32_matmul_precision(device) == MatmulPrecision::High,
        bias: desc.opts.bias.is_some(),
        activation: desc.opts.activation.0.is_some(),
        row_sums: desc.row_sums,
        tile: desc.opts.tile,
        tc_tile: desc.opts.tc_tile,
        wg_tile: desc.opts.wg_tile,
    }
}

/// `NETCL_DEBUG=gemm`: one line on stderr for each (device, problem, plan) not printed yet.
fn print_once(device: &Device, problem: &GemmProblem, plan: &GemmPlan) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let line = format!("netcl gemm on {device}: {problem}: {plan}");
    let seen = SEEN.get_or_init(|| Mutex::new(HashSet::new()));
    if seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(line.clone())
    {
        eprintln!("{line}");
    }
}

/// One kernel launch of a product: `out (batch, M, N) = act(a x b + bias)`, a (..., M, K) and b
/// (..., K, N) at any strides, their strides over the (broadcast) `batch` dims `batch_strides`.
pub(super) struct Gemm<'a> {
    pub out: &'a Tensor,
    pub a: &'a Tensor,
    pub b: &'a Tensor,
    pub batch: &'a [usize],
    pub batch_strides: [&'a [usize]; 2],
    pub bias: Option<&'a Tensor>,
    pub activation: Activation,
    /// `MatmulOptions::lower`.
    pub lower: Option<isize>,
    /// Where the kernel writes A's row sums (M, one batch), when its plan adds them up.
    pub row_sums: Option<&'a Tensor>,
}

impl<'a> Gemm<'a> {
    /// `out = a x b` of one 2-D product, no epilogue (the probes' products).
    pub fn plain(out: &'a Tensor, a: &'a Tensor, b: &'a Tensor) -> Gemm<'a> {
        Gemm {
            out,
            a,
            b,
            batch: &[],
            batch_strides: [&[], &[]],
            bias: None,
            activation: Activation::None,
            lower: None,
            row_sums: None,
        }
    }

    /// (M, K, N).
    pub fn dims(&self) -> (usize, usize, usize) {
        let (na, nb) = (self.a.ndim(), self.b.ndim());
        (
            self.a.shape[na - 2],
            self.a.shape[na - 1],
            self.b.shape[nb - 1],
        )
    }

    /// `[sam, sak, sbk, sbn]`.
    pub fn strides(&self) -> [usize; 4] {
        let (na, nb) = (self.a.ndim(), self.b.ndim());
        [
            self.a.strides[na - 2],
            self.a.strides[na - 1],
            self.b.strides[nb - 2],
            self.b.strides[nb - 1],
        ]
    }

    pub fn batches(&self) -> usize {
        numel(self.batch)
    }

    /// The batch layout of out (contiguous), a and b, with the operands' offsets.
    pub fn layout(&self) -> Result<KernelLayout> {
        let (m, _, n) = self.dims();
        let so: Vec<usize> = contiguous_strides(self.batch)
            .iter()
            .map(|s| s * m * n)
            .collect();
        KernelLayout::new(
            "matmul",
            self.batch,
            &[
                (&so, 0),
                (self.batch_strides[0], self.a.offset),
                (self.batch_strides[1], self.b.offset),
            ],
        )
    }
}

/// Launches `kernel` for `g`.
pub(super) fn launch(kernel: &GemmKernel, g: &Gemm<'_>) -> Result<()> {
    match kernel {
        GemmKernel::Host => Err(Error::invalid(
            "matmul",
            "the host reference has no kernel to launch",
        )),
        GemmKernel::Cpu { path, blocking } => matmul_cpu::launch(*path, *blocking, g),
        GemmKernel::Gemv(v) => matmul_gemv::launch(v, g),
        GemmKernel::Tiled { tile, k4, strip } => matmul_tiled::launch(tile, *k4, strip, g),
        GemmKernel::Async {
            tile,
            staging,
            strip,
        } => matmul_async::launch(tile, *staging, strip, g),
        GemmKernel::MmaSync { kind, tile, a, b } => matmul_tc::launch(*kind, tile, [*a, *b], g),
        GemmKernel::Wgmma {
            kind,
            tile,
            raster,
            a,
            b,
        } => matmul_wg::launch(*kind, *tile, *raster, [*a, *b], g),
    }
}

/// Carries out `plan` for `desc`.
fn execute(plan: &GemmPlan, desc: &Matmul<'_>, device: &Device) -> Result<Product> {
    let op = "matmul";
    let Matmul {
        a, b, batch, opts, ..
    } = desc;
    let (m, k, n) = desc.dims;
    let shape = desc.out_shape();
    let wanted = opts.out_dtype.unwrap_or(a.dtype);
    let (out_dtype, narrow_bias) = match plan.widen {
        true => (a.dtype, opts.bias.map(|t| t.to_dtype(a.dtype)).transpose()?),
        false => (wanted, None),
    };
    let bias = narrow_bias.as_ref().or(opts.bias);
    // The kernels read the bias densely from its buffer's start: a view (one projection's piece
    // of biases joined in one tensor) is copied first.
    let dense_bias = bias.map(crate::base::host::dense).transpose()?;
    let bias = dense_bias.as_ref();
    let nd = a.ndim();
    let (a, b, sa, sb) = match plan.copy {
        Some(which) => {
            // A single product: the batch dims are all 1, so the copy's strides over them are 0.
            let zeros = vec![0; batch.len()];
            let (a, b) = match which {
                Operand::A => (
                    a.transpose(nd - 2, nd - 1)?
                        .contiguous()?
                        .transpose(nd - 2, nd - 1)?,
                    b.clone(),
                ),
                Operand::B => (a.clone(), b.contiguous()?),
            };
            (a, b, zeros.clone(), zeros)
        }
        None => (a.clone(), b.clone(), desc.sa.clone(), desc.sb.clone()),
    };
    check_fits(op, &a, &b, &shape)?;
    let out = Tensor::alloc(&shape, out_dtype, device)?;
    let sums = plan
        .row_sums
        .then(|| Tensor::alloc(&[m], a.dtype, device))
        .transpose()?;
    match plan.split {
        None => launch(
            &plan.kernel,
            &Gemm {
                out: &out,
                a: &a,
                b: &b,
                batch,
                batch_strides: [&sa, &sb],
                bias,
                activation: opts.activation,
                lower: opts.lower,
                row_sums: sums.as_ref(),
            },
        )?,
        Some(split) => {
            // The chunks as one batched product over strided views, then their sum.
            let s = split.chunks;
            let kc = k / s;
            let (sam, sak) = (a.strides[nd - 2], a.strides[nd - 1]);
            let nb = b.ndim();
            let (sbk, sbn) = (b.strides[nb - 2], b.strides[nb - 1]);
            let av = a.view_of(vec![s, m, kc], vec![kc * sak, sam, sak], a.offset);
            let bv = b.view_of(vec![s, kc, n], vec![kc * sbk, sbk, sbn], b.offset);
            let parts_dtype = if split.f32_parts {
                DType::F32
            } else {
                out_dtype
            };
            let parts = Tensor::alloc(&[s, m, n], parts_dtype, device)?;
            launch(
                &plan.kernel,
                &Gemm {
                    out: &parts,
                    a: &av,
                    b: &bv,
                    batch: &[s],
                    batch_strides: [&[kc * sak], &[kc * sbk]],
                    bias: None,
                    activation: Activation::None,
                    lower: None,
                    row_sums: None,
                },
            )?;
            matmul_parts::launch(&out, &parts, bias, opts.activation, &split)?;
        }
    }
    let out = match plan.widen {
        true => out.to_dtype(wanted)?,
        false => out,
    };
    Ok((out, sums))
}

/// Error naming the operands when an element of A, B or the product lies past the 32-bit
/// kernel index.
fn check_fits(op: &str, a: &Tensor, b: &Tensor, out: &[usize]) -> Result<()> {
    let too_far = || {
        Error::shape(
            op,
            format!(
                "{:?} x {:?} reaches past the 32-bit kernel index",
                a.shape, b.shape
            ),
        )
    };
    // The operands' own dims: the batch dims they are broadcast over add nothing to their reach.
    for t in [a, b] {
        check_reach(op, &t.shape, &t.strides, t.offset).map_err(|_| too_far())?;
    }
    if numel(out) > u32::MAX as usize {
        return Err(too_far());
    }
    Ok(())
}

/// The plan of a product of `a` and `b` with `opts` on their device (`Tensor::matmul_plan`).
pub(super) fn plan_of(desc: &Matmul<'_>, device: &Device) -> GemmPlan {
    let problem = problem_of(desc, device);
    plan(&DeviceCaps::of(device, &problem), &problem)
}
