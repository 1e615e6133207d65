//! Element types of tensors.

use std::fmt;

/// Element type. Activations are always `F32`; weights may be any of the three and are
/// widened to f32 inside the kernels that read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
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
