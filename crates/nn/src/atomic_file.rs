//! Crash-safe file replacement: write a temporary file beside the target, fsync it, rename it over the target.
use netcl_ops::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A temporary file in the target's directory. Dropping it without [`TempFile::persist`] removes
/// it, so a failed write leaves the target untouched.
pub(crate) struct TempFile {
    path: PathBuf,
    target: PathBuf,
    persisted: bool,
}

impl TempFile {
    /// Creates `<target>.tmp-<pid>-<n>` (a fresh name: never an existing file) and opens it for reading and writing.
    pub(crate) fn create(target: &Path) -> Result<(TempFile, File)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut name = target
            .file_name()
            .ok_or_else(|| {
                Error::invalid(
                    "checkpoint",
                    format!("{} has no file name", target.display()),
                )
            })?
            .to_os_string();
        name.push(format!(
            ".tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let path = target.with_file_name(name);
        // Readable too: the checkpoint hashes the npz it just wrote.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io(path.display().to_string(), e))?;
        let temp = TempFile {
            path,
            target: target.to_path_buf(),
            persisted: false,
        };
        Ok((temp, file))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the temporary file over the target (atomic on POSIX file systems).
    pub(crate) fn persist(mut self) -> io::Result<()> {
        std::fs::rename(&self.path, &self.target)?;
        self.persisted = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Flushes a written file's data and metadata to the disk.
pub(crate) fn sync_file(file: &File, path: &Path) -> Result<()> {
    file.sync_all()
        .map_err(|e| Error::io(path.display().to_string(), e))
}

/// Makes renames inside `dir` durable (a no-op where directories cannot be opened, e.g. Windows).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let d = File::open(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
        d.sync_all()
            .map_err(|e| Error::io(dir.display().to_string(), e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}
