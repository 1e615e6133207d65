//! Element types of tensors.

use std::fmt;

/// Element type. Activations are always `F32`; weights may be any of the three float types
/// (widened to f32 inside the kernels that read them) or one of the block-quantized types of
/// GGUF (`Q8_0`, `Q4K`, `Q6K`: llama.cpp's layouts, see [`crate::quant`]); the KV cache is `F32`
/// or `F16`; `U32` holds token ids and decode cursors.
///
/// A tensor's shape is always in elements. A block type stores each row as whole blocks of
/// [`DType::block_size`] elements in [`DType::block_bytes`] bytes, so its rows must be a multiple
/// of the block size long ([`DType::row_bytes`] checks it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    U32,
    /// Blocks of 32: an f16 scale and 32 int8 values (34 bytes).
    Q8_0,
    /// Super-blocks of 256: f16 scale and min, 8 six-bit sub-block scales and mins, 4-bit values
    /// (144 bytes).
    Q4K,
    /// Super-blocks of 256: 6-bit values, 16 int8 sub-block scales, an f16 scale (210 bytes).
    Q6K,
}

impl DType {
    /// Bytes per element of an element type; for a block type, bytes per block (use
    /// [`DType::row_bytes`] for sizes).
    pub fn size_of(self) -> usize {
        self.block_bytes()
    }

    /// Elements per block: 1 for the element types.
    pub fn block_size(self) -> usize {
        match self {
            DType::Q8_0 => crate::quant::QK8_0,
            DType::Q4K | DType::Q6K => crate::quant::QK_K,
            _ => 1,
        }
    }

    /// Bytes per block (per element for the element types).
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => crate::quant::q8_0::BLOCK_BYTES,
            DType::Q4K => crate::quant::q4_k::BLOCK_BYTES,
            DType::Q6K => crate::quant::q6_k::BLOCK_BYTES,
        }
    }

    /// Whether this is a block-quantized type.
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes of `elems` elements, or `None` when `elems` is not a whole number of blocks or the
    /// size overflows.
    pub fn row_bytes(self, elems: usize) -> Option<usize> {
        if elems % self.block_size() != 0 {
            return None;
        }
        (elems / self.block_size()).checked_mul(self.block_bytes())
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
            DType::Q8_0 => "q8_0",
            DType::Q4K => "q4_k",
            DType::Q6K => "q6_k",
        }
    }

    /// A floating-point type (weights, activations, caches), not an integer one.
    pub fn is_float(self) -> bool {
        self != DType::U32
    }

    /// Parses `f32`, `f16`, `bf16` (the user's names for float types).
    pub fn parse_float(s: &str) -> Option<DType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Some(DType::F32),
            "f16" | "float16" | "half" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::BF16),
            _ => None,
        }
    }

    /// Widens one stored 16-bit element (f16 or bf16 bits) to f32; `F32` is not a 16-bit type.
    #[inline(always)]
    pub fn half_to_f32(self, bits: u16) -> f32 {
        match self {
            DType::BF16 => gpu::math::bf16_to_f32(bits),
            _ => gpu::math::f16_to_f32(bits),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
