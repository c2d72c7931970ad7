//! Kernel signatures read from OpenCL C text: the parameter lists of a kernel (its name resolved through `-D` options and `NAME##suffix` macro bodies), and what each parameter is (a pointer in which address space, a value of how many bytes). Loaded graphs are checked against them, and the declarations against the kernel files.

/// The parameter lists of every signature of `kernel` in the program `text` built with
/// `options` (comments stripped, object-like macros of the text expanded where they have one
/// definition; several lists where `#if` branches declare the kernel more than once).
pub fn signatures(text: &str, options: &str, kernel: &str) -> Vec<Vec<String>> {
    let text = strip_comments(text);
    let macros = macros(&text);
    let defines = defines(options);
    let mut found = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = find_word(rest, &["__kernel", "kernel"]) {
        rest = &rest[at..];
        let Some((name, params, after)) = signature(rest) else {
            rest = &rest[1..];
            continue;
        };
        rest = after;
        if name_matches(&name, kernel, &defines) {
            let params = expand(params, &macros);
            found.push(
                split_params(&params)
                    .into_iter()
                    .map(str::to_string)
                    .collect(),
            );
        }
    }
    found
}

/// `text` with comments and line continuations replaced by spaces.
pub fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('/', Some('*')) => {
                chars.next();
                let mut prev = ' ';
                for d in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
                out.push(' ');
            }
            ('/', Some('/')) => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
                out.push('\n');
            }
            ('\\', Some('\n')) => {
                chars.next();
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    out
}

/// The object-like macros `#define NAME body` of `text` (continuations already joined) that have
/// one body: a name defined twice differently (`#if` branches) is left out, so never guessed.
fn macros(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for line in text.lines() {
        let Some(def) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        let Some(def) = def.trim_start().strip_prefix("define") else {
            continue;
        };
        if !def.starts_with(char::is_whitespace) {
            continue;
        }
        let def = def.trim_start();
        let end = def.find(|c: char| !is_ident(c)).unwrap_or(def.len());
        let (name, body) = def.split_at(end);
        if name.is_empty() || body.starts_with('(') {
            continue; // function-like
        }
        let body = body.trim().to_string();
        match out.iter_mut().find(|(n, _)| n == name) {
            Some((_, b)) if b.as_deref() != Some(body.as_str()) => *b = None,
            Some(_) => {}
            None => out.push((name.to_string(), Some(body))),
        }
    }
    out.into_iter().filter_map(|(n, b)| Some((n, b?))).collect()
}

/// `params` with whole-word uses of `macros` replaced by their bodies (nested ones too, a few
/// levels deep).
fn expand(params: &str, macros: &[(String, String)]) -> String {
    let mut text = params.to_string();
    for _ in 0..4 {
        let mut out = String::with_capacity(text.len());
        let mut changed = false;
        let mut word = String::new();
        for c in text.chars().chain(std::iter::once(' ')) {
            if is_ident(c) {
                word.push(c);
                continue;
            }
            match macros.iter().find(|(n, _)| *n == word) {
                Some((_, body)) => {
                    out.push_str(body);
                    changed = true;
                }
                None => out.push_str(&word),
            }
            word.clear();
            out.push(c);
        }
        out.pop();
        text = out;
        if !changed {
            break;
        }
    }
    text
}

/// `-DNAME=VALUE` (or `-D NAME=VALUE`) definitions of build options.
fn defines(options: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut words = options.split_whitespace();
    while let Some(w) = words.next() {
        let def = match w.strip_prefix("-D") {
            Some("") => words.next().unwrap_or(""),
            Some(d) => d,
            None => continue,
        };
        if let Some((k, v)) = def.split_once('=') {
            out.push((k.to_string(), v.to_string()));
        }
    }
    out
}

pub fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Byte offset of the first of `words` (ASCII) standing as a whole word in `s`. Compares bytes,
/// so text with multi-byte characters anywhere (an `#if 0` block, a string) is fine.
pub fn find_word(s: &str, words: &[&str]) -> Option<usize> {
    let bytes = s.as_bytes();
    let whole = |at: usize, len: usize| {
        let before = at == 0 || !is_ident(bytes[at - 1] as char);
        let after = at + len >= bytes.len() || !is_ident(bytes[at + len] as char);
        before && after
    };
    (0..bytes.len()).find(|&at| {
        words
            .iter()
            .any(|w| bytes[at..].starts_with(w.as_bytes()) && whole(at, w.len()))
    })
}

/// The text from `open` (a `(`) to its matching `)`, exclusive, and what follows.
fn balanced(s: &str) -> Option<(&str, &str)> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some((&s[1..i], &s[i + 1..]));
                }
            }
            _ => {}
        }
    }
    None
}

/// At `__kernel`: the kernel's name (spaces removed), its parameter list and the text after it.
pub fn signature(s: &str) -> Option<(String, &str, &str)> {
    let mut rest = s.trim_start_matches(|c: char| is_ident(c)).trim_start();
    while let Some(attr) = rest.strip_prefix("__attribute__") {
        let (_, after) = balanced(attr.trim_start())?;
        rest = after.trim_start();
    }
    rest = rest.strip_prefix("void")?;
    let open = rest.find('(')?;
    let name: String = rest[..open].split_whitespace().collect();
    if name.is_empty() || !name.chars().all(|c| is_ident(c) || c == '#') {
        return None;
    }
    let (params, after) = balanced(&rest[open..])?;
    Some((name, params, after))
}

fn name_matches(name: &str, kernel: &str, defines: &[(String, String)]) -> bool {
    if let Some((_, suffix)) = name.split_once("##") {
        return kernel.ends_with(&suffix.replace("##", ""));
    }
    let resolved = defines
        .iter()
        .find(|(k, _)| k == name)
        .map_or(name, |(_, v)| v.as_str());
    resolved == kernel
}

/// Parameters split at top-level commas (none for an empty list or `void`).
fn split_params(params: &str) -> Vec<&str> {
    let p = params.trim();
    if p.is_empty() || p == "void" {
        return Vec::new();
    }
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in p.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&p[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&p[start..]);
    out
}

/// What one kernel parameter takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A pointer to `__global` or `__constant` memory: a buffer.
    Buffer,
    /// A pointer to `__local` memory: a size in bytes.
    Local,
    /// A value, with its size in bytes where the type is a built-in scalar or vector.
    Value(Option<usize>),
}

/// What the parameter declaration `p` (`__global const T* x`, `uint n`, `Layout l`) takes.
pub fn param(p: &str) -> ParamKind {
    let words: Vec<&str> = p
        .split(|c: char| !is_ident(c))
        .filter(|w| !w.is_empty())
        .collect();
    if p.contains('*') {
        let local = words.iter().any(|w| *w == "__local" || *w == "local");
        return if local {
            ParamKind::Local
        } else {
            ParamKind::Buffer
        };
    }
    let qualifier = |w: &&&str| {
        matches!(
            **w,
            "const" | "volatile" | "restrict" | "__private" | "private"
        )
    };
    let types: Vec<&str> = words.iter().filter(|w| !qualifier(w)).copied().collect();
    // The last word is the parameter's name; what precedes it is its type.
    let ty = match types.as_slice() {
        [.., "unsigned", _] | [.., "signed", _] => "int",
        [.., ty, _] => ty,
        _ => return ParamKind::Value(None),
    };
    ParamKind::Value(crate::decl::value_bytes(ty))
}

/// The parameter declaration `p`'s name and the use a declaration of it must give, in the
/// form `{:?}` prints a [`Use`](crate::decl::Use): `In` for a pointer to `const` (or
/// `__constant`) global data, `Out` for other global pointers, `Local`, `Value("uint")`.
pub fn declared(p: &str) -> (String, String) {
    let words: Vec<&str> = p
        .split(|c: char| !is_ident(c))
        .filter(|w| !w.is_empty())
        .collect();
    let name = words.last().unwrap_or(&"").to_string();
    let usage = match (param(p), p.find('*')) {
        (ParamKind::Local, _) => "Local".to_string(),
        (ParamKind::Buffer, Some(star)) => {
            let before: Vec<&str> = p[..star]
                .split(|c: char| !is_ident(c))
                .filter(|w| !w.is_empty())
                .collect();
            let read_only = before
                .iter()
                .any(|w| matches!(*w, "const" | "__constant" | "constant"));
            if read_only { "In" } else { "Out" }.to_string()
        }
        _ => {
            let types: Vec<&&str> = (words.iter())
                .filter(|w| {
                    !matches!(
                        **w,
                        "const" | "volatile" | "restrict" | "__private" | "private"
                    )
                })
                .collect();
            let ty = types.len().checked_sub(2).map_or("", |i| *types[i]);
            format!("Value({ty:?})")
        }
    };
    (name, usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_buffers_local_memory_or_values_of_known_size() {
        assert_eq!(param("__global const T* restrict x"), ParamKind::Buffer);
        assert_eq!(param("__constant float* c"), ParamKind::Buffer);
        assert_eq!(param("__local float* tmp"), ParamKind::Local);
        assert_eq!(param("const uint n"), ParamKind::Value(Some(4)));
        assert_eq!(param("unsigned int n"), ParamKind::Value(Some(4)));
        assert_eq!(param("ulong seed"), ParamKind::Value(Some(8)));
        assert_eq!(param("float3 v"), ParamKind::Value(Some(16)));
        assert_eq!(param("Layout l"), ParamKind::Value(None));
    }

    #[test]
    fn text_with_multi_byte_characters_is_read() {
        let text = "#if 0\nkernel café ü\n#endif\n__kernel void k(__global float* x, uint n) {}";
        let found = signatures(text, "", "k");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].len(), 2);
        assert_eq!(find_word("é kernel", &["kernel"]), Some(3));
    }

    /// Every parameter of every kernel netcl ships reads as a type and a name once its file's
    /// macros are expanded, so a loaded launch's arguments are checked against all of them.
    #[test]
    fn every_parameter_of_netcls_kernels_has_a_type_and_a_name() {
        for src in crate::sources::every() {
            let text = strip_comments(src.text);
            let macros = macros(&text);
            let mut rest = text.as_str();
            while let Some(at) = find_word(rest, &["__kernel"]) {
                rest = &rest[at..];
                let (name, params, after) = signature(rest).expect("readable");
                rest = after;
                let params = expand(params, &macros);
                for p in split_params(&params) {
                    let words = p.split(|c: char| !is_ident(c)).filter(|w| !w.is_empty());
                    assert!(words.count() >= 2, "{}: {name}: parameter {p:?}", src.name);
                }
            }
        }
    }

    #[test]
    fn parameter_macros_of_the_text_are_expanded_when_defined_once() {
        let text = "#define ARGS __global float* y, \\\n  __global const float* x /* in */\n\
                    #ifdef A\n#define W int\n#else\n#define W long\n#endif\n\
                    __kernel void k(ARGS, uint n) {}\n__kernel void w(W v) {}";
        let k = signatures(text, "", "k");
        assert_eq!(k[0].len(), 3, "{k:?}");
        assert_eq!(param(&k[0][1]), ParamKind::Buffer);
        // W has two definitions: left as it is (a value of unknown size).
        assert_eq!(
            param(&signatures(text, "", "w")[0][0]),
            ParamKind::Value(None)
        );
    }
}
