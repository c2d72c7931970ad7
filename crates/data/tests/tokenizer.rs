//! Byte-level BPE tokenizer: UTF-8 round trips, save/load keeps ids, training is deterministic, errors name the file.
mod common;
use common::TempDir;
use netcl_data::{TextCorpus, Tokenizer, ENDOFTEXT};

fn trained(vocab: usize) -> Tokenizer {
    let corpus = TextCorpus::embedded();
    Tokenizer::train_bpe(corpus.documents(), vocab, &[ENDOFTEXT]).unwrap()
}

#[test]
fn round_trips_ascii_and_multibyte_utf8() {
    let tok = trained(400);
    assert_eq!(tok.vocab_size(), 400);
    assert_eq!(tok.eos_id(), Some(0), "special tokens get the first ids");
    for text in [
        "The river does not hurry, and yet it reaches the sea.",
        "  leading spaces,\ttabs\nand new lines\r\n",
        "Grüße aus Köln — naïve café, Ελληνικά, русский, 日本語, emoji 🦀🚀, combining e\u{301}",
        "",
    ] {
        let ids = tok.encode(text).unwrap();
        assert!(ids.iter().all(|&i| (i as usize) < tok.vocab_size()));
        assert_eq!(tok.decode(&ids).unwrap(), text, "ids {ids:?}");
    }
    // Merges were learnt: common English compresses well below one token per byte, while
    // characters never seen in training still encode (as their bytes).
    let text = "the sea and the river and the town";
    assert!(tok.encode(text).unwrap().len() * 2 < text.len());
    assert_eq!(tok.encode("🦀").unwrap().len(), 4);
    // The special token in text becomes its id.
    let ids = tok.encode(&format!("a{ENDOFTEXT}b")).unwrap();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[1], 0);
    // Ids past the vocabulary (a padded embedding's rows) are skipped, not an error.
    let v = tok.vocab_size() as u32;
    let ids = tok.encode("the sea").unwrap();
    let mut padded = vec![v + 85];
    padded.extend(&ids);
    padded.push(v);
    assert_eq!(tok.decode(&padded).unwrap(), tok.decode(&ids).unwrap());
    assert_eq!(tok.unknown_ids(&padded), 2);
}

#[test]
fn save_then_load_gives_identical_ids() {
    let dir = TempDir::new("tokenizer-save");
    let tok = trained(350);
    let path = dir.join("tokenizer.json");
    tok.save(&path).unwrap();
    let back = Tokenizer::from_file(&path).unwrap();
    assert_eq!(back.vocab_size(), tok.vocab_size());
    assert_eq!(back.eos_id(), tok.eos_id());
    for doc in TextCorpus::embedded().documents().iter().take(20) {
        assert_eq!(back.encode(doc).unwrap(), tok.encode(doc).unwrap());
    }
    let text = "A bridge is a promise — 約束 — made in stone.";
    assert_eq!(back.decode(&back.encode(text).unwrap()).unwrap(), text);
}

#[test]
fn training_is_deterministic_and_depends_on_input() {
    let docs: Vec<String> = TextCorpus::embedded().documents()[..40].to_vec();
    let dir = TempDir::new("tokenizer-determinism");
    let (a, b) = (dir.join("a.json"), dir.join("b.json"));
    Tokenizer::train_bpe(&docs, 320, &[ENDOFTEXT])
        .unwrap()
        .save(&a)
        .unwrap();
    Tokenizer::train_bpe(&docs, 320, &[ENDOFTEXT])
        .unwrap()
        .save(&b)
        .unwrap();
    let (ja, jb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_eq!(
        ja, jb,
        "two trainings on the same input write the same tokenizer.json"
    );
    let other = Tokenizer::train_bpe(&docs[..20], 320, &[ENDOFTEXT]).unwrap();
    other.save(&b).unwrap();
    assert_ne!(ja, std::fs::read(&b).unwrap());
    // From files, one document per file: the same tokenizer as from memory.
    let files: Vec<_> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let f = dir.join(format!("doc{i}.txt"));
            std::fs::write(&f, d).unwrap();
            f
        })
        .collect();
    let from_files = Tokenizer::train_bpe_files(&files, 320, &[ENDOFTEXT]).unwrap();
    from_files.save(&b).unwrap();
    assert_eq!(ja, std::fs::read(&b).unwrap());
}

#[test]
fn errors_name_the_file_or_value() {
    let dir = TempDir::new("tokenizer-errors");
    let missing = dir.join("missing.json");
    let err = Tokenizer::from_file(&missing).unwrap_err().to_string();
    assert!(err.contains("missing.json"), "{err}");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{ not a tokenizer").unwrap();
    let err = Tokenizer::from_file(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.json"), "{err}");
    let err = Tokenizer::train_bpe(&["abc"], 100, &[ENDOFTEXT])
        .unwrap_err()
        .to_string();
    assert!(err.contains("100") && err.contains("257"), "{err}");
    let err = Tokenizer::train_bpe_files(&[&missing], 300, &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.json"), "{err}");
    let err = trained(300)
        .save(dir.join("no/such/dir/t.json"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("t.json"), "{err}");
}
