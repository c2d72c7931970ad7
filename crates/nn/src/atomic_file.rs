//! Crash-safe file replacement: write a temporary file beside the target, fsync it, rename it over the target; plus, with feature `test-hooks`, a fault-injection hook that kills a save before a chosen file-system step.
use netcl_ops::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable of the fault-injection hook (feature `test-hooks` only):
/// `NETCL_CHECKPOINT_CRASH_AT=k` makes every checkpoint save of the process abort it right before
/// its k-th file-system step (each write, fsync, rename or removal; counted from 1 in each save).
/// Read once. For crash tests only.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub const CRASH_AT_ENV: &str = "NETCL_CHECKPOINT_CRASH_AT";

#[cfg(feature = "test-hooks")]
fn crash_at() -> Option<u64> {
    static AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *AT.get_or_init(|| std::env::var(CRASH_AT_ENV).ok()?.trim().parse().ok())
}

/// Counts one save's file-system steps and (feature `test-hooks`) applies the crash hook.
pub(crate) struct FsSteps {
    #[cfg(feature = "test-hooks")]
    done: u64,
}

impl FsSteps {
    pub(crate) fn new() -> FsSteps {
        FsSteps {
            #[cfg(feature = "test-hooks")]
            done: 0,
        }
    }

    /// Called right before each file-system step; with feature `test-hooks`, aborts the process
    /// when the hook names the step.
    #[inline]
    pub(crate) fn step(&mut self) {
        #[cfg(feature = "test-hooks")]
        {
            self.done += 1;
            if crash_at() == Some(self.done) {
                std::process::abort();
            }
        }
    }
}

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
        let file = OpenOptions::new()
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
    pub(crate) fn persist(self) -> io::Result<()> {
        let target = self.target.clone();
        self.persist_as(&target)
    }

    /// Renames the temporary file over `target` (in the same directory) instead.
    pub(crate) fn persist_as(mut self, target: &Path) -> io::Result<()> {
        std::fs::rename(&self.path, target)?;
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
