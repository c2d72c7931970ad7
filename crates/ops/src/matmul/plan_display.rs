//! The planner's one-line forms: a problem (`512x768x768 bf16->f32 A k-major B mn-major`) and a plan (`matmul_wg Bf16 128x256 (4 stages), A KRows, B Mn`), as `NETCL_DEBUG=gemm` prints them.
use super::plan::{GemmKernel, GemmPlan, GemmProblem, OperandLayout, Strip};
use netcl_kernels::GemmTile;
use std::fmt;

impl fmt::Display for GemmProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |l: &OperandLayout, k_dim: usize| match (l.strides[k_dim], l.strides[1 - k_dim])
        {
            (1, _) => "k",
            (_, 1) => "mn",
            _ => "strided",
        };
        write!(f, "{}x{}x{}", self.m, self.n, self.k)?;
        if !self.batch.is_empty() {
            write!(f, " batch {:?}", self.batch)?;
        }
        write!(
            f,
            " {}->{} A {}-major B {}-major",
            self.dtype,
            self.out_dtype,
            side(&self.a, 1),
            side(&self.b, 0)
        )?;
        for (on, what) in [
            (self.tf32, " tf32"),
            (self.bias, " +bias"),
            (self.activation, " +act"),
            (self.row_sums, " +row sums"),
        ] {
            if on {
                f.write_str(what)?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for GemmPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.widen {
            f.write_str("widened after ")?;
        }
        if let Some(c) = self.copy {
            write!(f, "copy {c:?} mn-contiguous, then ")?;
        }
        if let Some(s) = self.split {
            let parts = if s.f32_parts { " f32" } else { "" };
            write!(f, "split K in {}{parts} parts of ", s.chunks)?;
        }
        write!(f, "{}", self.kernel)?;
        if self.split.is_some() {
            f.write_str(", summed by matmul_parts")?;
        }
        if self.row_sums {
            f.write_str(", with row sums")?;
        }
        Ok(())
    }
}

impl fmt::Display for GemmKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tile = |t: &GemmTile| format!("{}x{}x{}/{}x{}", t.bm, t.bn, t.bk, t.wm, t.wn);
        let k4 = |k: &[bool; 2]| match k {
            [true, true] => " (A, B in runs of 4)",
            [true, false] => " (A in runs of 4)",
            [false, true] => " (B in runs of 4)",
            _ => "",
        };
        let strip = |s: &Option<Strip>| match s {
            Some(s) => format!(
                ", columns {}.. matmul_tiled {}{}",
                s.col,
                tile(&s.tile),
                k4(&s.k4)
            ),
            None => String::new(),
        };
        match self {
            GemmKernel::Host => f.write_str("host reference"),
            GemmKernel::Cpu { path, blocking } => write!(
                f,
                "matmul_cpu {path:?} ({}x{} vectors, NT {}x{}, groups of {})",
                blocking.rm, blocking.nv, blocking.rmt, blocking.rn, blocking.group
            ),
            GemmKernel::Gemv(g) => write!(
                f,
                "matmul_gemv{} {} rows of {} x {} columns, team {}{}",
                if g.r <= 4 { 4 } else { 16 },
                g.r,
                if g.rows_of_a { "A" } else { "Bᵀ" },
                g.j,
                g.team,
                if g.kmajor { ", k-major" } else { "" }
            ),
            GemmKernel::Tiled {
                tile: t,
                k4: k,
                strip: s,
            } => {
                write!(f, "matmul_tiled {}{}{}", tile(t), k4(k), strip(s))
            }
            GemmKernel::Async {
                tile: t,
                staging,
                strip: s,
            } => write!(
                f,
                "matmul_async {}x{}/{}x{} (A {:?}, B {:?}){}",
                t.tm,
                t.tn,
                t.wm,
                t.wn,
                staging[0],
                staging[1],
                strip(s)
            ),
            GemmKernel::MmaSync {
                kind,
                tile: t,
                a,
                b,
            } => write!(
                f,
                "matmul_tc {kind:?} {}x{} ({}x{} warps, kw {}, stages {}), A {a:?}, B {b:?}",
                t.rows(),
                t.cols(),
                t.warps_m,
                t.warps_n,
                t.kw,
                t.stages
            ),
            GemmKernel::Wgmma {
                kind,
                tile: t,
                raster,
                a,
                b,
            } => {
                write!(f, "matmul_wg {kind:?} 128x{} ({} stages", t.tbn, t.stages)?;
                if t.persistent > 0 {
                    write!(f, ", {} persistent a unit", t.persistent)?;
                }
                if t.ws {
                    write!(f, ", a loading warpgroup")?;
                }
                if *raster > 0 {
                    write!(f, ", bands of {raster}")?;
                }
                write!(f, "), A {a:?}, B {b:?}")
            }
        }
    }
}
