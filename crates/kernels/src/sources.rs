//! The OpenCL C sources in the top-level kernels/ folder, embedded at compile time, with their kernels' declarations.
use crate::decl::KernelDecl;

/// One kernels/*.cl file (or a generated program). `kernels/common.cl` is prepended to every
/// program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Source {
    /// File name under kernels/, e.g. `copy.cl`.
    pub name: &'static str,
    pub text: &'static str,
    /// Its kernels' declarations (decls.rs for the files): `Kernel::new` launches only declared
    /// kernels and checks their arguments against the declaration.
    pub kernels: &'static [KernelDecl],
}

/// A kernels/*.cl file with its declarations, the list of the same name in decls.rs.
macro_rules! source {
    ($ident:ident, $file:literal) => {
        pub const $ident: Source = Source {
            name: $file,
            text: include_str!(concat!("../../../kernels/", $file)),
            kernels: crate::decls::$ident,
        };
    };
}

pub const COMMON: Source = Source {
    name: "common.cl",
    text: include_str!("../../../kernels/common.cl"),
    kernels: &[],
};
source!(COPY, "copy.cl");
source!(RANDOM, "random.cl");
// The GEMMs (ops/src/matmul/): the portable tiled kernel, skinny products, split-K sums.
source!(MATMUL_TILED, "matmul_tiled.cl");
source!(MATMUL_GEMV, "matmul_gemv.cl");
source!(MATMUL_PARTS, "matmul_parts.cl");
// Tensor-core GEMM (inline NVIDIA PTX): built only where its probe passes, so not in `ALL`.
source!(MATMUL_TC, "matmul_tc.cl");
// Tensor-core GEMM through Hopper's wgmma (sm_90a PTX): built only where its probe passes.
source!(MATMUL_WG, "matmul_wg.cl");
// f32 GEMM through a cp.async pipeline (inline NVIDIA PTX): built only where its probe passes.
source!(MATMUL_ASYNC, "matmul_async.cl");
// GEMM for CPU devices: built with the -D blocking matmul_cpu.rs chooses, so not in `ALL` either.
source!(MATMUL_CPU, "matmul_cpu.cl");
source!(INDEX, "index.cl");
source!(SHAPE, "shape.cl");
source!(ROPE, "rope.cl");
source!(REDUCE, "reduce.cl");
source!(SOFTMAX, "softmax.cl");
source!(NORM, "norm.cl");
source!(CONV, "conv.cl");
source!(POOL, "pool.cl");
source!(SORT, "sort.cl");
source!(ATTENTION, "attention.cl");
// Fused attention on tensor cores (inline NVIDIA PTX): built only where the GEMM's probe passed.
source!(ATTENTION_TC, "attention_tc.cl");
source!(DECODE, "decode.cl");
// The persistent decode block, built after decode.cl's text (`prelude`); built only where
// ops/src/decode allows it, so not in `ALL`.
source!(DECODE_BLOCK, "decode_block.cl");

/// The text a program of `source` is built with after common.cl and before its own: decode.cl for
/// decode_block.cl (whose tiles it runs), nothing for the others.
pub fn prelude(source: &Source) -> &'static str {
    match source.name {
        "decode_block.cl" => DECODE.text,
        _ => "",
    }
}

/// Every op-family source (not the common header).
pub static ALL: [Source; 16] = [
    COPY,
    RANDOM,
    MATMUL_TILED,
    MATMUL_GEMV,
    MATMUL_PARTS,
    INDEX,
    SHAPE,
    ROPE,
    REDUCE,
    SOFTMAX,
    NORM,
    CONV,
    POOL,
    SORT,
    ATTENTION,
    DECODE,
];

/// The device-specific sources: PTX kernels built only where their probes pass, the CPU
/// devices' GEMM and the persistent decode block.
pub static DEVICE_SPECIFIC: [Source; 6] = [
    MATMUL_TC,
    MATMUL_WG,
    MATMUL_ASYNC,
    MATMUL_CPU,
    ATTENTION_TC,
    DECODE_BLOCK,
];

impl Source {
    /// The declaration of kernel `name`: its own, or that of the `NAME##suffix` family it
    /// belongs to (a macro in the .cl that defines one kernel per `NAME`).
    pub fn declaration(&self, name: &str) -> Option<&'static KernelDecl> {
        let family = |d: &&KernelDecl| {
            d.name
                .strip_prefix("NAME##")
                .is_some_and(|suffix| name.len() > suffix.len() && name.ends_with(suffix))
        };
        (self.kernels.iter().find(|d| d.name == name)).or_else(|| self.kernels.iter().find(family))
    }
}

/// Every file under kernels/: the common header, the op families and the device-specific ones.
pub fn every() -> impl Iterator<Item = &'static Source> {
    std::iter::once(&COMMON)
        .chain(ALL.iter())
        .chain(DEVICE_SPECIFIC.iter())
}
