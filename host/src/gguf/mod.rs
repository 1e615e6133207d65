//! GGUF files (version 2 and 3): the reader ([`read`]), the writer ([`write`]), the tensor
//! names and metadata keys llama.cpp uses for Qwen3-VL ([`names`], [`meta`]).
//!
//! Layout: `"GGUF"`, version (u32), tensor count (u64), metadata count (u64); the metadata
//! key/value pairs; the tensor infos (name, dims innermost first, ggml type, offset); then the
//! tensor data, starting at the next multiple of `general.alignment` (32 by default), each
//! tensor at an aligned offset. Everything is little-endian.

pub mod meta;
pub mod names;
pub mod read;
pub mod write;

pub use read::{Gguf, TensorInfo};
pub use write::Writer;

use crate::DType;

/// GGUF metadata value types.
pub mod vtype {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(Array),
}

/// A metadata array: one element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    /// The type's name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
            Value::Array(_) => "array",
        }
    }

    /// An integer value of any integer type, if non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }

    /// A float or integer value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` of an integer array, if non-negative.
    pub fn u64_at(&self, i: usize) -> Option<u64> {
        match self {
            Array::U8(v) => v.get(i).map(|&x| x as u64),
            Array::U16(v) => v.get(i).map(|&x| x as u64),
            Array::U32(v) => v.get(i).map(|&x| x as u64),
            Array::U64(v) => v.get(i).copied(),
            Array::I8(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            Array::I16(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            Array::I32(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            Array::I64(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            _ => None,
        }
    }

    /// Element `i` of a numeric array as f64.
    pub fn f64_at(&self, i: usize) -> Option<f64> {
        match self {
            Array::F32(v) => v.get(i).map(|&x| x as f64),
            Array::F64(v) => v.get(i).copied(),
            _ => self.u64_at(i).map(|x| x as f64),
        }
    }
}

/// ggml type ids of the tensor types this engine reads (others are refused by name).
pub mod ggml_type {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q8_0: u32 = 8;
    pub const Q4_K: u32 = 12;
    pub const Q6_K: u32 = 14;
    pub const BF16: u32 = 30;
}

/// The engine dtype of a ggml type id, or the type's name when it is one this engine does not
/// read (or `None` when the id is unknown).
pub fn dtype_of_ggml(t: u32) -> Result<DType, Option<&'static str>> {
    Ok(match t {
        ggml_type::F32 => DType::F32,
        ggml_type::F16 => DType::F16,
        ggml_type::BF16 => DType::BF16,
        ggml_type::Q8_0 => DType::Q8_0,
        ggml_type::Q4_K => DType::Q4K,
        ggml_type::Q6_K => DType::Q6K,
        2 => return Err(Some("Q4_0")),
        3 => return Err(Some("Q4_1")),
        6 => return Err(Some("Q5_0")),
        7 => return Err(Some("Q5_1")),
        9 => return Err(Some("Q8_1")),
        10 => return Err(Some("Q2_K")),
        11 => return Err(Some("Q3_K")),
        13 => return Err(Some("Q5_K")),
        15 => return Err(Some("Q8_K")),
        16..=23 | 29 => return Err(Some("an IQ type")),
        24 => return Err(Some("I8")),
        25 => return Err(Some("I16")),
        26 => return Err(Some("I32")),
        27 => return Err(Some("I64")),
        28 => return Err(Some("F64")),
        34 | 35 => return Err(Some("a TQ type")),
        39 => return Err(Some("MXFP4")),
        _ => return Err(None),
    })
}

/// The ggml type id of an engine dtype (`None` for `U32`, which GGUF tensors do not hold here).
pub fn ggml_of_dtype(d: DType) -> Option<u32> {
    Some(match d {
        DType::F32 => ggml_type::F32,
        DType::F16 => ggml_type::F16,
        DType::BF16 => ggml_type::BF16,
        DType::Q8_0 => ggml_type::Q8_0,
        DType::Q4K => ggml_type::Q4_K,
        DType::Q6K => ggml_type::Q6_K,
        DType::U32 => return None,
    })
}
