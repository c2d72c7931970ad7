//! Checkpoints: `P.json` (metadata, schema version, hashes) + `P.npz` (tensors), saved atomically and verified on load.
//!
//! A checkpoint at path `P` is two files:
//! - `P.npz`: one uncompressed `<name>.npy` entry per tensor, readable by `numpy.load`
//!   (f32 `<f4`, f64 `<f8`, f16 `<f2`, i32 `<i4`, u32 `<u4`; bf16 as its raw bits `<u2`).
//! - `P.json`: a [`Checkpoint`]: schema version, the caller's model/optimizer/step/extra values,
//!   each tensor's name, shape, dtype and SHA-256, and the SHA-256 of the whole npz file.
//!
//! A tensor's `sha256` is over its elements' little-endian bytes in row-major order (numpy:
//! `hashlib.sha256(arr.tobytes())`), not over the npy header. Saving writes both files to
//! temporaries in the target directory, syncs them, then renames the npz and then the json over
//! the old pair; a failed save leaves the previous checkpoint in place, and a crash between the
//! two renames leaves a pair whose npz hash no longer matches, which [`load`] reports.
use crate::atomic_file::{sync_dir, sync_file, TempFile};
use crate::npz::{NpzReader, NpzWriter};
use netcl_ops::{with_host, DType, Device, Error, HostData, Result, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The version of the json layout written by [`save`]; [`load`] reads only this version.
pub const SCHEMA_VERSION: u32 = 1;

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
    /// Lower-case hex SHA-256 of the whole `P.npz` file: ties the pair together.
    pub npz_sha256: String,
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

/// `P.npz`: the path with ".npz" appended.
pub fn npz_path(path: impl AsRef<Path>) -> PathBuf {
    with_suffix(path.as_ref(), ".npz")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// Lower-case hex of a SHA-256 digest.
fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
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
    Ok(hex(&hasher.finalize()))
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

/// Saves `tensors` (any device, any layout; copied to the host one at a time) and `info` as the
/// checkpoint at `path` (`path.npz` + `path.json`), creating parent directories. Returns the
/// metadata written to `path.json`. On error the previous checkpoint at `path`, if any, is intact.
pub fn save<S: AsRef<str>>(
    path: impl AsRef<Path>,
    info: &CheckpointInfo,
    tensors: &[(S, &Tensor)],
) -> Result<Checkpoint> {
    let path = path.as_ref();
    let (json_file, npz_file) = (json_path(path), npz_path(path));
    if path.file_name().is_none() {
        return Err(Error::invalid(
            "checkpoint::save",
            format!("checkpoint path '{}' has no file name", shown(path)),
        ));
    }
    let problems = name_problems(tensors.iter().map(|(n, _)| n.as_ref()));
    if !problems.is_empty() {
        return Err(Error::invalid(
            "checkpoint::save",
            format!("{}: {}", shown(path), problems.join("; ")),
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(shown(&dir), e))?;

    // 1. The npz, to a temporary file, hashing each tensor as it goes.
    let (npz_temp, file) = TempFile::create(&npz_file)?;
    let mut writer = NpzWriter::new(file, npz_temp.path());
    let mut metas = Vec::with_capacity(tensors.len());
    for (name, tensor) in tensors {
        let name = name.as_ref();
        let data = tensor.to_host_data()?;
        writer.add(name, tensor.dtype(), tensor.shape(), data.as_bytes())?;
        metas.push(TensorMeta {
            name: name.to_string(),
            shape: tensor.shape().to_vec(),
            dtype: tensor.dtype(),
            sha256: sha256_hex(data.as_bytes()),
        });
    }
    let mut file = writer.finish()?;
    sync_file(&file, npz_temp.path())?;
    let npz_sha256 = sha256_file(&mut file, npz_temp.path())?;
    drop(file);

    // 2. The json, to a temporary file.
    let ckpt = Checkpoint {
        schema_version: SCHEMA_VERSION,
        model: info.model.clone(),
        optimizer: info.optimizer.clone(),
        step: info.step,
        extra: info.extra.clone(),
        tensors: metas,
        npz_sha256,
    };
    let text = json_text(&ckpt)
        .map_err(|e| Error::format(shown(&json_file), format!("serialising the metadata: {e}")))?;
    let (json_temp, mut file) = TempFile::create(&json_file)?;
    file.write_all(text.as_bytes())
        .map_err(|e| Error::io(shown(json_temp.path()), e))?;
    sync_file(&file, json_temp.path())?;
    drop(file);

    // 3. Both complete on disk: replace the npz, then the json that vouches for it.
    npz_temp
        .persist()
        .map_err(|e| Error::io(shown(&npz_file), e))?;
    json_temp.persist().map_err(|e| {
        let msg = format!(
            "{} was replaced but renaming the new json over it failed ({e}); the checkpoint at {} \
             is inconsistent and will fail to load until saved again",
            shown(&npz_file),
            shown(path)
        );
        Error::io(shown(&json_file), io::Error::new(e.kind(), msg))
    })?;
    sync_dir(&dir)?;
    Ok(ckpt)
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
    if version.as_u64() != Some(u64::from(SCHEMA_VERSION)) {
        let msg = format!("checkpoint schema version {version} found, this netcl supports version {SCHEMA_VERSION}");
        return Err(Error::format(what, msg));
    }
    let ckpt: Checkpoint = serde_json::from_value(value)
        .map_err(|e| Error::format(what.clone(), format!("bad checkpoint metadata: {e}")))?;
    let mut problems = name_problems(ckpt.tensors.iter().map(|t| t.name.as_str()));
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
    let (json_file, npz_file) = (json_path(path), npz_path(path));
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
