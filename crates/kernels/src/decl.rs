//! Kernel declarations: each kernel's name and how it uses each argument, written once (decls.rs for the kernels/*.cl files, by the generator for generated ones); launches check their arguments against them and captured graphs take what a kernel writes from them.

/// How a kernel uses one argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Use {
    /// A buffer the kernel only reads (`__global const T*`).
    In,
    /// A buffer the kernel may write (and read).
    Out,
    /// A value of the OpenCL C type named (`uint`, `Layout`, `T`, ...); its size is checked
    /// where the type is a built-in scalar or vector.
    Value(&'static str),
    /// `__local` memory sized at launch.
    Local,
}

/// One argument of a kernel: its name in the .cl signature and its use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Param {
    pub name: &'static str,
    pub usage: Use,
}

/// A kernel's name and its arguments in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelDecl {
    pub name: &'static str,
    pub params: &'static [Param],
}

impl KernelDecl {
    /// Per argument: whether the kernel may write it (a buffer declared `Out`).
    pub fn writes(&self) -> Vec<bool> {
        self.params.iter().map(|p| p.usage == Use::Out).collect()
    }

    /// A declaration made at run time (a generated kernel's), kept for the process's life as
    /// the generated source it belongs to is.
    pub fn leak(name: &str, params: Vec<Param>) -> KernelDecl {
        KernelDecl {
            name: Box::leak(name.to_string().into_boxed_str()),
            params: Box::leak(params.into_boxed_slice()),
        }
    }
}

/// Bytes of a built-in scalar or vector type of OpenCL C (`float4`: 16; a 3-vector takes 4);
/// `None` for other types (structs, and `T`-like names a build option defines).
pub fn value_bytes(ty: &str) -> Option<usize> {
    let base = ty.trim_end_matches(|c: char| c.is_ascii_digit());
    let width = match &ty[base.len()..] {
        "" => 1,
        "2" => 2,
        "3" | "4" => 4,
        "8" => 8,
        "16" => 16,
        _ => return None,
    };
    let scalar = match base {
        "char" | "uchar" => 1,
        "short" | "ushort" | "half" => 2,
        "int" | "uint" | "float" => 4,
        "long" | "ulong" | "double" => 8,
        _ => return None,
    };
    Some(scalar * width)
}

/// Declarations in the form of a .cl signature: `name(out: Out, x: In, n: V("uint"))`; a
/// `NAME##suffix` macro family's name as a string, `"NAME##_wg"(...)`.
#[macro_export]
macro_rules! kernels {
    ($($kernel:tt($($param:ident: $usage:expr),* $(,)?)),* $(,)?) => {
        &[$($crate::decl::KernelDecl {
            name: $crate::kernel_name!($kernel),
            params: &[$($crate::decl::Param { name: stringify!($param), usage: $usage }),*],
        }),*]
    };
}

/// A declared kernel's name: an identifier, or a family's string.
#[doc(hidden)]
#[macro_export]
macro_rules! kernel_name {
    ($name:ident) => {
        stringify!($name)
    };
    ($name:literal) => {
        $name
    };
}

#[cfg(test)]
mod tests {
    use crate::signature::{declared, find_word, signature, signatures, strip_comments};
    use crate::sources;

    /// Every kernel of every kernels/*.cl file is declared, every declaration names a kernel of
    /// its file, and each declared argument has the name and use its .cl parameter implies.
    #[test]
    fn declarations_match_the_kernel_files() {
        let mut checked = 0;
        for src in sources::every() {
            let text = strip_comments(src.text);
            let mut rest = text.as_str();
            let mut names = Vec::new();
            while let Some(at) = find_word(rest, &["__kernel"]) {
                rest = &rest[at..];
                let (name, _, after) = signature(rest).expect("a readable signature");
                names.push(name);
                rest = after;
            }
            for d in src.kernels {
                assert!(
                    names.iter().any(|n| n == d.name),
                    "{}: {} is declared but not defined",
                    src.name,
                    d.name
                );
            }
            for name in names {
                // A NAME##suffix family is checked through one of its members.
                let concrete = name.replace("NAME##", "sum");
                let d = src
                    .declaration(&concrete)
                    .unwrap_or_else(|| panic!("{}: {name} is not declared", src.name));
                let sigs = signatures(src.text, "", &concrete);
                assert_eq!(sigs.len(), 1, "{}: {name}", src.name);
                let want: Vec<(String, String)> = sigs[0].iter().map(|p| declared(p)).collect();
                let got: Vec<(String, String)> = (d.params.iter())
                    .map(|p| (p.name.to_string(), format!("{:?}", p.usage)))
                    .collect();
                assert_eq!(got, want, "{}: {name}", src.name);
                checked += 1;
            }
        }
        assert!(checked > 70, "{checked} kernels");
    }

    #[test]
    fn families_match_their_members_only() {
        let d = sources::REDUCE.declaration("argmax_wg").expect("argmax_wg");
        assert_eq!(d.name, "NAME##_wg");
        assert!(sources::REDUCE.declaration("_wg").is_none());
        assert!(sources::REDUCE.declaration("argmax_w").is_none());
        assert!(sources::COPY.declaration("fill").is_some());
        assert!(sources::COPY.declaration("fil").is_none());
    }
}
