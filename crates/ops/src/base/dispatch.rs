//! The one place where a device picks an op's implementation: its OpenCL kernels or its host reference.
//!
//! Every op is written as a description: a value made after the op's checks that holds its
//! inputs and parameters (and so its output shape and dtype), and implements [`Op`] with an
//! OpenCL implementation (in its family's `opencl.rs`) and a reference implementation (in its
//! family's `reference.rs`). The public method validates, builds the description and hands it to
//! [`dispatch`]; nothing else in the op families asks which kind of device a tensor is on.
//! Descriptions are plain values (`Clone + Debug`): the same value dispatched again computes the
//! same result, which is what a recorder or a graph replay needs.
use netcl_core_devices::{Device, Result};

/// An op after its checks, with both implementations.
pub(crate) trait Op: std::fmt::Debug {
    /// What the op returns (a tensor, or several).
    type Output;
    /// The op's name: the profiler span its dispatch opens, and errors.
    const NAME: &'static str;
    /// The name of this instance, for ops named per call (a fused expression carries the name
    /// of the op it implements: `add`, `relu`, ...); [`Op::NAME`] unless overridden.
    fn name(&self) -> &'static str {
        Self::NAME
    }
    /// Compute on the OpenCL device `device` (launch kernels; no host reads beyond what the
    /// op documents).
    fn opencl(&self, device: &Device) -> Result<Self::Output>;
    /// Compute on the host: the reference the tests compare every device against.
    fn reference(&self) -> Result<Self::Output>;
}

/// Run `op` on `device`: the host reference on the host device, the OpenCL implementation on an
/// OpenCL device, inside a profiler span named for the op.
pub(crate) fn dispatch<O: Op>(device: &Device, op: &O) -> Result<O::Output> {
    let _span = netcl_profiling::span(op.name());
    match backend(device) {
        Backend::Host => op.reference(),
        Backend::OpenCl => op.opencl(device),
    }
}

/// The two kinds of device, for the base tier's storage code that is not an op (allocation,
/// uploads, the device error record) and for planners deciding what a device can batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// The host device: tensors in host memory, computed by the reference implementations.
    Host,
    /// An OpenCL device: tensors in its buffers, computed by kernels.
    OpenCl,
}

/// Which kind of device `device` is: the one place in netcl-ops that asks.
pub(crate) fn backend(device: &Device) -> Backend {
    if device.is_host() {
        Backend::Host
    } else {
        Backend::OpenCl
    }
}

/// Implements [`Op`] for a family's description `$desc` with output `$out` and name `$name`:
/// its OpenCL side is `opencl::$f(self, device)` and its reference `reference::$f(self)` (the
/// family's two modules, resolved where the macro is used); `|d| expr` names each call instead
/// (ops that share a description, `softmax`/`log_softmax`).
macro_rules! impl_op {
    ($desc:ty, $out:ty, $name:literal, $f:ident $(, |$d:ident| $per_call:expr)?) => {
        impl $crate::base::dispatch::Op for $desc {
            type Output = $out;
            const NAME: &'static str = $name;
            $(fn name(&self) -> &'static str {
                let $d = self;
                $per_call
            })?
            fn opencl(
                &self,
                device: &netcl_core_devices::Device,
            ) -> netcl_core_devices::Result<$out> {
                opencl::$f(self, device)
            }
            fn reference(&self) -> netcl_core_devices::Result<$out> {
                reference::$f(self)
            }
        }
    };
}
