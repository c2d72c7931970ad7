//! Test helper: a fresh directory under the system temp dir, removed when dropped.
use std::ffi::OsStr;
use std::ops::Deref;
use std::path::{Path, PathBuf};

pub struct TempDir(PathBuf);

impl TempDir {
    /// `$TMPDIR/netcl-data-<pid>-<tag>`, emptied first.
    pub fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("netcl-data-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for TempDir {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}
