//! Checkpoints: `P.json` (metadata, schema version, hashes) naming a content-addressed `P.<hash>.npz` (tensors), committed by one rename and verified on load.
//!
//! A checkpoint at path `P` is two files:
//! - `P.<first 16 hex of its SHA-256>.npz` ([`npz_path`]): one uncompressed `<name>.npy` entry
//!   per tensor, readable by `numpy.load` (f32 `<f4`, f64 `<f8`, f16 `<f2`, i32 `<i4`, u32
//!   `<u4`; bf16 as its raw bits `<u2`). Version-1 checkpoints used `P.npz`; they still load.
//! - `P.json`: a [`Checkpoint`]: schema version, the caller's model/optimizer/step/extra values,
//!   each tensor's name, shape, dtype and SHA-256, the npz's file name and its SHA-256.
//!
//! A tensor's `sha256` is over its elements' little-endian bytes in row-major order (numpy:
//! `hashlib.sha256(arr.tobytes())`), not over the npy header. [`save_with`] describes the commit
//! protocol: a crash at any point leaves the previous or the new save loadable, and the next
//! save removes what killed saves left behind.
use crate::atomic_file::{sync_dir, sync_file, FsSteps, TempFile};
use crate::npz::{sha256_hex, NpzReader, NpzWriter};
use netcl_ops::{with_host, DType, Device, Error, HostData, Result, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

#[doc(hidden)]
#[cfg(feature = "test-hooks")]
pub use crate::atomic_file::CRASH_AT_ENV;
use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The version of the json layout written by [`save`]; [`load`] reads it and version 1 (whose
/// npz is `P.npz` and which has no `npz_file`).
pub const SCHEMA_VERSION: u32 = 2;

/// Name, shape, dtype and hash of one saved tensor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMeta {
    pub name: String,
    pub shape: Vec<usize>,
    /// Written as its name: "f32", "f64", "f16", "bf16", "i32", "u32".
    #[serde(with = "dtype_name")]
    pub dtype: DType,
    /// Lower-case hex SHA-256 of the elements' little-endian bytes in row-major order.
    pub sha256: String,
}

/// What the caller records next to the tensors (everything of [`Checkpoint`] but tensors and hashes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointInfo {
    /// Module tree and hyper-parameters.
    pub model: Value,
    /// Optimizer hyper-parameters and step count.
    pub optimizer: Option<Value>,
    /// Training step (or epoch) counter.
    pub step: u64,
    /// Anything else: rng state, epoch, metrics, ...
    pub extra: Value,
}

/// The contents of `P.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub schema_version: u32,
    pub model: Value,
    pub optimizer: Option<Value>,
    pub step: u64,
    pub extra: Value,
    /// In save order; names are unique (e.g. "model.0.weight", "optim.m.0.weight").
    pub tensors: Vec<TensorMeta>,
    /// Lower-case hex SHA-256 of the whole npz file: ties the pair together.
    pub npz_sha256: String,
    /// The npz's file name, in the json's directory (version 2); `None` in version 1 (`P.npz`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npz_file: Option<String>,
}

impl Checkpoint {
    /// The caller's part of the metadata.
    pub fn info(&self) -> CheckpointInfo {
        CheckpointInfo {
            model: self.model.clone(),
            optimizer: self.optimizer.clone(),
            step: self.step,
            extra: self.extra.clone(),
        }
    }

    /// The metadata of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorMeta> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

mod dtype_name {
    use netcl_ops::DType;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(d.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DType, D::Error> {
        let name = String::deserialize(d)?;
        DType::parse(&name).map_err(serde::de::Error::custom)
    }
}

/// `P.json`: the path with ".json" appended (`runs/mlp/ckpt` -> `runs/mlp/ckpt.json`).
pub fn json_path(path: impl AsRef<Path>) -> PathBuf {
    with_suffix(path.as_ref(), ".json")
}

/// The npz file the checkpoint at `path` consists of: the one `path.json` names (read here).
pub fn npz_path(path: impl AsRef<Path>) -> Result<PathBuf> {
    let path = path.as_ref();
    Ok(npz_path_of(path, &read_meta(path)?))
}

/// The npz file named by `meta`, the metadata of the checkpoint at `path` (no file is read).
pub fn npz_path_of(path: impl AsRef<Path>, meta: &Checkpoint) -> PathBuf {
    let path = path.as_ref();
    dir_of(path).join(npz_file_name(path, meta))
}

/// The npz's file name: `meta.npz_file`, or `P.npz` for version 1.
fn npz_file_name(path: &Path, meta: &Checkpoint) -> String {
    match &meta.npz_file {
        Some(name) => name.clone(),
        None => {
            let base = path.file_name().map(|f| f.to_string_lossy().into_owned());
            format!("{}.npz", base.unwrap_or_default())
        }
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// SHA-256 of a file's contents from its start.
fn sha256_file(file: &mut File, path: &Path) -> Result<String> {
    let io_err = |e| Error::io(shown(path), e);
    file.seek(SeekFrom::Start(0)).map_err(io_err)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(e)),
        };
        hasher.update(&buf[..n]);
    }
    file.seek(SeekFrom::Start(0)).map_err(io_err)?;
    Ok(crate::npz::hex(&hasher.finalize()))
}

/// Why `name` cannot name a tensor (it becomes the zip entry `<name>.npy`), if it cannot.
fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.len() > 4096 {
        Some("is longer than 4096 bytes")
    } else if name.chars().any(|c| c.is_control()) {
        Some("contains a control character")
    } else if name.contains('\\') {
        Some("contains a backslash")
    } else if name.starts_with('/') || name.ends_with('/') {
        Some("starts or ends with '/'")
    } else {
        None
    }
}

/// Names that are invalid or repeated, as messages; empty when all are fine.
fn name_problems<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for name in names {
        if let Some(p) = name_problem(name) {
            problems.push(format!("tensor name {name:?} {p}"));
        }
        if !seen.insert(name) {
            problems.push(format!("tensor name {name:?} appears more than once"));
        }
    }
    problems
}

/// How [`save_with`] keeps earlier saves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaveOptions {
    /// How many completed saves stay loadable (at least 1): the newest is `P`, the older ones
    /// `P.step-<step>` (see [`checkpoints`]); a save removes those beyond this count. Like
    /// Hugging Face's `save_total_limit`. Two kept saves of the same step share one name, the
    /// later replacing the earlier.
    pub keep_last: usize,
}

impl Default for SaveOptions {
    /// Keep only the newest save.
    fn default() -> Self {
        SaveOptions { keep_last: 1 }
    }
}

/// Saves `tensors` (any device, any layout; copied to the host one at a time) and `info` as the
/// checkpoint at `path`, creating parent directories; [`save_with`] with the default options
/// (only this save is kept). Returns the metadata written to `path.json`. On error the previous
/// checkpoint at `path`, if any, is intact.
pub fn save<S: AsRef<str>>(
    path: impl AsRef<Path>,
    info: &CheckpointInfo,
    tensors: &[(S, &Tensor)],
) -> Result<Checkpoint> {
    save_with(path, info, tensors, &SaveOptions::default())
}

/// [`save`], keeping the last `options.keep_last` completed saves loadable.
///
/// The commit protocol: the npz is written to a temporary, synced and renamed to its
/// content-addressed name `P.<16 hex of its SHA-256>.npz`; with `keep_last > 1` the previous
/// `P.json` is copied to `P.step-<its step>.json` (temporary, sync, rename); the new json, which
/// names the npz, is written to a temporary, synced and renamed over `P.json` (the one atomic
/// commit); the directory is synced. Only then are removed: kept saves beyond `keep_last`, npz
/// files no remaining json names (the previous save's, or those of killed saves) and temporaries
/// of this checkpoint left by killed saves. So a crash at any point leaves `P` loadable as the
/// previous or the new save. Saves to one path must not run concurrently.
pub fn save_with<S: AsRef<str>>(
    path: impl AsRef<Path>,
    info: &CheckpointInfo,
    tensors: &[(S, &Tensor)],
    options: &SaveOptions,
) -> Result<Checkpoint> {
    let path = path.as_ref();
    let Some(base) = path.file_name().and_then(|f| f.to_str()) else {
        return Err(Error::invalid(
            "checkpoint::save",
            format!(
                "checkpoint path '{}' has no file name, or one that is not UTF-8",
                shown(path)
            ),
        ));
    };
    if options.keep_last == 0 {
        return Err(Error::invalid(
            "checkpoint::save",
            format!("{}: keep_last must be at least 1", shown(path)),
        ));
    }
    let problems = name_problems(tensors.iter().map(|(n, _)| n.as_ref()));
    if !problems.is_empty() {
        return Err(Error::invalid(
            "checkpoint::save",
            format!("{}: {}", shown(path), problems.join("; ")),
        ));
    }
    let dir = dir_of(path);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(shown(&dir), e))?;
    let mut fs = FsSteps::new();

    // 1. The npz, to a temporary file, hashed (whole file and each tensor) as it is written.
    fs.step();
    let (npz_temp, file) = TempFile::create(&with_suffix(path, ".npz"))?;
    let mut writer = NpzWriter::new(file, npz_temp.path());
    let mut metas = Vec::with_capacity(tensors.len());
    for (name, tensor) in tensors {
        let name = name.as_ref();
        let data = tensor.to_host_data()?;
        let sha256 = writer.add(name, tensor.dtype(), tensor.shape(), data.as_bytes())?;
        metas.push(TensorMeta {
            name: name.to_string(),
            shape: tensor.shape().to_vec(),
            dtype: tensor.dtype(),
            sha256,
        });
    }
    let (file, npz_sha256) = writer.finish()?;
    fs.step();
    sync_file(&file, npz_temp.path())?;
    drop(file);
    let npz_name = format!("{base}.{}.npz", &npz_sha256[..16]);
    let npz_file = dir.join(&npz_name);
    fs.step();
    npz_temp
        .persist_as(&npz_file)
        .map_err(|e| Error::io(shown(&npz_file), e))?;
    fs.step();
    sync_dir(&dir)?;

    // 2. With keep_last > 1, the previous save stays loadable as P.step-<step>.
    if options.keep_last > 1 {
        if let Ok(mut old) = read_meta(path) {
            old.npz_file = Some(npz_file_name(path, &old));
            old.schema_version = SCHEMA_VERSION;
            write_json(&step_path(path, old.step), &old, &mut fs)?;
        }
    }

    // 3. The commit: the json naming the new npz replaces P.json in one rename.
    let ckpt = Checkpoint {
        schema_version: SCHEMA_VERSION,
        model: info.model.clone(),
        optimizer: info.optimizer.clone(),
        step: info.step,
        extra: info.extra.clone(),
        tensors: metas,
        npz_sha256,
        npz_file: Some(npz_name),
    };
    write_json(path, &ckpt, &mut fs)?;
    fs.step();
    sync_dir(&dir)?;

    // 4. Clean up what no kept json names any more.
    remove_stale(path, base, &dir, options.keep_last, &mut fs)?;
    Ok(ckpt)
}

/// Writes `ckpt` as the json of checkpoint `path`: temporary, fsync, rename (three steps).
fn write_json(path: &Path, ckpt: &Checkpoint, fs: &mut FsSteps) -> Result<()> {
    let json_file = json_path(path);
    let text = json_text(ckpt)
        .map_err(|e| Error::format(shown(&json_file), format!("serialising the metadata: {e}")))?;
    fs.step();
    let (json_temp, mut file) = TempFile::create(&json_file)?;
    file.write_all(text.as_bytes())
        .map_err(|e| Error::io(shown(json_temp.path()), e))?;
    fs.step();
    sync_file(&file, json_temp.path())?;
    drop(file);
    fs.step();
    json_temp
        .persist()
        .map_err(|e| Error::io(shown(&json_file), e))
}

/// The directory a checkpoint's files are in.
fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// What a file in a checkpoint's directory is to the checkpoint with file name `base`.
#[derive(Debug, PartialEq)]
enum Own {
    /// `base.step-<N>.json`: a kept earlier save.
    Step(u64),
    /// `base.<16 hex>.npz` or the version-1 `base.npz`.
    Npz,
    /// A temporary of one of these, or of `base.json`, left by a save.
    Temp,
}

fn classify(base: &str, name: &str) -> Option<Own> {
    let rest = name.strip_prefix(base)?.strip_prefix('.')?;
    let is_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let is_target = |s: &str| {
        s == "json"
            || s == "npz"
            || s.strip_suffix(".npz").is_some_and(|h| {
                h.len() == 16 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            })
            || s.strip_prefix("step-")
                .and_then(|s| s.strip_suffix(".json"))
                .is_some_and(is_digits)
    };
    if let Some((target, tag)) = rest.rsplit_once(".tmp-") {
        let tag_ok = tag
            .split_once('-')
            .is_some_and(|(pid, n)| is_digits(pid) && is_digits(n));
        return (tag_ok && is_target(target)).then_some(Own::Temp);
    }
    if rest == "json" || !is_target(rest) {
        return None;
    }
    match rest
        .strip_prefix("step-")
        .and_then(|s| s.strip_suffix(".json"))
    {
        Some(n) => n.parse().ok().map(Own::Step),
        None => Some(Own::Npz),
    }
}

/// The files of checkpoint `base` in `dir`: kept steps (newest first), npz files, temporaries.
fn own_files(dir: &Path, base: &str) -> Result<(Vec<u64>, Vec<PathBuf>, Vec<PathBuf>)> {
    let (mut steps, mut npzs, mut temps) = (Vec::new(), Vec::new(), Vec::new());
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(shown(dir), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(shown(dir), e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        match classify(base, name) {
            Some(Own::Step(n)) => steps.push(n),
            Some(Own::Npz) => npzs.push(dir.join(name)),
            Some(Own::Temp) => temps.push(dir.join(name)),
            None => {}
        }
    }
    steps.sort_unstable_by(|a, b| b.cmp(a));
    Ok((steps, npzs, temps))
}

fn remove(file: &Path, fs: &mut FsSteps) -> Result<()> {
    fs.step();
    match std::fs::remove_file(file) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::io(shown(file), e)),
        _ => Ok(()),
    }
}

/// Removes kept saves beyond `keep_last`, then npz files that no remaining json names, then
/// temporaries of killed saves.
fn remove_stale(
    path: &Path,
    base: &str,
    dir: &Path,
    keep_last: usize,
    fs: &mut FsSteps,
) -> Result<()> {
    let (steps, npzs, temps) = own_files(dir, base)?;
    for &n in steps.iter().skip(keep_last - 1) {
        remove(&json_path(step_path(path, n)), fs)?;
    }
    let mut named = BTreeSet::new();
    for p in checkpoints(path)? {
        // A json that cannot be read might name any npz: keep them all.
        let Ok(meta) = read_meta(&p) else {
            return Ok(());
        };
        named.insert(npz_path_of(&p, &meta));
    }
    for npz in npzs.iter().filter(|f| !named.contains(*f)) {
        remove(npz, fs)?;
    }
    for temp in &temps {
        remove(temp, fs)?;
    }
    Ok(())
}

/// `P.step-<step>`: where [`save_with`] keeps an earlier save of `step`.
pub fn step_path(path: impl AsRef<Path>, step: u64) -> PathBuf {
    with_suffix(path.as_ref(), &format!(".step-{step}"))
}

/// The loadable saves of the checkpoint at `path`, newest first: `path` itself (when
/// `path.json` exists), then the kept `path.step-<N>` by decreasing step (see [`SaveOptions`]).
pub fn checkpoints(path: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
    let path = path.as_ref();
    let Some(base) = path.file_name().and_then(|f| f.to_str()) else {
        return Err(Error::invalid(
            "checkpoint::checkpoints",
            format!("checkpoint path '{}' has no UTF-8 file name", shown(path)),
        ));
    };
    let dir = dir_of(path);
    let mut found = Vec::new();
    if json_path(path).exists() {
        found.push(path.to_path_buf());
    }
    if dir.is_dir() {
        let (steps, _, _) = own_files(&dir, base)?;
        found.extend(steps.into_iter().map(|n| step_path(path, n)));
    }
    Ok(found)
}

/// `ckpt` as indented JSON, fields in declaration order, one compact line per tensor.
fn json_text(ckpt: &Checkpoint) -> serde_json::Result<String> {
    let field = |name: &str, v: &Value| -> serde_json::Result<String> {
        let pretty = serde_json::to_string_pretty(v)?.replace('\n', "\n  ");
        Ok(format!("  {}: {pretty}", Value::from(name)))
    };
    let mut tensors = Vec::with_capacity(ckpt.tensors.len());
    for t in &ckpt.tensors {
        tensors.push(format!("    {}", serde_json::to_string(t)?));
    }
    let tensors = if tensors.is_empty() {
        "  \"tensors\": []".to_string()
    } else {
        format!("  \"tensors\": [\n{}\n  ]", tensors.join(",\n"))
    };
    let lines = [
        field("schema_version", &Value::from(ckpt.schema_version))?,
        field("model", &ckpt.model)?,
        field("optimizer", &serde_json::to_value(&ckpt.optimizer)?)?,
        field("step", &Value::from(ckpt.step))?,
        field("extra", &ckpt.extra)?,
        tensors,
        field("npz_sha256", &Value::from(ckpt.npz_sha256.as_str()))?,
    ];
    let mut lines = lines.to_vec();
    if let Some(f) = &ckpt.npz_file {
        lines.push(field("npz_file", &Value::from(f.as_str()))?);
    }
    Ok(format!("{{\n{}\n}}\n", lines.join(",\n")))
}

/// Reads and validates `path.json` alone (schema version, names, hashes' form): a cheap look at
/// a checkpoint's step, model description and tensor list without reading the npz.
pub fn read_meta(path: impl AsRef<Path>) -> Result<Checkpoint> {
    let json_file = json_path(path.as_ref());
    let what = shown(&json_file);
    let bytes = std::fs::read(&json_file).map_err(|e| Error::io(what.clone(), e))?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::format(what.clone(), format!("not valid JSON: {e}")))?;
    let version = value.get("schema_version").ok_or_else(|| {
        Error::format(
            what.clone(),
            "no schema_version field: not a netcl checkpoint",
        )
    })?;
    let version = match version.as_u64() {
        Some(v @ (1 | 2)) => v,
        _ => {
            let msg = format!("checkpoint schema version {version} found, this netcl supports versions 1 and {SCHEMA_VERSION}");
            return Err(Error::format(what, msg));
        }
    };
    let ckpt: Checkpoint = serde_json::from_value(value)
        .map_err(|e| Error::format(what.clone(), format!("bad checkpoint metadata: {e}")))?;
    let mut problems = name_problems(ckpt.tensors.iter().map(|t| t.name.as_str()));
    match (&ckpt.npz_file, version) {
        (None, 1) => {}
        (None, _) => problems.push("no npz_file field (required from version 2)".into()),
        (Some(_), 1) => problems.push("npz_file field in a version-1 checkpoint".into()),
        (Some(f), _) => {
            let plain = Path::new(f).file_name().is_some_and(|n| n == f.as_str())
                && !f.contains(['/', '\\'])
                && f.ends_with(".npz");
            if !plain {
                problems.push(format!(
                    "npz_file {f:?} is not an .npz file name (no directories)"
                ));
            }
        }
    }
    let is_hash =
        |h: &str| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !is_hash(&ckpt.npz_sha256) {
        problems.push(format!(
            "npz_sha256 {:?} is not a hex SHA-256",
            ckpt.npz_sha256
        ));
    }
    for t in &ckpt.tensors {
        if !is_hash(&t.sha256) {
            problems.push(format!(
                "tensor '{}': sha256 {:?} is not a hex SHA-256",
                t.name, t.sha256
            ));
        }
        if t.shape
            .iter()
            .try_fold(t.dtype.size(), |a, &d| a.checked_mul(d))
            .is_none()
        {
            problems.push(format!(
                "tensor '{}': shape {:?} is too large",
                t.name, t.shape
            ));
        }
    }
    if !problems.is_empty() {
        return Err(Error::format(
            what,
            format!("bad checkpoint metadata: {}", problems.join("; ")),
        ));
    }
    Ok(ckpt)
}

/// A checkpoint read back by [`load`]: its metadata and its tensors, on the host.
#[derive(Debug)]
pub struct LoadedCheckpoint {
    path: PathBuf,
    meta: Checkpoint,
    tensors: Vec<(String, Tensor)>,
    index: HashMap<String, usize>,
}

impl LoadedCheckpoint {
    /// The checkpoint's path `P` (without ".json"/".npz").
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The contents of `P.json`.
    pub fn meta(&self) -> &Checkpoint {
        &self.meta
    }
    /// The tensors in save order, each on the host device.
    pub fn tensors(&self) -> &[(String, Tensor)] {
        &self.tensors
    }
    pub fn into_tensors(self) -> Vec<(String, Tensor)> {
        self.tensors
    }
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.index.get(name).map(|&i| &self.tensors[i].1)
    }
    /// Tensor `name`, or an error naming the checkpoint and the name.
    pub fn require(&self, name: &str) -> Result<&Tensor> {
        self.get(name).ok_or_else(|| {
            Error::format(
                shown(&self.path),
                format!("checkpoint has no tensor '{name}'"),
            )
        })
    }
    /// [`check_against`] this checkpoint.
    pub fn check_against<S: AsRef<str>, D: AsRef<[usize]>>(
        &self,
        expected: &[(S, D, DType)],
    ) -> Result<()> {
        check_against(&self.path, &self.meta, expected)
    }
}

/// Loads the checkpoint at `path`, verifying the schema version, the npz's hash against the json,
/// that both list the same tensors, each array's dtype and shape against the json, and each
/// tensor's hash. Tensors come back on the host device (move them with `Tensor::to_device`).
pub fn load(path: impl AsRef<Path>) -> Result<LoadedCheckpoint> {
    let path = path.as_ref();
    let meta = read_meta(path)?;
    let (json_file, npz_file) = (json_path(path), npz_path_of(path, &meta));
    let mut file = File::open(&npz_file).map_err(|e| Error::io(shown(&npz_file), e))?;
    let found = sha256_file(&mut file, &npz_file)?;
    if found != meta.npz_sha256 {
        return Err(Error::format(
            shown(&npz_file),
            format!(
                "SHA-256 {found} differs from {} recorded in {}: the npz was altered or truncated, \
                 or the two files come from different saves",
                meta.npz_sha256,
                shown(&json_file)
            ),
        ));
    }
    let mut npz = NpzReader::new(file, &npz_file)?;
    let in_npz: BTreeSet<String> = npz.names().into_iter().collect();
    let in_json: BTreeSet<String> = meta.tensors.iter().map(|t| t.name.clone()).collect();
    let missing: Vec<&String> = in_json.difference(&in_npz).collect();
    let extra: Vec<&String> = in_npz.difference(&in_json).collect();
    if !missing.is_empty() || !extra.is_empty() {
        return Err(Error::format(
            shown(&npz_file),
            format!(
                "arrays listed in {} but missing from the npz: {missing:?}; arrays in the npz \
                 but not in the json: {extra:?}",
                shown(&json_file)
            ),
        ));
    }
    // Every entry's declared size against the json before any tensor is allocated; all
    // tensors together cannot be larger than the (uncompressed) npz.
    let mut total = 0u64;
    for t in &meta.tensors {
        total += npz.check(&t.name, t.dtype, &t.shape)? as u64;
    }
    let file_len = std::fs::metadata(&npz_file)
        .map_err(|e| Error::io(shown(&npz_file), e))?
        .len();
    if total > file_len {
        return Err(Error::format(
            shown(&npz_file),
            format!("its arrays declare {total} data bytes in all, more than the file's {file_len} bytes"),
        ));
    }
    let host = Device::host();
    let mut tensors = Vec::with_capacity(meta.tensors.len());
    for t in &meta.tensors {
        let data = npz.read(&t.name, t.dtype, &t.shape)?;
        let found = sha256_hex(data.as_bytes());
        if found != t.sha256 {
            return Err(Error::format(
                shown(&npz_file),
                format!(
                    "tensor '{}': SHA-256 {found} differs from {} recorded in {}",
                    t.name,
                    t.sha256,
                    shown(&json_file)
                ),
            ));
        }
        tensors.push((t.name.clone(), host_tensor(data, &t.shape, &host)?));
    }
    let index = tensors
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.clone(), i))
        .collect();
    Ok(LoadedCheckpoint {
        path: path.to_path_buf(),
        meta,
        tensors,
        index,
    })
}

fn host_tensor(data: HostData, shape: &[usize], host: &Device) -> Result<Tensor> {
    with_host!(data, v => Tensor::from_vec(v, shape, host))
}

/// Compares the checkpoint's tensors with what a model expects (`(name, shape, dtype)` each) and
/// reports every mismatch in one error naming the checkpoint `path`: expected names missing from
/// the checkpoint, checkpoint names the model does not expect, shape and dtype differences.
pub fn check_against<S: AsRef<str>, D: AsRef<[usize]>>(
    path: &Path,
    ckpt: &Checkpoint,
    expected: &[(S, D, DType)],
) -> Result<()> {
    let saved: HashMap<&str, &TensorMeta> =
        ckpt.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut problems = Vec::new();
    let mut wanted = BTreeSet::new();
    for (name, shape, dtype) in expected {
        let (name, shape) = (name.as_ref(), shape.as_ref());
        if !wanted.insert(name) {
            problems.push(format!("'{name}' is expected more than once"));
            continue;
        }
        match saved.get(name) {
            None => problems.push(format!("missing '{name}' (expected {dtype} {shape:?})")),
            Some(t) => {
                if t.shape != shape {
                    problems.push(format!(
                        "'{name}' has shape {:?} in the checkpoint, the model expects {shape:?}",
                        t.shape
                    ));
                }
                if t.dtype != *dtype {
                    problems.push(format!(
                        "'{name}' is {} in the checkpoint, the model expects {dtype}",
                        t.dtype
                    ));
                }
            }
        }
    }
    for t in &ckpt.tensors {
        if !wanted.contains(t.name.as_str()) {
            problems.push(format!(
                "unexpected '{}' ({} {:?}) not in the model",
                t.name, t.dtype, t.shape
            ));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(Error::format(
        format!("checkpoint {}", shown(path)),
        format!(
            "does not match the model ({} problem{}):\n  {}",
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            problems.join("\n  ")
        ),
    ))
}
