//! Binary elementwise ops with NumPy broadcasting over any strides: add, sub, mul, div.
use crate::element::{Element, HostData};
use crate::launch::{launch_1d, program_for};
use crate::layout::{broadcast_shapes, broadcast_strides, contiguous_strides, KernelLayout};
use crate::tensor::Tensor;
use half::{bf16, f16};
use netcl_core_devices::{Error, Result};
use netcl_kernels::sources::ELEMENTWISE;

/// A binary elementwise op; its name is the kernel prefix (`add_contig`, `add_strided`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }
}

/// Host arithmetic matching the kernels: floats in their accumulator type (f16/bf16 in f32,
/// rounded to nearest even on store), integers wrapping.
trait Arith: Element {
    fn apply(op: BinaryOp, x: Self, y: Self) -> Self;
}

fn float_op<
    F: std::ops::Add<Output = F>
        + std::ops::Sub<Output = F>
        + std::ops::Mul<Output = F>
        + std::ops::Div<Output = F>,
>(
    op: BinaryOp,
    x: F,
    y: F,
) -> F {
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
    }
}

impl Arith for f32 {
    fn apply(op: BinaryOp, x: f32, y: f32) -> f32 {
        float_op(op, x, y)
    }
}
impl Arith for f64 {
    fn apply(op: BinaryOp, x: f64, y: f64) -> f64 {
        float_op(op, x, y)
    }
}
impl Arith for f16 {
    fn apply(op: BinaryOp, x: f16, y: f16) -> f16 {
        f16::from_f32(float_op(op, x.to_f32(), y.to_f32()))
    }
}
impl Arith for bf16 {
    fn apply(op: BinaryOp, x: bf16, y: bf16) -> bf16 {
        bf16::from_f32(float_op(op, x.to_f32(), y.to_f32()))
    }
}
macro_rules! int_arith {
    ($t:ty) => {
        impl Arith for $t {
            fn apply(op: BinaryOp, x: $t, y: $t) -> $t {
                match op {
                    BinaryOp::Add => x.wrapping_add(y),
                    BinaryOp::Sub => x.wrapping_sub(y),
                    BinaryOp::Mul => x.wrapping_mul(y),
                    // Division by zero is undefined on devices; the host gives 0 rather than panic.
                    BinaryOp::Div => x.checked_div(y).unwrap_or(0),
                }
            }
        }
    };
}
int_arith!(i32);
int_arith!(u32);

fn zip_apply<T: Arith>(op: BinaryOp, x: &[T], y: &[T]) -> HostData {
    T::wrap(x.iter().zip(y).map(|(&x, &y)| T::apply(op, x, y)).collect())
}

impl Tensor {
    /// `op(self, other)` elementwise, broadcasting both to a common shape.
    pub fn binary(&self, other: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let name = op.name();
        if self.device != other.device {
            return Err(Error::device(
                name,
                format!("operands on {} and {}", self.device, other.device),
            ));
        }
        if self.dtype != other.dtype {
            return Err(Error::dtype(
                name,
                format!(
                    "operands are {} {:?} and {} {:?}",
                    self.dtype, self.shape, other.dtype, other.shape
                ),
            ));
        }
        let shape = broadcast_shapes(name, &self.shape, &other.shape)?;
        let sa = broadcast_strides(name, &self.shape, &self.strides, &shape)?;
        let sb = broadcast_strides(name, &other.shape, &other.strides, &shape)?;
        if let (Some(x), Some(y)) = (self.host_view(&shape, &sa), other.host_view(&shape, &sb)) {
            let data = match (&x, &y) {
                (HostData::F32(x), HostData::F32(y)) => zip_apply(op, x, y),
                (HostData::F64(x), HostData::F64(y)) => zip_apply(op, x, y),
                (HostData::F16(x), HostData::F16(y)) => zip_apply(op, x, y),
                (HostData::BF16(x), HostData::BF16(y)) => zip_apply(op, x, y),
                (HostData::I32(x), HostData::I32(y)) => zip_apply(op, x, y),
                (HostData::U32(x), HostData::U32(y)) => zip_apply(op, x, y),
                _ => return Err(Error::dtype(name, "host storage does not match the dtype")),
            };
            return Ok(Tensor::from_host_data(data, &shape));
        }
        let out = Tensor::alloc(&shape, self.dtype, &self.device)?;
        let program = program_for(&self.device, &ELEMENTWISE, self.dtype)?;
        let n = out.numel();
        let dense = self.is_contiguous()
            && other.is_contiguous()
            && self.shape == shape
            && other.shape == shape;
        if dense && self.offset == 0 && other.offset == 0 {
            launch_1d(&program, &format!("{name}_contig"), n, |k| {
                k.arg_mem(out.mem()?)?
                    .arg_mem(self.mem()?)?
                    .arg_mem(other.mem()?)?;
                Ok(())
            })?;
        } else {
            let so = contiguous_strides(&shape);
            let layout = KernelLayout::new(
                name,
                &shape,
                &[(&so, 0), (&sa, self.offset), (&sb, other.offset)],
            )?;
            launch_1d(&program, &format!("{name}_strided"), n, |k| {
                k.arg_mem(out.mem()?)?
                    .arg_mem(self.mem()?)?
                    .arg_mem(other.mem()?)?
                    .arg(&layout)?;
                Ok(())
            })?;
        }
        Ok(out)
    }

    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Add)
    }
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Sub)
    }
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Mul)
    }
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Div)
    }
}
