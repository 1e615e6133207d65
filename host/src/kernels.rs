//! The typed list of every kernel in the PTX modules built from `gpu/`, with the architecture
//! each needs. Names follow `<op>[_<variant>]_<dtype>`; nothing else in the engine spells a
//! kernel name. The compute_61 module holds the kernels of `Arch::Compute61`; the compute_80
//! module holds those and the ones that need `Arch::Compute80` (tensor cores).

use crate::{DType, Error, Result};
use std::str::FromStr;

/// A PTX module's virtual architecture (what `cuda_builder` built it for).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    /// Pascal and every newer GPU: FP32 math, `dp4a`.
    Compute61,
    /// Ampere, Ada, Hopper: adds `mma.sync`, `ldmatrix`, `cp.async`.
    Compute80,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Compute61, Arch::Compute80];

    /// `compute_61` / `compute_80`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Compute61 => "compute_61",
            Arch::Compute80 => "compute_80",
        }
    }

    /// The compute capability (major, minor) a device needs to run the module.
    pub fn capability(self) -> (u32, u32) {
        match self {
            Arch::Compute61 => (6, 1),
            Arch::Compute80 => (8, 0),
        }
    }

    /// The `.target` line's value in the PTX text.
    pub fn ptx_target(self) -> &'static str {
        match self {
            Arch::Compute61 => "sm_61",
            Arch::Compute80 => "sm_80",
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One PTX module embedded at build time.
#[derive(Clone, Copy, Debug)]
pub struct Ptx {
    pub arch: Arch,
    pub text: &'static str,
}

/// The comment a kernel's PTX carries where it waits for the kernel before it (`grid_dep_wait`
/// in `gpu/src/mem.rs`), and where it lets the next one launch (`grid_dep_launch`).
pub const GRID_DEP_WAIT: &str = "// qwen3vl:griddepcontrol.wait";
pub const GRID_DEP_LAUNCH: &str = "// qwen3vl:griddepcontrol.launch_dependents";
/// The comment before an sm_90 instruction in the compute_80 PTX (thread-block clusters:
/// `cluster_sync`, `cluster_map`, `ld_cluster_f32x4` in `gpu/src/mem.rs`); dropped on compute 9.0
/// devices, where the instruction then runs. Kernels with them launch only there.
pub const SM90_MARK: &str = "// qwen3vl:";
/// The comment before an sm_90a instruction in the compute_80 PTX (the warpgroup multiplies
/// of `gpu/src/wgmma.rs`): dropped, with the module made `.target sm_90a` (PTX 8.0), where a
/// compute 9.0 device loads it (not 10.0 and newer, which have no `wgmma`). Kernels with them
/// launch only there ([`Kernel::needs_sm90a`]).
pub const SM90A_MARK: &str = "// qwen3vl90a:";

/// Whether [`Ptx::text_for`] makes the compute_80 module sm_90a on compute 9.0 devices, so the
/// warpgroup GEMMs run (`QWEN3_VL_WGMMA=0`: sm_90, the pipelined `mma.sync` kernels in their
/// place; an A/B aid, read once).
pub fn wgmma_enabled() -> bool {
    static WGMMA: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_WGMMA");
    WGMMA.on()
}

/// Whether [`Ptx::text_for`] gives compute 9.0 devices the overlapping variant of the compute_80
/// module (`QWEN3_VL_PDL=0` keeps the plain one: an A/B aid; read once).
pub fn grid_dep_enabled() -> bool {
    static PDL: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_PDL");
    PDL.on()
}

/// Whether kernels that merge through a thread-block cluster may launch where the compute_80
/// module loads as sm_90 (the split-K 64 × 64 pipelined tiles, `host/src/cuda/linear.rs`;
/// `QWEN3_VL_CLUSTERS=0`: a workspace and a reduce launch as elsewhere, an A/B aid; read once).
pub fn clusters_enabled() -> bool {
    static CLUSTERS: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_CLUSTERS");
    CLUSTERS.on()
}

impl Ptx {
    /// The text a device of compute capability `cc` loads, and whether its kernels overlap the
    /// ones before them. On compute 9.0 and newer the compute_80 module becomes an sm_90 module
    /// whose `grid_dep_*` comments are the `griddepcontrol` instructions (programmatic
    /// dependent launch: a kernel's blocks start while the kernel before it finishes, load what
    /// does not depend on it, then wait; on every other device, or with `overlap` false, the
    /// comments stay comments). On exactly compute 9.0 the module is `.target sm_90a` and its
    /// `SM90A_MARK` comments instructions too ([`Ptx::is_sm90a`]). Register caps as
    /// [`Ptx::text_with_caps`].
    pub fn text_for(&self, cc: (u32, u32), overlap: bool) -> (String, bool) {
        self.text_for_with(cc, overlap, wgmma_enabled())
    }

    /// [`Ptx::text_for`], the sm_90a form only with `wgmma` (the module loader's fallback when
    /// the driver refuses the sm_90a text).
    pub fn text_for_with(&self, cc: (u32, u32), overlap: bool, wgmma: bool) -> (String, bool) {
        let text = self.text_with_caps();
        if !(overlap && self.arch == Arch::Compute80 && cc >= (9, 0)) {
            return (text, false);
        }
        let target = format!(".target {}", self.arch.ptx_target());
        if !text.contains(&target) {
            return (text, false);
        }
        // the grid dependency comments, then every other sm_90 instruction the compute_80 text
        // carries as a comment (`SM90_MARK` and the instruction: `gpu/src/mem.rs`, `cluster_*`)
        let text = text
            .replacen(&target, ".target sm_90", 1)
            .replace(&format!("{}\n", GRID_DEP_WAIT), "griddepcontrol.wait;\n")
            .replace(&format!("{}\n", GRID_DEP_LAUNCH), "griddepcontrol.launch_dependents;\n")
            .replace(SM90_MARK, "");
        // sm_90a (exactly compute 9.0): the warpgroup instructions, which need PTX 8.0
        if cc == (9, 0) && wgmma && text.contains(SM90A_MARK) && text.contains(".version 7.8\n") {
            let text = text.replacen(".target sm_90\n", ".target sm_90a\n", 1).replacen(".version 7.8\n", ".version 8.0\n", 1).replace(SM90A_MARK, "");
            return (text, true);
        }
        (text, true)
    }

    /// Whether `text` (a module's text as loaded) is an sm_90a module, whose warpgroup kernels run:
    /// its `.target` line, in the header (the rest of the 7 MB text is not read).
    pub fn is_sm90a(text: &str) -> bool {
        text.lines().find(|l| l.starts_with(".target ")) == Some(".target sm_90a")
    }

    /// The names of the kernels whose entry in `text` (a module's text as loaded) waits for
    /// the kernel before it: `griddepcontrol.wait` between its `.entry` and the next one. One
    /// pass over the text (a lookup per kernel would scan the 7 MB module a hundred times).
    pub fn waiting_entries(text: &str) -> std::collections::HashSet<&str> {
        text.split(".entry ").skip(1).filter(|entry| entry.contains("griddepcontrol.wait;")).filter_map(|entry| entry.split('(').next()).collect()
    }

    /// The module's text as it is loaded: a `.maxnreg` directive for every kernel with a
    /// register cap ([`Kernel::max_registers`]). `QWEN3_VL_REG_CAPS=0` leaves them out (an A/B
    /// aid for benchmarks; read once).
    pub fn text_with_caps(&self) -> String {
        static CAPS: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_REG_CAPS");
        let mut text = self.text.to_string();
        if !CAPS.on() {
            return text;
        }
        for k in Kernel::in_module(self.arch) {
            if let Some(n) = k.max_registers() {
                // `.entry name(\n\t.param ...\n)` then the body: the directive goes between
                let head = format!(".entry {}(", k.name());
                if let Some(at) = text.find(&head) {
                    if let Some(close) = text[at..].find("\n)\n") {
                        let pos = at + close + 3;
                        text.insert_str(pos, &format!(".maxnreg {}\n", n));
                    }
                }
            }
        }
        text
    }
}

/// Which module to load (`--kernels`): the best one the device supports, or a forced one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelsRequest {
    Auto,
    Force(Arch),
}

impl FromStr for KernelsRequest {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(KernelsRequest::Auto),
            "compute_61" | "61" | "sm_61" => Ok(KernelsRequest::Force(Arch::Compute61)),
            "compute_80" | "80" | "sm_80" => Ok(KernelsRequest::Force(Arch::Compute80)),
            other => Err(format!("unknown kernels '{}': expected auto, compute_61 or compute_80", other)),
        }
    }
}

/// Defines [`Kernel`] from one table: variant, PTX entry name, the architecture it needs.
macro_rules! kernel_table {
    ($($variant:ident = $name:literal @ $arch:ident,)*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Kernel {
            $($variant,)*
        }

        impl Kernel {
            /// Every kernel, in table order (`k as usize` indexes it).
            pub const ALL: &'static [Kernel] = &[$(Kernel::$variant,)*];

            /// The entry name in the PTX.
            pub fn name(self) -> &'static str {
                match self {
                    $(Kernel::$variant => $name,)*
                }
            }

            /// The oldest architecture whose module carries this kernel.
            pub fn arch(self) -> Arch {
                match self {
                    $(Kernel::$variant => Arch::$arch,)*
                }
            }
        }
    };
}

kernel_table! {
    MatmulF32 = "matmul_f32" @ Compute61,
    MatmulF16 = "matmul_f16" @ Compute61,
    MatmulBf16 = "matmul_bf16" @ Compute61,
    GemvF32 = "gemv_f32" @ Compute61,
    GemvF16 = "gemv_f16" @ Compute61,
    GemvBf16 = "gemv_bf16" @ Compute61,
    RmsNormF32 = "rms_norm_f32" @ Compute61,
    SoftmaxF32 = "softmax_f32" @ Compute61,
    SiluMulF32 = "silu_mul_f32" @ Compute61,
    AddF32 = "add_f32" @ Compute61,
    EmbeddingF32 = "embedding_f32" @ Compute61,
    EmbeddingF16 = "embedding_f16" @ Compute61,
    EmbeddingBf16 = "embedding_bf16" @ Compute61,
    GatherRowsF16 = "gather_rows_f16" @ Compute61,
    RopeF32 = "rope_f32" @ Compute61,
    AttentionF32 = "attention_f32" @ Compute61,
    ScatterRowsF32 = "scatter_rows_f32" @ Compute61,
    BlendRowsF32 = "blend_rows_f32" @ Compute61,
    LayerNormF32 = "layer_norm_f32" @ Compute61,
    GeluTanhF32 = "gelu_tanh_f32" @ Compute61,
    GeluErfF32 = "gelu_erf_f32" @ Compute61,
    GemvVecF32 = "gemv_vec_f32" @ Compute61,
    GemvVecF16 = "gemv_vec_f16" @ Compute61,
    GemvVecBf16 = "gemv_vec_bf16" @ Compute61,
    GemvGateUpF32 = "gemv_gate_up_f32" @ Compute61,
    GemvGateUpF16 = "gemv_gate_up_f16" @ Compute61,
    GemvGateUpBf16 = "gemv_gate_up_bf16" @ Compute61,
    QkvRopeAppendF32 = "qkv_rope_append_f32" @ Compute61,
    QkvRopeAppendF16 = "qkv_rope_append_f16" @ Compute61,
    AttentionF16 = "attention_f16" @ Compute61,
    AttentionSplitF32 = "attention_split_f32" @ Compute61,
    AttentionSplitF16 = "attention_split_f16" @ Compute61,
    SampleTopkF32 = "sample_topk_f32" @ Compute61,
    SamplePickF32 = "sample_pick_f32" @ Compute61,
    CastF16F32 = "cast_f16_f32" @ Compute61,
    MatmulBigF32 = "matmul_big_f32" @ Compute61,
    MatmulBigF16 = "matmul_big_f16" @ Compute61,
    MatmulBigBf16 = "matmul_big_bf16" @ Compute61,
    MatmulBigSplitF32 = "matmul_big_split_f32" @ Compute61,
    MatmulBigSplitF16 = "matmul_big_split_f16" @ Compute61,
    MatmulBigSplitBf16 = "matmul_big_split_bf16" @ Compute61,
    LinearSplitReduceF32 = "linear_split_reduce_f32" @ Compute61,
    MatmulMmaF16 = "matmul_mma_f16" @ Compute80,
    MatmulMmaBf16 = "matmul_mma_bf16" @ Compute80,
    MatmulMma64x128F16 = "matmul_mma_64x128_f16" @ Compute80,
    MatmulMma64x128Bf16 = "matmul_mma_64x128_bf16" @ Compute80,
    MatmulMma64x64F16 = "matmul_mma_64x64_f16" @ Compute80,
    MatmulMma64x64Bf16 = "matmul_mma_64x64_bf16" @ Compute80,
    MatmulMma64x64SplitF16 = "matmul_mma_64x64_split_f16" @ Compute80,
    MatmulMma64x64SplitBf16 = "matmul_mma_64x64_split_bf16" @ Compute80,
    MatmulSkinnyM16F16 = "matmul_skinny_m16_f16" @ Compute80,
    MatmulSkinnyM16Bf16 = "matmul_skinny_m16_bf16" @ Compute80,
    MatmulSkinnyM32F16 = "matmul_skinny_m32_f16" @ Compute80,
    MatmulSkinnyM32Bf16 = "matmul_skinny_m32_bf16" @ Compute80,
    GateUpSkinnyM16F16 = "gate_up_skinny_m16_f16" @ Compute80,
    GateUpSkinnyM16Bf16 = "gate_up_skinny_m16_bf16" @ Compute80,
    GateUpSkinnyM32F16 = "gate_up_skinny_m32_f16" @ Compute80,
    GateUpSkinnyM32Bf16 = "gate_up_skinny_m32_bf16" @ Compute80,
    MatmulMmaPipeF16 = "matmul_mma_pipe_f16" @ Compute80,
    MatmulMmaPipeBf16 = "matmul_mma_pipe_bf16" @ Compute80,
    MatmulMmaPipe64x128F16 = "matmul_mma_pipe_64x128_f16" @ Compute80,
    MatmulMmaPipe64x128Bf16 = "matmul_mma_pipe_64x128_bf16" @ Compute80,
    MatmulMmaPipe64x64F16 = "matmul_mma_pipe_64x64_f16" @ Compute80,
    MatmulMmaPipe64x64Bf16 = "matmul_mma_pipe_64x64_bf16" @ Compute80,
    MatmulMmaPipe64x64SplitF16 = "matmul_mma_pipe_64x64_split_f16" @ Compute80,
    MatmulMmaPipe64x64SplitBf16 = "matmul_mma_pipe_64x64_split_bf16" @ Compute80,
    MatmulMmaPipe64x64ClusterF16 = "matmul_mma_pipe_64x64_cluster_f16" @ Compute80,
    MatmulMmaPipe64x64ClusterBf16 = "matmul_mma_pipe_64x64_cluster_bf16" @ Compute80,
    GateUpPipeF16 = "gate_up_pipe_f16" @ Compute80,
    GateUpPipeBf16 = "gate_up_pipe_bf16" @ Compute80,
    GateUpPipe64x128F16 = "gate_up_pipe_64x128_f16" @ Compute80,
    GateUpPipe64x128Bf16 = "gate_up_pipe_64x128_bf16" @ Compute80,
    GateUpPipeC16Bf16 = "gate_up_pipe_c16_bf16" @ Compute80,
    GateUpPipe64x128C16Bf16 = "gate_up_pipe_64x128_c16_bf16" @ Compute80,
    MatmulMmaPipeC16Bf16 = "matmul_mma_pipe_c16_bf16" @ Compute80,
    MatmulMmaPipe64x128C16Bf16 = "matmul_mma_pipe_64x128_c16_bf16" @ Compute80,
    MatmulMmaPipe128x256F16 = "matmul_mma_pipe_128x256_f16" @ Compute80,
    MatmulMmaPipe128x256Bf16 = "matmul_mma_pipe_128x256_bf16" @ Compute80,
    MatmulMmaPipe128x256C16Bf16 = "matmul_mma_pipe_128x256_c16_bf16" @ Compute80,
    GateUpPipe128x256F16 = "gate_up_pipe_128x256_f16" @ Compute80,
    GateUpPipe128x256Bf16 = "gate_up_pipe_128x256_bf16" @ Compute80,
    GateUpPipe128x256C16Bf16 = "gate_up_pipe_128x256_c16_bf16" @ Compute80,
    MatmulWgmma128x256Bf16 = "matmul_wgmma_128x256_bf16" @ Compute80,
    MatmulWgmma128x256C16Bf16 = "matmul_wgmma_128x256_c16_bf16" @ Compute80,
    GateUpWgmma128x256Bf16 = "gate_up_wgmma_128x256_bf16" @ Compute80,
    GateUpWgmma128x256C16Bf16 = "gate_up_wgmma_128x256_c16_bf16" @ Compute80,
    MatmulWgmma64x128Bf16 = "matmul_wgmma_64x128_bf16" @ Compute80,
    MatmulWgmma64x128C16Bf16 = "matmul_wgmma_64x128_c16_bf16" @ Compute80,
    MatmulWgmma64x64Bf16 = "matmul_wgmma_64x64_bf16" @ Compute80,
    MatmulWgmma64x64ClusterBf16 = "matmul_wgmma_64x64_cluster_bf16" @ Compute80,
    GateUpWgmma64x128Bf16 = "gate_up_wgmma_64x128_bf16" @ Compute80,
    GateUpWgmma64x128C16Bf16 = "gate_up_wgmma_64x128_c16_bf16" @ Compute80,
    RmsNormA16Bf16 = "rms_norm_a16_bf16" @ Compute80,
    LayerNormA16Bf16 = "layer_norm_a16_bf16" @ Compute80,
    CastA16F16 = "cast_a16_f16" @ Compute80,
    CastA16Bf16 = "cast_a16_bf16" @ Compute80,
    MatmulSkinnyM16A16F16 = "matmul_skinny_m16_a16_f16" @ Compute80,
    MatmulSkinnyM16A16Bf16 = "matmul_skinny_m16_a16_bf16" @ Compute80,
    MatmulSkinnyM32A16F16 = "matmul_skinny_m32_a16_f16" @ Compute80,
    MatmulSkinnyM32A16Bf16 = "matmul_skinny_m32_a16_bf16" @ Compute80,
    GateUpSkinnyM16A16F16 = "gate_up_skinny_m16_a16_f16" @ Compute80,
    GateUpSkinnyM16A16Bf16 = "gate_up_skinny_m16_a16_bf16" @ Compute80,
    GateUpSkinnyM32A16F16 = "gate_up_skinny_m32_a16_f16" @ Compute80,
    GateUpSkinnyM32A16Bf16 = "gate_up_skinny_m32_a16_bf16" @ Compute80,
    RowScaleF32 = "row_scale_f32" @ Compute80,
    FlashAttentionD64F32 = "flash_attention_d64_f32" @ Compute61,
    FlashAttentionD64F16 = "flash_attention_d64_f16" @ Compute61,
    FlashAttentionD128F32 = "flash_attention_d128_f32" @ Compute61,
    FlashAttentionD128F16 = "flash_attention_d128_f16" @ Compute61,
    RopeCastF16 = "rope_cast_f16" @ Compute61,
    RopeCastX4F16 = "rope_cast_x4_f16" @ Compute61,
    FlashAttentionMmaD64F16 = "flash_attention_mma_d64_f16" @ Compute80,
    FlashAttentionMmaD128F16 = "flash_attention_mma_d128_f16" @ Compute80,
    FlashAttentionWgmmaD64F16 = "flash_attention_wgmma_d64_f16" @ Compute80,
    FlashAttentionWgmmaD128F16 = "flash_attention_wgmma_d128_f16" @ Compute80,
    AttentionPagedF16 = "attention_paged_f16" @ Compute80,
    AttentionPagedMmaF16 = "attention_paged_mma_f16" @ Compute80,
    QuantizeActF32 = "quantize_act_f32" @ Compute61,
    MmvqQ8_0 = "mmvq_q8_0" @ Compute61,
    MmvqQ4K = "mmvq_q4_k" @ Compute61,
    MmvqQ6K = "mmvq_q6_k" @ Compute61,
    MmvqGateUpQ8_0 = "mmvq_gate_up_q8_0" @ Compute61,
    MmvqGateUpQ4K = "mmvq_gate_up_q4_k" @ Compute61,
    MmvqGateUpQ6K = "mmvq_gate_up_q6_k" @ Compute61,
    DequantRowsQ8_0 = "dequant_rows_q8_0" @ Compute61,
    DequantRowsQ4K = "dequant_rows_q4_k" @ Compute61,
    DequantRowsQ6K = "dequant_rows_q6_k" @ Compute61,
}

impl Kernel {
    /// The kernels a module of `arch` carries.
    pub fn in_module(arch: Arch) -> impl Iterator<Item = Kernel> {
        Kernel::ALL.iter().copied().filter(move |k| k.arch() <= arch)
    }

    /// The tiled matmul for weights of `dtype`.
    pub fn matmul(dtype: DType) -> Result<Kernel> {
        by_weight(dtype, [Kernel::MatmulF32, Kernel::MatmulF16, Kernel::MatmulBf16])
    }

    /// The 128 × 128-tile SIMT matmul for weights of `dtype` (`split`: its split-K form).
    pub fn matmul_big(dtype: DType, split: bool) -> Result<Kernel> {
        if split {
            by_weight(dtype, [Kernel::MatmulBigSplitF32, Kernel::MatmulBigSplitF16, Kernel::MatmulBigSplitBf16])
        } else {
            by_weight(dtype, [Kernel::MatmulBigF32, Kernel::MatmulBigF16, Kernel::MatmulBigBf16])
        }
    }

    /// The tensor-core matmul for at most `rows` (16 or 32) rows (compute_80 module); `a16`:
    /// the variant with 16-bit activations (`Precision::Bf16`).
    pub fn matmul_skinny(dtype: DType, rows: u32, a16: bool) -> Result<Kernel> {
        use Kernel::*;
        let set = match rows {
            16 => [MatmulSkinnyM16F16, MatmulSkinnyM16Bf16, MatmulSkinnyM16A16F16, MatmulSkinnyM16A16Bf16],
            32 => [MatmulSkinnyM32F16, MatmulSkinnyM32Bf16, MatmulSkinnyM32A16F16, MatmulSkinnyM32A16Bf16],
            other => return Err(Error::Limit { op: "matmul_skinny", msg: format!("no kernel for {} rows", other) }),
        };
        by_half(dtype, a16, set, "matmul_skinny")
    }

    /// The few-row tensor-core SwiGLU gate/up product for at most `rows` (16 or 32) rows
    /// (`a16` as for [`Kernel::matmul_skinny`]).
    pub fn gate_up_skinny(dtype: DType, rows: u32, a16: bool) -> Result<Kernel> {
        use Kernel::*;
        let set = match rows {
            16 => [GateUpSkinnyM16F16, GateUpSkinnyM16Bf16, GateUpSkinnyM16A16F16, GateUpSkinnyM16A16Bf16],
            32 => [GateUpSkinnyM32F16, GateUpSkinnyM32Bf16, GateUpSkinnyM32A16F16, GateUpSkinnyM32A16Bf16],
            other => return Err(Error::Limit { op: "gate_up_skinny", msg: format!("no kernel for {} rows", other) }),
        };
        by_half(dtype, a16, set, "gate_up_skinny")
    }

    /// The tensor-core matmul with `(rows, columns)` tiles (one of `gpu::params::mma_tile::TILES`)
    /// for 16-bit weights of `dtype` over f32 activations (compute_80 module).
    /// `split`: the split-K form, which only the 64 × 64 tile has.
    pub fn matmul_mma(dtype: DType, tile: (u32, u32), split: bool) -> Result<Kernel> {
        use Kernel::*;
        let set = match (tile, split) {
            ((64, 64), true) => [MatmulMma64x64SplitF16, MatmulMma64x64SplitBf16],
            (_, true) => return Err(Error::Limit { op: "matmul_mma", msg: format!("split-K needs the 64x64 tile, not {}x{}", tile.0, tile.1) }),
            ((128, 128), false) => [MatmulMmaF16, MatmulMmaBf16],
            ((64, 128), false) => [MatmulMma64x128F16, MatmulMma64x128Bf16],
            ((64, 64), false) => [MatmulMma64x64F16, MatmulMma64x64Bf16],
            (other, false) => return Err(Error::Limit { op: "matmul_mma", msg: format!("no {}x{} tile kernel", other.0, other.1) }),
        };
        by_half(dtype, false, [set[0], set[1], set[0], set[1]], "matmul_mma")
    }

    /// The pipelined tensor-core matmul over 16-bit activations (`gpu/src/mma_pipe.rs`,
    /// `Precision::Bf16`) with `(rows, columns)` tiles for weights of `dtype`; `split` as for
    /// [`Kernel::matmul_mma`].
    pub fn matmul_mma_pipe(dtype: DType, tile: (u32, u32), split: bool) -> Result<Kernel> {
        use Kernel::*;
        let set = match (tile, split) {
            ((64, 64), true) => [MatmulMmaPipe64x64SplitF16, MatmulMmaPipe64x64SplitBf16],
            (_, true) => return Err(Error::Limit { op: "matmul_mma_pipe", msg: format!("split-K needs the 64x64 tile, not {}x{}", tile.0, tile.1) }),
            ((128, 256), false) => [MatmulMmaPipe128x256F16, MatmulMmaPipe128x256Bf16],
            ((128, 128), false) => [MatmulMmaPipeF16, MatmulMmaPipeBf16],
            ((64, 128), false) => [MatmulMmaPipe64x128F16, MatmulMmaPipe64x128Bf16],
            ((64, 64), false) => [MatmulMmaPipe64x64F16, MatmulMmaPipe64x64Bf16],
            (other, false) => return Err(Error::Limit { op: "matmul_mma_pipe", msg: format!("no {}x{} tile kernel", other.0, other.1) }),
        };
        by_half(dtype, false, [set[0], set[1], set[0], set[1]], "matmul_mma_pipe")
    }

    /// The pipelined SwiGLU gate/up product over 16-bit activations with `(rows, columns)`
    /// tiles (128 × 256, 128 × 128 or 64 × 128, half the columns from each matrix) for weights
    /// of `dtype`.
    pub fn gate_up_pipe(dtype: DType, tile: (u32, u32)) -> Result<Kernel> {
        use Kernel::*;
        let set = match tile {
            (128, 256) => [GateUpPipe128x256F16, GateUpPipe128x256Bf16],
            (128, 128) => [GateUpPipeF16, GateUpPipeBf16],
            (64, 128) => [GateUpPipe64x128F16, GateUpPipe64x128Bf16],
            other => return Err(Error::Limit { op: "gate_up_pipe", msg: format!("no {}x{} tile kernel", other.0, other.1) }),
        };
        by_half(dtype, false, [set[0], set[1], set[0], set[1]], "gate_up_pipe")
    }

    /// The pipelined bf16 kernels that write their output in bf16 (the next GEMM's operand):
    /// the gate/up product (`gate_up`) or a linear layer with `(rows, columns)` tiles (128 × 256,
    /// 128 × 128 or 64 × 128); `None` for other tiles.
    pub fn pipe_c16(gate_up: bool, tile: (u32, u32)) -> Option<Kernel> {
        use Kernel::*;
        match (gate_up, tile) {
            (true, (128, 256)) => Some(GateUpPipe128x256C16Bf16),
            (true, (128, 128)) => Some(GateUpPipeC16Bf16),
            (true, (64, 128)) => Some(GateUpPipe64x128C16Bf16),
            (false, (128, 256)) => Some(MatmulMmaPipe128x256C16Bf16),
            (false, (128, 128)) => Some(MatmulMmaPipeC16Bf16),
            (false, (64, 128)) => Some(MatmulMmaPipe64x128C16Bf16),
            _ => None,
        }
    }

    /// Whether this kernel reads its activations as 16-bit values (from `cast_a16_*`).
    pub fn reads_a16(self) -> bool {
        use Kernel::*;
        matches!(
            self,
            MatmulMmaPipeF16 | MatmulMmaPipeBf16 | MatmulMmaPipe64x128F16 | MatmulMmaPipe64x128Bf16 | MatmulMmaPipe64x64F16 | MatmulMmaPipe64x64Bf16 | MatmulMmaPipe64x64SplitF16 | MatmulMmaPipe64x64SplitBf16
                | MatmulMmaPipe64x64ClusterF16 | MatmulMmaPipe64x64ClusterBf16
                | GateUpPipeF16 | GateUpPipeBf16 | GateUpPipe64x128F16 | GateUpPipe64x128Bf16
                | GateUpPipeC16Bf16 | GateUpPipe64x128C16Bf16 | MatmulMmaPipeC16Bf16 | MatmulMmaPipe64x128C16Bf16
                | MatmulMmaPipe128x256F16 | MatmulMmaPipe128x256Bf16 | MatmulMmaPipe128x256C16Bf16
                | GateUpPipe128x256F16 | GateUpPipe128x256Bf16 | GateUpPipe128x256C16Bf16
        ) || self.is_warpgroup_gemm()
    }

    /// Whether this is one of the warpgroup GEMMs (`gpu/src/wgmma.rs`).
    pub fn is_warpgroup_gemm(self) -> bool {
        use Kernel::*;
        matches!(self, MatmulWgmma128x256Bf16 | MatmulWgmma128x256C16Bf16 | GateUpWgmma128x256Bf16 | GateUpWgmma128x256C16Bf16 | MatmulWgmma64x128Bf16 | MatmulWgmma64x128C16Bf16 | MatmulWgmma64x64Bf16 | MatmulWgmma64x64ClusterBf16 | GateUpWgmma64x128Bf16 | GateUpWgmma64x128C16Bf16)
    }

    /// Whether this kernel runs only where the compute_80 module was loaded as sm_90a: the
    /// warpgroup GEMMs and the flash attention kernels by warpgroups (`gpu/src/flash_mma.rs`).
    pub fn needs_sm90a(self) -> bool {
        self.is_warpgroup_gemm() || matches!(self, Kernel::FlashAttentionWgmmaD64F16 | Kernel::FlashAttentionWgmmaD128F16)
    }

    /// The warpgroup (sm_90a) kernel that computes what `self` does, the same tile and
    /// parameters: the pipelined bf16 GEMMs and gate/up pairs of 128 × 256, 64 × 128 and 64 × 64
    /// tiles (64 × 64 also split in a cluster; not the grid-split one, which writes a workspace),
    /// and the tensor-core flash attention kernels.
    pub fn wgmma_variant(self) -> Option<Kernel> {
        match self {
            Kernel::MatmulMmaPipe128x256Bf16 => Some(Kernel::MatmulWgmma128x256Bf16),
            Kernel::MatmulMmaPipe128x256C16Bf16 => Some(Kernel::MatmulWgmma128x256C16Bf16),
            Kernel::GateUpPipe128x256Bf16 => Some(Kernel::GateUpWgmma128x256Bf16),
            Kernel::GateUpPipe128x256C16Bf16 => Some(Kernel::GateUpWgmma128x256C16Bf16),
            Kernel::MatmulMmaPipe64x128Bf16 => Some(Kernel::MatmulWgmma64x128Bf16),
            Kernel::MatmulMmaPipe64x128C16Bf16 => Some(Kernel::MatmulWgmma64x128C16Bf16),
            Kernel::MatmulMmaPipe64x64Bf16 => Some(Kernel::MatmulWgmma64x64Bf16),
            Kernel::MatmulMmaPipe64x64ClusterBf16 => Some(Kernel::MatmulWgmma64x64ClusterBf16),
            Kernel::GateUpPipe64x128Bf16 => Some(Kernel::GateUpWgmma64x128Bf16),
            Kernel::GateUpPipe64x128C16Bf16 => Some(Kernel::GateUpWgmma64x128C16Bf16),
            Kernel::FlashAttentionMmaD64F16 => Some(Kernel::FlashAttentionWgmmaD64F16),
            Kernel::FlashAttentionMmaD128F16 => Some(Kernel::FlashAttentionWgmmaD128F16),
            _ => None,
        }
    }

    /// The dynamic shared memory this kernel always launches with (the module loader raises the
    /// kernel's limit to it: past the default 48 KiB for some), or 0 for kernels that size it
    /// per launch or use none.
    pub fn large_shared_bytes(self) -> u32 {
        use gpu::params::mma_pipe_tile::shared_bytes;
        use Kernel::*;
        match self {
            MatmulMmaPipeF16 | MatmulMmaPipeBf16 | MatmulMmaPipeC16Bf16 => shared_bytes(128, 128),
            MatmulMmaPipe64x128F16 | MatmulMmaPipe64x128Bf16 | GateUpPipe64x128F16 | GateUpPipe64x128Bf16 | MatmulMmaPipe64x128C16Bf16 | GateUpPipe64x128C16Bf16 => shared_bytes(64, 128),
            MatmulMmaPipe64x64F16 | MatmulMmaPipe64x64Bf16 | MatmulMmaPipe64x64SplitF16 | MatmulMmaPipe64x64SplitBf16 | MatmulMmaPipe64x64ClusterF16 | MatmulMmaPipe64x64ClusterBf16 => shared_bytes(64, 64),
            MatmulMmaPipe128x256F16 | MatmulMmaPipe128x256Bf16 | MatmulMmaPipe128x256C16Bf16 | GateUpPipe128x256F16 | GateUpPipe128x256Bf16 | GateUpPipe128x256C16Bf16 => shared_bytes(128, 256),
            MatmulWgmma128x256Bf16 | MatmulWgmma128x256C16Bf16 | GateUpWgmma128x256Bf16 | GateUpWgmma128x256C16Bf16 => gpu::params::wgmma_tile::shared_bytes(128, 256),
            MatmulWgmma64x128Bf16 | MatmulWgmma64x128C16Bf16 | GateUpWgmma64x128Bf16 | GateUpWgmma64x128C16Bf16 => gpu::params::wgmma_tile::shared_bytes(64, 128),
            MatmulWgmma64x64Bf16 | MatmulWgmma64x64ClusterBf16 => gpu::params::wgmma_tile::shared_bytes(64, 64),
            AttentionPagedF16 => gpu::params::attn_paged_tile::SHARED_BYTES,
            AttentionPagedMmaF16 => gpu::params::attn_paged_mma_tile::SHARED_BYTES,
            FlashAttentionWgmmaD64F16 => gpu::params::flash_mma_tile::wg_shared_bytes(64) as u32,
            _ => 0,
        }
    }

    /// A cap on this kernel's registers per thread (PTX `.maxnreg`), where the compiler's own
    /// choice would halve the blocks an SM holds: the 16-row SwiGLU kernels take 132 registers
    /// on sm_90 (one block of 256 threads per SM), the 128 × 128 pipelined GEMMs 129-150
    /// (by ptxas version and main loop); at 128 (no spills) two fit. The 64-dim flash attention
    /// by warpgroups (256 threads) takes 168: at 128 two blocks fit instead of one.
    pub fn max_registers(self) -> Option<u32> {
        use Kernel::*;
        match self {
            GateUpSkinnyM16F16 | GateUpSkinnyM16Bf16 | GateUpSkinnyM16A16F16 | GateUpSkinnyM16A16Bf16 => Some(128),
            // at 118-128 without the cap (CUDA 13.5, sm_80 / sm_90); capped so that
            // `skinny_tile::resident`'s two blocks per SM hold whatever the compiler picks
            MatmulSkinnyM16F16 | MatmulSkinnyM16Bf16 | MatmulSkinnyM16A16F16 | MatmulSkinnyM16A16Bf16 => Some(128),
            MatmulMmaPipeBf16 | MatmulMmaPipeF16 | MatmulMmaPipeC16Bf16 => Some(128),
            FlashAttentionWgmmaD64F16 => Some(128),
            _ => None,
        }
    }

    /// Whether this is an f16 tensor-core kernel, which needs its activations' row scales.
    pub fn needs_row_scale(self) -> bool {
        use Kernel::*;
        matches!(
            self,
            MatmulMmaF16 | MatmulMma64x128F16 | MatmulMma64x64F16 | MatmulMma64x64SplitF16 | MatmulSkinnyM16F16 | MatmulSkinnyM32F16
                | MatmulSkinnyM16A16F16 | MatmulSkinnyM32A16F16
                | MatmulMmaPipeF16 | MatmulMmaPipe64x128F16 | MatmulMmaPipe64x64F16 | MatmulMmaPipe64x64SplitF16 | MatmulMmaPipe64x64ClusterF16 | GateUpPipeF16 | GateUpPipe64x128F16
                | MatmulMmaPipe128x256F16 | GateUpPipe128x256F16
        )
    }

    /// The embedding lookup for a table of `dtype`.
    pub fn embedding(dtype: DType) -> Result<Kernel> {
        by_weight(dtype, [Kernel::EmbeddingF32, Kernel::EmbeddingF16, Kernel::EmbeddingBf16])
    }

    /// The scalar GEMV for weights of `dtype` (any `k`).
    pub fn gemv(dtype: DType) -> Result<Kernel> {
        by_weight(dtype, [Kernel::GemvF32, Kernel::GemvF16, Kernel::GemvBf16])
    }

    /// The 16-byte-vector GEMV for weights of `dtype`.
    pub fn gemv_vec(dtype: DType) -> Result<Kernel> {
        by_weight(dtype, [Kernel::GemvVecF32, Kernel::GemvVecF16, Kernel::GemvVecBf16])
    }

    /// The gate/up SwiGLU GEMV for weights of `dtype`.
    pub fn gemv_gate_up(dtype: DType) -> Result<Kernel> {
        by_weight(dtype, [Kernel::GemvGateUpF32, Kernel::GemvGateUpF16, Kernel::GemvGateUpBf16])
    }

    /// A kernel over a KV cache of `dtype`: `[for f32, for f16]`.
    pub fn by_kv(dtype: DType, kernels: [Kernel; 2]) -> Result<Kernel> {
        match dtype {
            DType::F32 => Ok(kernels[0]),
            DType::F16 => Ok(kernels[1]),
            other => Err(Error::DType { op: kernels[0].name(), expected: "an f32 or f16 KV cache", got: other }),
        }
    }
}

impl Kernel {
    /// The quantized GEMV (8-bit activations, `dp4a`) for weights of the block type `dtype`.
    pub fn mmvq(dtype: DType) -> Result<Kernel> {
        by_block(dtype, [Kernel::MmvqQ8_0, Kernel::MmvqQ4K, Kernel::MmvqQ6K])
    }

    /// The quantized gate/up SwiGLU GEMV for weights of the block type `dtype`.
    pub fn mmvq_gate_up(dtype: DType) -> Result<Kernel> {
        by_block(dtype, [Kernel::MmvqGateUpQ8_0, Kernel::MmvqGateUpQ4K, Kernel::MmvqGateUpQ6K])
    }

    /// The row dequantizer (to f32 or f16) for weights of the block type `dtype`.
    pub fn dequant_rows(dtype: DType) -> Result<Kernel> {
        by_block(dtype, [Kernel::DequantRowsQ8_0, Kernel::DequantRowsQ4K, Kernel::DequantRowsQ6K])
    }
}

/// The kernel of `[f16, bf16, f16 with 16-bit activations, bf16 with 16-bit activations]` for
/// 16-bit weights of `dtype`.
fn by_half(dtype: DType, a16: bool, kernels: [Kernel; 4], op: &'static str) -> Result<Kernel> {
    match (dtype, a16) {
        (DType::F16, false) => Ok(kernels[0]),
        (DType::BF16, false) => Ok(kernels[1]),
        (DType::F16, true) => Ok(kernels[2]),
        (DType::BF16, true) => Ok(kernels[3]),
        (other, _) => Err(Error::DType { op, expected: "f16 or bf16 weights", got: other }),
    }
}

/// The kernel of `[q8_0, q4_k, q6_k]` for weights of the block type `dtype`.
fn by_block(dtype: DType, kernels: [Kernel; 3]) -> Result<Kernel> {
    match dtype {
        DType::Q8_0 => Ok(kernels[0]),
        DType::Q4K => Ok(kernels[1]),
        DType::Q6K => Ok(kernels[2]),
        other => Err(Error::DType { op: kernels[0].name(), expected: "q8_0, q4_k or q6_k weights", got: other }),
    }
}

/// The kernel of `[f32, f16, bf16]` for weights of `dtype`.
fn by_weight(dtype: DType, kernels: [Kernel; 3]) -> Result<Kernel> {
    match dtype {
        DType::F32 => Ok(kernels[0]),
        DType::F16 => Ok(kernels[1]),
        DType::BF16 => Ok(kernels[2]),
        other => Err(Error::DType { op: kernels[0].name(), expected: "f32, f16 or bf16 weights", got: other }),
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
    fn a_register_cap_goes_between_an_entrys_parameters_and_its_body() {
        let text = ".visible .entry gate_up_skinny_m16_a16_bf16(\n\t.param .align 8 .b8 p[72]\n)\n{\n\tret;\n}\n.visible .entry rms_norm_f32(\n\t.param .b8 q[8]\n)\n{\n\tret;\n}\n";
        let capped = Ptx { arch: Arch::Compute80, text }.text_with_caps();
        assert_eq!(Kernel::GateUpSkinnyM16A16Bf16.max_registers(), Some(128));
        assert!(capped.contains("p[72]\n)\n.maxnreg 128\n{"), "{}", capped);
        // one directive: the kernel without a cap is left as it was
        assert_eq!(capped.matches(".maxnreg").count(), 1);
        assert!(capped.contains("q[8]\n)\n{"));
    }

    #[test]
    fn compute_9_devices_get_the_grid_dependency_instructions_and_others_keep_comments() {
        let text = ".version 7.8\n.target sm_80\n.address_size 64\n.visible .entry gemv_vec_bf16(\n\t.param .b8 p[8]\n)\n{\n\t// qwen3vl:griddepcontrol.wait\n\t// qwen3vl:griddepcontrol.launch_dependents\n\tret;\n}\n.visible .entry rms_norm_f32(\n\t.param .b8 q[8]\n)\n{\n\t// qwen3vl:barrier.cluster.arrive.aligned;\n\t// qwen3vl:mapa.shared::cluster.u64 %rd1, %rd2, %r3;\n\tret;\n}\n";
        let ptx = Ptx { arch: Arch::Compute80, text };
        let (h100, overlap) = ptx.text_for((9, 0), true);
        assert!(overlap);
        assert!(h100.contains(".target sm_90\n") && !h100.contains("sm_80"), "{}", h100);
        assert!(h100.contains("\tgriddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n"), "{}", h100);
        // the other sm_90 instructions (thread-block clusters) run too
        assert!(h100.contains("\tbarrier.cluster.arrive.aligned;\n\tmapa.shared::cluster.u64 %rd1, %rd2, %r3;\n") && !h100.contains(SM90_MARK), "{}", h100);
        let waiting = Ptx::waiting_entries(&h100);
        assert!(waiting.contains(Kernel::GemvVecBf16.name()));
        assert!(!waiting.contains(Kernel::RmsNormF32.name()));
        assert_eq!(waiting.len(), 1);
        // an Ampere device, the switch off, or the compute_61 module: comments, no overlap
        for (p, cc, on) in [(ptx, (8, 6), true), (ptx, (9, 0), false), (Ptx { arch: Arch::Compute61, text }, (9, 0), true)] {
            let (plain, overlap) = p.text_for(cc, on);
            assert!(!overlap);
            assert!(plain.contains(GRID_DEP_WAIT) && !plain.contains("griddepcontrol.wait;"));
            assert!(plain.contains("// qwen3vl:barrier.cluster.arrive.aligned;") && !plain.contains("\tbarrier.cluster"));
            assert!(Ptx::waiting_entries(&plain).is_empty());
        }
    }

    #[test]
    fn exactly_compute_9_0_gets_the_warpgroup_instructions_as_sm_90a() {
        let text = ".version 7.8\n.target sm_80\n.address_size 64\n.visible .entry matmul_wgmma_128x256_bf16(\n\t.param .b8 p[8]\n)\n{\n\t// qwen3vl:griddepcontrol.wait\n\t// qwen3vl90a:wgmma.fence.sync.aligned;\n\tret;\n}\n";
        let ptx = Ptx { arch: Arch::Compute80, text };
        let (h100, overlap) = ptx.text_for((9, 0), true);
        assert!(overlap && Ptx::is_sm90a(&h100), "{}", h100);
        assert!(h100.starts_with(".version 8.0\n.target sm_90a\n"), "{}", h100);
        assert!(h100.contains("\tgriddepcontrol.wait;\n\twgmma.fence.sync.aligned;\n") && !h100.contains(SM90A_MARK), "{}", h100);
        // a newer device (no wgmma), or no overlap: the instruction stays a comment, and no
        // module is sm_90a
        for (cc, on) in [((10, 0), true), ((9, 0), false), ((8, 0), true)] {
            let (other, _) = ptx.text_for(cc, on);
            assert!(!Ptx::is_sm90a(&other) && other.contains("// qwen3vl90a:wgmma.fence.sync.aligned;") && other.contains(".version 7.8\n"), "{:?}: {}", cc, other);
        }
        // the loader's fallback: sm_90 with its grid dependencies, the warpgroup marks comments
        let (plain, overlap) = ptx.text_for_with((9, 0), true, false);
        assert!(overlap && !Ptx::is_sm90a(&plain) && plain.contains(".target sm_90\n") && plain.contains("\tgriddepcontrol.wait;\n\t// qwen3vl90a:wgmma.fence"), "{}", plain);
        assert!(Kernel::MatmulWgmma128x256Bf16.needs_sm90a() && !Kernel::MatmulMmaPipe128x256Bf16.needs_sm90a());
        assert_eq!(Kernel::MatmulMmaPipe128x256C16Bf16.wgmma_variant(), Some(Kernel::MatmulWgmma128x256C16Bf16));
        assert_eq!(Kernel::MatmulMmaPipe128x256F16.wgmma_variant(), None);
        // the flash kernels by warpgroups: sm_90a only, not GEMMs (no 16-bit activations), the
        // 64-dim one with its double-buffered dynamic shared memory raised at load
        for (mma, wg) in [(Kernel::FlashAttentionMmaD64F16, Kernel::FlashAttentionWgmmaD64F16), (Kernel::FlashAttentionMmaD128F16, Kernel::FlashAttentionWgmmaD128F16)] {
            assert_eq!(mma.wgmma_variant(), Some(wg));
            assert!(wg.needs_sm90a() && !wg.is_warpgroup_gemm() && !wg.reads_a16() && !mma.needs_sm90a());
        }
        assert_eq!(Kernel::FlashAttentionWgmmaD64F16.large_shared_bytes() as usize, gpu::params::flash_mma_tile::wg_shared_bytes(64));
        assert!(gpu::params::flash_mma_tile::wg_shared_bytes(64) > 48 * 1024 && gpu::params::flash_mma_tile::wg_shared_bytes(128) == 0);
    }

    #[test]
    fn names_are_unique_and_follow_the_scheme() {
        let mut names: Vec<_> = Kernel::ALL.iter().map(|k| k.name()).collect();
        for n in &names {
            let suffixes = ["_f32", "_f16", "_bf16", "_u32", "_q8_0", "_q4_k", "_q6_k"];
            assert!(suffixes.iter().any(|s| n.ends_with(s)), "{} lacks a dtype suffix", n);
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Kernel::ALL.len());
    }

    #[test]
    fn table_order_is_the_index() {
        for (i, k) in Kernel::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
    }

    #[test]
    fn ptx_entries_are_parsed() {
        let ptx = ".version 7.8\n.visible .entry gemv_f32(\n\t.param .b8 p[56]\n)\n.visible .entry softmax_f32(\n";
        assert_eq!(ptx_entries(ptx), vec!["gemv_f32", "softmax_f32"]);
    }

    #[test]
    fn kernels_requests_parse() {
        assert_eq!("auto".parse::<KernelsRequest>().unwrap(), KernelsRequest::Auto);
        assert_eq!("compute_61".parse::<KernelsRequest>().unwrap(), KernelsRequest::Force(Arch::Compute61));
        assert_eq!("80".parse::<KernelsRequest>().unwrap(), KernelsRequest::Force(Arch::Compute80));
        assert!("sm_75".parse::<KernelsRequest>().is_err());
    }
}
