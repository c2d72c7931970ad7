//! The OpenCL side of bernoulli and dropout: random.cl's kernels, four words of the Philox draw per work-item.
use super::{Bernoulli, Dropout, Stream};
use crate::base::acc::arg_acc;
use crate::base::launch::program_for;
use crate::base::layout::{contiguous_strides, KernelLayout};
use crate::base::tensor::Tensor;
use netcl_core_devices::{DType, Device, Result};
use netcl_kernels::sources::RANDOM;
use netcl_kernels::{Kernel, GROUP_1D};

/// Sets the stream arguments shared by the kernels: key, base counter, threshold.
fn stream_args(k: &mut Kernel, s: &Stream) -> Result<()> {
    k.arg(&s.key[0])?
        .arg(&s.key[1])?
        .arg(&(s.base as u64))?
        .arg(&((s.base >> 64) as u64))?
        .arg(&s.thr)?;
    Ok(())
}

/// Launches `k` (arguments set) over the `n` elements, four per work-item.
fn launch_words(k: &mut Kernel, n: usize) -> Result<()> {
    let group = GROUP_1D.min(k.max_work_group_size());
    k.launch(&[n.div_ceil(4)], &[group])
}

/// The mask on `device`: `bernoulli` for float dtypes, `bernoulli_int` of the f32 program for
/// integer ones (random.cl only builds for float dtypes).
pub(super) fn bernoulli(desc: &Bernoulli, device: &Device) -> Result<Tensor> {
    let Bernoulli {
        shape,
        dtype,
        n,
        stream,
    } = desc;
    let out = Tensor::alloc(shape, *dtype, device)?;
    let (program, name) = if dtype.is_float() {
        (program_for(device, &RANDOM, *dtype)?, "bernoulli")
    } else {
        (program_for(device, &RANDOM, DType::F32)?, "bernoulli_int")
    };
    let mut k = Kernel::new(&program, name)?;
    k.arg_mem(out.mem()?)?;
    stream_args(&mut k, stream)?;
    k.arg(&(*n as u32))?;
    launch_words(&mut k, *n)?;
    Ok(out)
}

/// y and the mask in one `dropout` kernel reading x through its view; nothing is launched for an
/// empty input.
pub(super) fn dropout(desc: &Dropout, device: &Device) -> Result<(Tensor, Tensor)> {
    let op = "dropout";
    let Dropout { x, scale, stream } = desc;
    let n = x.numel();
    let y = Tensor::alloc(&x.shape, x.dtype, device)?;
    let mask = Tensor::alloc(&x.shape, x.dtype, device)?;
    if n == 0 {
        return Ok((y, mask));
    }
    // Operand 0: y and the mask (contiguous), operand 1: x.
    let layout = KernelLayout::new(
        op,
        &x.shape,
        &[(&contiguous_strides(&x.shape), 0), (&x.strides, x.offset)],
    )?;
    let program = program_for(device, &RANDOM, x.dtype)?;
    let mut k = Kernel::new(&program, op)?;
    k.arg_mem(y.mem()?)?
        .arg_mem(mask.mem()?)?
        .arg_mem(x.mem()?)?;
    stream_args(&mut k, stream)?;
    arg_acc(&mut k, x.dtype, *scale)?;
    k.arg(&layout)?.arg(&(n as u32))?;
    launch_words(&mut k, n)?;
    Ok((y, mask))
}
