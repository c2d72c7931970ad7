//! Reading files a user names: only regular files (a FIFO or a device such as /dev/zero would block or never end), and at most a given size.
use crate::{Error, Result};
use std::path::Path;

/// The length of `path` (symlinks followed), an error unless it is a regular file.
pub fn regular_file(path: &Path) -> Result<u64> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path.display().to_string(), e))?;
    if !meta.is_file() {
        return Err(Error::format(
            path.display().to_string(),
            format!("not a regular file ({:?})", meta.file_type()),
        ));
    }
    Ok(meta.len())
}

/// The bytes of the regular file `path`, an error naming it when it holds more than `limit`
/// bytes (what `what` says the limit is, e.g. "NETCL_CORPUS_LIMIT").
pub fn read_regular(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    let len = regular_file(path)?;
    if len > limit {
        return Err(Error::format(
            path.display().to_string(),
            format!("{len} bytes, more than {limit} ({what})"),
        ));
    }
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len as usize).map_err(|_| {
        Error::format(
            path.display().to_string(),
            format!("{len} bytes: no memory"),
        )
    })?;
    use std::io::Read;
    std::fs::File::open(path)
        .and_then(|f| f.take(limit.saturating_add(1)).read_to_end(&mut bytes))
        .map_err(|e| Error::io(path.display().to_string(), e))?;
    if bytes.len() as u64 > limit {
        return Err(Error::format(
            path.display().to_string(),
            format!("more than {limit} bytes ({what}; it grew while read)"),
        ));
    }
    Ok(bytes)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn fifos_devices_and_files_over_the_limit_are_refused() {
        let e = read_regular(Path::new("/dev/zero"), 1 << 20, "test").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let dir = std::env::temp_dir().join(format!("netcl-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        if std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success())
        {
            let e = read_regular(&fifo, 1 << 20, "test").unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        let f = dir.join("f");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_regular(&f, 10, "test").unwrap(), b"0123456789");
        let e = read_regular(&f, 9, "the limit").unwrap_err().to_string();
        assert!(e.contains("10 bytes, more than 9 (the limit)"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
