//! Command lines of the examples and tools: clap's derive API, errors in netcl's type, `--help` printed rather than failed.
use crate::{Error, Result};
pub use clap::{Args, CommandFactory, FromArgMatches, Parser};

/// `T` parsed from `args` (without the program name) as `program`'s command line. `Ok(None)`
/// when the user asked for `--help` or `--version` (printed to stdout); a bad flag or value is
/// an error naming it.
pub fn parse<T: Parser>(program: &str, args: Vec<String>) -> Result<Option<T>> {
    parse_with(program, args, |c| c)
}

/// [`parse`], with the command changed first by `adjust` (e.g. defaults set at run time).
pub fn parse_with<T: Parser>(
    program: &str,
    args: Vec<String>,
    adjust: impl FnOnce(clap::Command) -> clap::Command,
) -> Result<Option<T>> {
    let command = adjust(T::command().name(program.to_string()));
    let argv = std::iter::once(program.to_string()).chain(args);
    let matches = match command.try_get_matches_from(argv) {
        Ok(m) => m,
        Err(e) => return shown_or_error(program, e),
    };
    match T::from_arg_matches(&matches) {
        Ok(t) => Ok(Some(t)),
        Err(e) => shown_or_error(program, e),
    }
}

fn shown_or_error<T>(program: &str, e: clap::Error) -> Result<Option<T>> {
    use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
    if matches!(e.kind(), DisplayHelp | DisplayVersion) {
        // A closed stdout (`| head`) is not an error of the program.
        let _ = e.print();
        return Ok(None);
    }
    let text = e.render().to_string();
    // clap's first line says what is wrong; the usage lines after it repeat `--help`'s.
    let first = text.lines().next().unwrap_or("").trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    Err(Error::invalid(
        program,
        format!("{first} (see {program} --help)"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool's flags.
    #[derive(Parser, Debug)]
    struct Tool {
        /// Steps to run.
        #[arg(long, default_value_t = 5)]
        steps: usize,
        /// Where to write.
        #[arg(long)]
        out: Option<String>,
    }

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn flags_help_and_errors() {
        let t: Tool = parse("tool", args("--steps 7")).unwrap().unwrap();
        assert_eq!((t.steps, t.out), (7, None));
        assert!(parse::<Tool>("tool", args("--help")).unwrap().is_none());
        let bad = parse::<Tool>("tool", args("--steps x"))
            .unwrap_err()
            .to_string();
        assert!(bad.contains("--steps") && bad.contains("'x'"), "{bad}");
        let unknown = parse::<Tool>("tool", args("--stpes 3"))
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("--stpes"), "{unknown}");
        let set = parse_with::<Tool>("tool", vec![], |c| {
            c.mut_arg("steps", |a| a.default_value("9"))
        });
        assert_eq!(set.unwrap().unwrap().steps, 9);
    }
}
