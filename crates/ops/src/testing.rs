//! Helpers for op test suites (ours and users'): deterministic random cases, random views, tolerant comparison.
use crate::base::tensor::Tensor;
use half::{bf16, f16};
use netcl_core_devices::{DType, Device};

/// Row lengths around the steps of the register-resident row kernels (softmax, norms,
/// cross-entropy: 1 to 32 values per work-item of 256) and past their limit (8193 and 8196 take
/// the general kernels, 8196 with 4-wide access where the rows are aligned).
pub const ROW_LENGTHS: [usize; 11] = [1, 3, 255, 256, 257, 1000, 4096, 4097, 8192, 8193, 8196];

/// Rows longer than this take the general (two-pass) row kernels (on devices that run
/// work-groups of 256).
pub const MAX_REGISTER_ROW: usize = crate::base::rows::MAX_ROW;

/// Runs `f` (an op on `dev` over rows of `n`) and asserts that it launched the row kernel `name`
/// on this thread once when `dev` is an OpenCL device and the rows fit the register-resident
/// kernels, else not at all; `what` names the case in the message.
pub fn expect_row_kernel<R>(
    name: &str,
    dev: &Device,
    n: usize,
    what: &str,
    f: impl FnOnce() -> R,
) -> R {
    let before = netcl_kernels::thread_launches(name);
    let out = f();
    let launched = netcl_kernels::thread_launches(name) - before;
    let expect = u64::from(dev.is_opencl() && n <= MAX_REGISTER_ROW);
    assert_eq!(launched, expect, "{what} on {dev}: {name} launches");
    out
}

/// Small deterministic xorshift generator for test cases.
#[derive(Clone, Debug)]
pub struct Cases(pub u64);

impl Cases {
    pub fn new(seed: u64) -> Cases {
        Cases(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    /// A shape of 1..=`max_dims` dims, each 0..=`max_len` long.
    pub fn shape(&mut self, max_dims: usize, max_len: usize) -> Vec<usize> {
        (0..1 + self.below(max_dims))
            .map(|_| self.below(max_len + 1))
            .collect()
    }
}

/// The dtypes `dev` supports (f64 only with fp64).
pub fn dtypes_for(dev: &Device) -> Vec<DType> {
    DType::ALL
        .into_iter()
        .filter(|d| *d != DType::F64 || dev.info().fp64)
        .collect()
}

/// A host tensor of `dtype` holding `values` (converted) in `shape`.
pub fn host_tensor(dtype: DType, values: &[f64], shape: &[usize]) -> Tensor {
    let h = Device::host();
    let t = match dtype {
        DType::F32 => Tensor::from_vec(values.iter().map(|&x| x as f32).collect(), shape, &h),
        DType::F64 => Tensor::from_vec(values.to_vec(), shape, &h),
        DType::F16 => Tensor::from_vec(
            values.iter().map(|&x| f16::from_f64(x)).collect(),
            shape,
            &h,
        ),
        DType::BF16 => Tensor::from_vec(
            values.iter().map(|&x| bf16::from_f64(x)).collect(),
            shape,
            &h,
        ),
        DType::I32 => Tensor::from_vec(values.iter().map(|&x| x as i32).collect(), shape, &h),
        DType::U32 => Tensor::from_vec(values.iter().map(|&x| x as u32).collect(), shape, &h),
    };
    t.expect("host_tensor: values.len() must equal the shape's element count")
}

/// Values exact in every dtype (small integers and halves; positive for integer dtypes), so
/// results of exact ops compare bit for bit.
pub fn sample(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    let mut c = Cases::new(seed);
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            let x = (c.below(64) as f64) - 16.0;
            if dtype.is_float() {
                x * 0.5
            } else {
                x.abs() + 1.0
            }
        })
        .collect();
    host_tensor(dtype, &v, shape)
}

/// Uniform random values in `[lo, hi)` (integers truncated) on the host.
pub fn random_tensor(dtype: DType, shape: &[usize], lo: f64, hi: f64, seed: u64) -> Tensor {
    let mut c = Cases::new(seed);
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| c.uniform(lo, hi)).collect();
    host_tensor(dtype, &v, shape)
}

/// A random view of `t` (a rotation of its dims, slices with steps); the same `Cases` state
/// gives the same view of tensors of the same shape on any device.
pub fn random_view(t: &Tensor, c: &mut Cases) -> Tensor {
    let mut v = t.clone();
    let nd = v.ndim();
    if nd >= 2 && c.below(2) == 0 {
        let mut dims: Vec<usize> = (0..nd).collect();
        dims.rotate_left(1 + c.below(nd - 1));
        v = v.permute(&dims).expect("a rotation is a valid permutation");
    }
    for d in 0..v.ndim() {
        let n = v.shape()[d];
        if n > 2 && c.below(3) == 0 {
            let start = c.below(n / 2);
            let step = 1 + c.below(2);
            v = v.slice(d, start, n, step).expect("slice within bounds");
        }
    }
    v
}

/// Relative tolerance for results computed in `dtype` (storage rounding dominates for f16/bf16).
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        DType::I32 | DType::U32 => 0.0,
    }
}

/// Checks `|got - want| <= tol * (|want| + scale)` elementwise, NaN matching NaN and equal
/// infinities matching. `scale` absorbs cancellation (pass the typical magnitude of the inputs).
/// Returns a message naming `what`, the index and the values at the first mismatch.
pub fn check_close(
    got: &[f64],
    want: &[f64],
    tol: f64,
    scale: f64,
    what: &str,
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} values vs {} expected",
            got.len(),
            want.len()
        ));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (w.abs() + scale);
        if !ok {
            return Err(format!(
                "{what}: element {i} is {g}, expected {w} (tolerance {tol})"
            ));
        }
    }
    Ok(())
}

/// `check_close` of two tensors' elements (shapes must match) that panics with its message.
pub fn assert_close(got: &Tensor, want: &Tensor, tol: f64, scale: f64, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shapes");
    let g = got.to_vec_f64().expect("read result");
    let w = want.to_vec_f64().expect("read reference");
    if let Err(msg) = check_close(&g, &w, tol, scale, what) {
        panic!("{msg}");
    }
}

/// The process's peak resident memory (Linux `VmHWM`) in bytes; `None` where there is no
/// `/proc/self/status`.
pub fn peak_rss() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The peak resident memory `f` adds to what the process holds when it starts (Linux 4.0 and
/// later: writing 5 to `/proc/self/clear_refs` resets the peak). Meant for a test alone in its
/// binary, as other threads' memory counts too.
pub fn rss_added<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = peak_rss().unwrap_or(0);
    let r = f();
    (r, peak_rss().unwrap_or(0).saturating_sub(before))
}
