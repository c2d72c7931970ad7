//! Which arguments of a kernel it may write, read from its OpenCL C signature (a `__global` pointer to data that is not `const`): a replay over several queues orders its nodes by what each reads and writes.
use crate::signature::{is_ident, signatures};

/// For each parameter of `kernel` in the program `text` built with `options`: whether it is a
/// `__global` pointer to non-`const` data (the kernel may write through it). Kernel names may be
/// `-D` macros of the options, or `NAME##suffix` inside a macro body (matched by the suffix).
/// None when no signature matches or matching ones disagree: the caller then counts every buffer
/// argument as written.
pub(crate) fn writable_args(text: &str, options: &str, kernel: &str) -> Option<Vec<bool>> {
    let mut found: Option<Vec<bool>> = None;
    for params in signatures(text, options, kernel) {
        let mask: Vec<bool> = params.iter().map(|p| writable(p)).collect();
        match &found {
            Some(m) if *m != mask => return None,
            _ => found = Some(mask),
        }
    }
    found
}

/// A `__global` pointer whose pointee is not `const` (a `const` after the `*` binds the pointer).
fn writable(param: &str) -> bool {
    let Some(star) = param.find('*') else {
        return false;
    };
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !is_ident(c))
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    let before = words(&param[..star]);
    let global = before.iter().any(|w| w == "__global" || w == "global");
    let constant = before.iter().any(|w| w == "const");
    global && !constant
}

/// The buffers `node` writes and those it only reads: a kernel's arguments by its signature (all
/// written where `writable_args` cannot tell), a copy's source read and destination written.
pub(crate) fn node_buffers(
    node: &crate::desc::Node,
    programs: &[crate::desc::ProgramDesc],
) -> (Vec<crate::desc::BufRef>, Vec<crate::desc::BufRef>) {
    use crate::desc::{Node, NodeArg};
    match node {
        Node::Launch {
            program,
            kernel,
            args,
            ..
        } => {
            let writable = programs.get(*program).and_then(|p| {
                writable_args(&p.text, &p.options, kernel).filter(|w| w.len() == args.len())
            });
            let (mut writes, mut reads) = (Vec::new(), Vec::new());
            for (i, arg) in args.iter().enumerate() {
                if let NodeArg::Buf(b) = arg {
                    let w = writable.as_ref().is_none_or(|w| w[i]);
                    if w { &mut writes } else { &mut reads }.push(*b);
                }
            }
            (writes, reads)
        }
        Node::Write { dst, .. } => (vec![*dst], Vec::new()),
        Node::Copy { src, dst, .. } => (vec![*dst], vec![*src]),
    }
}

#[cfg(test)]
mod tests {
    use super::writable_args;
    use crate::signature::{find_word, signature, strip_comments};
    use netcl_kernels::sources;

    #[test]
    fn every_kernel_of_the_sources_has_a_readable_signature() {
        let mut kernels = 0;
        for src in sources::every() {
            let text = strip_comments(src.text);
            let mut rest = text.as_str();
            while let Some(at) = find_word(rest, &["__kernel"]) {
                rest = &rest[at..];
                let (name, _, after) = signature(rest).unwrap_or_else(|| {
                    panic!(
                        "{}: no signature at {:?}",
                        src.name,
                        &rest[..80.min(rest.len())]
                    )
                });
                assert!(!name.is_empty());
                kernels += 1;
                rest = after;
            }
        }
        assert!(kernels > 60, "{kernels} kernels");
    }

    #[test]
    fn the_gemm_kernels_resolve_by_their_option_names() {
        // Kernels that resolve count only their own outputs as written (an unresolved one counts
        // every buffer, which serialises a multi-queue replay around it).
        let opts = "-DDT_F32";
        let mut skinny = vec![true, false, false, false, true];
        skinny.extend([false; 15]);
        for name in ["matmul_gemv4", "matmul_gemv16"] {
            assert_eq!(
                writable_args(sources::MATMUL_GEMV.text, opts, name).as_ref(),
                Some(&skinny),
                "{name}"
            );
        }
        let tiled = writable_args(sources::MATMUL_TILED.text, opts, "matmul_tiled").unwrap();
        assert_eq!(tiled.iter().filter(|&&w| w).count(), 2, "c and rsum");
    }

    #[test]
    fn const_global_pointers_are_read_only_and_the_rest_are_not_written() {
        let text = "/* a, b */ __kernel void add(__global T* out, /* out */ __global const T* a,\n\
                    const __global T* b, __global T* const c, __local float* tmp, uint n) { }\n\
                    __kernel __attribute__((reqd_work_group_size(64, 1, 1)))\n\
                    void other(__global float* x) { }";
        assert_eq!(
            writable_args(text, "", "add"),
            Some(vec![true, false, false, true, false, false])
        );
        assert_eq!(writable_args(text, "", "other"), Some(vec![true]));
        assert_eq!(writable_args(text, "", "missing"), None);
    }

    #[test]
    fn names_from_build_options_and_macro_bodies_are_found() {
        let text = "__kernel void MATMUL_KERNEL(__global T* c, __global const T* a) {}\n\
                    #define RED(NAME) \\\n\
                    __kernel void NAME##_wg(__global OUT_T* out, __global const T* x) {}\n";
        let opts = "-DT=float -D MATMUL_KERNEL=matmul_64x64 -cl-fast-relaxed-math";
        assert_eq!(
            writable_args(text, opts, "matmul_64x64"),
            Some(vec![true, false])
        );
        assert_eq!(writable_args(text, opts, "sum_wg"), Some(vec![true, false]));
        assert_eq!(writable_args(text, "", "matmul_64x64"), None);
    }

    #[test]
    fn disagreeing_signatures_of_one_name_count_as_unknown() {
        let text = "#ifdef A\n__kernel void k(__global float* x) {}\n#else\n\
                    __kernel void k(__global const float* x) {}\n#endif";
        assert_eq!(writable_args(text, "", "k"), None);
    }
}
