//! What the planner reads off a device (`DeviceCaps::of`): its limits and tuning, and which PTX kernels run it exactly, each found by a probe (small integers multiplied against the host, bit for bit) run once per device and cached.
use super::plan::{DeviceCaps, GemmProblem, KindSet};
use super::precision::TensorCoreKind;
use super::{matmul_async, matmul_tc, matmul_wg};
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, DeviceKind, Result};
use netcl_kernels::{gemm_tile, plan_tuning, tc_tile, WgChoice};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

impl DeviceCaps {
    /// `device`'s capabilities for `p`: the probes of the kernels `p` may take run (once per
    /// device) on NVIDIA OpenCL devices; the others read as absent.
    pub fn of(device: &Device, p: &GemmProblem) -> DeviceCaps {
        let host = device.is_host();
        let info = device.info();
        let kind = match p.dtype {
            DType::F32 if p.tf32 => Some(TensorCoreKind::Tf32),
            DType::BF16 => Some(TensorCoreKind::Bf16),
            DType::F16 => Some(TensorCoreKind::F16),
            _ => None,
        };
        let tuning = plan_tuning(device);
        let (mut mma_sync, mut wgmma) = (KindSet::NONE, Vec::new());
        if let Some(kind) = kind.filter(|_| !host) {
            mma_sync = mma_sync.with(kind, matmul_tc::has_tensor_cores(device, kind));
            // The tuning's tilings, and the one the autotuner forces (costed as the first).
            let forced = p.wg_tile.map(|tile| WgChoice {
                tile,
                cost: (tuning.wg.iter().find(|c| c.tile == tile))
                    .or(tuning.wg.first())
                    .map_or(tuning.tc_cost, |c| c.cost),
            });
            wgmma = (tuning.wg.iter().copied().chain(forced))
                .filter(|c| matmul_wg::runs(device, kind, c.tile))
                .map(|c| (kind, c))
                .collect();
        }
        let portable_f32 = p.dtype == DType::F32 && kind.is_none() && !host;
        let async_tiles = match portable_f32 {
            true => [false, true].map(|small| matmul_async::runs(device, small)),
            false => [false, false],
        };
        DeviceCaps {
            host,
            cpu: info.kind == DeviceKind::Cpu,
            compute_units: info.compute_units as usize,
            max_work_group: info.max_work_group_size,
            local_mem_bytes: info.local_mem_bytes,
            mma_sync,
            wgmma,
            async_tiles,
            tile: gemm_tile(device),
            tc_tile: tc_tile(device),
            tuning,
        }
    }
}

/// Cached probe results, by key.
pub(crate) type Probes<K> = OnceLock<Mutex<HashMap<K, bool>>>;

/// `probe`'s result for `key`, run once per key where `enabled` on NVIDIA OpenCL devices (whose
/// compiler takes the inline PTX of the tensor-core and pipelined kernels) and cached; false
/// elsewhere and when the probe fails (its message logged).
pub(crate) fn probed<K: Copy + Eq + std::hash::Hash>(
    cache: &'static Probes<K>,
    key: K,
    device: &Device,
    enabled: bool,
    probe: impl FnOnce() -> std::result::Result<bool, String>,
) -> bool {
    if !enabled {
        return false;
    }
    let map = cache.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(&ok) = map.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return ok;
    }
    let eligible = device.is_opencl()
        && device
            .info()
            .extensions
            .contains("cl_nv_device_attribute_query");
    let ok = eligible
        && probe().unwrap_or_else(|e| {
            // Why a kernel is not used: printed where GEMM plans are (`NETCL_DEBUG=gemm`).
            if netcl_core_devices::debug::gemm_plans().unwrap_or(false) {
                eprintln!("netcl gemm: {e}");
            }
            log::info!("{e}");
            false
        });
    map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ok);
    ok
}

/// A probe's product of small integers, exact in every input format and in f32: A (m, k), B
/// (k, n), row-major values, with the product and A's row sums they must give.
pub(crate) struct Exact {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub want: Vec<f64>,
    pub sums: Vec<f64>,
}

impl Exact {
    pub fn new(m: usize, n: usize, k: usize) -> Exact {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 + 3) % 5) as f32 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 3 + 1) % 5) as f32 - 2.0).collect();
        let want = (0..m * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                (0..k).map(|j| a[r * k + j] * b[j * n + c]).sum::<f32>() as f64
            })
            .collect();
        let sums = (0..m)
            .map(|r| a[r * k..(r + 1) * k].iter().sum::<f32>() as f64)
            .collect();
        Exact {
            m,
            n,
            k,
            a,
            b,
            want,
            sums,
        }
    }

    /// `rows` x `cols` stored with row stride `ld` (>= cols) on `device` in `dtype`, element
    /// (r, c) = f(r, c).
    pub fn stored(
        device: &Device,
        dtype: DType,
        (rows, cols, ld): (usize, usize, usize),
        f: &dyn Fn(usize, usize) -> f32,
    ) -> Result<Tensor> {
        let v = (0..rows * ld)
            .map(|i| {
                if i % ld < cols {
                    f(i / ld, i % ld)
                } else {
                    0.0
                }
            })
            .collect();
        Tensor::from_vec(v, &[rows, ld], &Device::host())?
            .to_dtype(dtype)?
            .to_device(device)?
            .narrow(1, 0, cols)
    }

    /// A (m, k) in `dtype` on `device`: row-major (`mk`), or stored (k, m) and transposed.
    pub fn a_on(&self, device: &Device, dtype: DType, mk: bool) -> Result<Tensor> {
        let (m, k) = (self.m, self.k);
        match mk {
            true => Self::stored(device, dtype, (m, k, k), &|r, j| self.a[r * k + j]),
            false => {
                Self::stored(device, dtype, (k, m, m), &|j, r| self.a[r * k + j])?.transpose(0, 1)
            }
        }
    }

    /// B (k, n) in `dtype` on `device`: row-major (`kn`), or stored (n, k) and transposed.
    pub fn b_on(&self, device: &Device, dtype: DType, kn: bool) -> Result<Tensor> {
        let (n, k) = (self.n, self.k);
        match kn {
            true => Self::stored(device, dtype, (k, n, n), &|j, c| self.b[j * n + c]),
            false => {
                Self::stored(device, dtype, (n, k, k), &|c, j| self.b[j * n + c])?.transpose(0, 1)
            }
        }
    }
}
