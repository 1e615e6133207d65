//! A Hugging Face safetensors checkpoint: `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`, memory-mapped. Tensors are handed to a backend by name with
//! their expected shape; every problem (missing file or tensor, truncated file, wrong dtype or
//! shape, tensors nobody asked for) is an error naming the file and tensor.

use super::source::{self, Raw, TensorSource};
use crate::{Backend, DType, Error, MappedBytes, Result, Tensor};
use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    /// Absolute byte range in the mapped file.
    start: usize,
    end: usize,
}

pub struct Checkpoint {
    files: Vec<(PathBuf, Arc<memmap2::Mmap>)>,
    entries: BTreeMap<String, Entry>,
    taken: Mutex<HashSet<String>>,
}

impl Checkpoint {
    /// Opens the checkpoint in `dir`: the shards of `model.safetensors.index.json` when present,
    /// else `model.safetensors`.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            shard_files(&index)?.into_iter().map(|f| dir.join(f)).collect()
        } else {
            let single = dir.join("model.safetensors");
            if !single.exists() {
                return Err(Error::Checkpoint {
                    file: dir.display().to_string(),
                    tensor: String::new(),
                    msg: "neither model.safetensors nor model.safetensors.index.json is here".into(),
                });
            }
            vec![single]
        };
        Checkpoint::from_files(&files)
    }

    /// Maps and indexes the given safetensors files.
    pub fn from_files(paths: &[PathBuf]) -> Result<Checkpoint> {
        let mut files = Vec::new();
        let mut entries = BTreeMap::new();
        for (fi, path) in paths.iter().enumerate() {
            let name = path.display().to_string();
            let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
            // SAFETY: the file is opened read-only; a checkpoint modified while mapped is outside
            // what we can guard against (as with every mmap-based loader).
            let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?);
            let bad = |tensor: &str, msg: String| Error::Checkpoint { file: name.clone(), tensor: tensor.into(), msg };
            let (header, meta) = SafeTensors::read_metadata(&map).map_err(|e| bad("", format!("not a valid safetensors file: {}", header_problem(&e, &map))))?;
            let base = 8 + header;
            for (tname, info) in meta.tensors() {
                let dtype = match info.dtype {
                    Dtype::F32 => DType::F32,
                    Dtype::F16 => DType::F16,
                    Dtype::BF16 => DType::BF16,
                    other => return Err(bad(&tname, format!("dtype {:?} is not supported (F32, F16, BF16)", other))),
                };
                let (s, e) = info.data_offsets;
                let want = info.shape.iter().product::<usize>() * dtype.size_of();
                if e < s || e - s != want || base + e > map.len() {
                    return Err(bad(&tname, format!("data range {}..{} does not hold shape {:?} of {}", s, e, info.shape, dtype)));
                }
                if entries.contains_key(&tname) {
                    return Err(bad(&tname, "appears in more than one shard".into()));
                }
                entries.insert(tname, Entry { file: fi, dtype, shape: info.shape.clone(), start: base + s, end: base + e });
            }
            files.push((path.clone(), map));
        }
        Ok(Checkpoint { files, entries, taken: Mutex::new(HashSet::new()) })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(|s| s.as_str())
    }

    /// The stored shape of `name`.
    pub fn shape_of(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| &e.shape[..])
    }

    /// The stored element type of `name`.
    pub fn dtype_of(&self, name: &str) -> Option<DType> {
        self.entries.get(name).map(|e| e.dtype)
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> usize {
        self.entries.values().map(|e| e.end - e.start).sum()
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries.get(name).ok_or_else(|| Error::Checkpoint {
            file: self.files.iter().map(|f| f.0.display().to_string()).collect::<Vec<_>>().join(", "),
            tensor: name.into(),
            msg: "missing from the checkpoint".into(),
        })
    }

    fn file_name(&self, e: &Entry) -> String {
        self.files[e.file].0.display().to_string()
    }

    /// The entry of `name`, checked to have `shape`, marked as used.
    fn take(&self, name: &str, shape: &[usize]) -> Result<&Entry> {
        let e = self.entry(name)?;
        if e.shape != shape {
            return Err(Error::Checkpoint { file: self.file_name(e), tensor: name.into(), msg: format!("shape {:?}, expected {:?}", e.shape, shape) });
        }
        self.taken.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string());
        Ok(e)
    }

    /// Loads `name` onto `backend` in its stored dtype, checking it has `shape`.
    pub fn load(&self, backend: &dyn Backend, name: &str, shape: &[usize]) -> Result<Tensor> {
        let e = self.take(name, shape)?;
        let bytes = MappedBytes::new(Arc::clone(&self.files[e.file].1), e.start, e.end - e.start).expect("range checked when indexing");
        backend.upload_mapped(shape, e.dtype, bytes)
    }

    /// Loads `name` as f32 (norm weights and biases, which the ops take in f32), widening
    /// f16/bf16 on the host.
    pub fn load_f32(&self, backend: &dyn Backend, name: &str, shape: &[usize]) -> Result<Tensor> {
        if self.entry(name)?.dtype == DType::F32 {
            return self.load(backend, name, shape);
        }
        backend.upload_f32(shape, &self.read_f32(name, shape)?)
    }

    /// Rows `row0 .. row0 + rows` of the 2-D tensor `name` (checked to be `[total_rows, cols]`),
    /// as a `[rows, cols]` tensor in the stored dtype: how fused checkpoint weights (the vision
    /// tower's qkv) are split without copying.
    pub fn load_rows(&self, backend: &dyn Backend, name: &str, shape: &[usize], row0: usize, rows: usize) -> Result<Tensor> {
        let e = self.take(name, shape)?;
        if shape.is_empty() || row0 + rows > shape[0] {
            return Err(Error::Checkpoint { file: self.file_name(e), tensor: name.into(), msg: format!("rows {}..{} are outside shape {:?}", row0, row0 + rows, shape) });
        }
        let row_bytes = shape[1..].iter().product::<usize>() * e.dtype.size_of();
        let mut out_shape = shape.to_vec();
        out_shape[0] = rows;
        let bytes = MappedBytes::new(Arc::clone(&self.files[e.file].1), e.start + row0 * row_bytes, rows * row_bytes).expect("inside the tensor");
        backend.upload_mapped(&out_shape, e.dtype, bytes)
    }

    /// The 2-D tensors `parts` (name, shape; one dtype, one column count) stacked along rows
    /// into one `[Σ rows, cols]` tensor in their stored dtype: how the decoder's q, k and v
    /// projections become one weight, read by one kernel.
    pub fn load_concat(&self, backend: &dyn Backend, parts: &[(&str, &[usize])]) -> Result<Tensor> {
        let mut entries = Vec::with_capacity(parts.len());
        for (name, shape) in parts {
            let e = self.take(name, shape)?;
            let first: &Entry = entries.first().map_or(e, |(_, f)| *f);
            if shape.len() != 2 || e.dtype != first.dtype || e.shape[1] != first.shape[1] {
                return Err(Error::Checkpoint {
                    file: self.file_name(e),
                    tensor: name.to_string(),
                    msg: format!("{:?} of {} cannot be stacked with {:?} of {} (2-D, one dtype and width)", e.shape, e.dtype, first.shape, first.dtype),
                });
            }
            entries.push((*name, e));
        }
        let (rows, cols) = (entries.iter().map(|(_, e)| e.shape[0]).sum::<usize>(), entries.first().map_or(0, |(_, e)| e.shape[1]));
        let dtype = entries.first().map_or(DType::F32, |(_, e)| e.dtype);
        let raw: Vec<u8> = entries.iter().flat_map(|(_, e)| self.files[e.file].1[e.start..e.end].iter().copied()).collect();
        match dtype {
            DType::F32 => backend.upload_f32(&[rows, cols], &raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>()),
            _ => backend.upload_half(&[rows, cols], dtype, &raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect::<Vec<_>>()),
        }
    }

    /// The tensor `name` (checked to have `shape`) widened to f32 in host memory.
    pub fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let e = self.take(name, shape)?;
        let raw = &self.files[e.file].1[e.start..e.end];
        Ok(match e.dtype {
            DType::F32 => raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            d => raw.chunks_exact(2).map(|c| d.half_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
        })
    }

    /// Bytes of a tensor (for progress accounting); 0 when absent.
    pub fn bytes_of(&self, name: &str) -> usize {
        self.entries.get(name).map_or(0, |e| e.end - e.start)
    }

    /// Names not loaded so far that do not start with any of `ignored_prefixes`.
    pub fn unused(&self, ignored_prefixes: &[&str]) -> Vec<String> {
        let taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        self.entries.keys().filter(|n| !taken.contains(*n) && !ignored_prefixes.iter().any(|p| n.starts_with(p))).cloned().collect()
    }
}

/// What is wrong with a safetensors file whose header did not parse, in words: the sizes
/// involved for a truncated file, which part is malformed otherwise.
fn header_problem(e: &SafeTensorError, file: &[u8]) -> String {
    let len = file.len();
    let header_len = file.get(..8).map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]));
    match e {
        SafeTensorError::HeaderTooSmall => format!("the file is only {} bytes, too short for the 8-byte header size (truncated?)", len),
        SafeTensorError::HeaderTooLarge => format!("the header size field says {} bytes, more than the 100 MB a safetensors header may have", header_len.unwrap_or(0)),
        SafeTensorError::InvalidHeaderLength => {
            format!("the header size field says {} bytes but the file has only {} after it (truncated, or not a safetensors file)", header_len.unwrap_or(0), len.saturating_sub(8))
        }
        SafeTensorError::InvalidHeader(e) => format!("the header is not UTF-8 text ({})", e),
        SafeTensorError::InvalidHeaderStart => "the header does not start with a JSON object".into(),
        SafeTensorError::InvalidHeaderDeserialization(e) => format!("the header is not the JSON a safetensors file has (name -> {{dtype, shape, data_offsets}}): {}", e),
        SafeTensorError::MetadataIncompleteBuffer => match described_size(file) {
            Some(want) if want > len => format!("the file is {} bytes but its header describes {} (truncated: an interrupted download?)", len, want),
            Some(want) => format!("the file is {} bytes but its header describes only {} (trailing bytes)", len, want),
            None => "the header's data offsets do not cover the file exactly (truncated or corrupt)".into(),
        },
        SafeTensorError::InvalidOffset(t) => format!("the data offsets of tensor '{}' do not follow those of the tensor before it", t),
        SafeTensorError::TensorInvalidInfo => "a tensor's data range does not match its shape and dtype".into(),
        SafeTensorError::ValidationOverflow => "a tensor's shape is too large to address (overflow)".into(),
        other => format!("{:?}", other),
    }
}

/// The file size a safetensors header describes (8 + header + the last data offset), when the
/// header parses as JSON.
fn described_size(file: &[u8]) -> Option<usize> {
    let n = usize::try_from(u64::from_le_bytes(file.get(..8)?.try_into().ok()?)).ok()?;
    let header: serde_json::Value = serde_json::from_slice(file.get(8..8usize.checked_add(n)?)?).ok()?;
    let end = header.as_object()?.values().filter_map(|t| t.get("data_offsets")?.get(1)?.as_u64()).max().unwrap_or(0);
    8usize.checked_add(n)?.checked_add(usize::try_from(end).ok()?)
}

/// The distinct shard file names of an index, in first-seen order.
fn shard_files(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let bad = |msg: String| Error::Checkpoint { file: index.display().to_string(), tensor: String::new(), msg };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {}", e)))?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("has no weight_map object".into()))?;
    let mut files: Vec<String> = Vec::new();
    for (tensor, f) in map {
        let f = f.as_str().ok_or_else(|| bad(format!("weight_map entry of '{}' is not a file name", tensor)))?;
        if f.contains('/') || f.contains("..") {
            return Err(bad(format!("shard name '{}' must be a plain file name", f)));
        }
        if !files.iter().any(|x| x == f) {
            files.push(f.to_string());
        }
    }
    if files.is_empty() {
        return Err(bad("weight_map lists no shards".into()));
    }
    Ok(files)
}

/// Loads tensors from a [`TensorSource`] onto a backend, reporting the bytes of each to a
/// progress callback.
pub struct Loader<'a> {
    pub src: &'a dyn TensorSource,
    pub backend: &'a dyn Backend,
    pub progress: &'a mut dyn FnMut(usize),
}

impl Loader<'_> {
    /// A weight in its stored dtype.
    pub fn weight(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        (self.progress)(self.src.bytes_of(name));
        source::load(self.src, self.backend, name, shape)
    }

    /// Rows of a 2-D weight (see [`source::load_rows`]); the progress counts the share.
    pub fn weight_rows(&mut self, name: &str, shape: &[usize], row0: usize, rows: usize) -> Result<Tensor> {
        (self.progress)(self.src.bytes_of(name) * rows / shape[0].max(1));
        source::load_rows(self.src, self.backend, name, shape, row0, rows)
    }

    /// A table kept in host memory as f32.
    pub fn host_f32(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        (self.progress)(self.src.bytes_of(name));
        source::read_f32(self.src, name, shape)
    }

    /// Weights stacked along rows (see [`source::load_concat`]).
    pub fn weight_concat(&mut self, parts: &[(&str, &[usize])]) -> Result<Tensor> {
        (self.progress)(parts.iter().map(|(n, _)| self.src.bytes_of(n)).sum());
        source::load_concat(self.src, self.backend, parts)
    }

    /// 1-D tensors (biases) widened to f32 and concatenated.
    pub fn f32_concat(&mut self, parts: &[(&str, &[usize])]) -> Result<Tensor> {
        let mut all = Vec::new();
        for (name, shape) in parts {
            all.extend(self.host_f32(name, shape)?);
        }
        self.backend.upload_f32(&[all.len()], &all)
    }

    /// A norm weight or bias as f32.
    pub fn f32(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        (self.progress)(self.src.bytes_of(name));
        source::load_f32(self.src, self.backend, name, shape)
    }
}

impl TensorSource for Checkpoint {
    fn describe(&self) -> String {
        self.files.iter().map(|f| f.0.display().to_string()).collect::<Vec<_>>().join(", ")
    }

    fn contains(&self, name: &str) -> bool {
        Checkpoint::contains(self, name)
    }

    fn bytes_of(&self, name: &str) -> usize {
        Checkpoint::bytes_of(self, name)
    }

    fn total_bytes(&self) -> usize {
        Checkpoint::total_bytes(self)
    }

    fn raw(&self, name: &str, shape: &[usize]) -> Result<Raw<'_>> {
        let e = self.take(name, shape)?;
        let map = &self.files[e.file].1;
        Ok(Raw {
            dtype: e.dtype,
            bytes: std::borrow::Cow::Borrowed(&map[e.start..e.end]),
            mapped: MappedBytes::new(Arc::clone(map), e.start, e.end - e.start),
            file: self.file_name(e),
        })
    }

    fn unused(&self, ignored_prefixes: &[&str]) -> Vec<String> {
        Checkpoint::unused(self, ignored_prefixes)
    }
}
