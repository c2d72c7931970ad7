//! IDX files (the MNIST format), plain or gzip-compressed: reading with full validation, and writing.
//!
//! Layout: a 4-byte magic `0x00 0x00 TYPE NDIM`, then `NDIM` big-endian u32 dimensions, then the
//! elements in row-major order, big-endian. Every error names the file.
//!
//! What is read is bounded by the header: a header declaring more than [`MAX_IDX_DATA_BYTES`], or
//! more than the input could hold (its length, or 1032 times it when gzip-compressed: deflate's
//! largest ratio), is refused before any data is read, so a gzip bomb costs no memory.
use flate2::bufread::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use netcl_core_devices::{Error, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

/// The most data bytes an IDX header may declare (2 GiB; Fashion-MNIST's largest file has 47 MB).
pub const MAX_IDX_DATA_BYTES: u64 = 1 << 31;
/// Deflate's largest compression ratio (about 1032:1): a gzip stream of `n` bytes cannot
/// decompress to more than `n * GZIP_MAX_RATIO` bytes.
const GZIP_MAX_RATIO: u64 = 1032;
/// Trailing bytes after the data are counted up to this many, then reported as "at least".
const TRAILING_COUNTED: u64 = 1 << 20;

/// The element type of an IDX file: the third byte of the magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdxType {
    U8,
    I8,
    I16,
    I32,
    F32,
    F64,
}

impl IdxType {
    /// The type for an IDX type code (0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64).
    pub fn from_code(code: u8) -> Option<IdxType> {
        Some(match code {
            0x08 => IdxType::U8,
            0x09 => IdxType::I8,
            0x0B => IdxType::I16,
            0x0C => IdxType::I32,
            0x0D => IdxType::F32,
            0x0E => IdxType::F64,
            _ => return None,
        })
    }

    pub fn code(self) -> u8 {
        match self {
            IdxType::U8 => 0x08,
            IdxType::I8 => 0x09,
            IdxType::I16 => 0x0B,
            IdxType::I32 => 0x0C,
            IdxType::F32 => 0x0D,
            IdxType::F64 => 0x0E,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            IdxType::U8 | IdxType::I8 => 1,
            IdxType::I16 => 2,
            IdxType::I32 | IdxType::F32 => 4,
            IdxType::F64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            IdxType::U8 => "u8",
            IdxType::I8 => "i8",
            IdxType::I16 => "i16",
            IdxType::I32 => "i32",
            IdxType::F32 => "f32",
            IdxType::F64 => "f64",
        }
    }
}

/// The elements of an IDX file, converted from big-endian to native values.
#[derive(Clone, Debug, PartialEq)]
pub enum IdxData {
    U8(Vec<u8>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl IdxData {
    pub fn idx_type(&self) -> IdxType {
        match self {
            IdxData::U8(_) => IdxType::U8,
            IdxData::I8(_) => IdxType::I8,
            IdxData::I16(_) => IdxType::I16,
            IdxData::I32(_) => IdxType::I32,
            IdxData::F32(_) => IdxType::F32,
            IdxData::F64(_) => IdxType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            IdxData::U8(v) => v.len(),
            IdxData::I8(v) => v.len(),
            IdxData::I16(v) => v.len(),
            IdxData::I32(v) => v.len(),
            IdxData::F32(v) => v.len(),
            IdxData::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Big-endian element bytes into native values of `ty` (`raw.len()` is a multiple of its size).
    fn from_be_bytes(ty: IdxType, raw: Vec<u8>) -> IdxData {
        fn conv<T, const N: usize>(raw: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
            raw.chunks_exact(N)
                .map(|c| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(c);
                    f(a)
                })
                .collect()
        }
        match ty {
            IdxType::U8 => IdxData::U8(raw),
            IdxType::I8 => IdxData::I8(raw.into_iter().map(|b| b as i8).collect()),
            IdxType::I16 => IdxData::I16(conv(&raw, i16::from_be_bytes)),
            IdxType::I32 => IdxData::I32(conv(&raw, i32::from_be_bytes)),
            IdxType::F32 => IdxData::F32(conv(&raw, f32::from_be_bytes)),
            IdxType::F64 => IdxData::F64(conv(&raw, f64::from_be_bytes)),
        }
    }
}

/// One IDX file: its dimensions and its elements (row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct IdxArray {
    pub dims: Vec<usize>,
    pub data: IdxData,
}

impl IdxArray {
    /// The u8 elements; an error naming `file` when the file holds another type.
    pub fn into_u8(self, file: &str) -> Result<Vec<u8>> {
        match self.data {
            IdxData::U8(v) => Ok(v),
            other => Err(Error::format(
                file,
                format!(
                    "IDX elements are {} (type code 0x{:02X}), expected u8 (0x08)",
                    other.idx_type().name(),
                    other.idx_type().code()
                ),
            )),
        }
    }
}

/// Read an IDX file, gzip-compressed (detected by its `1f 8b` header, whatever the name) or plain.
pub fn read_idx(path: impl AsRef<Path>) -> Result<IdxArray> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let file = File::open(path).map_err(|e| Error::io(&name, e))?;
    let len = file.metadata().map_err(|e| Error::io(&name, e))?.len();
    parse_reader(BufReader::new(file), &name, len)
}

/// Parse IDX bytes held in memory (gzip-compressed or plain); `name` names them in errors.
pub fn parse_idx(bytes: &[u8], name: &str) -> Result<IdxArray> {
    parse_reader(bytes, name, bytes.len() as u64)
}

/// `input_len`: the input's length in bytes, which bounds what its header may declare.
fn parse_reader<R: BufRead>(mut input: R, name: &str, input_len: u64) -> Result<IdxArray> {
    let head = input.fill_buf().map_err(|e| Error::io(name, e))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        let most = input_len.saturating_mul(GZIP_MAX_RATIO);
        parse_stream(&mut MultiGzDecoder::new(input), name, true, most)
    } else {
        parse_stream(&mut input, name, false, input_len)
    }
}

/// Read up to `want` bytes (fewer only at the end of the stream).
fn read_up_to(r: &mut dyn Read, want: usize, name: &str, gz: bool) -> Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(want.min(1 << 26));
    r.take(want as u64)
        .read_to_end(&mut buf)
        .map_err(|e| stream_error(name, gz, e))?;
    Ok(buf)
}

fn stream_error(name: &str, gz: bool, e: std::io::Error) -> Error {
    if gz {
        Error::format(name, format!("corrupt or truncated gzip data: {e}"))
    } else {
        Error::io(name, e)
    }
}

/// `most`: the most bytes the (decompressed) stream can hold.
fn parse_stream(r: &mut dyn Read, name: &str, gz: bool, most: u64) -> Result<IdxArray> {
    let what = if gz {
        "decompressed IDX data"
    } else {
        "IDX file"
    };
    let magic = read_up_to(r, 4, name, gz)?;
    if magic.len() < 4 {
        return Err(Error::format(
            name,
            format!(
                "{what} is {} bytes long, too short for the 4-byte IDX magic",
                magic.len()
            ),
        ));
    }
    if magic[0] != 0 || magic[1] != 0 {
        return Err(Error::format(
            name,
            format!(
                "bad IDX magic {:02X} {:02X} {:02X} {:02X}: the first two bytes must be 00 00 \
                 (then the type code and the number of dimensions)",
                magic[0], magic[1], magic[2], magic[3]
            ),
        ));
    }
    let ty = IdxType::from_code(magic[2]).ok_or_else(|| {
        Error::format(
            name,
            format!(
                "unknown IDX type code 0x{:02X} (known: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, \
                 0x0D f32, 0x0E f64)",
                magic[2]
            ),
        )
    })?;
    let ndim = magic[3] as usize;
    if ndim == 0 {
        return Err(Error::format(name, "IDX header declares 0 dimensions"));
    }
    let raw_dims = read_up_to(r, 4 * ndim, name, gz)?;
    if raw_dims.len() < 4 * ndim {
        return Err(Error::format(
            name,
            format!(
                "truncated IDX header: {ndim} dimensions need {} bytes after the magic, found {}",
                4 * ndim,
                raw_dims.len()
            ),
        ));
    }
    let dims: Vec<usize> = raw_dims
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let expected = dims
        .iter()
        .try_fold(ty.size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Error::format(
                name,
                format!(
                    "IDX dimensions {dims:?} of {} overflow the address space",
                    ty.name()
                ),
            )
        })?;
    let header = 4 + 4 * ndim as u64;
    if expected as u64 > MAX_IDX_DATA_BYTES {
        return Err(Error::format(
            name,
            format!(
                "IDX dimensions {dims:?} of {} declare {expected} data bytes, more than the \
                 {MAX_IDX_DATA_BYTES} read at most",
                ty.name()
            ),
        ));
    }
    if header + expected as u64 > most {
        let found = if gz {
            format!(
                "but its {} compressed bytes hold at most {most} bytes in all",
                most / GZIP_MAX_RATIO
            )
        } else {
            format!("found {}", most.saturating_sub(header))
        };
        return Err(Error::format(
            name,
            format!(
                "truncated: dimensions {dims:?} of {} need {expected} data bytes, {found}",
                ty.name()
            ),
        ));
    }
    let raw = read_up_to(r, expected, name, gz)?;
    if raw.len() < expected {
        return Err(Error::format(
            name,
            format!(
                "truncated: dimensions {dims:?} of {} need {expected} data bytes, found {}",
                ty.name(),
                raw.len()
            ),
        ));
    }
    let trailing = std::io::copy(&mut r.take(TRAILING_COUNTED), &mut std::io::sink())
        .map_err(|e| stream_error(name, gz, e))?;
    if trailing > 0 {
        let count = if trailing == TRAILING_COUNTED {
            format!("at least {trailing}")
        } else {
            trailing.to_string()
        };
        return Err(Error::format(
            name,
            format!(
                "{count} trailing bytes after the {expected} data bytes of dimensions {dims:?} \
                 ({} elements)",
                ty.name()
            ),
        ));
    }
    Ok(IdxArray {
        dims,
        data: IdxData::from_be_bytes(ty, raw),
    })
}

/// The plain (uncompressed) IDX encoding of u8 elements with `dims`.
pub fn encode_idx_u8(dims: &[usize], data: &[u8]) -> Result<Vec<u8>> {
    let op = "encode_idx_u8";
    if dims.is_empty() || dims.len() > 255 {
        return Err(Error::invalid(
            op,
            format!("{} dimensions; IDX holds 1 to 255", dims.len()),
        ));
    }
    if let Some(d) = dims.iter().find(|&&d| d > u32::MAX as usize) {
        return Err(Error::invalid(op, format!("dimension {d} exceeds u32")));
    }
    let numel: usize = dims.iter().product();
    if numel != data.len() {
        return Err(Error::shape(
            op,
            format!(
                "{} elements do not fill dimensions {dims:?} ({numel})",
                data.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(4 + 4 * dims.len() + data.len());
    out.extend_from_slice(&[0, 0, IdxType::U8.code(), dims.len() as u8]);
    for &d in dims {
        out.extend_from_slice(&(d as u32).to_be_bytes());
    }
    out.extend_from_slice(data);
    Ok(out)
}

/// Write u8 elements with `dims` as an IDX file, gzip-compressed (best compression, no name or
/// time in the header, so the bytes are reproducible) when the path ends in `.gz`.
pub fn write_idx_u8(path: impl AsRef<Path>, dims: &[usize], data: &[u8]) -> Result<()> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let plain = encode_idx_u8(dims, data)?;
    let bytes = if path.extension().is_some_and(|e| e == "gz") {
        let mut enc = GzEncoder::new(Vec::new(), Compression::best());
        enc.write_all(&plain).map_err(|e| Error::io(&name, e))?;
        enc.finish().map_err(|e| Error::io(&name, e))?
    } else {
        plain
    };
    std::fs::write(path, bytes).map_err(|e| Error::io(&name, e))
}
