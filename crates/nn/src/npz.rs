//! Uncompressed npz archives of raw little-endian arrays (readable by `numpy.load`), written and read in bulk.
use netcl_ops::{DType, Error, HostData, Result};
use npyz::npz::{file_name_from_array_name, NpzArchive};
use npyz::zip::write::FileOptions;
use npyz::zip::{CompressionMethod, DateTime, ZipWriter};
use npyz::{TypeStr, WriteOptions, WriterBuilder};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

const BUF_BYTES: usize = 1 << 20;

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

/// Writes arrays one by one into an npz file (entries `<name>.npy`, stored uncompressed).
pub(crate) struct NpzWriter<'p> {
    zip: ZipWriter<BufWriter<File>>,
    path: &'p Path,
}

impl<'p> NpzWriter<'p> {
    /// `path` is only used in error messages.
    pub(crate) fn new(file: File, path: &'p Path) -> Self {
        NpzWriter {
            zip: ZipWriter::new(BufWriter::with_capacity(BUF_BYTES, file)),
            path,
        }
    }

    fn io_err(&self, e: impl Into<io::Error>) -> Error {
        Error::io(self.path.display().to_string(), e.into())
    }

    /// Adds the array `name` of `dtype` and `shape` whose row-major little-endian elements are `data`.
    pub(crate) fn add(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        data: &[u8],
    ) -> Result<()> {
        // zip64 records only where an entry may pass 4 GiB (the npy header adds < 64 KiB).
        let large = data.len() as u64 >= u32::MAX as u64 - (1 << 16);
        let options = FileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .last_modified_time(DateTime::default())
            .unix_permissions(0o644)
            .large_file(large);
        self.zip
            .start_file(file_name_from_array_name(name), options)
            .map_err(|e| self.io_err(e))?;
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let zip = WriteOptions::new_header_only()
            .dtype(npy_dtype(dtype)?)
            .shape(&shape)
            .writer(&mut self.zip)
            .write_header_only()
            .map_err(|e| Error::io(self.path.display().to_string(), e))?;
        zip.write_all(data)
            .map_err(|e| Error::io(self.path.display().to_string(), e))
    }

    /// Writes the zip directory and returns the file, flushed but not yet synced.
    pub(crate) fn finish(mut self) -> Result<File> {
        let buffered = self.zip.finish().map_err(|e| self.io_err(e))?;
        buffered
            .into_inner()
            .map_err(|e| Error::io(self.path.display().to_string(), e.into_error()))
    }
}

/// Reads arrays from an npz file, checking each against the dtype and shape it should have.
pub(crate) struct NpzReader<'p> {
    archive: NpzArchive<BufReader<File>>,
    path: &'p Path,
}

impl<'p> NpzReader<'p> {
    /// `file` must be positioned at its start; `path` is only used in error messages.
    pub(crate) fn new(file: File, path: &'p Path) -> Result<Self> {
        let archive = NpzArchive::new(BufReader::with_capacity(BUF_BYTES, file)).map_err(|e| {
            Error::format(
                path.display().to_string(),
                format!("not a readable npz (zip) archive: {e}"),
            )
        })?;
        Ok(NpzReader { archive, path })
    }

    /// The names of the arrays in the archive (in no particular order).
    pub(crate) fn names(&self) -> Vec<String> {
        self.archive.array_names().map(str::to_string).collect()
    }

    /// The array `name`, which must be stored as `dtype` (see [`npy_descr`]) in C order with `shape`.
    pub(crate) fn read(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<HostData> {
        let path = self.path.display().to_string();
        let npy = match self.archive.by_name(name) {
            Ok(Some(npy)) => npy,
            Ok(None) => {
                return Err(Error::format(
                    path,
                    format!("no array '{name}' in the archive"),
                ))
            }
            Err(e) => {
                return Err(Error::format(
                    path,
                    format!("array '{name}': unreadable npy header: {e}"),
                ))
            }
        };
        let want = npy_dtype(dtype)?;
        if npy.dtype() != want {
            return Err(Error::format(
                path,
                format!(
                    "array '{name}' is stored as {}, but a {dtype} tensor must be stored as '{}'",
                    npy.dtype().descr(),
                    npy_descr(dtype)
                ),
            ));
        }
        if npy.order() != npyz::Order::C {
            return Err(Error::format(
                path,
                format!("array '{name}' is in Fortran order; only C order is read"),
            ));
        }
        if npy.shape().len() != shape.len()
            || npy.shape().iter().zip(shape).any(|(&a, &b)| a != b as u64)
        {
            return Err(Error::format(
                path,
                format!(
                    "array '{name}' has shape {:?} in the npz but {shape:?} in the json",
                    npy.shape()
                ),
            ));
        }
        let expected = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                Error::format(
                    path.clone(),
                    format!("array '{name}': shape {shape:?} is too large"),
                )
            })?;
        let mut entry = npy.into_inner();
        // Capacity bounded by the entry's real size: a lying header cannot force a huge allocation.
        let mut bytes = Vec::with_capacity(expected.min(entry.size() as usize));
        (&mut entry)
            .take(expected as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| {
                Error::format(
                    path.clone(),
                    format!("array '{name}': reading its data failed: {e}"),
                )
            })?;
        if bytes.len() != expected {
            let found = if bytes.len() > expected {
                format!("more than {expected}")
            } else {
                bytes.len().to_string()
            };
            return Err(Error::format(
                path,
                format!("array '{name}' has {found} data bytes, {expected} expected for {dtype} {shape:?}"),
            ));
        }
        Ok(HostData::from_bytes(dtype, &bytes))
    }
}
