//! Block-quantized weights as the CUDA backend stores them, and the pure per-block math shared
//! by the GPU kernels (`mmvq`, `dequant`) and the host (`host/src/quant`, the upload repack), so
//! each formula exists once. Compiles for the host and for the GPU.
//!
//! # Device layouts
//! GGUF blocks are 34 (`Q8_0`), 144 (`Q4_K`) and 210 (`Q6_K`) bytes, so most `Q8_0` and `Q6_K`
//! blocks start at addresses no 16-byte load can use. The CUDA backend stores a quantized
//! `[n, k]` tensor with the same bytes regrouped into planes (structure of arrays) so every
//! plane is 16-byte aligned and the kernels read weights with 16-byte loads:
//! - `Q8_0`: `qs [n, k]` int8, then `d [n, k / 32]` f16 ([`q8_0_d_at`]).
//! - `Q4_K`: unchanged (144 = 9 × 16: every super-block is aligned already).
//! - `Q6_K`: `ql [n · s, 128]`, `qh [n · s, 64]`, `scales [n · s, 16]` int8, `d [n · s]` f16,
//!   with `s = k / 256` super-blocks per row ([`q6_k_planes`]).
//! The total size equals the GGUF size.

/// Elements per `Q8_0` block.
pub const QK8_0: usize = 32;
/// Elements per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes per `Q4_K` super-block.
pub const Q4_K_BYTES: usize = 144;
/// Bytes per `Q6_K` super-block.
pub const Q6_K_BYTES: usize = 210;

/// Byte offset of the `d` plane of a planar `Q8_0` tensor of `n` rows of `k` values.
#[inline(always)]
pub const fn q8_0_d_at(n: usize, k: usize) -> usize {
    n * k
}

/// Byte offsets `(qh, scales, d)` of the planes of a planar `Q6_K` tensor of `blocks` super-blocks
/// (`ql` starts at 0).
#[inline(always)]
pub const fn q6_k_planes(blocks: usize) -> (usize, usize, usize) {
    (blocks * 128, blocks * 192, blocks * 208)
}

/// `(sc_j, m_j)` of `Q4_K` sub-block `j < 8` from the 12 packed scale bytes (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
pub fn q4_k_scale_min(scales: &[u8; 12], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    }
}

/// The 12 scale bytes of a `Q4_K` super-block from its first 16 bytes read as 4 little-endian
/// words (`d`, `dmin` in word 0).
#[inline(always)]
pub fn q4_k_scale_bytes(head: [u32; 4]) -> [u8; 12] {
    let (a, b, c) = (head[1].to_le_bytes(), head[2].to_le_bytes(), head[3].to_le_bytes());
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3]]
}

/// Where element `e < 256` of a `Q6_K` super-block keeps its bits: `(ql byte, high nibble?,
/// qh byte, qh shift)`. Half `h = e / 128`, quarter `t = (e % 128) / 32`, `l = e % 32`: the low
/// four bits are in `ql[64h + l + 32 (t & 1)]` (high nibble for `t ≥ 2`), the top two at bit
/// `2t` of `qh[32h + l]`.
#[inline(always)]
pub const fn q6_k_bits_at(e: usize) -> (usize, bool, usize, u32) {
    let (h, t, l) = (e / 128, (e % 128) / 32, e % 32);
    (64 * h + l + 32 * (t & 1), t >= 2, 32 * h + l, 2 * t as u32)
}

/// Four 6-bit `Q6_K` values packed in a word (one per byte, 0 ..= 63) minus 32 each, as four
/// signed bytes: each byte's top bit is set first so the per-byte subtraction cannot borrow
/// from its neighbour, then flipped back.
#[inline(always)]
pub const fn q6_k_center(q: u32) -> u32 {
    ((q | 0x8080_8080).wrapping_sub(0x2020_2020)) ^ 0x8080_8080
}

/// Layout of a buffer of 8-bit activations (`[m, k]` quantized in blocks of `block`):
/// `qs [m, k]` int8, then `d [m, k / block]` f32, then `bsums [m, k / 16]` i16 (sums of 16
/// consecutive values). Returns the byte offsets of `d` and `bsums` and the total size.
#[inline(always)]
pub const fn act_layout(m: usize, k: usize, block: usize) -> (usize, usize, usize) {
    let d = m * k;
    let bs = d + 4 * (m * k / block);
    (d, bs, bs + 2 * (m * k / 16))
}
