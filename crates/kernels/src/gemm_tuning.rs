//! The GEMM planner's data per device (a tuning entry's `plan`): the tensor-core tilings with their measured costs, the pipelined f32 GEMM's tiles, the CPU kernels' blocking and the thresholds between paths, with the environment's overrides applied once.
use netcl_core_devices::Config;
use serde::{Deserialize, Serialize};

/// matmul_wg.cl's tiling: 128 x `tbn` outputs a work-group, a ring of `stages` K tiles,
/// `persistent` work-groups per compute unit looping over the tiles (0: one work-group per tile),
/// and with `ws` a third warpgroup that only loads the ring while the two others multiply (warp
/// specialisation; otherwise every work-item loads and multiplies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WgTile {
    pub tbn: u32,
    pub stages: u32,
    #[serde(default)]
    pub persistent: u32,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ws: bool,
}

impl WgTile {
    pub const ROWS: usize = 128;

    /// Work-items of a work-group: two warpgroups, three with a loading one.
    pub fn group(self) -> usize {
        if self.ws {
            384
        } else {
            256
        }
    }

    /// Local memory a work-group declares: the stages (128 + tbn rows of 128 bytes each), 1 KiB
    /// to align them, and the loading warpgroup's barriers.
    pub fn shared_bytes(self) -> usize {
        let barriers = if self.ws { 128 } else { 0 };
        self.stages as usize * (Self::ROWS + self.tbn as usize) * 128 + 1024 + barriers
    }

    /// Whether matmul_wg.cl builds this tiling: 64, 128 or 256 columns, 3 to 5 stages (6 with
    /// a loading warpgroup, which takes no persistent loop), within the 227 KiB a Hopper
    /// work-group may declare.
    pub fn valid(self) -> bool {
        let stages = if self.ws { 3..=6 } else { 3..=5 };
        [64, 128, 256].contains(&self.tbn)
            && stages.contains(&self.stages)
            && self.persistent <= 4
            && !(self.ws && self.persistent > 0)
            && self.shared_bytes() <= 227 * 1024
    }

    /// Work-groups to launch for `tiles` output tiles on `compute_units`.
    pub fn groups(self, tiles: usize, compute_units: usize) -> usize {
        match self.persistent {
            0 => tiles,
            p => tiles.min(p as usize * compute_units),
        }
    }

    /// The -D options of the tiling (the work-groups' count is the launch's).
    pub fn options(self) -> String {
        format!(
            "-DTBN={} -DSTAGES={} -DSM90A_SHARED={}{}{}",
            self.tbn,
            self.stages,
            self.shared_bytes(),
            match self.ws {
                true => format!(" -DWS -DSM90A_THREADS={}", self.group()),
                false => String::new(),
            },
            if self.persistent > 0 {
                " -DPERSISTENT"
            } else {
                ""
            }
        )
    }
}

/// What a tensor-core work-group's tile costs, for the planner's model of a product's time:
/// `groups / (compute units x per_cu)` waves (rounded up), each `fixed_us` plus its
/// multiply-adds at `tflops` shared by all the device's concurrent work-groups.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TileCost {
    /// The device's rate with every compute unit busy on such tiles (TFLOP/s).
    pub tflops: f64,
    /// A tile's time besides its multiply-adds: the pipeline's fill and the epilogue (µs).
    pub fixed_us: f64,
    /// Work-groups of this tile one compute unit runs at once.
    pub per_cu: u32,
}

/// A wgmma tiling the planner may choose, and its cost.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct WgChoice {
    pub tile: WgTile,
    pub cost: TileCost,
}

/// An output tile of matmul_async.cl: `tm` x `tn` outputs, `wm` x `wn` a work-item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AsyncTile {
    pub tm: u32,
    pub tn: u32,
    pub wm: u32,
    pub wn: u32,
}

impl AsyncTile {
    /// Work-items of a work-group.
    pub fn group(self) -> usize {
        ((self.tm / self.wm) * (self.tn / self.wn)) as usize
    }
}

/// matmul_async.cl's settings: its pipeline's depth (2 to 5 steps of K in flight), K step (8 or
/// 16), a register cap per work-item (0: none), and its two tiles: `large` where the portable
/// tile stays 128 x 128, `small` for single products too small to fill the device with it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AsyncTuning {
    pub stages: u32,
    pub k_step: u32,
    #[serde(default)]
    pub max_registers: u32,
    pub large: AsyncTile,
    pub small: AsyncTile,
}

impl AsyncTuning {
    /// Whether the pipeline builds: 2-5 stages of 8 or 16 K rows, both operands' padded tiles
    /// (for the larger tile) within OpenCL's 48 KiB of local memory.
    pub fn valid(&self) -> bool {
        let side = self.large.tm.max(self.large.tn) + 4;
        let bytes = self.stages * self.k_step * side * 4 * 2;
        (2..=5).contains(&self.stages) && [8, 16].contains(&self.k_step) && bytes <= 48 * 1024
    }
}

/// matmul_cpu.cl's register blocking: rows and 512-bit vectors of columns per work-item of the
/// NN kernel, rows and columns per work-item of the NT kernel, work-items per work-group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuBlocking {
    pub rm: u32,
    pub nv: u32,
    pub rmt: u32,
    pub rn: u32,
    pub group: u32,
}

/// When a product takes matmul_gemv.cl: at most `max_rows` rows on its few side whose operand
/// has at most `max_few` elements over a K of at most `max_k`; or at most `decode_rows` rows of
/// A against a K-contiguous B at any K (one-token decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkinnyLimits {
    pub max_rows: u32,
    pub max_k: u32,
    pub max_few: u32,
    pub decode_rows: u32,
}

/// When a product splits K (matmul_parts.cl sums the parts): K at least `min_k`, chunks of at
/// least `min_chunk`; the portable kernels split for `waves` work-groups per compute unit where
/// their tiles make fewer than two; tensor-core products split where the cost model says so,
/// with the parts' sum at `parts_gbps` plus `launch_us`. `forced` splits every product whose
/// K it divides (`NETCL_GEMM_SPLIT`, for measurements; 1: none).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitLimits {
    pub min_k: u32,
    pub min_chunk: u32,
    pub waves: u32,
    pub parts_gbps: f64,
    pub launch_us: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced: Option<u32>,
}

/// When an f32 product with both operands K-contiguous copies one of them M- (N-) contiguous for
/// the pipelined kernel: the longer of M and N at least `min_long`, the shorter at least
/// `min_short`, K at least `min_k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyFirst {
    pub min_long: u32,
    pub min_short: u32,
    pub min_k: u32,
}

/// The planner's data for one device. Absent fields take the defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlanTuning {
    /// wgmma tilings the planner chooses among (by cost), where the device runs matmul_wg.cl.
    pub wg: Vec<WgChoice>,
    /// The cost of matmul_tc.cl's tiling (mma.sync).
    pub tc_cost: TileCost,
    /// TF32 products' rate against 16-bit ones' on the same tiles.
    pub tf32_ratio: f64,
    /// wgmma products wider than a band take their tiles in bands of rows of tiles.
    pub raster: bool,
    /// The pipelined f32 GEMM; None: not used.
    pub async_f32: Option<AsyncTuning>,
    /// The CPU kernels (CPU devices); None: CPU devices take the portable kernel.
    pub cpu: Option<CpuBlocking>,
    pub skinny: SkinnyLimits,
    pub split: SplitLimits,
    pub copy_first: CopyFirst,
}

impl Default for PlanTuning {
    /// The H100's calibration (kernels/tuning.json's entry; wgmma tilings apply only where their
    /// probes pass) and the CPU kernels' blocking measured with PoCL on a 2-core AMD EPYC: the
    /// defaults of a device without an entry.
    fn default() -> PlanTuning {
        let cost = |tflops, fixed_us, per_cu| TileCost {
            tflops,
            fixed_us,
            per_cu,
        };
        let wg = |tbn, stages, persistent, ws, c| WgChoice {
            tile: WgTile {
                tbn,
                stages,
                persistent,
                ws,
            },
            cost: c,
        };
        PlanTuning {
            wg: vec![
                wg(256, 4, 0, true, cost(789.3, 9.81, 1)),
                wg(256, 4, 0, false, cost(764.9, 9.52, 1)),
                wg(128, 5, 0, false, cost(651.9, 4.77, 1)),
                wg(128, 3, 0, false, cost(610.8, 9.11, 2)),
                wg(64, 5, 1, false, cost(424.9, 2.28, 1)),
            ],
            tc_cost: cost(317.9, 4.59, 1),
            tf32_ratio: 0.57,
            raster: true,
            async_f32: Some(AsyncTuning {
                stages: 2,
                k_step: 16,
                max_registers: 0,
                large: AsyncTile {
                    tm: 128,
                    tn: 128,
                    wm: 8,
                    wn: 8,
                },
                small: AsyncTile {
                    tm: 64,
                    tn: 64,
                    wm: 8,
                    wn: 4,
                },
            }),
            cpu: Some(CpuBlocking {
                rm: 8,
                nv: 2,
                rmt: 4,
                rn: 4,
                group: 4,
            }),
            skinny: SkinnyLimits {
                max_rows: 16,
                max_k: 2048,
                max_few: 16384,
                decode_rows: 4,
            },
            split: SplitLimits {
                min_k: 1024,
                min_chunk: 256,
                waves: 4,
                parts_gbps: 2500.0,
                launch_us: 4.0,
                forced: None,
            },
            copy_first: CopyFirst {
                min_long: 2048,
                min_short: 128,
                min_k: 64,
            },
        }
    }
}

impl PlanTuning {
    /// This data with the [`Config`]'s overrides, read with the device's tuning and reported on
    /// stderr when malformed: `NETCL_WG_TILE=tbn,stages` (the only wgmma tiling),
    /// `NETCL_GEMM_ASYNC` (`0`: no pipelined f32 GEMM; else `stages[,k step[,registers]]`),
    /// `NETCL_CPU_GEMM` (`0`: CPU devices take the portable kernel; else `rm,nv,rmt,rn,group`),
    /// `NETCL_GEMM_SPLIT=S` (split every product whose K S divides).
    pub fn with_env(mut self) -> PlanTuning {
        let env = Overrides::parse(&Config::get());
        if let Some(t) = env.wg {
            let cost = self
                .wg
                .iter()
                .find(|c| c.tile == t)
                .or(self.wg.first())
                .map_or(self.tc_cost, |c| c.cost);
            self.wg = vec![WgChoice { tile: t, cost }];
        }
        match env.async_f32 {
            Some(None) => self.async_f32 = None,
            Some(Some([stages, k_step, regs])) => {
                if let Some(a) = &mut self.async_f32 {
                    let mut s = AsyncTuning {
                        stages: stages.unwrap_or(a.stages),
                        k_step: k_step.unwrap_or(a.k_step),
                        max_registers: regs.unwrap_or(a.max_registers),
                        ..*a
                    };
                    if !s.valid() {
                        eprintln!(
                            "netcl: NETCL_GEMM_ASYNC ignored (want 0, or stages 2-5, k step 8 or \
                             16 within 48 KiB, registers)"
                        );
                        s = *a;
                    }
                    *a = s;
                }
            }
            None => {}
        }
        match env.cpu {
            Some(None) => self.cpu = None,
            Some(Some(b)) => self.cpu = Some(b),
            None => {}
        }
        if let Some(s) = env.split {
            self.split.forced = Some(s);
        }
        self
    }
}

/// The GEMM planner's overrides from the [`Config`], parsed.
struct Overrides {
    wg: Option<WgTile>,
    /// Some(None): off; Some(Some(fields)): stages, k step, registers (each optional).
    async_f32: Option<Option<[Option<u32>; 3]>>,
    cpu: Option<Option<CpuBlocking>>,
    split: Option<u32>,
}

impl Overrides {
    fn parse(c: &Config) -> Overrides {
        let numbers =
            |v: &str| -> Vec<Option<u32>> { v.split(',').map(|x| x.trim().parse().ok()).collect() };
        let wg = c.wg_tile.clone().and_then(|v| {
            let t = match numbers(&v)[..] {
                [Some(tbn), Some(stages)] => Some((tbn, stages, 0, false)),
                [Some(tbn), Some(stages), Some(p)] => Some((tbn, stages, p, false)),
                [Some(tbn), Some(stages), Some(p), Some(ws @ 0..=1)] => {
                    Some((tbn, stages, p, ws == 1))
                }
                _ => None,
            }
            .map(|(tbn, stages, persistent, ws)| WgTile {
                tbn,
                stages,
                persistent,
                ws,
            });
            let ok = t.filter(|t| t.valid());
            if ok.is_none() {
                eprintln!(
                    "netcl: NETCL_WG_TILE={v} ignored: takes 64, 128 or 256 columns, 3 to 5 stages \
                     (and optionally 0 to 4 persistent work-groups per compute unit, then 1 for \
                     a loading warpgroup: 3 to 6 stages, no persistent work-groups)"
                );
            }
            ok
        });
        let async_f32 = c.gemm_async.clone().map(|v| match numbers(&v)[..] {
            [Some(0)] => None,
            ref f => Some([0, 1, 2].map(|i| f.get(i).copied().flatten())),
        });
        let cpu = c.cpu_gemm.clone().and_then(|v| match numbers(&v)[..] {
            [Some(0)] => Some(None),
            [Some(rm), Some(nv), Some(rmt), Some(rn), Some(group)]
                if rm * nv * rmt * rn * group > 0 =>
            {
                Some(Some(CpuBlocking {
                    rm,
                    nv,
                    rmt,
                    rn,
                    group,
                }))
            }
            _ => {
                eprintln!("netcl: NETCL_CPU_GEMM={v:?} is not rm,nv,rmt,rn,group or 0; ignored");
                None
            }
        });
        Overrides {
            wg,
            async_f32,
            cpu,
            split: c.gemm_split,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse_and_bad_values_are_ignored() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            Overrides::parse(&Config::from_lookup(move |k| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }))
        };
        let o = env(&[
            ("NETCL_WG_TILE", "128, 4"),
            ("NETCL_GEMM_ASYNC", "3"),
            ("NETCL_CPU_GEMM", "0"),
            ("NETCL_GEMM_SPLIT", "4"),
        ]);
        assert_eq!(
            o.wg,
            Some(WgTile {
                tbn: 128,
                stages: 4,
                persistent: 0,
                ws: false
            })
        );
        assert_eq!(o.async_f32, Some(Some([Some(3), None, None])));
        assert_eq!(o.cpu, Some(None));
        assert_eq!(o.split, Some(4));
        let bad = env(&[
            ("NETCL_WG_TILE", "96,4"),
            ("NETCL_GEMM_ASYNC", "0"),
            ("NETCL_CPU_GEMM", "8,2"),
        ]);
        assert_eq!(bad.wg, None);
        assert_eq!(bad.async_f32, Some(None));
        assert_eq!(bad.cpu, None);
        let none = env(&[]);
        assert!(none.wg.is_none() && none.async_f32.is_none() && none.split.is_none());
    }

    #[test]
    fn tilings_check_their_limits() {
        let t = |tbn, stages| WgTile {
            tbn,
            stages,
            persistent: 2,
            ws: false,
        };
        assert!(t(256, 4).valid() && t(64, 5).valid());
        assert!(!t(256, 5).valid() && !t(96, 4).valid());
        assert!(PlanTuning::default().async_f32.unwrap().valid());
        let deep = AsyncTuning {
            stages: 5,
            ..PlanTuning::default().async_f32.unwrap()
        };
        assert!(!deep.valid());
    }
}
