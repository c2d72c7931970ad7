//! The `mma_peak` suite of netcl-bench: mma.sync throughput with operands in registers (crates/bench/kernels/mma_peak.cl), the ceiling for matmul_tc.cl, on devices whose tensor-core probe passed.
use crate::Runner;
use netcl_core_devices::{DType, Result};
use netcl_kernels::{program, Kernel, Source, Use};
use netcl_ops::{has_tensor_cores, Tensor, TensorCoreKind};

const MMA_PEAK: Source = Source {
    name: "mma_peak.cl",
    text: include_str!("../../../kernels/mma_peak.cl"),
    kernels: netcl_kernels::kernels![mma_peak(out: Use::Out, iters: Use::Value("uint"))],
};

impl Runner {
    /// TF/s of back-to-back mma.sync (8 independent chains per warp, 8 warps per work-group,
    /// 8 work-groups per compute unit) for each tensor-core kind the device has.
    pub(crate) fn mma_peak(&mut self) -> Result<()> {
        let kinds = [
            (TensorCoreKind::Bf16, DType::BF16, "-DTC_BF16", 4096.0),
            (TensorCoreKind::F16, DType::F16, "-DTC_F16", 4096.0),
            (TensorCoreKind::Tf32, DType::F32, "-DTC_TF32", 2048.0),
        ];
        let cus = self.dev.info().compute_units as usize;
        let (group, iters) = (256usize, 4096u32);
        let items = cus * 8 * group;
        let out = Tensor::zeros(&[items], DType::F32, &self.dev)?;
        for (kind, dtype, define, flops_per_mma) in kinds {
            if !has_tensor_cores(&self.dev, kind) {
                println!("mma_peak     {kind:?}: no tensor cores on {}", self.dev);
                continue;
            }
            let options = format!("{} {define}", dtype.build_option());
            let prog = program(&self.dev, &MMA_PEAK, &options)?;
            let warps = (items / 32) as f64;
            let flops = warps * iters as f64 * 8.0 * flops_per_mma;
            self.measure(
                "mma_peak",
                format!("mma_sync_{kind:?}"),
                (0.0, flops, 1),
                || {
                    let mut k = Kernel::new(&prog, "mma_peak")?;
                    k.arg_mem(out.mem()?)?.arg(&iters)?;
                    k.launch(&[items], &[group])
                },
            )?;
        }
        Ok(())
    }
}
