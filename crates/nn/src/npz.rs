//! Uncompressed npz archives (readable by `numpy.load`): a one-pass writer that hashes while it writes, and a reader that checks every declared size before it allocates.
use netcl_ops::{DType, Error, HostData, Result};
use npyz::npz::{array_name_from_file_name, file_name_from_array_name};
use npyz::zip::{CompressionMethod, ZipArchive};
use npyz::{TypeStr, WriteOptions, WriterBuilder};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Cursor, Read, Write};
use std::path::Path;

const BUF_BYTES: usize = 1 << 20;
/// The largest npy header read (numpy writes a few hundred bytes; version 1 allows 64 KiB).
const MAX_NPY_HEADER: u64 = 1 << 20;
/// Zip's 1980-01-01 00:00 (MS-DOS date and time): a fixed stamp keeps saves byte-identical.
const DOS_DATE: u16 = (1 << 5) | 1;
/// Unix 3.0 in "version made by": the external attributes hold unix permissions.
const MADE_BY_UNIX: u16 = 0x031E;
const FILE_MODE: u32 = 0o100644;

/// The numpy type string an array of `dtype` is stored as. numpy has no bfloat16, so bf16 is
/// stored as its raw bits (`<u2`); the checkpoint's json records the real dtype.
pub(crate) fn npy_descr(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::BF16 => "<u2",
        DType::I32 => "<i4",
        DType::U32 => "<u4",
    }
}

fn npy_dtype(dtype: DType) -> Result<npyz::DType> {
    let ts: TypeStr = npy_descr(dtype)
        .parse()
        .map_err(|e| Error::invalid("npz", format!("type string for {dtype}: {e}")))?;
    Ok(npyz::DType::Plain(ts))
}

/// Lower-case hex of a SHA-256 digest.
pub(crate) fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Counts and SHA-256-hashes every byte written through it, in file order.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// What the central directory records of one written entry.
struct Entry {
    name: Vec<u8>,
    crc: u32,
    size: u64,
    offset: u64,
}

/// Little-endian field appenders for zip records.
trait Le {
    fn u16(&mut self, v: u16);
    fn u32(&mut self, v: u32);
    fn u64(&mut self, v: u64);
}

impl Le for Vec<u8> {
    fn u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
}

/// Writes arrays one by one as a zip of stored `<name>.npy` entries, in one sequential pass (no
/// seeking back), computing the whole file's SHA-256 and each array's on the way. Zip64 fields
/// are used where a size or offset reaches 4 GiB.
pub(crate) struct NpzWriter<'p, W: Write> {
    out: HashingWriter<BufWriter<W>>,
    entries: Vec<Entry>,
    path: &'p Path,
    zip64_from: u64,
}

impl<'p, W: Write> NpzWriter<'p, W> {
    /// `path` is only used in error messages.
    pub(crate) fn new(inner: W, path: &'p Path) -> Self {
        NpzWriter {
            out: HashingWriter {
                inner: BufWriter::with_capacity(BUF_BYTES, inner),
                hasher: Sha256::new(),
                written: 0,
            },
            entries: Vec::new(),
            path,
            zip64_from: u64::from(u32::MAX),
        }
    }

    /// Uses zip64 fields for sizes and offsets from `limit` bytes on (tests force them with small limits).
    #[cfg(test)]
    fn zip64_from(mut self, limit: u64) -> Self {
        self.zip64_from = limit;
        self
    }

    fn io_err(&self, e: io::Error) -> Error {
        Error::io(self.path.display().to_string(), e)
    }

    /// Adds the array `name` of `dtype` and `shape` whose row-major little-endian elements are
    /// `data`; returns the hex SHA-256 of `data` (hashed on a second thread for large arrays).
    pub(crate) fn add(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        data: &[u8],
    ) -> Result<String> {
        let mut header = Vec::new();
        let shape64: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        WriteOptions::new_header_only()
            .dtype(npy_dtype(dtype)?)
            .shape(&shape64)
            .writer(&mut header)
            .write_header_only()
            .map_err(|e| self.io_err(e))?;
        let file_name = file_name_from_array_name(name).into_bytes();
        if file_name.len() > usize::from(u16::MAX) {
            return Err(Error::invalid(
                "npz",
                format!("array name of {} bytes is too long for zip", name.len()),
            ));
        }
        let big = data.len() >= 1 << 20;
        let (sha, written) = std::thread::scope(|s| {
            let hashing = big.then(|| s.spawn(|| sha256_hex(data)));
            let written = self.write_entry(file_name, &header, data);
            let sha = match hashing {
                Some(h) => h.join().unwrap_or_else(|_| sha256_hex(data)),
                None => sha256_hex(data),
            };
            (sha, written)
        });
        written?;
        Ok(sha)
    }

    fn write_entry(&mut self, name: Vec<u8>, header: &[u8], data: &[u8]) -> Result<()> {
        let mut crc = crc32fast::Hasher::new();
        crc.update(header);
        crc.update(data);
        let crc = crc.finalize();
        let size = (header.len() + data.len()) as u64;
        let zip64 = size >= self.zip64_from;
        let mut local = Vec::with_capacity(50 + name.len());
        local.u32(0x0403_4b50);
        local.u16(if zip64 { 45 } else { 20 });
        local.u16(utf8_flag(&name));
        local.u16(0); // stored
        local.u16(0);
        local.u16(DOS_DATE);
        local.u32(crc);
        let small = if zip64 { u32::MAX } else { size as u32 };
        local.u32(small);
        local.u32(small);
        local.u16(name.len() as u16);
        local.u16(if zip64 { 20 } else { 0 });
        local.extend_from_slice(&name);
        if zip64 {
            local.u16(1);
            local.u16(16);
            local.u64(size);
            local.u64(size);
        }
        let offset = self.out.written;
        let r = (self.out.write_all(&local))
            .and_then(|()| self.out.write_all(header))
            .and_then(|()| self.out.write_all(data));
        r.map_err(|e| self.io_err(e))?;
        self.entries.push(Entry {
            name,
            crc,
            size,
            offset,
        });
        Ok(())
    }

    /// Writes the zip directory, flushes, and returns the writer and the file's hex SHA-256.
    /// Every write error is returned here: nothing is left to a destructor.
    pub(crate) fn finish(mut self) -> Result<(W, String)> {
        let lim = self.zip64_from;
        let cd_start = self.out.written;
        let mut cd = Vec::new();
        for e in &self.entries {
            let (big_size, big_offset) = (e.size >= lim, e.offset >= lim);
            let mut extra = Vec::new();
            if big_size {
                extra.u64(e.size);
                extra.u64(e.size);
            }
            if big_offset {
                extra.u64(e.offset);
            }
            cd.u32(0x0201_4b50);
            cd.u16(MADE_BY_UNIX);
            cd.u16(if extra.is_empty() { 20 } else { 45 });
            cd.u16(utf8_flag(&e.name));
            cd.u16(0);
            cd.u16(0);
            cd.u16(DOS_DATE);
            cd.u32(e.crc);
            let size = if big_size { u32::MAX } else { e.size as u32 };
            cd.u32(size);
            cd.u32(size);
            cd.u16(e.name.len() as u16);
            cd.u16(if extra.is_empty() {
                0
            } else {
                4 + extra.len() as u16
            });
            cd.u16(0); // comment
            cd.u16(0); // disk
            cd.u16(0); // internal attributes
            cd.u32(FILE_MODE << 16);
            cd.u32(if big_offset {
                u32::MAX
            } else {
                e.offset as u32
            });
            cd.extend_from_slice(&e.name);
            if !extra.is_empty() {
                cd.u16(1);
                cd.u16(extra.len() as u16);
                cd.extend_from_slice(&extra);
            }
        }
        let n = self.entries.len() as u64;
        let cd_size = cd.len() as u64;
        let zip64 = n >= 0xFFFF || cd_start >= lim || cd_size >= lim;
        if zip64 {
            let at = cd_start + cd_size;
            cd.u32(0x0606_4b50);
            cd.u64(44);
            cd.u16(MADE_BY_UNIX);
            cd.u16(45);
            cd.u32(0);
            cd.u32(0);
            cd.u64(n);
            cd.u64(n);
            cd.u64(cd_size);
            cd.u64(cd_start);
            cd.u32(0x0706_4b50);
            cd.u32(0);
            cd.u64(at);
            cd.u32(1);
        }
        let clip32 = |v: u64| if v >= lim { u32::MAX } else { v as u32 };
        cd.u32(0x0605_4b50);
        cd.u16(0);
        cd.u16(0);
        cd.u16(n.min(0xFFFF) as u16);
        cd.u16(n.min(0xFFFF) as u16);
        cd.u32(clip32(cd_size));
        cd.u32(clip32(cd_start));
        cd.u16(0);
        self.out.write_all(&cd).map_err(|e| self.io_err(e))?;
        let HashingWriter { inner, hasher, .. } = self.out;
        let inner = inner
            .into_inner()
            .map_err(|e| Error::io(self.path.display().to_string(), e.into_error()))?;
        Ok((inner, hex(&hasher.finalize())))
    }
}

/// Zip's "name is UTF-8" flag, set for non-ASCII names.
fn utf8_flag(name: &[u8]) -> u16 {
    if name.is_ascii() {
        0
    } else {
        1 << 11
    }
}

/// Reads arrays from an npz file, checking each against the dtype and shape it should have.
pub(crate) struct NpzReader<'p> {
    zip: ZipArchive<BufReader<File>>,
    path: &'p Path,
    file_len: u64,
}

/// An entry's parsed npy header, its raw header bytes and its data size.
type RawHeader = (npyz::NpyFile<Cursor<Vec<u8>>>, Vec<u8>, u64);

/// The checked layout of one entry: its npy header bytes and its data size.
struct EntryLayout {
    header: Vec<u8>,
    data_bytes: usize,
}

impl<'p> NpzReader<'p> {
    /// `file` must be positioned at its start; `path` is only used in error messages.
    pub(crate) fn new(file: File, path: &'p Path) -> Result<Self> {
        let shown = path.display().to_string();
        let file_len = file.metadata().map_err(|e| Error::io(&shown, e))?.len();
        let zip = ZipArchive::new(BufReader::with_capacity(BUF_BYTES, file))
            .map_err(|e| Error::format(&shown, format!("not a readable npz (zip) archive: {e}")))?;
        Ok(NpzReader {
            zip,
            path,
            file_len,
        })
    }

    /// The names of the arrays in the archive (in no particular order); an entry that is not an
    /// `.npy` file is listed under its own name.
    pub(crate) fn names(&self) -> Vec<String> {
        self.zip
            .file_names()
            .map(|f| array_name_from_file_name(f).unwrap_or(f).to_string())
            .collect()
    }

    fn format_err(&self, msg: String) -> Error {
        Error::format(self.path.display().to_string(), msg)
    }

    /// Checks, without reading its data, that the entry of array `name` is stored uncompressed
    /// inside the file and holds an npy header of `dtype`, C order and `shape` followed by exactly
    /// the bytes they need; returns the number of data bytes.
    pub(crate) fn check(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<usize> {
        Ok(self.layout(name, dtype, shape)?.data_bytes)
    }

    /// The dtype and shape array `name` is stored with (its npy header; the entry checked as in
    /// [`NpzReader::check`] except against expectations). `<u2` (numpy has no bfloat16) is read
    /// as bf16 only when the caller knows it is; here it is an error.
    pub(crate) fn describe(&mut self, name: &str) -> Result<(DType, Vec<usize>)> {
        let (npy, _, _) = self.raw_header(name)?;
        let descr = npy.dtype().descr();
        let dtype = [DType::F32, DType::F64, DType::F16, DType::I32, DType::U32]
            .into_iter()
            .find(|&d| npy_dtype(d).is_ok_and(|t| t == npy.dtype()))
            .ok_or_else(|| {
                self.format_err(format!(
                    "array '{name}' is stored as {descr}; netcl reads <f4, <f8, <f2, <i4 and <u4"
                ))
            })?;
        let shape = npy
            .shape()
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| {
                self.format_err(format!(
                    "array '{name}': shape {:?} is too large",
                    npy.shape()
                ))
            })?;
        Ok((dtype, shape))
    }

    fn layout(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<EntryLayout> {
        let expected = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                self.format_err(format!("array '{name}': shape {shape:?} is too large"))
            })?;
        let (npy, header, data_bytes) = self.raw_header(name)?;
        let err = |msg: String| self.format_err(msg);
        let want = npy_dtype(dtype)?;
        if npy.dtype() != want {
            return Err(err(format!(
                "array '{name}' is stored as {}, but a {dtype} tensor must be stored as '{}'",
                npy.dtype().descr(),
                npy_descr(dtype)
            )));
        }
        if npy.order() != npyz::Order::C {
            return Err(err(format!(
                "array '{name}' is in Fortran order; only C order is read"
            )));
        }
        if npy.shape().len() != shape.len()
            || npy.shape().iter().zip(shape).any(|(&a, &b)| a != b as u64)
        {
            return Err(err(format!(
                "array '{name}' has shape {:?} in the npz but {shape:?} in the json",
                npy.shape()
            )));
        }
        if data_bytes != expected as u64 {
            return Err(err(format!(
                "array '{name}' has {data_bytes} data bytes, {expected} expected for {dtype} {shape:?}"
            )));
        }
        Ok(EntryLayout {
            header,
            data_bytes: expected,
        })
    }

    /// Array `name`'s parsed npy header, its raw header bytes and its data size, after checking
    /// that the entry is stored uncompressed inside the file with a header of bounded size.
    fn raw_header(&mut self, name: &str) -> Result<RawHeader> {
        let file_len = self.file_len;
        let path = self.path.display().to_string();
        let err = |msg: String| Error::format(&path, msg);
        let mut entry = match self.zip.by_name(&file_name_from_array_name(name)) {
            Ok(e) => e,
            Err(npyz::zip::result::ZipError::FileNotFound) => {
                return Err(err(format!("no array '{name}' in the archive")))
            }
            Err(e) => return Err(err(format!("array '{name}': unreadable zip entry: {e}"))),
        };
        if entry.compression() != CompressionMethod::Stored {
            return Err(err(format!(
                "array '{name}' is compressed ({}); checkpoints store arrays uncompressed",
                entry.compression()
            )));
        }
        let size = entry.size();
        let ends = entry.data_start().checked_add(size);
        if entry.compressed_size() != size || ends.is_none_or(|end| end > file_len) {
            return Err(err(format!(
                "array '{name}': zip entry declares {size} bytes ({} stored) from offset {}, \
                 beyond the {file_len}-byte file",
                entry.compressed_size(),
                entry.data_start()
            )));
        }
        // The npy pre-header: magic, version, header length (u16 in version 1, u32 after).
        let mut pre = [0u8; 12];
        let pre_len = if size >= 10 { 10 } else { 0 };
        entry.read_exact(&mut pre[..pre_len]).map_err(|e| {
            err(format!(
                "array '{name}': reading its npy header failed: {e}"
            ))
        })?;
        if pre_len < 10 || &pre[..6] != b"\x93NUMPY" {
            return Err(err(format!(
                "array '{name}' is not an npy array (bad magic)"
            )));
        }
        let (pre_len, header_len) = if pre[6] == 1 {
            (10, u64::from(u16::from_le_bytes([pre[8], pre[9]])))
        } else {
            entry.read_exact(&mut pre[10..12]).map_err(|e| {
                err(format!(
                    "array '{name}': reading its npy header failed: {e}"
                ))
            })?;
            (
                12,
                u64::from(u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]])),
            )
        };
        if header_len > MAX_NPY_HEADER || pre_len + header_len > size {
            return Err(err(format!(
                "array '{name}': npy header of {header_len} bytes does not fit its {size}-byte entry \
                 (at most {MAX_NPY_HEADER} bytes are read)"
            )));
        }
        let data_bytes = size - pre_len - header_len;
        let mut header = pre[..pre_len as usize].to_vec();
        (&mut entry)
            .take(header_len)
            .read_to_end(&mut header)
            .map_err(|e| {
                err(format!(
                    "array '{name}': reading its npy header failed: {e}"
                ))
            })?;
        let npy = npyz::NpyFile::new(Cursor::new(header.clone()))
            .map_err(|e| err(format!("array '{name}': unreadable npy header: {e}")))?;
        Ok((npy, header, data_bytes))
    }

    /// The array `name`, which must be stored as `dtype` (see [`npy_descr`]) in C order with
    /// `shape`; its size is checked against the file before anything is allocated.
    pub(crate) fn read(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<HostData> {
        let layout = self.layout(name, dtype, shape)?;
        let path = self.path.display().to_string();
        let mut entry = self
            .zip
            .by_name(&file_name_from_array_name(name))
            .map_err(|e| Error::format(&path, format!("array '{name}': {e}")))?;
        let read_err = |e: io::Error| {
            Error::format(
                &path,
                format!("array '{name}': reading its data failed: {e}"),
            )
        };
        io::copy(
            &mut (&mut entry).take(layout.header.len() as u64),
            &mut io::sink(),
        )
        .map_err(read_err)?;
        // Bounded by the file's size (checked in `layout`).
        let mut bytes = vec![0u8; layout.data_bytes];
        entry.read_exact(&mut bytes).map_err(read_err)?;
        // Reading to the end lets the zip reader check the entry's CRC.
        let mut rest = [0u8; 1];
        if entry.read(&mut rest).map_err(read_err)? != 0 {
            return Err(Error::format(
                path,
                format!("array '{name}' has more data bytes than its shape needs"),
            ));
        }
        HostData::from_bytes(dtype, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("netcl-npz-{}-{name}", std::process::id()))
    }

    /// Entries written with zip64 fields (forced at every size) read back exactly.
    #[test]
    fn zip64_records_read_back() {
        let path = temp_path("zip64.npz");
        let data: Vec<u8> = (0..40u8).collect();
        let mut w = NpzWriter::new(File::create(&path).unwrap(), &path).zip64_from(0);
        let sha = w.add("a", DType::F32, &[2, 5], &data).unwrap();
        assert_eq!(sha, sha256_hex(&data));
        w.add("b.c", DType::I32, &[0], &[]).unwrap();
        let (file, file_sha) = w.finish().unwrap();
        drop(file);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(file_sha, sha256_hex(&bytes));
        assert!(
            bytes.windows(4).any(|w| w == b"PK\x06\x06"),
            "zip64 end record"
        );
        let mut r = NpzReader::new(File::open(&path).unwrap(), &path).unwrap();
        let mut names = r.names();
        names.sort();
        assert_eq!(names, ["a", "b.c"]);
        assert_eq!(
            r.read("a", DType::F32, &[2, 5]).unwrap().as_bytes(),
            &data[..]
        );
        assert!(r
            .read("b.c", DType::I32, &[0])
            .unwrap()
            .as_bytes()
            .is_empty());
        let _ = std::fs::remove_file(&path);
    }

    /// A sink that fails after `left` bytes, like a disk filling up.
    struct FillsUp {
        left: usize,
    }

    impl Write for FillsUp {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.left == 0 {
                return Err(io::Error::new(io::ErrorKind::StorageFull, "no space left"));
            }
            let n = buf.len().min(self.left);
            self.left -= n;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Every write error comes back from `add` or `finish` as an error naming the file (the
    /// buffered tail included), whatever the point where the disk fills up.
    #[test]
    fn a_full_disk_is_an_error_from_add_or_finish() {
        let path = Path::new("full.npz");
        let data = vec![7u8; 3 << 20];
        for left in [0, 10, 100, 500, 2 << 20, (6 << 20) + 200] {
            let mut w = NpzWriter::new(FillsUp { left }, path);
            let r = w
                .add("a", DType::U32, &[3 << 18], &data)
                .and_then(|_| w.add("b", DType::U32, &[3 << 18], &data))
                .and_then(|_| w.finish().map(|_| ()));
            let e = r.expect_err("the disk is full");
            assert!(
                matches!(e, Error::Io { .. }) && e.to_string().contains("full.npz"),
                "{left}: {e}"
            );
        }
        #[cfg(target_os = "linux")]
        {
            let dev_full = Path::new("/dev/full");
            if let Ok(f) = std::fs::OpenOptions::new().write(true).open(dev_full) {
                let mut w = NpzWriter::new(f, dev_full);
                w.add("a", DType::F32, &[1], &[0; 4]).unwrap(); // buffered
                let e = w.finish().expect_err("/dev/full refuses the data");
                assert!(e.to_string().contains("/dev/full"), "{e}");
            }
        }
    }
}
