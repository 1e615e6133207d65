//! Element types of tensors.

use std::fmt;

/// Element type. Activations are always `F32`; weights may be any of the three float types and
/// are widened to f32 inside the kernels that read them; the KV cache is `F32` or `F16`; `U32`
/// holds token ids and decode cursors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    U32,
}

impl DType {
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
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
