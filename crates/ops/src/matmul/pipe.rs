//! The f32 GEMM through a cp.async pipeline (kernels/matmul_async.cl): which devices run it (a probe with an exact-result check, cached per device), its settings and build options.
use super::matmul_source;
use super::opencl::{TiledLaunch, MATMUL_KERNEL};
use super::tc::{probed, Probes};
use crate::base::layout::KernelLayout;
use crate::base::tensor::Tensor;
use crate::fused::activation::Activation;
use crate::fused::expr::Class;
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::sources::MATMUL_ASYNC;
use netcl_kernels::{program, GemmTile, Program};
use std::sync::{Arc, OnceLock};

/// An output tile of matmul_async.cl: `tm` x `tn` outputs, `wm` x `wn` a work-item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct AsyncTile {
    pub tm: usize,
    pub tn: usize,
    wm: usize,
    wn: usize,
}

impl AsyncTile {
    const fn new(tm: usize, tn: usize, wm: usize, wn: usize) -> AsyncTile {
        AsyncTile { tm, tn, wm, wn }
    }

    /// The tile (rows, columns) and work-group of a launch.
    pub(super) fn shape(self) -> ((usize, usize), [usize; 3]) {
        (
            (self.tm, self.tn),
            [(self.tm / self.wm) * (self.tn / self.wn), 1, 1],
        )
    }

    fn options(self) -> String {
        format!(
            " -DTM={} -DTN={} -DWM={} -DWN={}",
            self.tm, self.tn, self.wm, self.wn
        )
    }
}

/// The tiles: 128 x 128 (8 x 8 outputs a work-item, 256 work-items), and 64 x 64 (8 x 4, 128
/// work-items) for products too small to fill the device with the large one.
const LARGE: AsyncTile = AsyncTile::new(128, 128, 8, 8);
const SMALL: AsyncTile = AsyncTile::new(64, 64, 8, 4);

/// The pipeline's depth (2 to 5 steps of K in flight), its K step (8 or 16) and a register cap
/// per work-item (0: none). `NETCL_GEMM_ASYNC`: `0` turns the pipeline off, else
/// `stages[,k step[,registers]]`. The default, 2 steps of 16, was the fastest on the H100 of
/// (2, 3, 4, 5) x 8 and 2 x 16 (docs/performance.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Settings {
    stages: u32,
    k_step: u32,
    max_registers: u32,
}

/// The settings in force (read once per process), None when turned off.
fn settings() -> Option<Settings> {
    static SETTINGS: OnceLock<Option<Settings>> = OnceLock::new();
    *SETTINGS.get_or_init(|| {
        let default = Settings {
            stages: 2,
            k_step: 16,
            max_registers: 0,
        };
        let Ok(v) = std::env::var("NETCL_GEMM_ASYNC") else {
            return Some(default);
        };
        let f: Vec<u32> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        let field = |i: usize, d: u32| f.get(i).copied().unwrap_or(d);
        let s = Settings {
            stages: field(0, default.stages),
            k_step: field(1, default.k_step),
            max_registers: field(2, default.max_registers),
        };
        // Local memory: both operands' padded tiles (k_step rows of 132 floats, for the largest
        // tile) per stage.
        let fits = s.stages * s.k_step * 132 * 4 * 2 <= 48 * 1024;
        match f[..] {
            [0] => None,
            _ if (2..=5).contains(&s.stages) && [8, 16].contains(&s.k_step) && fits => Some(s),
            _ => {
                eprintln!(
                    "netcl: NETCL_GEMM_ASYNC={v:?} ignored (want 0, or stages 2-5, k step 8 or \
                     16 within 48 KiB, registers)"
                );
                Some(default)
            }
        }
    })
}

/// Whether `device` runs matmul_async.cl with exact results (in its large tile): probed once per
/// device (NVIDIA OpenCL devices only, as the kernel is PTX).
pub fn has_async_gemm(device: &Device) -> bool {
    runs(device, LARGE)
}

/// Whether `device` runs matmul_async.cl in `tile` with exact results, probed once per device
/// and tile.
fn runs(device: &Device, tile: AsyncTile) -> bool {
    static PROBES: Probes<(usize, AsyncTile)> = OnceLock::new();
    let Some(s) = settings() else {
        return false;
    };
    probed(&PROBES, (device.ordinal(), tile), device, true, || {
        probe(device, s, tile).map_err(|e| {
            format!("pipelined f32 GEMM in {tile:?} tiles unavailable on {device}: {e}")
        })
    })
}

/// How matmul_async.cl copies an operand into its tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Staging {
    /// 16 bytes at a time along M (N).
    Vec,
    /// 4 bytes at a time, consecutive work-items along K.
    NarrowK,
    /// 4 bytes at a time, consecutive work-items along M (N).
    Narrow,
}

impl Staging {
    /// The staging of an operand whose M (N) stride is `contig`, K stride `k_stride`, other
    /// strides `others` and offset `offset`.
    fn of(contig: usize, k_stride: usize, others: &[usize], offset: usize) -> Staging {
        let aligned = [k_stride, offset]
            .iter()
            .chain(others)
            .all(|s| s.is_multiple_of(4));
        match (contig, k_stride) {
            (1, _) if aligned => Staging::Vec,
            (_, 1) => Staging::NarrowK,
            _ => Staging::Narrow,
        }
    }

    /// The build flag for operand `name` (A or B).
    fn flag(self, name: char) -> String {
        match self {
            Staging::Vec => format!(" -D{name}_VEC"),
            Staging::NarrowK => format!(" -D{name}_KFAST"),
            Staging::Narrow => String::new(),
        }
    }
}

/// The stagings of `l`'s operands (columns from `col`).
fn stagings(l: &TiledLaunch<'_>, col: usize) -> [Staging; 2] {
    let [sam, sak, sbk, sbn] = l.strides;
    [
        Staging::of(sam, sak, l.batch_strides[0], l.a.offset),
        Staging::of(sbn, sbk, l.batch_strides[1], l.b.offset + col * sbn),
    ]
}

/// The operand of an f32 product `m x n x k` on `device` to copy transposed before the pipeline
/// takes it, when both are K-contiguous (x Wᵀ: K strides `sak == sbk == 1`): matmul_async.cl would
/// read both 4 bytes at a time (25-29% slower than matmul.cl on the H100), and matmul.cl runs
/// about 10% behind the pipeline's 16-byte copies. The smaller one (B where n <= m) is made M- or
/// N-contiguous, for products where the copy costs about 3% of the product or less (the larger of
/// m and n at least 2048, the smaller at least a tile).
pub(super) fn copy_first(
    device: &Device,
    dtype: DType,
    [m, n, k]: [usize; 3],
    sak: usize,
    sbk: usize,
) -> Option<Operand> {
    let worth = m.max(n) >= 2048 && m.min(n) >= 128 && k >= 64;
    (dtype == DType::F32 && sak == 1 && sbk == 1 && worth && has_async_gemm(device))
        .then_some(if n <= m { Operand::B } else { Operand::A })
}

/// One operand of a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Operand {
    A,
    B,
}

/// The tile `l`'s product takes through the pipeline, when it does (f32 operands, on a device
/// whose probe of the tile passed): 128 x 128 where matmul.cl's fitted tile stayed that large and
/// an operand is copied 16 bytes at a time; 64 x 64 for smaller products of one batch whose
/// operands are both copied 16 bytes at a time (weight gradients `dYᵀ X`: the MLP's 1024 x 784 x
/// 256 took 19.8-21.5 us against matmul.cl's 26.2 on the H100, 1024 x 1024 x 256 20.0 against
/// 22.0 in 128 x 128 tiles). Products with a K-contiguous operand kept matmul.cl's small tiles:
/// in 64 x 64 pipelined tiles the MLP's 256 x 1024 x 784 forward took 36.5 us against 27.7.
pub(super) fn tile(device: &Device, l: &TiledLaunch<'_>, fitted: &GemmTile) -> Option<AsyncTile> {
    if l.a.dtype != DType::F32 || settings().is_none() {
        return None;
    }
    let [_, _, _, batch] = l.dims;
    let vec = stagings(l, 0).map(|s| s == Staging::Vec);
    let t = if fitted.bm == 128 && fitted.bn == 128 && vec.contains(&true) {
        LARGE
    } else if batch == 1 && vec == [true, true] {
        SMALL
    } else {
        return None;
    };
    runs(device, t).then_some(t)
}

/// The program for columns `col .. col + width` of `l`'s product through the pipeline in `tile`.
pub(super) fn for_launch(
    device: &Device,
    l: &TiledLaunch<'_>,
    act: Activation,
    col: usize,
    width: usize,
    tile: AsyncTile,
) -> Result<Arc<Program>> {
    let s = settings().ok_or_else(|| {
        netcl_core_devices::Error::invalid("matmul", "the pipelined GEMM is turned off")
    })?;
    build(device, l, act, col, width, s, tile)
}

/// matmul_async.cl built for `l`'s operand layouts (columns `col .. col + width`) and `act`.
fn build(
    device: &Device,
    l: &TiledLaunch<'_>,
    act: Activation,
    col: usize,
    width: usize,
    s: Settings,
    tile: AsyncTile,
) -> Result<Arc<Program>> {
    let [m, _, k, _] = l.dims;
    let [a, b] = stagings(l, col);
    let aligned = m.is_multiple_of(tile.tm)
        && width.is_multiple_of(tile.tn)
        && k.is_multiple_of(s.k_step as usize);
    let options = format!(
        "{}{} -DMATMUL_KERNEL={MATMUL_KERNEL} -DSTAGES={} -DTK={}{}{}{}{}{}",
        DType::F32.build_option(),
        tile.options(),
        s.stages,
        s.k_step,
        match s.max_registers {
            0 => String::new(),
            r => format!(" -cl-nv-maxrregcount={r}"),
        },
        a.flag('A'),
        b.flag('B'),
        if aligned { " -DALIGNED" } else { "" },
        if l.row_sums.is_some() {
            " -DROW_SUMS"
        } else {
            ""
        },
    );
    let source = matmul_source(MATMUL_ASYNC, act, Class::of(DType::F32));
    program(device, &source, &options)
}

/// Small integers make every product and sum exact in f32: the device must match the host bit for
/// bit (the product, and A's row sums from a -DROW_SUMS build), over ragged M, N and K with
/// several steps of K, for each way of reaching an operand.
fn probe(device: &Device, s: Settings, tile: AsyncTile) -> Result<bool> {
    let (m, n, k) = (136usize, 132usize, 70usize);
    let host = Device::host();
    let av: Vec<f32> = (0..m * k).map(|i| ((i * 7 + 3) % 5) as f32 - 2.0).collect();
    let bv: Vec<f32> = (0..k * n).map(|i| ((i * 3 + 1) % 5) as f32 - 2.0).collect();
    let want: Vec<f64> = (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            (0..k).map(|j| av[r * k + j] * bv[j * n + c]).sum::<f32>() as f64
        })
        .collect();
    let want_sums: Vec<f64> = (0..m)
        .map(|r| av[r * k..(r + 1) * k].iter().sum::<f32>() as f64)
        .collect();
    // `rows` x `cols` stored with row stride `ld` (>= cols), element (r, c) = f(r, c).
    let stored = |rows: usize, cols: usize, ld: usize, f: &dyn Fn(usize, usize) -> f32| {
        let v = (0..rows * ld)
            .map(|i| {
                if i % ld < cols {
                    f(i / ld, i % ld)
                } else {
                    0.0
                }
            })
            .collect();
        Tensor::from_vec(v, &[rows, ld], &host)?
            .to_device(device)?
            .narrow(1, 0, cols)
    };
    let a_of = |r: usize, j: usize| av[r * k + j];
    let b_of = |j: usize, c: usize| bv[j * n + c];
    // A with K contiguous (4-byte copies along K) and B with N contiguous (16-byte copies); A with
    // M contiguous and B with K contiguous; A with M contiguous but an odd K stride (4-byte copies
    // along M).
    let a = stored(m, k, k, &a_of)?;
    let b = stored(k, n, n, &b_of)?;
    let a_mk = stored(k, m, m, &|j, r| a_of(r, j))?.transpose(0, 1)?;
    let b_nk = stored(n, k, k, &|c, j| b_of(j, c))?.transpose(0, 1)?;
    let a_odd = stored(k, m, m + 1, &|j, r| a_of(r, j))?.transpose(0, 1)?;
    let layouts = [(&a, &b), (&a_mk, &b_nk), (&a_odd, &b)];
    for ((a, b), with_sums) in layouts.into_iter().flat_map(|p| [(p, false), (p, true)]) {
        let out = Tensor::alloc(&[m, n], DType::F32, device)?;
        let sums = Tensor::alloc(&[m], DType::F32, device)?;
        let layout =
            KernelLayout::new("matmul", &[], &[(&[], 0), (&[], a.offset), (&[], b.offset)])?;
        let l = TiledLaunch {
            out: &out,
            a,
            b,
            bias: None,
            layout: &layout,
            batch_strides: [&[], &[]],
            dims: [m, n, k, 1],
            strides: [a.strides[0], a.strides[1], b.strides[0], b.strides[1]],
            lower: None,
            row_sums: with_sums.then_some(&sums),
        };
        let prog = build(device, &l, Activation::None, 0, n, s, tile)?;
        l.run(&prog, MATMUL_KERNEL, 0, n, tile.shape())?;
        if out.to_vec_f64()? != want || (with_sums && sums.to_vec_f64()? != want_sums) {
            return Ok(false);
        }
    }
    Ok(true)
}
