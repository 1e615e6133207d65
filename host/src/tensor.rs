//! A small tensor: a shape, a dtype and storage on one device. Tensors are immutable values
//! (ops return new tensors) and cheap to clone (the storage is shared).

use crate::{DType, Error, Result};
use std::sync::Arc;

/// Where a tensor's elements live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        })
    }
}

/// A window of a memory-mapped file: a checkpoint tensor's bytes, shared without copying.
#[derive(Clone)]
pub struct MappedBytes {
    map: Arc<memmap2::Mmap>,
    offset: usize,
    len: usize,
}

impl MappedBytes {
    /// The window `offset .. offset + len` of `map`, or `None` when it is out of range.
    pub fn new(map: Arc<memmap2::Mmap>, offset: usize, len: usize) -> Option<MappedBytes> {
        if offset.checked_add(len)? > map.len() {
            return None;
        }
        Some(MappedBytes { map, offset, len })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }

    /// The sub-window `offset .. offset + len` of this window, or `None` when out of range.
    pub fn slice(&self, offset: usize, len: usize) -> Option<MappedBytes> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        MappedBytes::new(Arc::clone(&self.map), self.offset + offset, len)
    }
}

impl std::fmt::Debug for MappedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedBytes({} bytes at {})", self.len, self.offset)
    }
}

/// Host memory of a CPU tensor: f32 elements, the raw bits of f16/bf16 elements, u32 elements,
/// the blocks of a quantized type, or a memory-mapped window holding f32/f16/bf16 (aligned for
/// its element type) or quantized blocks (any alignment: blocks are read bytewise).
#[derive(Debug)]
pub enum CpuBuffer {
    F32(Vec<f32>),
    Half(Vec<u16>),
    U32(Vec<u32>),
    Bytes(Vec<u8>),
    Mapped(MappedBytes),
}

/// The bytes of a block-quantized tensor, mapped from a file or owned (see
/// [`crate::Backend::upload_blocks`]).
pub enum Blocks {
    Mapped(MappedBytes),
    Owned(Vec<u8>),
}

impl Blocks {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Blocks::Mapped(m) => m.bytes(),
            Blocks::Owned(v) => v,
        }
    }
}

#[derive(Clone, Debug)]
pub enum Storage {
    Cpu(Arc<CpuBuffer>),
    #[cfg(feature = "cuda")]
    Cuda(Arc<crate::cuda::pool::DeviceBuffer>),
}

#[derive(Clone, Debug)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    storage: Storage,
}

impl Tensor {
    /// Wraps storage; the caller guarantees it holds `shape`'s element count of `dtype`.
    pub(crate) fn from_storage(shape: Vec<usize>, dtype: DType, storage: Storage) -> Tensor {
        Tensor { shape, dtype, storage }
    }

    /// A CPU f32 tensor owning `data`.
    pub fn cpu_f32(shape: &[usize], data: Vec<f32>) -> Result<Tensor> {
        check_len("Tensor::cpu_f32", shape, data.len())?;
        Ok(Tensor::from_storage(shape.to_vec(), DType::F32, Storage::Cpu(Arc::new(CpuBuffer::F32(data)))))
    }

    /// A CPU f16 or bf16 tensor owning the raw element bits.
    pub fn cpu_half(shape: &[usize], dtype: DType, bits: Vec<u16>) -> Result<Tensor> {
        if dtype == DType::F32 {
            return Err(Error::DType { op: "Tensor::cpu_half", expected: "f16 or bf16", got: dtype });
        }
        check_len("Tensor::cpu_half", shape, bits.len())?;
        Ok(Tensor::from_storage(shape.to_vec(), dtype, Storage::Cpu(Arc::new(CpuBuffer::Half(bits)))))
    }

    /// A CPU u32 tensor owning `data` (token ids, decode cursors).
    pub fn cpu_u32(shape: &[usize], data: Vec<u32>) -> Result<Tensor> {
        check_len("Tensor::cpu_u32", shape, data.len())?;
        Ok(Tensor::from_storage(shape.to_vec(), DType::U32, Storage::Cpu(Arc::new(CpuBuffer::U32(data)))))
    }

    /// A CPU tensor of a block-quantized `dtype` over `blocks` (zero-copy); `shape` is in
    /// elements, its last axis a whole number of blocks, and the bytes exactly its blocks.
    pub fn cpu_blocks(shape: &[usize], dtype: DType, blocks: Blocks) -> Result<Tensor> {
        let bytes = quantized_bytes("Tensor::cpu_blocks", shape, dtype)?;
        let len = blocks.bytes().len();
        if len != bytes {
            return Err(Error::shape("Tensor::cpu_blocks", &[shape], format!("{} of shape {:?} is {} bytes, {} were given", dtype, shape, bytes, len)));
        }
        let buf = match blocks {
            Blocks::Mapped(m) => CpuBuffer::Mapped(m),
            Blocks::Owned(v) => CpuBuffer::Bytes(v),
        };
        Ok(Tensor::from_storage(shape.to_vec(), dtype, Storage::Cpu(Arc::new(buf))))
    }

    /// A CPU tensor over mapped checkpoint bytes (little-endian elements of `dtype`); zero-copy
    /// when the window is aligned for the element type, copied otherwise.
    pub fn cpu_mapped(shape: &[usize], dtype: DType, bytes: MappedBytes) -> Result<Tensor> {
        if dtype.is_quantized() {
            return Tensor::cpu_blocks(shape, dtype, Blocks::Mapped(bytes));
        }
        let elems = bytes.len / dtype.size_of();
        if bytes.len % dtype.size_of() != 0 {
            return Err(Error::shape("Tensor::cpu_mapped", &[shape], format!("{} bytes is not a whole number of {} elements", bytes.len, dtype)));
        }
        check_len("Tensor::cpu_mapped", shape, elems)?;
        if bytes.bytes().as_ptr() as usize % dtype.size_of() == 0 {
            return Ok(Tensor::from_storage(shape.to_vec(), dtype, Storage::Cpu(Arc::new(CpuBuffer::Mapped(bytes)))));
        }
        let raw = bytes.bytes();
        match dtype {
            DType::F32 => Tensor::cpu_f32(shape, raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
            DType::U32 => Tensor::cpu_u32(shape, raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
            DType::F16 | DType::BF16 => Tensor::cpu_half(shape, dtype, raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()),
            _ => unreachable!("block types returned above"),
        }
    }

    /// The blocks of a CPU tensor of a quantized type.
    pub fn as_cpu_blocks(&self, op: &'static str) -> Result<&[u8]> {
        match &self.storage {
            Storage::Cpu(b) if self.dtype.is_quantized() => match &**b {
                CpuBuffer::Bytes(v) => Ok(v),
                CpuBuffer::Mapped(m) => Ok(m.bytes()),
                _ => Err(Error::DType { op, expected: "a block-quantized type", got: self.dtype }),
            },
            Storage::Cpu(_) => Err(Error::DType { op, expected: "a block-quantized type", got: self.dtype }),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::Device { op, msg: "expected a CPU tensor, got a CUDA one".into() }),
        }
    }

    /// The blocks of a CPU tensor of a quantized type for another backend's `upload_blocks`:
    /// the mapped file window itself when it is mapped (no copy), else a copy.
    pub fn to_blocks(&self, op: &'static str) -> Result<Blocks> {
        match &self.storage {
            Storage::Cpu(b) if self.dtype.is_quantized() => match &**b {
                CpuBuffer::Mapped(m) => Ok(Blocks::Mapped(m.clone())),
                CpuBuffer::Bytes(v) => Ok(Blocks::Owned(v.clone())),
                _ => Err(Error::DType { op, expected: "a block-quantized type", got: self.dtype }),
            },
            Storage::Cpu(_) => Err(Error::DType { op, expected: "a block-quantized type", got: self.dtype }),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::Device { op, msg: "expected a CPU tensor, got a CUDA one".into() }),
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    pub fn device(&self) -> DeviceKind {
        match self.storage {
            Storage::Cpu(_) => DeviceKind::Cpu,
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => DeviceKind::Cuda,
        }
    }

    /// `(rows, cols)` of a 2-D tensor, or all leading axes folded into rows for higher ranks.
    pub fn rows_cols(&self) -> (usize, usize) {
        match self.shape.split_last() {
            Some((&cols, lead)) => (lead.iter().product(), cols),
            None => (1, 1),
        }
    }

    /// The same elements under another shape of equal element count (no copy).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if shape.iter().product::<usize>() != self.elem_count() {
            return Err(Error::shape("reshape", &[&self.shape, shape], "element counts differ"));
        }
        Ok(Tensor { shape: shape.to_vec(), dtype: self.dtype, storage: self.storage.clone() })
    }

    /// Mutable f32 elements of a CPU tensor whose storage is not shared with another tensor.
    pub fn as_cpu_f32_mut(&mut self, op: &'static str) -> Result<&mut [f32]> {
        let dtype = self.dtype;
        match &mut self.storage {
            Storage::Cpu(b) => match Arc::get_mut(b) {
                Some(CpuBuffer::F32(v)) => Ok(v),
                Some(_) => Err(Error::DType { op, expected: "f32", got: dtype }),
                None => Err(Error::Device { op, msg: "cannot write in place: the tensor's storage is shared".into() }),
            },
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::Device { op, msg: "expected a CPU tensor, got a CUDA one".into() }),
        }
    }

    /// The f32 elements of a CPU tensor.
    pub fn as_cpu_f32(&self, op: &'static str) -> Result<&[f32]> {
        match &self.storage {
            Storage::Cpu(b) => match &**b {
                CpuBuffer::F32(v) => Ok(v),
                CpuBuffer::Mapped(m) if self.dtype == DType::F32 => Ok(cast_mapped(m)),
                _ => Err(Error::DType { op, expected: "f32", got: self.dtype }),
            },
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::Device { op, msg: "expected a CPU tensor, got a CUDA one".into() }),
        }
    }

    /// The raw f16/bf16 bits of a CPU tensor.
    pub fn as_cpu_half(&self, op: &'static str) -> Result<&[u16]> {
        match &self.storage {
            Storage::Cpu(b) => match &**b {
                CpuBuffer::Half(v) => Ok(v),
                CpuBuffer::Mapped(m) if self.dtype == DType::F16 || self.dtype == DType::BF16 => Ok(cast_mapped(m)),
                _ => Err(Error::DType { op, expected: "f16 or bf16", got: self.dtype }),
            },
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::Device { op, msg: "expected a CPU tensor, got a CUDA one".into() }),
        }
    }
}

impl Tensor {
    /// The u32 elements of a CPU tensor.
    pub fn as_cpu_u32(&self, op: &'static str) -> Result<&[u32]> {
        match &self.storage {
            Storage::Cpu(b) => match &**b {
                CpuBuffer::U32(v) => Ok(v),
                CpuBuffer::Mapped(m) if self.dtype == DType::U32 => Ok(cast_mapped(m)),
                _ => Err(Error::DType { op, expected: "u32", got: self.dtype }),
            },
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::Device { op, msg: "expected a CPU tensor, got a CUDA one".into() }),
        }
    }

    /// Mutable u32 elements of a CPU tensor whose storage is not shared with another tensor.
    pub fn as_cpu_u32_mut(&mut self, op: &'static str) -> Result<&mut [u32]> {
        let dtype = self.dtype;
        match &mut self.storage {
            Storage::Cpu(b) => match Arc::get_mut(b) {
                Some(CpuBuffer::U32(v)) => Ok(v),
                Some(_) => Err(Error::DType { op, expected: "u32", got: dtype }),
                None => Err(Error::Device { op, msg: "cannot write in place: the tensor's storage is shared".into() }),
            },
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::Device { op, msg: "expected a CPU tensor, got a CUDA one".into() }),
        }
    }

    /// Mutable raw f16/bf16 bits of a CPU tensor whose storage is not shared.
    pub fn as_cpu_half_mut(&mut self, op: &'static str) -> Result<&mut [u16]> {
        let dtype = self.dtype;
        match &mut self.storage {
            Storage::Cpu(b) => match Arc::get_mut(b) {
                Some(CpuBuffer::Half(v)) => Ok(v),
                Some(_) => Err(Error::DType { op, expected: "f16 or bf16 held in memory", got: dtype }),
                None => Err(Error::Device { op, msg: "cannot write in place: the tensor's storage is shared".into() }),
            },
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::Device { op, msg: "expected a CPU tensor, got a CUDA one".into() }),
        }
    }
}

/// The elements of an aligned mapped window (alignment is checked in [`Tensor::cpu_mapped`]).
fn cast_mapped<T: Copy>(m: &MappedBytes) -> &[T] {
    let bytes = m.bytes();
    debug_assert_eq!(bytes.as_ptr() as usize % std::mem::align_of::<T>(), 0);
    // SAFETY: the window is inside the live mapping (held by `m`), aligned for `T` (checked at
    // construction), and `T` is a plain number type valid for any bit pattern.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / std::mem::size_of::<T>()) }
}

/// Bytes of a tensor of block type `dtype` and `shape` (elements), checking that its rows are
/// whole blocks and the size fits in memory.
pub(crate) fn quantized_bytes(op: &'static str, shape: &[usize], dtype: DType) -> Result<usize> {
    let (rows, cols) = match shape.split_last() {
        Some((&c, lead)) => (lead.iter().try_fold(1usize, |a, &x| a.checked_mul(x)), c),
        None => (Some(1), 1),
    };
    let row = dtype.row_bytes(cols).ok_or_else(|| Error::shape(op, &[shape], format!("rows of {} elements are not whole {} blocks of {}", cols, dtype, dtype.block_size())))?;
    rows.and_then(|r| r.checked_mul(row)).ok_or_else(|| Error::Limit { op, msg: format!("{} tensor of shape {:?} is too large to address", dtype, shape) })
}

fn check_len(op: &'static str, shape: &[usize], len: usize) -> Result<()> {
    let want: usize = shape.iter().product();
    if want != len {
        return Err(Error::shape(op, &[shape], format!("shape holds {} elements but {} were given", want, len)));
    }
    Ok(())
}
