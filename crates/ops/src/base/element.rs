//! Rust element types of tensors and the typed host storage they live in.
use half::{bf16, f16};
use netcl_core_devices::{DType, Result};
use netcl_core_memory::{host_vec, HostBuf};

/// Host storage: one typed vector per dtype (f16/bf16 as the `half` crate's 16-bit types).
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    U32(Vec<u32>),
}

/// Run `$body` with `$v` bound to the typed vector inside a `HostData` (one arm per dtype).
#[macro_export]
macro_rules! with_host {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::HostData::F32($v) => $body,
            $crate::HostData::F64($v) => $body,
            $crate::HostData::F16($v) => $body,
            $crate::HostData::BF16($v) => $body,
            $crate::HostData::I32($v) => $body,
            $crate::HostData::U32($v) => $body,
        }
    };
}

impl HostData {
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::I32(_) => DType::I32,
            HostData::U32(_) => DType::U32,
        }
    }

    pub fn len(&self) -> usize {
        with_host!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The raw little-endian bytes.
    pub fn as_bytes(&self) -> &[u8] {
        with_host!(self, v => bytemuck::cast_slice(v))
    }

    /// The raw little-endian bytes, to write into.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        with_host!(self, v => bytemuck::cast_slice_mut(v))
    }

    /// Typed storage of `dtype` from raw bytes (`bytes.len()` must be a multiple of the size),
    /// allocated fallibly and within the host budget.
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Result<HostData> {
        fn cast<T: bytemuck::Pod>(b: &[u8]) -> Result<Vec<T>> {
            let size = std::mem::size_of::<T>();
            let mut v: Vec<T> = host_vec::<T>(b.len() / size)?;
            v.extend(b.chunks_exact(size).map(bytemuck::pod_read_unaligned::<T>));
            Ok(v)
        }
        Ok(match dtype {
            DType::F32 => HostData::F32(cast(bytes)?),
            DType::F64 => HostData::F64(cast(bytes)?),
            DType::F16 => HostData::F16(cast(bytes)?),
            DType::BF16 => HostData::BF16(cast(bytes)?),
            DType::I32 => HostData::I32(cast(bytes)?),
            DType::U32 => HostData::U32(cast(bytes)?),
        })
    }

    /// `n` copies of `value` converted to `dtype`, allocated fallibly and within the host budget
    /// (`NETCL_POOL_LIMIT`): `Error::OutOfMemory` instead of an abort.
    pub fn try_filled(dtype: DType, n: usize, value: f64) -> Result<HostData> {
        HostData::try_from_fn(dtype, n, |_| value)
    }

    /// Element i is `f(i)` converted to `dtype`, allocated fallibly and within the host budget.
    pub fn try_from_fn(dtype: DType, n: usize, f: impl FnMut(usize) -> f64) -> Result<HostData> {
        fn make<T: Element>(n: usize, mut f: impl FnMut(usize) -> f64) -> Result<Vec<T>> {
            let mut v = host_vec(n)?;
            v.extend((0..n).map(|i| T::from_f64(f(i))));
            Ok(v)
        }
        Ok(match dtype {
            DType::F32 => HostData::F32(make(n, f)?),
            DType::F64 => HostData::F64(make(n, f)?),
            DType::F16 => HostData::F16(make(n, f)?),
            DType::BF16 => HostData::BF16(make(n, f)?),
            DType::I32 => HostData::I32(make(n, f)?),
            DType::U32 => HostData::U32(make(n, f)?),
        })
    }

    /// Every element as f64, in a counted host buffer (an error, not an abort, when it does not
    /// fit the host budget).
    pub fn to_f64(&self) -> Result<HostBuf<f64>> {
        with_host!(self, v => HostBuf::collect(v.len(), v.iter().map(|x| x.to_f64())))
    }
}

/// A Rust type that a tensor can hold.
pub trait Element:
    Copy + Send + Sync + bytemuck::Pod + std::fmt::Debug + PartialEq + 'static
{
    const DTYPE: DType;
    fn wrap(v: Vec<Self>) -> HostData;
    fn unwrap(d: &HostData) -> Option<&Vec<Self>>;
    /// The vector of `d` when it holds this type, without a copy.
    fn into_vec(d: HostData) -> Option<Vec<Self>>;
    fn to_f64(self) -> f64;
    /// Conversion from f64: floats round to nearest; integers truncate toward zero and wrap
    /// modulo 2^32, as the kernels' scalar arguments do.
    fn from_f64(x: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $variant:ident, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn wrap(v: Vec<Self>) -> HostData {
                HostData::$variant(v)
            }
            fn unwrap(d: &HostData) -> Option<&Vec<Self>> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn into_vec(d: HostData) -> Option<Vec<Self>> {
                match d {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(x: f64) -> Self {
                ($from)(x)
            }
        }
    };
}

element!(f32, F32, |x: f32| x as f64, |x: f64| x as f32);
element!(f64, F64, |x: f64| x, |x: f64| x);
element!(f16, F16, |x: f16| x.to_f64(), f16::from_f64);
element!(bf16, BF16, |x: bf16| x.to_f64(), bf16::from_f64);
element!(i32, I32, |x: i32| x as f64, |x: f64| x as i64 as i32);
element!(u32, U32, |x: u32| x as f64, |x: f64| x as i64 as u32);
