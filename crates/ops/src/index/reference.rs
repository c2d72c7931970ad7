//! The host indexing: gathers and scatter-adds over storage positions, summing in the kernels' accumulator arithmetic and order.
use super::{idx_along, Gather, GatherPlan, RowAdd, ScatterAdd, ScatterPlan};
use crate::base::element::{Element, HostData};
use crate::base::layout::{contiguous_strides, numel, strided_positions};
use crate::base::tensor::Tensor;
use half::{bf16, f16};
use netcl_core_devices::{Error, Result};

/// Storage positions of a strided view in row-major order.
fn positions(shape: &[usize], strides: &[usize], offset: usize) -> Vec<usize> {
    strided_positions(shape, strides, offset).collect()
}

/// Element types with the kernels' accumulator arithmetic (f16/bf16 in f32, integers wrapping).
trait Accum: Element {
    type A: Copy;
    fn zero() -> Self::A;
    fn to_acc(self) -> Self::A;
    fn from_acc(a: Self::A) -> Self;
    fn add(a: Self::A, b: Self::A) -> Self::A;
}

macro_rules! accum {
    ($t:ty, $a:ty, $to:expr, $from:expr, $add:expr) => {
        impl Accum for $t {
            type A = $a;
            fn zero() -> $a {
                <$a>::default()
            }
            fn to_acc(self) -> $a {
                ($to)(self)
            }
            fn from_acc(a: $a) -> $t {
                ($from)(a)
            }
            fn add(a: $a, b: $a) -> $a {
                ($add)(a, b)
            }
        }
    };
}
accum!(f32, f32, |x| x, |a| a, |a: f32, b| a + b);
accum!(f64, f64, |x| x, |a| a, |a: f64, b| a + b);
accum!(f16, f32, f16::to_f32, f16::from_f32, |a: f32, b| a + b);
accum!(bf16, f32, bf16::to_f32, bf16::from_f32, |a: f32, b| a + b);
accum!(i32, i32, |x| x, |a| a, i32::wrapping_add);
accum!(u32, u32, |x| x, |a| a, u32::wrapping_add);

/// A gather on the host, into a new host tensor.
pub(super) fn gather(desc: &Gather) -> Result<Tensor> {
    let Gather { src, idx, plan } = desc;
    let op = plan.op;
    let (Some(s), Some(i)) = (src.host(), idx.host()) else {
        return Err(Error::device(op, "host tensors without host storage"));
    };
    let HostData::I32(iv) = &*i else {
        return Err(Error::dtype(op, "index storage is not i32"));
    };
    let data = with_host!(&*s, v => host_gather(v, iv, plan, src.offset, idx.offset));
    Ok(Tensor::from_host_data(data, &plan.shape))
}

fn host_gather<T: Element>(
    src: &[T],
    idx: &[i32],
    plan: &GatherPlan,
    src_off: usize,
    idx_off: usize,
) -> HostData {
    let base = positions(&plan.shape, &plan.src_strides, src_off);
    let ip = positions(&plan.shape, &plan.idx_strides, idx_off);
    T::wrap(
        base.iter()
            .zip(&ip)
            .map(|(&b, &p)| src[b + idx[p] as usize * plan.stride])
            .collect(),
    )
}

/// A scatter-add on the host, into a new host tensor.
pub(super) fn scatter_add(desc: &ScatterAdd) -> Result<Tensor> {
    let ScatterAdd { x, idx, src, plan } = desc;
    let op = plan.op;
    let (i, s) = (idx.host(), src.host());
    let (Some(i), Some(s)) = (i, s) else {
        return Err(Error::device(op, "host tensors without host storage"));
    };
    let HostData::I32(iv) = &*i else {
        return Err(Error::dtype(op, "index storage is not i32"));
    };
    let xg = x.as_ref().map(|t| (t, t.host()));
    let data = match (&*s, xg.as_ref().map(|(t, g)| (t, g.as_deref()))) {
        (s, None) => {
            with_host!(s, v => host_scatter(None, iv, v, plan, idx.offset, src.offset))
        }
        (s, Some((xt, Some(xd)))) => {
            macro_rules! arm {
                ($($var:ident),*) => {
                    match (s, xd) {
                        $((HostData::$var(sv), HostData::$var(xv)) => host_scatter(
                            Some((xv.as_slice(), xt.strides.as_slice(), xt.offset)),
                            iv, sv, plan, idx.offset, src.offset),)*
                        _ => return Err(Error::dtype(op, "storage does not match the dtype")),
                    }
                };
            }
            arm!(F32, F64, F16, BF16, I32, U32)
        }
        (_, Some((_, None))) => return Err(Error::device(op, "x has no host storage")),
    };
    Ok(Tensor::from_host_data(data, &plan.shape))
}

fn host_scatter<T: Accum>(
    x: Option<(&[T], &[usize], usize)>,
    idx: &[i32],
    src: &[T],
    plan: &ScatterPlan,
    idx_off: usize,
    src_off: usize,
) -> HostData {
    let mut acc: Vec<T::A> = match x {
        Some((v, strides, off)) => positions(&plan.shape, strides, off)
            .iter()
            .map(|&p| v[p].to_acc())
            .collect(),
        None => vec![T::zero(); numel(&plan.shape)],
    };
    let out_strides = contiguous_strides(&plan.shape);
    let ip = positions(&plan.idx_shape, &plan.idx_strides, idx_off);
    let sp = positions(&plan.idx_shape, &plan.src_strides, src_off);
    // Output position of idx-space position p with the indexed coordinate removed.
    let base = positions(
        &plan.idx_shape,
        &out_strides
            .iter()
            .enumerate()
            .map(|(d, &s)| if d == plan.dim { 0 } else { s })
            .collect::<Vec<_>>(),
        0,
    );
    // Row-major order over idx space visits each output's contributions in ascending j, as the kernel does.
    for ((&b, &i), &s) in base.iter().zip(&ip).zip(&sp) {
        let o = b + idx[i] as usize * out_strides[plan.dim];
        acc[o] = T::add(acc[o], src[s].to_acc());
    }
    T::wrap(acc.into_iter().map(T::from_acc).collect())
}

/// A whole-row scatter-add on the host: the scatter-add along dim 0 of the 1-D index list (ids of
/// another rank flattened, and the grad rows with them), which sums each row in ascending j.
pub(super) fn row_add(desc: &RowAdd) -> Result<Tensor> {
    let (idx, src) = (&desc.idx, &desc.src);
    let (idx, src) = if idx.ndim() == 1 {
        (idx.clone(), src.clone())
    } else {
        let n = idx.numel();
        let row = numel(&src.shape[idx.ndim()..]);
        (idx.reshape(&[n])?, src.reshape(&[n, row])?)
    };
    let along = idx_along(&idx, 0, &src.shape);
    let x = desc.x.as_ref();
    scatter_add(&ScatterAdd::new(desc.op, x, &desc.shape, 0, &along, &src))
}
