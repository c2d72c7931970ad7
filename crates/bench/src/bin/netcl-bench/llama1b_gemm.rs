//! netcl-bench --suite llama1b_gemm: every product of a 1B-class Llama training step under bf16 autocast (dim 2048, 4 key/value heads of 64, SwiGLU 5632, vocabulary 32000), at 8192 and 16384 tokens, with the plan each takes; --suite lora1b_gemm: the rank-16 adapters' products of its LoRA step.
use super::Runner;
use netcl_core_devices::{DType, Result};
use netcl_ops::{MatmulOptions, Tensor};

impl Runner {
    /// Forward `x·Wᵀ` (nt, bf16 out; the LM head f32 out), input gradient `dY·W` (nn, bf16 out)
    /// and weight gradient `dYᵀ·X` (tn, f32 out: the master weights' gradient), named
    /// `llama1b_gemm_{layout}_{M}x{N}x{K}`; benches/reference/torch_bench.py times the same.
    pub(crate) fn llama1b_gemm(&mut self) -> Result<()> {
        let (dim, kv, hidden, vocab) = (2048, 256, 5632, 32000);
        // (out, in) of each linear: q and o, k and v, gate and up, down, the LM head.
        let linears = [
            (dim, dim),
            (kv, dim),
            (hidden, dim),
            (dim, hidden),
            (vocab, dim),
        ];
        for t in [8192, 16384] {
            for (out, inn) in linears {
                let head = out == vocab;
                for (layout, m, n, k, f32_out) in [
                    ("nt", t, out, inn, head),
                    ("nn", t, inn, out, false),
                    ("tn", out, inn, t, true),
                ] {
                    self.bf16_product(layout, (m, n, k), f32_out)?;
                }
            }
        }
        Ok(())
    }

    /// The products of a rank-16 LoRA adapter on each linear of the 1B-class step at 8192 tokens
    /// (bf16 autocast; the adapters' gradients in f32): h = x·Aᵀ and u = h·Bᵀ (nt), dh = dU·B and
    /// dx = dh·A (nn), dB = dUᵀ·h and dA = dhᵀ·x (tn).
    pub(crate) fn lora1b_gemm(&mut self) -> Result<()> {
        let (t, r) = (8192, 16);
        for (out, inn) in [(2048, 2048), (256, 2048), (5632, 2048), (2048, 5632)] {
            for (layout, m, n, k, f32_out) in [
                ("nt", t, r, inn, false),
                ("nt", t, out, r, false),
                ("nn", t, r, out, false),
                ("nn", t, inn, r, false),
                ("tn", out, r, t, true),
                ("tn", r, inn, t, true),
            ] {
                self.bf16_product(layout, (m, n, k), f32_out)?;
            }
        }
        Ok(())
    }

    /// Times one bf16 product `layout` (nt: B = Wᵀ of a row-major W; tn: A = Yᵀ of a row-major
    /// Y) of (m, n, k), written in f32 where `f32_out`.
    fn bf16_product(
        &mut self,
        layout: &str,
        (m, n, k): (usize, usize, usize),
        f32_out: bool,
    ) -> Result<()> {
        let bf16 = |r: &mut Runner, shape: &[usize]| r.randn(shape)?.to_dtype(DType::BF16);
        let a: Tensor = match layout {
            "tn" => bf16(self, &[k, m])?.transpose(0, 1)?,
            _ => bf16(self, &[m, k])?,
        };
        let b: Tensor = match layout {
            "nt" => bf16(self, &[n, k])?.transpose(0, 1)?,
            _ => bf16(self, &[k, n])?,
        };
        let opts = MatmulOptions {
            out_dtype: f32_out.then_some(DType::F32),
            ..Default::default()
        };
        let suffix = if f32_out { "_f32" } else { "" };
        let name = format!("llama1b_gemm_{layout}_{m}x{n}x{k}{suffix}");
        println!("  plan: {}", a.matmul_plan(&b, opts)?);
        let flops = 2.0 * (m * n * k) as f64;
        self.measure("llama1b_gemm", name, (0.0, flops, 1), || {
            a.matmul_with(&b, opts).map(|_| ())
        })
    }
}
