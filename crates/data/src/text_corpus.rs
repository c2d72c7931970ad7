//! Text corpora for language models: a file or folder of UTF-8 text (by default Debian's fortunes, else a shipped text) as documents, a deterministic train/validation split, token streams.
use crate::tokenizer::Tokenizer;
use netcl_core_devices::files::read_regular;
use netcl_core_devices::{Error, Result};
use std::fs;
use std::path::{Path, PathBuf};

/// The most bytes a corpus reads by default (all its files together); `NETCL_CORPUS_LIMIT`
/// (`512M`, `8G`, ...) raises or lowers it.
pub use netcl_core_devices::config::DEFAULT_CORPUS_LIMIT;

/// The corpus size limit: [`Config::corpus_limit`](netcl_core_devices::Config::corpus_limit)
/// (`NETCL_CORPUS_LIMIT`, else [`DEFAULT_CORPUS_LIMIT`]); a bad value is an error naming it.
pub fn corpus_limit() -> Result<u64> {
    netcl_core_devices::Config::get().corpus_limit.get()
}

/// Where Debian's `fortunes` package puts its fortune files.
pub const FORTUNES_DIR: &str = "/usr/share/games/fortunes";

/// The text used when [`FORTUNES_DIR`] is absent: about 21 KB of short English texts (145 documents) written for
/// netcl (public domain, CC0; see `crates/data/assets/text/LICENSE.txt`), in fortune format.
pub const EMBEDDED_TEXT: &str = include_str!("../assets/text/notes.txt");

/// Documents of text, in a fixed order.
///
/// Reading rules (the same for every source):
/// - a folder is walked recursively in sorted path order; symlinks and files named `*.dat`
///   (fortune's `strfile` indexes) are skipped, every other file is read as UTF-8 (invalid bytes
///   become U+FFFD), `\r\n` becomes `\n`;
/// - a file containing lines made of only `%` (fortune format) is split at those lines, any
///   other file at blank lines (paragraphs);
/// - documents are trimmed of surrounding whitespace and empty ones dropped;
/// - only regular files are read (a FIFO or a device named directly is an error, and skipped in
///   a folder), at most [`corpus_limit`] bytes in all.
#[derive(Clone, Debug)]
pub struct TextCorpus {
    /// What was read: a path, or `"embedded text"`.
    pub source: String,
    docs: Vec<String>,
}

/// Documents of one text, split by the rules of [`TextCorpus`].
pub fn split_documents(text: &str) -> Vec<String> {
    let text = text.replace("\r\n", "\n");
    let fortune = text.lines().any(|l| l.trim_end() == "%");
    let mut docs = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let boundary = if fortune {
            line.trim_end() == "%"
        } else {
            line.trim().is_empty()
        };
        if boundary {
            push_doc(&mut docs, &mut cur);
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    push_doc(&mut docs, &mut cur);
    docs
}

fn push_doc(docs: &mut Vec<String>, cur: &mut String) {
    let t = cur.trim();
    if !t.is_empty() {
        docs.push(t.to_string());
    }
    cur.clear();
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::io(path.display().to_string(), e)
}

/// Text files under `dir` in sorted path order (symlinks and `*.dat` skipped).
fn text_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries = fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| io(dir, e)))
        .collect::<Result<Vec<PathBuf>>>()?;
    entries.sort();
    for p in entries {
        let meta = fs::symlink_metadata(&p).map_err(|e| io(&p, e))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.is_dir() {
            text_files(&p, out)?;
        } else if meta.is_file() && p.extension().is_none_or(|e| e != "dat") {
            out.push(p);
        }
    }
    Ok(())
}

impl TextCorpus {
    /// The default corpus: Debian's fortunes at [`FORTUNES_DIR`] when that folder exists,
    /// else [`EMBEDDED_TEXT`].
    pub fn load_default() -> Result<TextCorpus> {
        if Path::new(FORTUNES_DIR).is_dir() {
            TextCorpus::from_path(FORTUNES_DIR)
        } else {
            Ok(TextCorpus::embedded())
        }
    }

    /// `path` (a file or folder) when given, else [`Self::load_default`].
    pub fn load(path: Option<&Path>) -> Result<TextCorpus> {
        match path {
            Some(p) => TextCorpus::from_path(p),
            None => TextCorpus::load_default(),
        }
    }

    /// The shipped text ([`EMBEDDED_TEXT`]).
    pub fn embedded() -> TextCorpus {
        TextCorpus {
            source: "embedded text".into(),
            docs: split_documents(EMBEDDED_TEXT),
        }
    }

    /// A file or a folder (recursively), read by the rules above. A missing or unreadable path
    /// is an I/O error naming it; a path without any text is an error naming it; more than
    /// [`corpus_limit`] bytes is an error naming the limit.
    pub fn from_path(path: impl AsRef<Path>) -> Result<TextCorpus> {
        TextCorpus::from_path_limited(path, corpus_limit()?)
    }

    /// [`Self::from_path`] reading at most `limit` bytes in all.
    pub fn from_path_limited(path: impl AsRef<Path>, limit: u64) -> Result<TextCorpus> {
        let path = path.as_ref();
        let meta = fs::metadata(path).map_err(|e| io(path, e))?;
        let files = if meta.is_dir() {
            let mut files = Vec::new();
            text_files(path, &mut files)?;
            files
        } else {
            vec![path.to_path_buf()]
        };
        let mut docs = Vec::new();
        let mut budget = limit;
        for f in &files {
            let bytes = read_regular(f, budget, "the corpus limit, NETCL_CORPUS_LIMIT")?;
            budget -= bytes.len() as u64;
            docs.extend(split_documents(&String::from_utf8_lossy(&bytes)));
        }
        TextCorpus::from_documents(path.display().to_string(), docs)
    }

    /// Documents given directly (kept as they are, empty ones included); at least one is needed.
    pub fn from_documents(source: impl Into<String>, docs: Vec<String>) -> Result<TextCorpus> {
        let source = source.into();
        if docs.iter().all(|d| d.is_empty()) {
            return Err(Error::invalid(
                "TextCorpus",
                format!("{source}: no text found (empty files, or only *.dat files and symlinks)"),
            ));
        }
        Ok(TextCorpus { source, docs })
    }

    /// All documents in order.
    pub fn documents(&self) -> &[String] {
        &self.docs
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// UTF-8 bytes of all documents.
    pub fn bytes(&self) -> usize {
        utf8_bytes(&self.docs)
    }

    /// The train/validation split: document `i` goes to validation when `i % every == every - 1`
    /// (every `every`-th document, `1/every` of them), the rest to training, both in corpus
    /// order. Needs `every >= 2` and at least `every` documents, so neither side is empty.
    pub fn split(&self, every: usize) -> Result<TextSplit<'_>> {
        if every < 2 || self.docs.len() < every {
            return Err(Error::invalid(
                "TextCorpus::split",
                format!(
                    "{}: every {every}-th of {} documents to validation leaves a side empty (need every >= 2 and at least every documents)",
                    self.source,
                    self.docs.len()
                ),
            ));
        }
        let (mut train, mut val) = (Vec::new(), Vec::new());
        for (i, d) in self.docs.iter().enumerate() {
            if i % every == every - 1 {
                val.push(d.as_str());
            } else {
                train.push(d.as_str());
            }
        }
        Ok(TextSplit { train, val })
    }
}

/// Training and validation documents of a [`TextCorpus`].
#[derive(Clone, Debug)]
pub struct TextSplit<'a> {
    pub train: Vec<&'a str>,
    pub val: Vec<&'a str>,
}

/// Total UTF-8 bytes of `docs` (separators not counted): the denominator of bits per byte.
pub fn utf8_bytes<S: AsRef<str>>(docs: &[S]) -> usize {
    docs.iter().map(|d| d.as_ref().len()).sum()
}

/// The token stream of `docs`: each document's ids followed by the end-of-sequence id (when the
/// tokenizer has one), documents in order. Each document is encoded on its own, so no token
/// spans two documents.
pub fn encode_documents<S: AsRef<str>>(tokenizer: &Tokenizer, docs: &[S]) -> Result<Vec<u32>> {
    encode_documents_with_progress(tokenizer, docs, |_, _| {})
}

/// [`encode_documents`], calling `progress(bytes done, bytes in all)` as it goes (after each
/// document and each piece of a long one).
pub fn encode_documents_with_progress<S: AsRef<str>>(
    tokenizer: &Tokenizer,
    docs: &[S],
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<u32>> {
    let total = utf8_bytes(docs);
    let mut out = Vec::new();
    let mut done = 0;
    for d in docs {
        let d = d.as_ref();
        out.extend(tokenizer.encode_with_progress(d, |n, _| progress(done + n, total))?);
        done += d.len();
        if let Some(eos) = tokenizer.eos_id() {
            out.push(eos);
        }
    }
    Ok(out)
}
