//! The GEMM planner: a pure function of a device's capabilities and a product that names the kernel, its tile, split and operand staging (`plan`); the tensor-core choice and its cost model are in plan_tc.rs, the one-line forms in plan_display.rs.
use super::precision::TensorCoreKind;
use netcl_core_devices::DType;
use netcl_kernels::{AsyncTile, CpuBlocking, GemmTile, PlanTuning, TcTile, WgChoice, WgTile};
use std::sync::Arc;

use super::plan_tc::tensor_core;
pub use super::plan_tc::{tc_time, tiles_time};

/// What the planner knows of a device: its kind and limits, which PTX kernels passed their
/// probes, and its tuning data. `DeviceCaps::of` reads it off a device; tests write it out.
#[derive(Clone, Debug)]
pub struct DeviceCaps {
    /// The host device: products run the host reference.
    pub host: bool,
    /// A CPU OpenCL device (matmul_cpu.cl).
    pub cpu: bool,
    pub compute_units: usize,
    pub max_work_group: usize,
    pub local_mem_bytes: u64,
    /// Tensor-core kinds whose mma.sync kernel (matmul_tc.cl) passed its probe.
    pub mma_sync: KindSet,
    /// The wgmma tilings (matmul_wg.cl, of `tuning.wg`) that passed their probes, per kind.
    pub wgmma: Vec<(TensorCoreKind, WgChoice)>,
    /// matmul_async.cl's `tuning.async_f32` tiles (large, small) that passed their probes.
    pub async_tiles: [bool; 2],
    /// The portable kernel's tile and the mma.sync tiling in force.
    pub tile: GemmTile,
    pub tc_tile: TcTile,
    pub tuning: Arc<PlanTuning>,
}

/// A set of tensor-core kinds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindSet(u8);

impl KindSet {
    pub const NONE: KindSet = KindSet(0);
    pub const ALL: KindSet = KindSet(7);

    fn bit(kind: TensorCoreKind) -> u8 {
        match kind {
            TensorCoreKind::Tf32 => 1,
            TensorCoreKind::Bf16 => 2,
            TensorCoreKind::F16 => 4,
        }
    }

    pub fn with(self, kind: TensorCoreKind, on: bool) -> KindSet {
        KindSet(if on {
            self.0 | Self::bit(kind)
        } else {
            self.0 & !Self::bit(kind)
        })
    }

    pub fn has(self, kind: TensorCoreKind) -> bool {
        self.0 & Self::bit(kind) != 0
    }
}

/// One operand's layout: the strides of its two matrix dims (A: M, K; B: K, N), its strides over
/// the product's (broadcast) batch dims, and its offset, all in elements.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OperandLayout {
    pub strides: [usize; 2],
    pub batch_strides: Vec<usize>,
    pub offset: usize,
}

impl OperandLayout {
    /// Whether the offset and every stride but the one `along` (0 or 1) are multiples of `q`.
    pub(super) fn aligned_but(&self, along: usize, q: usize) -> bool {
        self.offset.is_multiple_of(q)
            && self.strides[1 - along].is_multiple_of(q)
            && self.batch_strides.iter().all(|s| s.is_multiple_of(q))
    }
}

/// A product `act(A x B + bias)` as the planner sees it: A (batch, M, K), B (batch, K, N).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmProblem {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: Vec<usize>,
    pub a: OperandLayout,
    pub b: OperandLayout,
    pub dtype: DType,
    pub out_dtype: DType,
    /// f32 products may run on TF32 tensor cores (`MatmulPrecision::High` on the device).
    pub tf32: bool,
    pub bias: bool,
    pub activation: bool,
    /// A's row sums over K are wanted beside the product.
    pub row_sums: bool,
    /// The autotuner's forced portable tile, mma.sync tiling or wgmma tiling.
    pub tile: Option<GemmTile>,
    pub tc_tile: Option<TcTile>,
    pub wg_tile: Option<WgTile>,
}

impl GemmProblem {
    pub(super) fn batches(&self) -> usize {
        self.batch.iter().product()
    }
}

/// What a product runs.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmPlan {
    /// Computed in the operands' dtype, then widened to the output's (devices whose kernels
    /// cannot write the wider dtype).
    pub widen: bool,
    /// An f32 operand copied M- (N-) contiguous first, so the pipelined kernel reads it 16 bytes
    /// at a time.
    pub copy: Option<Operand>,
    /// K in chunks: the kernel writes the chunks' products, matmul_parts.cl sums them with the
    /// epilogue.
    pub split: Option<Split>,
    pub kernel: GemmKernel,
    /// The kernel also adds up A's rows (else they are summed apart, where wanted).
    pub row_sums: bool,
}

/// One operand of a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    A,
    B,
}

/// A split of K into `chunks` equal chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub chunks: usize,
    /// The parts are f32 (tensor cores' sums of 16-bit operands, which 16-bit parts would round).
    pub f32_parts: bool,
    /// Work-items sharing one output of the parts' sum (a power of two up to 32).
    pub team: usize,
}

/// The kernel of a plan and its settings; each variant is launched by the file named like its
/// kernel (matmul_tiled.rs, matmul_gemv.rs, ...).
#[derive(Clone, Debug, PartialEq)]
pub enum GemmKernel {
    /// The host reference.
    Host,
    /// matmul_cpu.cl (CPU OpenCL devices).
    Cpu {
        path: CpuPath,
        blocking: CpuBlocking,
    },
    /// matmul_gemv.cl: a few rows against many.
    Gemv(Gemv),
    /// matmul_tiled.cl in `tile`, its columns past `strip.col` in a narrower tile.
    Tiled {
        tile: GemmTile,
        k4: [bool; 2],
        strip: Option<Strip>,
    },
    /// matmul_async.cl in `tile` (f32), its columns past `strip.col` through matmul_tiled.cl.
    Async {
        tile: AsyncTile,
        staging: [Staging; 2],
        strip: Option<Strip>,
    },
    /// matmul_tc.cl (mma.sync).
    MmaSync {
        kind: TensorCoreKind,
        tile: TcTile,
        a: TcOperand,
        b: TcOperand,
    },
    /// matmul_wg.cl (wgmma), its tiles taken in bands of `raster` rows of tiles (0: row by row).
    Wgmma {
        kind: TensorCoreKind,
        tile: WgTile,
        raster: u32,
        a: TcOperand,
        b: TcOperand,
    },
}

/// How matmul_cpu.cl computes a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuPath {
    /// B copied into column panels, then the NN kernel (any strides).
    Packed,
    /// The NN kernel on B itself (`sbn == 1`): one block row of A, where packing would copy all
    /// of B to read it once.
    Nn,
    /// Vectors of partial dot products (`sak == sbk == 1`), for one block row of A.
    Nt,
}

/// A product for matmul_gemv.cl: `r` rows of a few-row operand F against the `j` columns of G,
/// each work-item reading G once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemv {
    /// F = A and G = B (M is the few side); else F = Bᵀ and G = Aᵀ (N is).
    pub rows_of_a: bool,
    pub r: usize,
    pub j: usize,
    /// F's (row, k) and G's (k, column) strides.
    pub strides: [usize; 4],
    /// G's K is contiguous (or neither of its dims is): a column's team are adjacent
    /// work-items; else adjacent columns are.
    pub kmajor: bool,
    /// Work-items per column.
    pub team: usize,
}

/// Columns `col..` of a tiled product in a narrower tile of matmul_tiled.cl.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strip {
    pub col: usize,
    pub tile: GemmTile,
    pub k4: [bool; 2],
}

/// How matmul_async.cl copies an operand into its tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// 16 bytes at a time along M (N).
    Vec,
    /// 4 bytes at a time, consecutive work-items along K.
    NarrowK,
    /// 4 bytes at a time, consecutive work-items along M (N).
    Narrow,
}

/// How a tensor-core kernel reads an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcOperand {
    /// As it lies: rows along K, contiguous and 16-byte aligned.
    KRows,
    /// As it lies: M- (A) or N-contiguous (B), read transposed (16-bit operands).
    Mn,
    /// A contiguous copy with K rows.
    Copy,
    /// A copy with K rows zero-padded to `kp` elements (a multiple of 16 bytes).
    Pad(usize),
}

/// The plan for `p` on a device with capabilities `caps`.
pub fn plan(caps: &DeviceCaps, p: &GemmProblem) -> GemmPlan {
    let host = GemmPlan {
        widen: p.out_dtype != p.dtype,
        copy: None,
        split: None,
        kernel: GemmKernel::Host,
        row_sums: false,
    };
    if caps.host {
        return host;
    }
    let tc = tensor_core_kind(caps, p);
    let widen = p.out_dtype != p.dtype && tc.is_none();
    let mut p = p.clone();
    if widen {
        p.out_dtype = p.dtype;
    }
    let copy = copy_first(caps, &p, tc.is_some());
    if let Some(which) = copy {
        p = copied(&p, which);
    }
    let (kernel, split, row_sums) = kernel_for(caps, &p, tc);
    GemmPlan {
        widen,
        copy,
        split,
        kernel,
        row_sums,
    }
}

/// The tensor-core kind `p` runs on, if any: none under a forced portable tile.
fn tensor_core_kind(caps: &DeviceCaps, p: &GemmProblem) -> Option<TensorCoreKind> {
    let kind = match p.dtype {
        DType::F32 if p.tf32 => TensorCoreKind::Tf32,
        DType::BF16 => TensorCoreKind::Bf16,
        DType::F16 => TensorCoreKind::F16,
        _ => return None,
    };
    (p.tile.is_none() && caps.mma_sync.has(kind)).then_some(kind)
}

/// The operand an f32 product copies M- (N-) contiguous before the pipeline takes it, when both
/// are K-contiguous (x Wᵀ): the pipeline would read both 4 bytes at a time, and the portable
/// kernel runs behind the pipeline's 16-byte copies. The smaller one (B where n <= m), for
/// products where the copy costs a few percent of the product (`tuning.copy_first`).
fn copy_first(caps: &DeviceCaps, p: &GemmProblem, tc: bool) -> Option<Operand> {
    let c = caps.tuning.copy_first;
    let worth = p.m.max(p.n) >= c.min_long as usize
        && p.m.min(p.n) >= c.min_short as usize
        && p.k >= c.min_k as usize;
    let k_contiguous = p.a.strides[1] == 1 && p.b.strides[0] == 1;
    (p.tile.is_none()
        && !tc
        && !caps.cpu
        && p.batches() == 1
        && p.dtype == DType::F32
        && k_contiguous
        && worth
        && caps.async_tiles[0]
        && caps.tuning.async_f32.is_some())
    .then_some(if p.n <= p.m { Operand::B } else { Operand::A })
}

/// `p` after `which` was copied: B (K, N) row-major, or A stored (K, M) M-contiguous.
fn copied(p: &GemmProblem, which: Operand) -> GemmProblem {
    let mut p = p.clone();
    let zeros = vec![0; p.batch.len()];
    match which {
        Operand::A => {
            p.a = OperandLayout {
                strides: [1, p.m],
                batch_strides: zeros,
                offset: 0,
            }
        }
        Operand::B => {
            p.b = OperandLayout {
                strides: [p.n, 1],
                batch_strides: zeros,
                offset: 0,
            }
        }
    }
    p
}

/// The kernel for `p` (after widening and copies), its split and whether it adds up A's rows.
fn kernel_for(
    caps: &DeviceCaps,
    p: &GemmProblem,
    tc: Option<TensorCoreKind>,
) -> (GemmKernel, Option<Split>, bool) {
    let batches = p.batches();
    let one = batches == 1;
    let strides = [
        p.a.strides[0],
        p.a.strides[1],
        p.b.strides[0],
        p.b.strides[1],
    ];
    if let Some(kernel) = p.tile.is_none().then(|| cpu_kernel(caps, p)).flatten() {
        return (kernel, None, false);
    }
    let gemv = (p.tile.is_none() && one && p.out_dtype == p.dtype && caps.max_work_group >= 256)
        .then(|| gemv(caps, p, strides))
        .flatten();
    if let Some(g) = gemv {
        return (GemmKernel::Gemv(g), None, p.row_sums && g.rows_of_a);
    }
    if let Some(kind) = tc {
        let (kernel, split) = tensor_core(caps, p, kind);
        return (kernel, split, false);
    }
    // The split-K test counts the unfitted tile's work-groups: a long K split over big tiles
    // beats small tiles.
    let base = p.tile.unwrap_or(caps.tile);
    let groups = p.m.div_ceil(base.bm as usize) * p.n.div_ceil(base.bn as usize) * batches;
    let waves = caps.tuning.split.waves as usize;
    if let Some(s) = one.then(|| split_k(caps, groups, p.k, waves)).flatten() {
        let inner = split_problem(p, s, p.out_dtype);
        let (kernel, _, _) = kernel_for(caps, &inner, None);
        return (kernel, Some(split(caps, s, p, false)), false);
    }
    (tiled(caps, p), None, p.row_sums && one)
}

/// matmul_cpu.cl's path for `p` on a CPU device (f32 or f64, K > 0).
fn cpu_kernel(caps: &DeviceCaps, p: &GemmProblem) -> Option<GemmKernel> {
    let blocking = caps.tuning.cpu?;
    let float = matches!(p.dtype, DType::F32 | DType::F64);
    if !caps.cpu || !float || p.k == 0 {
        return None;
    }
    let (sak, sbk, sbn) = (p.a.strides[1], p.b.strides[0], p.b.strides[1]);
    let path = if p.m > blocking.rm as usize {
        CpuPath::Packed
    } else if sak == 1 && sbk == 1 {
        CpuPath::Nt
    } else if sbn == 1 {
        CpuPath::Nn
    } else {
        CpuPath::Packed
    };
    Some(GemmKernel::Cpu { path, blocking })
}

/// The skinny form of `p` with strides `[sam, sak, sbk, sbn]`, if it has one: a side of at most
/// `max_rows` (M preferred) whose few-row operand stays in the compute units' caches (every
/// column reads all of it) over a short K (longer ones split K instead); or, as for one-token
/// decoding, a few rows of A against a B whose K is contiguous, at any K. f64 takes at most 4
/// rows (matmul_gemv.cl builds no 16-row kernel for it: local memory).
fn gemv(caps: &DeviceCaps, p: &GemmProblem, [sam, sak, sbk, sbn]: [usize; 4]) -> Option<Gemv> {
    let lim = caps.tuning.skinny;
    let max = (lim.max_rows as usize).min(16);
    let (rows_of_a, r, j, strides) = if p.m <= max {
        (true, p.m, p.n, [sam, sak, sbk, sbn])
    } else if p.n <= max {
        (false, p.n, p.m, [sbn, sbk, sak, sam])
    } else {
        return None;
    };
    let decoding = rows_of_a && p.m <= lim.decode_rows as usize && sbk == 1;
    let short = r * p.k <= lim.max_few as usize && p.k <= lim.max_k as usize;
    if !(decoding || short) || (p.dtype == DType::F64 && r > 4) {
        return None;
    }
    let kmajor = strides[2] == 1 || strides[3] != 1;
    Some(Gemv {
        rows_of_a,
        r,
        j,
        strides,
        kmajor,
        team: gemv_team(kmajor, j, p.k, caps.compute_units),
    })
}

/// The work-group of matmul_gemv.cl's kernels.
pub(crate) const GEMV_GROUP: usize = 256;

/// Work-items per column, a power of two: enough that the columns' teams make eight groups per
/// compute unit, no more than K needs, at least 32 (kmajor: a team reads 128 bytes of a column
/// at a time) and at most the group (kmajor) or 32 (else: 8 columns a group, 32 bytes of a row
/// at a time).
fn gemv_team(kmajor: bool, j: usize, k: usize, compute_units: usize) -> usize {
    let (least, most) = if kmajor { (32, GEMV_GROUP) } else { (1, 32) };
    let want = (8 * compute_units * GEMV_GROUP).div_ceil(j);
    want.next_power_of_two()
        .min(k.next_power_of_two())
        .clamp(least, most)
}

/// The number of K chunks for a portable product of `groups` work-groups: a divisor of `k`
/// giving at least `waves` work-groups per compute unit with chunks of at least `min_chunk`,
/// else the largest divisor below that; None when the tiles make two work-groups per compute
/// unit or K is short. (Between one and two, the unsplit product runs one wave with some units
/// doing twice the others' work; the portable kernels want several waves, so that the last,
/// partly filled one is short.) A forced split (`NETCL_GEMM_SPLIT`) applies wherever it
/// divides K.
fn split_k(caps: &DeviceCaps, groups: usize, k: usize, waves: usize) -> Option<usize> {
    let lim = caps.tuning.split;
    if let Some(s) = lim.forced {
        let s = s as usize;
        return (s > 1 && k.is_multiple_of(s)).then_some(s);
    }
    let cus = caps.compute_units;
    if groups >= 2 * cus || k < lim.min_k as usize {
        return None;
    }
    let (want, most) = (
        (waves * cus).div_ceil(groups).max(2),
        k / lim.min_chunk.max(1) as usize,
    );
    let divides = |s: &usize| k.is_multiple_of(*s);
    (want..=most)
        .find(divides)
        .or_else(|| (2..want.min(most + 1)).rev().find(divides))
}

/// The batched product of `p`'s `s` chunks of K: A viewed (s, M, K/s), B (s, K/s, N), the parts
/// written as `out` (no epilogue).
pub(super) fn split_problem(p: &GemmProblem, s: usize, out: DType) -> GemmProblem {
    let kc = p.k / s;
    let view = |l: &OperandLayout, k_dim: usize| OperandLayout {
        strides: l.strides,
        batch_strides: vec![kc * l.strides[k_dim]],
        offset: l.offset,
    };
    GemmProblem {
        k: kc,
        batch: vec![s],
        a: view(&p.a, 1),
        b: view(&p.b, 0),
        out_dtype: out,
        bias: false,
        activation: false,
        row_sums: false,
        ..p.clone()
    }
}

/// The split of `p` in `s` chunks: f32 parts where `f32_parts`, and the sum's team.
pub(super) fn split(caps: &DeviceCaps, s: usize, p: &GemmProblem, f32_parts: bool) -> Split {
    Split {
        chunks: s,
        f32_parts,
        team: parts_team(s, p.m * p.n, caps.compute_units),
    }
}

/// The work-group of matmul_parts.cl.
pub(crate) const PARTS_GROUP: usize = 256;

/// Work-items that share one output of the parts' sum (a power of two up to 32): 1 while the
/// outputs alone give each compute unit a work-group of them, else enough that `parts` of at
/// least 4 each do (a convolution's weight gradient: few outputs, many parts).
fn parts_team(parts: usize, outputs: usize, compute_units: usize) -> usize {
    let mut team = 1;
    while team < 32 && parts >= 8 * team && outputs.div_ceil(PARTS_GROUP / team) < compute_units {
        team *= 2;
    }
    team
}

/// The portable kernel for `p`: the tile fitted to the device, through the pipeline where the
/// device runs it (f32) and an operand is copied 16 bytes at a time; columns that a tile would
/// cover unevenly in a strip of narrower tiles.
fn tiled(caps: &DeviceCaps, p: &GemmProblem) -> GemmKernel {
    let batches = p.batches();
    let tile = p
        .tile
        .unwrap_or_else(|| caps.tile.fit(p.m, p.n, batches, caps.compute_units));
    let piped = p
        .tile
        .is_none()
        .then(|| async_tile(caps, p, &tile))
        .flatten();
    let bn = piped.map_or(tile.bn as usize, |(t, _)| t.tn as usize);
    // Columns a tile would cover unevenly, up to half a tile (288 = 2 x 128 + 32): a strip of
    // narrower tiles after the rest, so no tile is mostly empty and the rest builds aligned;
    // where the empty columns are under a tenth of those computed, one launch costs less than two.
    let rem = p.n % bn;
    let empty = (bn - rem) % bn;
    let strip = (rem > 0 && p.n > rem && 2 * rem <= bn && 10 * empty >= p.n + empty)
        .then(|| {
            let sbn = (rem.next_power_of_two().max(8)) as u32;
            let t = GemmTile {
                bn: sbn,
                wn: tile.wn.min(4).min(sbn),
                ..tile
            };
            fits(caps, &t, p.dtype).then_some(Strip {
                col: p.n - rem,
                tile: t,
                k4: k4(p, &t),
            })
        })
        .flatten();
    match piped {
        Some((tile, staging)) => GemmKernel::Async {
            tile,
            staging,
            strip,
        },
        None => GemmKernel::Tiled {
            tile,
            k4: k4(p, &tile),
            strip,
        },
    }
}

/// Whether portable tile `t` fits the device for `dtype` (work-group size, local memory).
pub(crate) fn fits(caps: &DeviceCaps, t: &GemmTile, dtype: DType) -> bool {
    let acc = if dtype == DType::F64 { 8 } else { 4 };
    let [x, y] = t.local();
    let local = t.bk as usize * (t.bm + t.bn + 8) as usize * acc;
    t.bm.is_multiple_of(t.wm)
        && t.bn.is_multiple_of(t.wn)
        && x * y <= caps.max_work_group
        && local as u64 <= caps.local_mem_bytes
}

/// 16-byte loads along K for an f32 operand of `p` in tile `t`: its K dim contiguous, its rows,
/// offset, batch strides and K multiples of 4, in tiles of at most 64 of its rows and 128
/// work-items or more, split into whole runs (`--suite tiles` measures where this pays).
fn k4(p: &GemmProblem, t: &GemmTile) -> [bool; 2] {
    let [x, y] = t.local();
    let run = |l: &OperandLayout, k_dim: usize, rows: u32| {
        p.dtype == DType::F32
            && rows <= 64
            && x * y >= 128
            && l.strides[k_dim] == 1
            && p.k.is_multiple_of(4)
            && l.aligned_but(k_dim, 4)
            && ((rows * t.bk) as usize).is_multiple_of(4 * x * y)
    };
    [run(&p.a, 1, t.bm), run(&p.b, 0, t.bn)]
}

/// The pipelined tile of `p` (f32), where the device's probe of it passed: the large one where
/// the portable tile stayed 128 x 128 and an operand is copied 16 bytes at a time; the small one
/// for single products too small for it whose operands are both copied 16 bytes at a time
/// (weight gradients dYᵀ X). Products with a K-contiguous operand keep the portable tiles.
fn async_tile(
    caps: &DeviceCaps,
    p: &GemmProblem,
    fitted: &GemmTile,
) -> Option<(AsyncTile, [Staging; 2])> {
    let settings = caps.tuning.async_f32?;
    if p.dtype != DType::F32 || caps.cpu {
        return None;
    }
    let staging = [staging_of(&p.a, 1), staging_of(&p.b, 0)];
    let vec = staging.map(|s| s == Staging::Vec);
    let (tile, probed) = if fitted.bm == 128 && fitted.bn == 128 && vec.contains(&true) {
        (settings.large, caps.async_tiles[0])
    } else if p.batches() == 1 && vec == [true, true] {
        (settings.small, caps.async_tiles[1])
    } else {
        return None;
    };
    probed.then_some((tile, staging))
}

/// How matmul_async.cl stages an operand whose K dim is `k_dim`.
pub(crate) fn staging_of(l: &OperandLayout, k_dim: usize) -> Staging {
    let (contig, k_stride) = (l.strides[1 - k_dim], l.strides[k_dim]);
    match (contig, k_stride) {
        (1, _) if l.aligned_but(1 - k_dim, 4) => Staging::Vec,
        (_, 1) => Staging::NarrowK,
        _ => Staging::Narrow,
    }
}
