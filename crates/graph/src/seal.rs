//! The seal of a graph file: HMAC-SHA256 of its text under a random key kept by this installation, so `Graph::load` builds and runs only what this netcl (or one given the same key) saved.
use hmac::{Hmac, Mac};
use netcl_core_devices::{Config, Error, Result};
use sha2::Sha256;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file holding the key: [`Config::graph_key`] (`NETCL_GRAPH_KEY`), else `graph.key` in netcl's cache folder
/// (`NETCL_CACHE_DIR`, `$XDG_CACHE_HOME/netcl` or `$HOME/.cache/netcl`).
pub fn key_path() -> Result<PathBuf> {
    match Config::get().graph_key.clone() {
        Some(p) => Ok(p),
        None => netcl_kernels::cache_dir()
            .map(|d| d.join("graph.key"))
            .ok_or_else(|| {
                Error::invalid(
                    "graph key",
                    "no folder for the key that seals graph files (NETCL_CACHE_DIR is off): set \
                     NETCL_GRAPH_KEY to a file",
                )
            }),
    }
}

/// The key in `path` (64 hex digits), or `None` where there is no such file.
fn read_key(path: &Path) -> Result<Option<Vec<u8>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path.display().to_string(), e)),
    };
    match from_hex(text.trim()) {
        Some(k) if k.len() == 32 => Ok(Some(k)),
        _ => Err(Error::format(
            format!("graph key {}", path.display()),
            "not 64 hex digits",
        )),
    }
}

/// This installation's key, made (32 random bytes, readable by the owner only) when `create`
/// and there is none yet. Two processes making it at once end with the same one.
fn key(create: bool) -> Result<Vec<u8>> {
    let path = key_path()?;
    if let Some(k) = read_key(&path)? {
        return Ok(k);
    }
    if !create {
        return Err(Error::invalid(
            "Graph::load",
            format!(
                "no graph key at {}: graph files load only where they were saved, or where \
                 that installation's key was copied",
                path.display()
            ),
        ));
    }
    let io = |e| Error::io(path.display().to_string(), e);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut k = [0u8; 32];
    getrandom::fill(&mut k)
        .map_err(|e| Error::invalid("graph key", format!("no random bytes: {e}")))?;
    let tmp = path.with_extension(format!("key.{}.tmp", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&tmp).and_then(|mut f| {
        f.write_all(to_hex(&k).as_bytes())
            .and_then(|_| f.sync_all())
    });
    // A link never replaces a key another process made first; that one is read back instead.
    let linked = written.and_then(|_| std::fs::hard_link(&tmp, &path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(k.to_vec()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_key(&path)?
            .ok_or_else(|| Error::invalid("graph key", "vanished while it was made")),
        Err(e) => Err(io(e)),
    }
}

fn mac(key: &[u8], bytes: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(bytes);
    m
}

/// The seal of `bytes` under this installation's key (made at the first save), as hex.
pub(crate) fn seal(bytes: &[u8]) -> Result<String> {
    Ok(to_hex(&mac(&key(true)?, bytes).finalize().into_bytes()))
}

/// Whether `seal` (hex) is the seal of `bytes` under this installation's key; an error naming
/// `what` otherwise (an edited file, or one saved under another key).
pub(crate) fn check(bytes: &[u8], seal: &str, what: &str) -> Result<()> {
    let key = key(false)?;
    let ok = from_hex(seal).is_some_and(|s| mac(&key, bytes).verify_slice(&s).is_ok());
    if ok {
        return Ok(());
    }
    Err(Error::format(
        what,
        format!(
            "its seal does not match: the file was changed after netcl saved it, or saved under \
             another key than {} (a graph file is code: netcl runs only those it sealed)",
            key_path()?.display()
        ),
    ))
}

pub(crate) fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}
