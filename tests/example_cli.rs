//! The examples as a user runs them (the binaries `cargo test` builds beside the tests): a non-UTF-8 argument is an error, not a panic; `llama_train --steps 0` reports a real validation loss.
#![cfg(unix)]
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::process::{Command, Output};

/// `target/<profile>/examples/<name>`, beside this test's `deps` folder.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples (or `cargo build --profile test \
         -p netcl --examples`)",
        path.display()
    );
    path
}

fn run(name: &str, args: &[OsString]) -> Output {
    Command::new(example(name)).args(args).output().unwrap()
}

#[test]
fn a_non_utf8_argument_is_an_error_not_a_panic() {
    let bad = OsString::from_vec(vec![b'-', b'-', 0xff]);
    for name in [
        "mlp",
        "cnn",
        "data_parallel",
        "llama_train",
        "llama_generate",
        "llama_finetune",
        "hf_finetune",
        "hf_convert",
    ] {
        let out = run(name, std::slice::from_ref(&bad));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains(&format!("{name}: argument 1")) && err.contains("not valid UTF-8"),
            "{name}: {err}"
        );
    }
}

#[test]
fn llama_train_with_zero_steps_reports_the_untrained_loss() {
    let dir = std::env::temp_dir().join(format!("netcl-example-steps0-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = dir.join("corpus.txt");
    std::fs::write(
        &corpus,
        "the cat sat on the mat\n\na dog ran far away\n\n".repeat(30),
    )
    .unwrap();
    let args: Vec<OsString> = [
        "--data",
        corpus.to_str().unwrap(),
        "--out",
        dir.join("run").to_str().unwrap(),
        "--vocab",
        "260",
        "--dim",
        "16",
        "--layers",
        "1",
        "--heads",
        "2",
        "--hidden",
        "32",
        "--context",
        "8",
        "--batch",
        "2",
        "--steps",
        "0",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let out = run("llama_train", &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = text.lines().last().unwrap_or_default();
    let loss: f64 = last
        .strip_prefix("final val_loss=")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("last line {last:?}"));
    // An untrained model over 260 tokens: near ln 260 = 5.56, and above all not NaN.
    assert!((4.0..8.0).contains(&loss), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--help` prints every example's flags with their defaults and exits 0; a bad value is an
/// error naming the flag.
#[test]
fn every_example_answers_help_and_names_a_bad_flag() {
    let help = OsString::from("--help");
    for (name, flag, default) in [
        ("mlp", "--epochs", "10"),
        ("cnn", "--batch", "128"),
        ("data_parallel", "--devices", "all"),
        ("llama_train", "--steps", "800"),
        ("llama_generate", "--top-k", "40"),
        ("hf_finetune", "--lora-targets", "q,v"),
        ("llama_finetune", "--steps", "100"),
        ("hf_convert", "<INPUT>", ""),
    ] {
        let out = run(name, std::slice::from_ref(&help));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{name}: {text}");
        assert!(text.contains(flag), "{name} --help lacks {flag}: {text}");
        assert!(
            text.contains(&format!("[default: {default}]")) || default.is_empty(),
            "{name} --help lacks the default {default}: {text}"
        );
    }
    let out = run(
        "llama_train",
        &[OsString::from("--steps"), OsString::from("many")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--steps") && err.contains("many"), "{err}");
}
