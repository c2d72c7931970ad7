//! The GEMM planner's tensor-core choice: the tiling and split of least modelled time, the model (waves of concurrent work-groups, each a tile's fixed cost plus its multiply-adds at the tiling's rate, and a split's sum), the band of rows of tiles, and how the kernels read each operand.
use super::plan::{
    split, split_problem, DeviceCaps, GemmKernel, GemmProblem, OperandLayout, Split, TcOperand,
};
use super::precision::TensorCoreKind;
use netcl_core_devices::DType;
use netcl_kernels::{TileCost, WgChoice, WgTile};

/// A tensor-core plan for `p`: the tiling and split of least modelled time (`tc_time`) among
/// the wgmma tilings where the device runs them, else mma.sync's tiling; splits of K into
/// chunks of at least `min_chunk` for single products with K at least `min_k`. A tiling the
/// autotuner forces runs unsplit.
pub(super) fn tensor_core(
    caps: &DeviceCaps,
    p: &GemmProblem,
    kind: TensorCoreKind,
) -> (GemmKernel, Option<Split>) {
    let tilings: Vec<WgChoice> = (caps.wgmma.iter())
        .filter(|(k, c)| *k == kind && p.tc_tile.is_none() && p.wg_tile.is_none_or(|t| t == c.tile))
        .map(|(_, c)| *c)
        .collect();
    let wg = !tilings.is_empty();
    let mma = WgChoice {
        tile: WgTile {
            tbn: 0,
            stages: 0,
            persistent: 0,
            ws: false,
        },
        cost: caps.tuning.tc_cost,
    };
    let mut candidates = if wg { tilings } else { vec![mma] };
    if kind == TensorCoreKind::Tf32 {
        for c in &mut candidates {
            c.cost.tflops *= caps.tuning.tf32_ratio;
        }
    }
    let tc_tile = p.tc_tile.unwrap_or(caps.tc_tile);
    let shape = |c: &WgChoice| match wg {
        true => (WgTile::ROWS, c.tile.tbn as usize),
        false => (tc_tile.rows(), tc_tile.cols()),
    };
    let lim = caps.tuning.split;
    let forced_tiling = p.tc_tile.is_some() || p.wg_tile.is_some();
    let splits: Vec<usize> = match (lim.forced, p.batches()) {
        _ if forced_tiling => vec![1],
        (Some(s), 1) if s > 1 && p.k.is_multiple_of(s as usize) => vec![s as usize],
        (Some(_), _) => vec![1],
        (None, 1) if p.k >= lim.min_k as usize => (1..=16)
            .filter(|s| p.k.is_multiple_of(*s) && p.k / s >= lim.min_chunk as usize)
            .collect(),
        _ => vec![1],
    };
    let mut best: Option<(f64, WgChoice, usize)> = None;
    for c in &candidates {
        for &s in &splits {
            let t = tc_time(caps, p, shape(c), c.cost, s);
            if best.is_none_or(|(b, _, _)| t < b) {
                best = Some((t, *c, s));
            }
        }
    }
    let (_, choice, s) = best.unwrap_or((0.0, candidates[0], 1));
    let wide = p.out_dtype.size() == 2;
    let (inner, split) = match s {
        1 => (p.clone(), None),
        s => {
            let out = if wide { DType::F32 } else { p.out_dtype };
            (split_problem(p, s, out), Some(split(caps, s, p, wide)))
        }
    };
    let (a, b) = tc_operands(&inner, kind);
    let kernel = match wg {
        true => GemmKernel::Wgmma {
            kind,
            tile: choice.tile,
            raster: raster(caps, &inner, choice.tile),
            a,
            b,
        },
        false => GemmKernel::MmaSync {
            kind,
            tile: tc_tile,
            a,
            b,
        },
    };
    (kernel, split)
}

/// The modelled time (µs) of `p` in tiles of `rows` x `cols` costing `cost`, split in `s`: its
/// tiles' time (`tiles_time`) and for a split the parts' write, read and sum.
pub fn tc_time(
    caps: &DeviceCaps,
    p: &GemmProblem,
    (rows, cols): (usize, usize),
    cost: TileCost,
    s: usize,
) -> f64 {
    let dims = (p.m, p.n, p.k / s, p.batches() * s);
    let mut t = tiles_time(caps.compute_units, dims, (rows, cols), cost);
    if s > 1 {
        let lim = caps.tuning.split;
        let bytes = (2 * s * p.m * p.n * 4 + p.m * p.n * p.out_dtype.size()) as f64;
        t += lim.launch_us + bytes / (lim.parts_gbps * 1e3);
    }
    t
}

/// The modelled time (µs) of `batches` products (m, n, k) in tiles of `rows` x `cols` costing
/// `cost` on `compute_units`: waves of the device's concurrent work-groups, each a tile's fixed
/// cost plus its multiply-adds at the device's rate shared among them.
pub fn tiles_time(
    compute_units: usize,
    (m, n, k, batches): (usize, usize, usize, usize),
    (rows, cols): (usize, usize),
    cost: TileCost,
) -> f64 {
    let slots = (compute_units * cost.per_cu.max(1) as usize) as f64;
    let groups = (m.div_ceil(rows) * n.div_ceil(cols) * batches) as f64;
    let flops = 2.0 * (rows * cols * k) as f64;
    (groups / slots).ceil() * (cost.fixed_us + flops / (cost.tflops * 1e6 / slots))
}

/// The band of rows of tiles a wgmma product takes its tiles in: with `w` tiles in flight of
/// 128 x `tbn`, a band of h rows reads h x 128 rows of A and w / h x `tbn` columns of B at a
/// time, least for h near sqrt(2 w tbn / 256); none where the product's columns of tiles fit in
/// such a band's width anyway.
fn raster(caps: &DeviceCaps, p: &GemmProblem, tile: WgTile) -> u32 {
    let w = (caps.compute_units * tile.persistent.max(1) as usize) as f64;
    let band = (2.0 * w * tile.tbn as f64 / 256.0).sqrt().round().max(1.0) as usize;
    let cols = p.n.div_ceil(tile.tbn as usize);
    let rows = p.m.div_ceil(WgTile::ROWS);
    if caps.tuning.raster && cols > w as usize / band && rows > band {
        band as u32
    } else {
        0
    }
}

/// How the tensor-core kernels read `p`'s operands: 16-bit ones whose M (N) dim is contiguous as
/// they lie (transposed), the rest as K-contiguous 16-byte aligned rows (a copy where they are
/// not, zero-padded where K is not a multiple of 16 bytes).
fn tc_operands(p: &GemmProblem, kind: TensorCoreKind) -> (TcOperand, TcOperand) {
    let q = 16 / kind.dtype().size();
    let kp = p.k.next_multiple_of(q);
    let sixteen = kind != TensorCoreKind::Tf32 && kp == p.k;
    // A (M, K): K is dim 1; B (K, N): K is dim 0.
    let form = |l: &OperandLayout, k_dim: usize, mn: usize| {
        let k_rows = l.strides[k_dim] == 1 && kp == p.k && l.aligned_but(k_dim, q);
        let mn_ok =
            l.strides[1 - k_dim] == 1 && mn.is_multiple_of(8) && l.aligned_but(1 - k_dim, q);
        if k_rows {
            TcOperand::KRows
        } else if sixteen && mn_ok {
            TcOperand::Mn
        } else if kp == p.k {
            TcOperand::Copy
        } else {
            TcOperand::Pad(kp)
        }
    };
    (form(&p.a, 1, p.m), form(&p.b, 0, p.n))
}
