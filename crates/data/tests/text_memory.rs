//! The text pipeline's memory: corpora read only regular files up to a limit, long texts encode in bounded pieces with the ids of a one-piece encoding, and BPE training on text without whitespace stays bounded. One test, alone in its binary: it reads the process's peak resident memory.
use netcl_data::{encode_documents_with_progress, TextCorpus, Tokenizer, ENDOFTEXT, TEXT_CHUNK};
use netcl_ops::testing::rss_added;

const MIB: usize = 1 << 20;

/// `n` pseudo-random bytes (xorshift), as binary data.
fn garbage(n: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn text_memory_is_bounded() {
    let docs = ["the cat sat on the mat. a dog ran far away!"; 40];
    let tok = Tokenizer::train_bpe(&docs, 300, &[ENDOFTEXT]).unwrap();

    // Long texts encode in pieces with the ids of one piece: prose, and prose without breaks.
    let prose =
        "It was the best of times,  it was the worst of times;\n\n\tit was the age. ".repeat(5000);
    assert!(prose.len() > 4 * TEXT_CHUNK);
    let whole = tok.inner().encode_fast(prose.as_str(), false).unwrap();
    assert_eq!(tok.encode(&prose).unwrap(), whole.get_ids());

    // A 4 MiB word and 4 MiB of binary data: memory of a piece plus the ids, not of the text.
    let letters: String = garbage(4 * MIB)
        .iter()
        .map(|b| (b'a' + b % 26) as char)
        .collect();
    let (ids, added) = rss_added(|| tok.encode(&letters).unwrap());
    assert!(
        !ids.is_empty() && added < 64 * MIB,
        "a 4 MiB word added {added} B"
    );
    let binary = String::from_utf8_lossy(&garbage(4 * MIB)).into_owned();
    let mut seen = Vec::new();
    let (ids, added) = rss_added(|| {
        encode_documents_with_progress(&tok, &[&binary], |d, t| seen.push((d, t))).unwrap()
    });
    assert!(
        ids.len() > MIB && added < 96 * MIB,
        "4 MiB of binary added {added} B"
    );
    assert!(seen.len() > 10 && seen.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(seen.last(), Some(&(binary.len(), binary.len())));

    // BPE training on it: the word counts stay within their budget.
    let (t, added) = rss_added(|| Tokenizer::train_bpe(&[&binary], 300, &[ENDOFTEXT]).unwrap());
    assert_eq!(t.vocab_size(), 300);
    assert!(
        added < 96 * MIB,
        "training on 4 MiB of binary added {added} B"
    );

    // Corpora: devices and FIFOs refused, sizes over the limit refused.
    let e = TextCorpus::from_path("/dev/zero").unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let dir = std::env::temp_dir().join(format!("netcl-text-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo.txt");
    if std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let e = TextCorpus::from_path(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
    let file = dir.join("big.txt");
    std::fs::write(&file, prose.as_bytes()).unwrap();
    let e = TextCorpus::from_path_limited(&file, 1000)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("more than 1000") && e.contains("NETCL_CORPUS_LIMIT"),
        "{e}"
    );
    assert!(TextCorpus::from_path_limited(&file, prose.len() as u64).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}
