//! The typed list of every kernel in the PTX built from `gpu/`. Names follow
//! `<op>[_<variant>]_<dtype>`; nothing else in the engine spells a kernel name.

use crate::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    MatmulF32,
    MatmulF16,
    MatmulBf16,
    GemvF32,
    GemvF16,
    GemvBf16,
    RmsNormF32,
    SoftmaxF32,
    SiluMulF32,
    AddF32,
    EmbeddingF32,
    EmbeddingF16,
    EmbeddingBf16,
    RopeF32,
    AttentionF32,
    ScatterRowsF32,
    LayerNormF32,
    GeluTanhF32,
    GeluErfF32,
}

impl Kernel {
    /// Every kernel, for load-time checks and the PTX test.
    pub const ALL: [Kernel; 19] = [
        Kernel::MatmulF32,
        Kernel::MatmulF16,
        Kernel::MatmulBf16,
        Kernel::GemvF32,
        Kernel::GemvF16,
        Kernel::GemvBf16,
        Kernel::RmsNormF32,
        Kernel::SoftmaxF32,
        Kernel::SiluMulF32,
        Kernel::AddF32,
        Kernel::EmbeddingF32,
        Kernel::EmbeddingF16,
        Kernel::EmbeddingBf16,
        Kernel::RopeF32,
        Kernel::AttentionF32,
        Kernel::ScatterRowsF32,
        Kernel::LayerNormF32,
        Kernel::GeluTanhF32,
        Kernel::GeluErfF32,
    ];

    /// The entry name in the PTX.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::MatmulF32 => "matmul_f32",
            Kernel::MatmulF16 => "matmul_f16",
            Kernel::MatmulBf16 => "matmul_bf16",
            Kernel::GemvF32 => "gemv_f32",
            Kernel::GemvF16 => "gemv_f16",
            Kernel::GemvBf16 => "gemv_bf16",
            Kernel::RmsNormF32 => "rms_norm_f32",
            Kernel::SoftmaxF32 => "softmax_f32",
            Kernel::SiluMulF32 => "silu_mul_f32",
            Kernel::AddF32 => "add_f32",
            Kernel::EmbeddingF32 => "embedding_f32",
            Kernel::EmbeddingF16 => "embedding_f16",
            Kernel::EmbeddingBf16 => "embedding_bf16",
            Kernel::RopeF32 => "rope_f32",
            Kernel::AttentionF32 => "attention_f32",
            Kernel::ScatterRowsF32 => "scatter_rows_f32",
            Kernel::LayerNormF32 => "layer_norm_f32",
            Kernel::GeluTanhF32 => "gelu_tanh_f32",
            Kernel::GeluErfF32 => "gelu_erf_f32",
        }
    }

    /// The tiled matmul for weights of `dtype`.
    pub fn matmul(dtype: DType) -> Kernel {
        match dtype {
            DType::F32 => Kernel::MatmulF32,
            DType::F16 => Kernel::MatmulF16,
            DType::BF16 => Kernel::MatmulBf16,
        }
    }

    /// The embedding lookup for a table of `dtype`.
    pub fn embedding(dtype: DType) -> Kernel {
        match dtype {
            DType::F32 => Kernel::EmbeddingF32,
            DType::F16 => Kernel::EmbeddingF16,
            DType::BF16 => Kernel::EmbeddingBf16,
        }
    }

    /// The GEMV for weights of `dtype`.
    pub fn gemv(dtype: DType) -> Kernel {
        match dtype {
            DType::F32 => Kernel::GemvF32,
            DType::F16 => Kernel::GemvF16,
            DType::BF16 => Kernel::GemvBf16,
        }
    }
}

/// The `.entry` names declared in a PTX text, in order.
pub fn ptx_entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or(rest).trim())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_follow_the_scheme() {
        let mut names: Vec<_> = Kernel::ALL.iter().map(|k| k.name()).collect();
        for n in &names {
            let dtype = n.rsplit('_').next().unwrap();
            assert!(["f32", "f16", "bf16"].contains(&dtype), "{} lacks a dtype suffix", n);
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Kernel::ALL.len());
    }

    #[test]
    fn ptx_entries_are_parsed() {
        let ptx = ".version 7.8\n.visible .entry gemv_f32(\n\t.param .b8 p[56]\n)\n.visible .entry softmax_f32(\n";
        assert_eq!(ptx_entries(ptx), vec!["gemv_f32", "softmax_f32"]);
    }
}
