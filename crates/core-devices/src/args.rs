//! Command-line arguments as UTF-8 strings: a non-UTF-8 argument is an error naming it, not a panic (as `std::env::args` would).
use crate::{Error, Result};
use std::ffi::OsString;

/// The process's arguments after the program name; an argument that is not valid UTF-8 is an
/// error naming `program`, its position and its bytes (lossily).
pub fn utf8_args(program: &str) -> Result<Vec<String>> {
    utf8_args_from(program, std::env::args_os().skip(1))
}

/// [`utf8_args`] over given arguments (numbered from 1).
pub fn utf8_args_from(
    program: &str,
    args: impl IntoIterator<Item = OsString>,
) -> Result<Vec<String>> {
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            a.into_string().map_err(|a| {
                Error::invalid(
                    program,
                    format!(
                        "argument {} ({:?}) is not valid UTF-8",
                        i + 1,
                        a.to_string_lossy()
                    ),
                )
            })
        })
        .collect()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn a_non_utf8_argument_is_an_error_naming_it() {
        let args = vec![
            OsString::from("--steps"),
            OsString::from_vec(vec![b'1', 0xff, b'2']),
        ];
        let e = utf8_args_from("llama_train", args).unwrap_err().to_string();
        assert!(
            e.contains("llama_train") && e.contains("argument 2") && e.contains("1\u{fffd}2"),
            "{e}"
        );
        let ok = utf8_args_from("x", [OsString::from("é")]).unwrap();
        assert_eq!(ok, ["é"]);
    }
}
