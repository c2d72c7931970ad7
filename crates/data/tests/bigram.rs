//! Bigram baseline: add-k smoothed loss and bits per byte against a hand computation.
use netcl_data::bigram_baseline;

#[test]
fn matches_hand_computation() {
    // Train "abab" as ids a=0, b=1 (vocab 3): pairs (a,b) x2, (b,a) x1; row counts a: 2, b: 1, c: 0.
    let train = [0, 1, 0, 1];
    // Validation "abc": pairs (a,b), (b,c). k = 1, vocab 3:
    // p(b|a) = (2 + 1) / (2 + 3) = 3/5; p(c|b) = (0 + 1) / (1 + 3) = 1/4.
    let val = [0, 1, 2];
    let r = bigram_baseline(&train, &val, 3, 1.0, 3).unwrap();
    let nats = -(0.6f64).ln() - (0.25f64).ln();
    assert_eq!(r.predictions, 2);
    assert!((r.loss - nats / 2.0).abs() < 1e-12, "{r:?}");
    assert!((r.bits_per_byte - nats / std::f64::consts::LN_2 / 3.0).abs() < 1e-12);
    // Smaller k sharpens seen pairs: p(b|a) = 2.5 / 3.5 with k = 0.5.
    let r = bigram_baseline(&train, &val[..2], 3, 0.5, 2).unwrap();
    assert!((r.loss + (2.5f64 / 3.5).ln()).abs() < 1e-12);
    // An unseen context is uniform: p(a|c) = 1/3 for any k.
    let r = bigram_baseline(&train, &[2, 0], 3, 0.1, 1).unwrap();
    assert!((r.loss - 3f64.ln()).abs() < 1e-12);
}

#[test]
fn bad_input_is_an_error() {
    assert!(bigram_baseline(&[0, 1], &[0, 1], 2, 0.0, 2).is_err());
    assert!(bigram_baseline(&[0], &[0, 1], 2, 1.0, 2).is_err());
    assert!(bigram_baseline(&[0, 1], &[0, 1], 2, 1.0, 0).is_err());
    let err = bigram_baseline(&[0, 1], &[0, 5], 2, 1.0, 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("5") && err.contains("validation"), "{err}");
}

#[test]
fn pipeline_on_the_embedded_text_beats_uniform() {
    use netcl_data::{encode_documents, utf8_bytes, TextCorpus, Tokenizer, ENDOFTEXT};
    let corpus = TextCorpus::embedded();
    let split = corpus.split(10).unwrap();
    let tok = Tokenizer::train_bpe(&split.train, 512, &[ENDOFTEXT]).unwrap();
    let train = encode_documents(&tok, &split.train).unwrap();
    let val = encode_documents(&tok, &split.val).unwrap();
    let r = bigram_baseline(&train, &val, tok.vocab_size(), 0.1, utf8_bytes(&split.val)).unwrap();
    let uniform = (tok.vocab_size() as f64).ln();
    // Held-out text: better than uniform over the vocabulary, worse than 1 bit per byte.
    assert!(r.loss < uniform && r.loss > 1.0, "{r:?}, uniform {uniform}");
    assert!(r.bits_per_byte > 1.0 && r.bits_per_byte < 8.0, "{r:?}");
    eprintln!(
        "embedded text: {} train / {} val tokens, vocab {}, bigram {:.3} nats/token, {:.3} bits/byte",
        train.len(),
        val.len(),
        tok.vocab_size(),
        r.loss,
        r.bits_per_byte
    );
}
