//! Text corpora: fortune-format and paragraph splitting, folder walking (sorted, *.dat and symlinks skipped), deterministic splits, errors naming the path.
mod common;
use common::TempDir;
use netcl_data::{
    encode_documents, split_documents, utf8_bytes, TextCorpus, Tokenizer, EMBEDDED_TEXT, ENDOFTEXT,
};

#[test]
fn fortune_files_split_at_percent_lines() {
    let text =
        "First fortune,\ntwo lines.\n%\nSecond one.\n%\n\n%\nThird: 50% off\n  -- a sign\n%\n";
    let docs = split_documents(text);
    assert_eq!(
        docs,
        vec![
            "First fortune,\ntwo lines.",
            "Second one.",
            "Third: 50% off\n  -- a sign"
        ]
    );
    // Without % lines, blank lines separate documents; CRLF is normalized.
    let docs = split_documents("Para one\r\nstill one.\r\n\r\n\r\nPara two.\n   \nthree");
    assert_eq!(docs, vec!["Para one\nstill one.", "Para two.", "three"]);
}

#[test]
fn folders_are_read_in_sorted_order_skipping_dat_and_symlinks() {
    let dir = TempDir::new("corpus-folder");
    std::fs::create_dir_all(dir.join("b")).unwrap();
    std::fs::write(dir.join("zeta"), "zeta one\n%\nzeta two\n%\n").unwrap();
    std::fs::write(dir.join("zeta.dat"), [0u8, 1, 2, 3, 0xff]).unwrap();
    std::fs::write(dir.join("alpha"), "alpha one\n%\nalpha two\n").unwrap();
    std::fs::write(dir.join("b/inner.txt"), b"inner \xffbyte\n\nsecond para").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(dir.join("alpha"), dir.join("alpha.u8")).unwrap();
    let c = TextCorpus::from_path(&dir).unwrap();
    assert_eq!(
        c.documents(),
        [
            "alpha one",
            "alpha two",
            "inner \u{fffd}byte",
            "second para",
            "zeta one",
            "zeta two"
        ]
    );
    assert!(c.source.contains("corpus-folder"));
    assert_eq!(c.bytes(), utf8_bytes(c.documents()));
    // One file works too.
    let one = TextCorpus::from_path(dir.join("zeta")).unwrap();
    assert_eq!(one.documents(), ["zeta one", "zeta two"]);
}

#[test]
fn missing_or_empty_paths_are_errors_naming_them() {
    let dir = TempDir::new("corpus-errors");
    let err = TextCorpus::from_path(dir.join("nope"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope"), "{err}");
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    std::fs::write(dir.join("empty/index.dat"), [1u8, 2]).unwrap();
    std::fs::write(dir.join("empty/blank"), "\n%\n  \n").unwrap();
    let err = TextCorpus::from_path(dir.join("empty"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty") && err.contains("no text"), "{err}");
    let err = TextCorpus::embedded().split(1).unwrap_err().to_string();
    assert!(err.contains("every 1"), "{err}");
}

#[test]
fn split_is_every_kth_document_and_deterministic() {
    let docs: Vec<String> = (0..23).map(|i| format!("doc {i}")).collect();
    let c = TextCorpus::from_documents("numbers", docs).unwrap();
    let s = c.split(5).unwrap();
    assert_eq!(s.val, ["doc 4", "doc 9", "doc 14", "doc 19"]);
    assert_eq!(s.train.len(), 19);
    assert_eq!(s.train[..5], ["doc 0", "doc 1", "doc 2", "doc 3", "doc 5"]);
    let again = c.split(5).unwrap();
    assert_eq!((s.train, s.val), (again.train, again.val));
    assert!(TextCorpus::from_documents("few", vec!["a".into()])
        .unwrap()
        .split(2)
        .is_err());
}

#[test]
fn embedded_text_and_default_corpus() {
    let c = TextCorpus::embedded();
    assert!(EMBEDDED_TEXT.len() > 20_000);
    assert!(c.len() >= 145, "{} documents", c.len());
    assert!(c
        .documents()
        .iter()
        .all(|d| !d.is_empty() && !d.contains("\n%\n")));
    let d = TextCorpus::load(None).unwrap();
    if std::path::Path::new(netcl_data::FORTUNES_DIR).is_dir() {
        assert_eq!(d.source, netcl_data::FORTUNES_DIR);
    } else {
        assert_eq!(d.source, "embedded text");
        assert_eq!(d.documents(), c.documents());
    }
}

#[test]
fn token_stream_ends_each_document_with_eos() {
    let c = TextCorpus::embedded();
    let tok = Tokenizer::train_bpe(c.documents(), 300, &[ENDOFTEXT]).unwrap();
    let docs = &c.documents()[..3];
    let ids = encode_documents(&tok, docs).unwrap();
    let eos = tok.eos_id().unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == eos).count(), 3);
    assert_eq!(*ids.last().unwrap(), eos);
    let parts: Vec<&[u32]> = ids.split(|&i| i == eos).collect();
    for (p, d) in parts.iter().zip(docs) {
        assert_eq!(tok.decode(p).unwrap(), *d);
    }
}
