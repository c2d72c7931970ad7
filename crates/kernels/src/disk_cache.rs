//! Program binaries on disk, keyed by a hash of source, options, platform, device and driver.
use netcl_core_devices::Config;
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"NETCLBIN";
const HEADER: usize = 8 + 8 + 8 + 8;

/// [`Config::cache_dir`]: `NETCL_CACHE_DIR`, else `$XDG_CACHE_HOME/netcl`, else
/// `$HOME/.cache/netcl`; `off` (`None`) disables it.
pub fn default_dir() -> Option<PathBuf> {
    Config::get().cache_dir.clone()
}

/// FNV-1a over `bytes`, from the given offset basis.
fn fnv1a(bytes: &[u8], basis: u64) -> u64 {
    bytes.iter().fold(basis, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Two independent 64-bit hashes of everything that determines a binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key(u64, u64);

impl Key {
    pub fn new(parts: &[&str]) -> Key {
        let joined = parts.join("\u{0}");
        Key(
            fnv1a(joined.as_bytes(), 0xcbf2_9ce4_8422_2325),
            fnv1a(joined.as_bytes(), 0x6c62_272e_07bb_0142),
        )
    }
}

pub fn path(dir: &Path, stem: &str, key: Key) -> PathBuf {
    dir.join(format!("{stem}-{:016x}.bin", key.0))
}

/// The binary stored for `key`, if the file exists and is intact.
pub fn load(file: &Path, key: Key) -> Option<Vec<u8>> {
    let data = std::fs::read(file).ok()?;
    if data.len() < HEADER || &data[..8] != MAGIC {
        return None;
    }
    let word =
        |i: usize| u64::from_le_bytes(data[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"));
    let (check, len, sum) = (word(0), word(1) as usize, word(2));
    let bin = &data[HEADER..];
    (check == key.1 && len == bin.len() && sum == fnv1a(bin, 0xcbf2_9ce4_8422_2325))
        .then(|| bin.to_vec())
}

/// Store a binary atomically (temporary file + rename). Failures are logged, never fatal.
pub fn store(file: &Path, key: Key, bin: &[u8]) {
    let write = || -> std::io::Result<()> {
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(MAGIC)?;
        f.write_all(&key.1.to_le_bytes())?;
        f.write_all(&(bin.len() as u64).to_le_bytes())?;
        f.write_all(&fnv1a(bin, 0xcbf2_9ce4_8422_2325).to_le_bytes())?;
        f.write_all(bin)?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)
    };
    if let Err(e) = write() {
        log::warn!("could not store kernel binary {}: {e}", file.display());
    }
}
