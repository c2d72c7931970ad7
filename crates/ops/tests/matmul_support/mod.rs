//! Helpers of the matmul tests (matmul.rs, matmul_forms.rs): operands stored either way, the small explicit tile, the closeness check, a product on a device.
#![allow(dead_code)] // each test file uses its own part
use netcl_ops::testing::{check_close, random_tensor, tolerance};
use netcl_ops::{DType, Device, GemmTile, Tensor};

pub const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// A (rows, cols) operand, stored transposed (and so viewed through swapped strides) when `t`.
pub fn operand(
    dtype: DType,
    batch: &[usize],
    rows: usize,
    cols: usize,
    t: bool,
    seed: u64,
) -> Tensor {
    let mut shape = batch.to_vec();
    if t {
        shape.extend([cols, rows]);
    } else {
        shape.extend([rows, cols]);
    }
    let x = random_tensor(dtype, &shape, -1.0, 1.0, seed);
    if t {
        let nd = shape.len();
        x.transpose(nd - 2, nd - 1).unwrap()
    } else {
        x
    }
}

/// A small explicit tile on OpenCL devices: their tiled kernels, also on CPU devices (whose f32
/// products otherwise run matmul_cpu.cl); none on the host.
pub fn tiled(dev: &Device) -> Option<GemmTile> {
    (!dev.is_host()).then_some(GemmTile {
        bm: 16,
        bn: 16,
        bk: 8,
        wm: 2,
        wn: 2,
    })
}

pub fn check(got: &Tensor, want: &Tensor, dtype: DType, k: usize, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let tol = match dtype {
        DType::F32 => 1e-5 * (k as f64).sqrt().max(1.0),
        d => tolerance(d) * 2.0,
    };
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    check_close(&g, &w, tol, 1.0, what).unwrap();
}

/// `a x b` computed on `dev` (the operands copied there).
pub fn matmul_on(dev: &Device, a: &Tensor, b: &Tensor) -> Tensor {
    a.to_device(dev)
        .unwrap()
        .matmul(&b.to_device(dev).unwrap())
        .unwrap()
}
