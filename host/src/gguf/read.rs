//! The GGUF reader. Every count, length, dimension, offset and size is checked against the
//! bytes that are actually there before it is used, so a truncated or hostile file gives an
//! [`Error::Checkpoint`] naming the file (and the tensor or key) and never a panic or an
//! allocation sized by an unchecked number: vectors grow only as elements are read.

use super::{dtype_of_ggml, vtype, Array, Value};
use crate::{DType, Error, MappedBytes, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most dimensions of a GGUF tensor (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Longest key or string value accepted (a chat template is a few KB; 16 MB is absurd already).
pub const MAX_STRING: u64 = 16 << 20;

/// One tensor of the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Row-major shape (outermost first): GGUF's dims reversed.
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
}

/// A parsed GGUF file, memory-mapped.
pub struct Gguf {
    path: PathBuf,
    map: Arc<memmap2::Mmap>,
    pub version: u32,
    pub alignment: usize,
    kv: Vec<(String, Value)>,
    kv_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// Bounds-checked little-endian reads over the file's bytes.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl<'a> Cursor<'a> {
    fn err(&self, what: &str, msg: String) -> Error {
        Error::Checkpoint { file: self.file.to_string(), tensor: String::new(), msg: format!("{} at byte {}: {}", what, self.pos, msg) }
    }

    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(what, format!("needs {} bytes but the file has only {} left (truncated?)", n, self.remaining())));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let s = self.take(8, what)?;
        Ok(u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        if n > MAX_STRING {
            return Err(self.err(what, format!("string length {} is over the {} byte limit", n, MAX_STRING)));
        }
        let s = self.take(n as usize, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| self.err(what, "string is not UTF-8".into()))
    }

    /// A count of elements at least `min_size` bytes each, checked against the bytes left.
    fn count(&mut self, what: &str, min_size: usize) -> Result<usize> {
        let n = self.u64(what)?;
        if n > (self.remaining() / min_size.max(1)) as u64 {
            return Err(self.err(what, format!("count {} cannot fit in the {} bytes left", n, self.remaining())));
        }
        Ok(n as usize)
    }

    fn value(&mut self, t: u32, key: &str) -> Result<Value> {
        let what = &format!("metadata key '{}'", key);
        Ok(match t {
            vtype::U8 => Value::U8(self.take(1, what)?[0]),
            vtype::I8 => Value::I8(self.take(1, what)?[0] as i8),
            vtype::U16 => {
                let s = self.take(2, what)?;
                Value::U16(u16::from_le_bytes([s[0], s[1]]))
            }
            vtype::I16 => {
                let s = self.take(2, what)?;
                Value::I16(i16::from_le_bytes([s[0], s[1]]))
            }
            vtype::U32 => Value::U32(self.u32(what)?),
            vtype::I32 => Value::I32(self.u32(what)? as i32),
            vtype::F32 => Value::F32(f32::from_bits(self.u32(what)?)),
            vtype::BOOL => match self.take(1, what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(what, format!("bool byte {} is neither 0 nor 1", b))),
            },
            vtype::STRING => Value::String(self.string(what)?),
            vtype::U64 => Value::U64(self.u64(what)?),
            vtype::I64 => Value::I64(self.u64(what)? as i64),
            vtype::F64 => Value::F64(f64::from_bits(self.u64(what)?)),
            vtype::ARRAY => Value::Array(self.array(key)?),
            other => return Err(self.err(what, format!("unknown value type {}", other))),
        })
    }

    fn array(&mut self, key: &str) -> Result<Array> {
        let what = &format!("metadata array '{}'", key);
        let t = self.u32(what)?;
        let size = match t {
            vtype::U8 | vtype::I8 | vtype::BOOL => 1,
            vtype::U16 | vtype::I16 => 2,
            vtype::U32 | vtype::I32 | vtype::F32 => 4,
            vtype::U64 | vtype::I64 | vtype::F64 | vtype::STRING => 8,
            vtype::ARRAY => return Err(self.err(what, "arrays of arrays are not supported".into())),
            other => return Err(self.err(what, format!("unknown element type {}", other))),
        };
        let n = self.count(what, size)?;
        macro_rules! fixed {
            ($variant:ident, $conv:expr) => {{
                let raw = self.take(n * size, what)?;
                Array::$variant(raw.chunks_exact(size).map($conv).collect())
            }};
        }
        Ok(match t {
            vtype::U8 => fixed!(U8, |c| c[0]),
            vtype::I8 => fixed!(I8, |c| c[0] as i8),
            vtype::BOOL => {
                let raw = self.take(n, what)?;
                if let Some(b) = raw.iter().find(|&&b| b > 1) {
                    return Err(self.err(what, format!("bool byte {} is neither 0 nor 1", b)));
                }
                Array::Bool(raw.iter().map(|&b| b == 1).collect())
            }
            vtype::U16 => fixed!(U16, |c| u16::from_le_bytes([c[0], c[1]])),
            vtype::I16 => fixed!(I16, |c| i16::from_le_bytes([c[0], c[1]])),
            vtype::U32 => fixed!(U32, |c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            vtype::I32 => fixed!(I32, |c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            vtype::F32 => fixed!(F32, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            vtype::U64 => fixed!(U64, |c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
            vtype::I64 => fixed!(I64, |c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
            vtype::F64 => fixed!(F64, |c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
            _ => {
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(self.string(what)?);
                }
                Array::String(v)
            }
        })
    }
}

impl Gguf {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<Gguf> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only; a file modified while mapped is outside what we
        // can guard against (as with every mmap-based loader).
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?);
        Gguf::parse(path, map)
    }

    fn parse(path: &Path, map: Arc<memmap2::Mmap>) -> Result<Gguf> {
        let file = path.display().to_string();
        let bad = |tensor: &str, msg: String| Error::Checkpoint { file: file.clone(), tensor: tensor.to_string(), msg };
        let mut c = Cursor { b: &map[..], pos: 0, file: &file };
        let magic = c.take(4, "magic").map_err(|_| bad("", format!("only {} bytes: not a GGUF file", map.len())))?;
        if magic != b"GGUF" {
            return Err(bad("", format!("starts with {:?}, not the GGUF magic (not a GGUF file)", String::from_utf8_lossy(magic))));
        }
        let version = c.u32("version")?;
        if version != 2 && version != 3 {
            return Err(bad("", format!("GGUF version {} is not supported (2 or 3)", version)));
        }
        // a tensor info takes at least 8 + 4 + 4 + 8 bytes, a key/value 8 + 4 + 1
        let n_tensors = c.count("tensor count", 24)?;
        let n_kv = c.count("metadata count", 13)?;
        let (mut kv, mut kv_index) = (Vec::new(), HashMap::new());
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let t = c.u32(&format!("type of metadata key '{}'", key))?;
            let v = c.value(t, &key)?;
            if kv_index.insert(key.clone(), kv.len()).is_some() {
                return Err(bad("", format!("metadata key '{}' appears twice", key)));
            }
            kv.push((key, v));
        }
        let alignment = match kv_index.get("general.alignment").map(|&i| &kv[i].1) {
            None => 32,
            Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => *a as usize,
            Some(v) => return Err(bad("", format!("general.alignment must be a power of two u32, got {:?}", v))),
        };
        let mut raw = Vec::new();
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            let nd = c.u32(&format!("tensor '{}' dimension count", name))? as usize;
            if nd == 0 || nd > MAX_DIMS {
                return Err(bad(&name, format!("{} dimensions (1 to {} supported)", nd, MAX_DIMS)));
            }
            let mut dims = Vec::with_capacity(nd);
            for _ in 0..nd {
                dims.push(c.u64(&format!("tensor '{}' dimensions", name))?);
            }
            let t = c.u32(&format!("tensor '{}' type", name))?;
            let off = c.u64(&format!("tensor '{}' offset", name))?;
            raw.push((name, dims, t, off));
        }
        let data_start = align_up(c.pos, alignment).filter(|&s| s <= map.len()).ok_or_else(|| bad("", format!("the tensor data would start past the end of the {}-byte file (truncated?)", map.len())))?;
        let (mut tensors, mut tensor_index) = (Vec::new(), HashMap::new());
        for (name, dims, t, off) in raw {
            let dtype = dtype_of_ggml(t).map_err(|n| match n {
                Some(known) => bad(&name, format!("tensor type {} ({}) is not supported (F32, F16, BF16, Q8_0, Q4_K, Q6_K)", known, t)),
                None => bad(&name, format!("unknown tensor type {}", t)),
            })?;
            let mut shape = Vec::with_capacity(dims.len());
            for &d in dims.iter().rev() {
                shape.push(usize::try_from(d).map_err(|_| bad(&name, format!("dimension {} is too large", d)))?);
            }
            let elems = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let len = elems
                .and_then(|_| dtype.row_bytes(shape[shape.len() - 1]))
                .and_then(|row| shape[..shape.len() - 1].iter().try_fold(row, |a, &d| a.checked_mul(d)))
                .ok_or_else(|| {
                    if elems.is_none() {
                        bad(&name, format!("shape {:?} is too large to address", shape))
                    } else {
                        bad(&name, format!("rows of {} values are not whole {} blocks of {}", shape[shape.len() - 1], dtype, dtype.block_size()))
                    }
                })?;
            let off = usize::try_from(off).map_err(|_| bad(&name, format!("offset {} is too large", off)))?;
            if off % alignment != 0 {
                return Err(bad(&name, format!("data offset {} is not a multiple of the alignment {}", off, alignment)));
            }
            let start = data_start.checked_add(off);
            match start.and_then(|s| s.checked_add(len)) {
                Some(end) if end <= map.len() => {}
                _ => return Err(bad(&name, format!("data ({} bytes at offset {} after the header) runs past the end of the {}-byte file (truncated?)", len, off, map.len()))),
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(bad(&name, "appears twice".into()));
            }
            tensors.push(TensorInfo { name, shape, dtype, start: start.unwrap_or(0), len });
        }
        // tensors must not overlap
        let mut order: Vec<&TensorInfo> = tensors.iter().collect();
        order.sort_by_key(|t| t.start);
        for w in order.windows(2) {
            if w[0].start + w[0].len > w[1].start {
                return Err(bad(&w[1].name, format!("data overlaps tensor '{}'", w[0].name)));
            }
        }
        Ok(Gguf { path: path.to_path_buf(), map, version, alignment, kv, kv_index, tensors, tensor_index })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name for error messages.
    pub fn file(&self) -> String {
        self.path.display().to_string()
    }

    /// An error about this file (`tensor` may be empty).
    pub fn error(&self, tensor: &str, msg: impl Into<String>) -> Error {
        Error::Checkpoint { file: self.file(), tensor: tensor.to_string(), msg: msg.into() }
    }

    /// Every metadata key and value, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.kv
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv_index.get(key).map(|&i| &self.kv[i].1)
    }

    fn wrong(&self, key: &str, v: &Value, want: &str) -> Error {
        self.error("", format!("metadata key '{}' is a {}, expected {}", key, v.type_name(), want))
    }

    /// A non-negative integer value (any integer type), `None` when absent.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.wrong(key, v, "a non-negative integer")),
        }
    }

    /// A non-negative integer value that must be present and fit `usize`.
    pub fn need_usize(&self, key: &str) -> Result<usize> {
        let v = self.get_u64(key)?.ok_or_else(|| self.error("", format!("metadata key '{}' is missing", key)))?;
        usize::try_from(v).map_err(|_| self.error("", format!("metadata key '{}' = {} is too large", key, v)))
    }

    /// A number (float or integer), `None` when absent.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.wrong(key, v, "a number")),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong(key, v, "a string")),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, v, "a bool")),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.wrong(key, v, "an array")),
        }
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes (checked to lie inside the file when parsing).
    pub fn bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.map[t.start..t.start + t.len]
    }

    /// The tensor's bytes as a shareable mapped window.
    pub fn mapped(&self, t: &TensorInfo) -> MappedBytes {
        MappedBytes::new(Arc::clone(&self.map), t.start, t.len).expect("checked when parsing")
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> usize {
        self.tensors.iter().map(|t| t.len).sum()
    }
}

fn align_up(x: usize, a: usize) -> Option<usize> {
    x.checked_add(a - 1).map(|v| v / a * a)
}
