//! Named tensors in the interchange formats: npz (numpy's `np.savez`/`np.load`) and safetensors (Hugging Face), read and written whole.
use crate::atomic_file::{sync_dir, sync_file, TempFile};
use crate::npz::{NpzReader, NpzWriter};
use memmap2::Mmap;
use netcl_ops::{with_host, DType, Device, Error, HostData, Result, Tensor};
use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView};
use std::fs::File;
use std::path::Path;

fn shown(path: &Path) -> String {
    path.display().to_string()
}

fn host_tensor(data: HostData, shape: &[usize]) -> Result<Tensor> {
    let host = Device::host();
    with_host!(data, v => Tensor::from_vec(v, shape, &host))
}

/// Writes `tensors` (any device and layout) as an uncompressed npz that `numpy.load` reads, one
/// `<name>.npy` entry each (bf16 as its raw bits, `<u2`, as numpy has no bfloat16). The file is
/// replaced atomically: a failed or interrupted save leaves the old one.
pub fn save_npz<S: AsRef<str>>(path: impl AsRef<Path>, tensors: &[(S, &Tensor)]) -> Result<()> {
    write_atomically(path.as_ref(), |file, temp| {
        let mut writer = NpzWriter::new(file, temp);
        for (name, t) in tensors {
            let data = t.to_host_data()?;
            writer.add(name.as_ref(), t.dtype(), t.shape(), data.as_bytes())?;
        }
        Ok(writer.finish()?.0)
    })
}

/// Writes `path` through a temporary beside it (`write` gets the open file and the temporary's
/// path and returns the file written), synced, renamed over `path`, the directory synced: a
/// failed or interrupted write leaves the old file.
fn write_atomically(path: &Path, write: impl FnOnce(File, &Path) -> Result<File>) -> Result<()> {
    let (temp, file) = TempFile::create(path)?;
    let file = write(file, temp.path())?;
    sync_file(&file, temp.path())?;
    drop(file);
    temp.persist().map_err(|e| Error::io(shown(path), e))?;
    sync_dir(
        path.parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new(".")),
    )
}

/// Reads every array of an uncompressed npz (`np.savez`, or [`save_npz`]) as host tensors, in
/// name order. Each entry's declared size is checked against the file before anything is
/// allocated; compressed entries (`np.savez_compressed`) and dtypes other than f32, f64, f16,
/// i32, u32 are errors naming the array.
pub fn load_npz(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let file = File::open(path).map_err(|e| Error::io(shown(path), e))?;
    let mut npz = NpzReader::new(file, path)?;
    let mut names = npz.names();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let (dtype, shape) = npz.describe(&name)?;
        let data = npz.read(&name, dtype, &shape)?;
        out.push((name, host_tensor(data, &shape)?));
    }
    Ok(out)
}

fn st_dtype(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::I32 => StDtype::I32,
        DType::U32 => StDtype::U32,
    }
}

fn netcl_dtype(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::F32 => DType::F32,
        StDtype::F64 => DType::F64,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::I32 => DType::I32,
        StDtype::U32 => DType::U32,
        _ => return None,
    })
}

/// Writes `tensors` (any device and layout) as a `.safetensors` file with `metadata` in its
/// header (e.g. `{"format": "pt"}`, which transformers expects), replaced atomically.
pub fn save_safetensors<S: AsRef<str>>(
    path: impl AsRef<Path>,
    tensors: &[(S, &Tensor)],
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<()> {
    let path = path.as_ref();
    let op = "save_safetensors";
    let data: Vec<(String, DType, Vec<usize>, HostData)> = tensors
        .iter()
        .map(|(n, t)| {
            Ok((
                n.as_ref().to_string(),
                t.dtype(),
                t.shape().to_vec(),
                t.to_host_data()?,
            ))
        })
        .collect::<Result<_>>()?;
    let views = data
        .iter()
        .map(|(n, d, s, h)| {
            TensorView::new(st_dtype(*d), s.clone(), h.as_bytes())
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::invalid(op, format!("tensor '{n}' {d} {s:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::tensor::serialize(views, metadata)
        .map_err(|e| Error::invalid(op, format!("{}: {e}", shown(path))))?;
    write_atomically(path, |mut file, temp| {
        std::io::Write::write_all(&mut file, &bytes).map_err(|e| Error::io(shown(temp), e))?;
        Ok(file)
    })
}

/// A `.safetensors` file, memory-mapped: its header is parsed and checked once (offsets inside
/// the file, sizes matching dtypes and shapes); tensors are copied out one at a time, so a model
/// larger than host memory can be moved to a device tensor by tensor.
pub struct SafetensorsFile {
    path: String,
    mmap: Mmap,
}

impl SafetensorsFile {
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref();
        // Checked first: opening a FIFO would block until a writer came.
        netcl_ops::files::regular_file(path)?;
        let file = File::open(path).map_err(|e| Error::io(shown(path), e))?;
        // SAFETY: the map is read-only; a file changed by another process while mapped is the
        // caller's problem, as with any reader (the header is re-validated on each access).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(shown(path), e))?;
        let st = SafetensorsFile {
            path: shown(path),
            mmap,
        };
        st.parsed()?;
        Ok(st)
    }

    fn parsed(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.mmap)
            .map_err(|e| Error::format(&self.path, format!("not a valid safetensors file: {e}")))
    }

    /// The file's `__metadata__` strings (empty when it has none).
    pub fn metadata(&self) -> Result<std::collections::HashMap<String, String>> {
        let (_, meta) = SafeTensors::read_metadata(&self.mmap)
            .map_err(|e| Error::format(&self.path, format!("not a valid safetensors file: {e}")))?;
        Ok(meta.metadata().clone().unwrap_or_default())
    }

    /// The tensor names, sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .parsed()?
            .names()
            .into_iter()
            .map(str::to_string)
            .collect();
        names.sort();
        Ok(names)
    }

    /// The dtype and shape of tensor `name`.
    pub fn info(&self, name: &str) -> Result<(DType, Vec<usize>)> {
        let st = self.parsed()?;
        let v = self.view(&st, name)?;
        let dtype = netcl_dtype(v.dtype()).ok_or_else(|| {
            Error::format(
                &self.path,
                format!(
                    "tensor '{name}' is {:?}; netcl reads F32, F64, F16, BF16, I32, U32",
                    v.dtype()
                ),
            )
        })?;
        Ok((dtype, v.shape().to_vec()))
    }

    fn view<'a>(&self, st: &'a SafeTensors<'a>, name: &str) -> Result<TensorView<'a>> {
        st.tensor(name)
            .map_err(|e| Error::format(&self.path, format!("tensor '{name}': {e}")))
    }

    /// Tensor `name` on `device`, in its stored dtype.
    pub fn tensor(&self, name: &str, device: &Device) -> Result<Tensor> {
        let (dtype, shape) = self.info(name)?;
        let st = self.parsed()?;
        let v = self.view(&st, name)?;
        let t = host_tensor(HostData::from_bytes(dtype, v.data())?, &shape)?;
        t.to_device(device)
    }
}

/// Every tensor of a `.safetensors` file as host tensors, in name order.
pub fn load_safetensors(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    let f = SafetensorsFile::open(path)?;
    let host = Device::host();
    f.names()?
        .into_iter()
        .map(|n| {
            let t = f.tensor(&n, &host)?;
            Ok((n, t))
        })
        .collect()
}
