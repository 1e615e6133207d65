//! Dequantization of block-quantized weight rows (`Q8_0`, `Q4_K`, `Q6_K` in the device layouts
//! of `qmath`): the embedding lookup of a quantized token table (f32 rows) and the weight chunks
//! the prefill path feeds to the f16 GEMMs (f16 rows).
//!
//! # Parameters ([`DequantParams`])
//! `w [n, k]` (`k` a multiple of 256), `ids [rows]` u32 or 0 (then rows `row0 ..`; an id `>= n`
//! gives a NaN row, never a read past the table), `out [rows, k]` f32, or f16 bits with `half`.
//! Values are computed as the host's `quant::*::dequantize_block` does (f32), then rounded to
//! f16 (nearest even) for `half`.
//!
//! # Thread mapping
//! One block of `ROW_THREADS` per output row (grid x = rows); thread `t` decodes the groups of
//! `DEQUANT_GROUP` (8) consecutive values `t, t + 256, ...`: one 8-byte load of values (plus the
//! block's scales) and one 16-byte (f16) or two 16-byte (f32) stores per group.
//!
//! # Safety
//! The launcher checks sizes and `k % 256 == 0`. No barriers.

use crate::mem::{f16x2_to_f32, f32_to_f16, ld_nc_u16, ld_nc_v2, ld_nc_v4};
use crate::params::qtile::DEQUANT_GROUP;
use crate::params::DequantParams;
use crate::qmath::{q4_k_scale_bytes, q4_k_scale_min, q6_k_bits_at, q6_k_planes, q8_0_d_at, Q4_K_BYTES, QK8_0, QK_K};
use cuda_std::{kernel, thread};

/// 16 bytes aligned to 16, for vector stores.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct V4([u32; 4]);

#[inline(always)]
fn h2f(h: u16) -> f32 {
    f16x2_to_f32(h as u32).0
}

/// Byte `i` of the 8 bytes `w`.
#[inline(always)]
fn byte(w: [u32; 2], i: usize) -> u32 {
    (w[i / 4] >> (8 * (i % 4))) & 0xff
}

/// One block-quantized type: the 8 values of group `g` (values `8g .. 8g + 8`) of row `row`.
trait QDecode {
    unsafe fn group(w: *const u8, n: usize, k: usize, row: usize, g: usize) -> [f32; 8];
}

struct Q8_0;
struct Q4K;
struct Q6K;

impl QDecode for Q8_0 {
    #[inline(always)]
    unsafe fn group(w: *const u8, n: usize, k: usize, row: usize, g: usize) -> [f32; 8] {
        let q = ld_nc_v2(w.add(row * k + 8 * g) as *const u32);
        let d = h2f(ld_nc_u16((w.add(q8_0_d_at(n, k)) as *const u16).add((row * k + 8 * g) / QK8_0)));
        let mut v = [0.0f32; 8];
        for i in 0..8 {
            v[i] = d * (byte(q, i) as u8 as i8) as f32;
        }
        v
    }
}

impl QDecode for Q4K {
    #[inline(always)]
    unsafe fn group(w: *const u8, _n: usize, k: usize, row: usize, g: usize) -> [f32; 8] {
        let (b, e) = ((8 * g) / QK_K, (8 * g) % QK_K);
        let blk = w.add((row * (k / QK_K) + b) * Q4_K_BYTES);
        let head = ld_nc_v4(blk as *const u32);
        let (j, l) = (e / 32, e % 32);
        let q = ld_nc_v2(blk.add(16 + 32 * (j / 2) + l) as *const u32);
        let (sc, m) = q4_k_scale_min(&q4_k_scale_bytes(head), j);
        let (d, dmin) = f16x2_to_f32(head[0]);
        let (d1, m1) = (d * sc as f32, dmin * m as f32);
        let shift = 4 * (j % 2) as u32;
        let mut v = [0.0f32; 8];
        for i in 0..8 {
            v[i] = d1 * ((byte(q, i) >> shift) & 0xf) as f32 - m1;
        }
        v
    }
}

impl QDecode for Q6K {
    #[inline(always)]
    unsafe fn group(w: *const u8, n: usize, k: usize, row: usize, g: usize) -> [f32; 8] {
        let s = k / QK_K;
        let (b, e) = ((8 * g) / QK_K, (8 * g) % QK_K);
        let i = row * s + b;
        let (qh_at, sc_at, d_at) = q6_k_planes(n * s);
        let (ql_byte, high, qh_byte, qh_shift) = q6_k_bits_at(e);
        let ql = ld_nc_v2(w.add(128 * i + ql_byte) as *const u32);
        let qh = ld_nc_v2(w.add(qh_at + 64 * i + qh_byte) as *const u32);
        let sc = *(w.add(sc_at + 16 * i + e / 16) as *const i8) as f32;
        let dd = h2f(ld_nc_u16(w.add(d_at + 2 * i) as *const u16));
        let lo_shift = if high { 4 } else { 0 };
        let mut v = [0.0f32; 8];
        for x in 0..8 {
            let q = ((byte(ql, x) >> lo_shift) & 0xf) | ((byte(qh, x) >> qh_shift) & 3) << 4;
            v[x] = dd * sc * (q as i32 - 32) as f32;
        }
        v
    }
}

#[inline(always)]
unsafe fn dequant<W: QDecode>(p: DequantParams) {
    let r = thread::block_idx_x() as usize;
    let (n, k) = (p.n as usize, p.k as usize);
    let row = if p.ids != 0 { *(p.ids as *const u32).add(r) as usize } else { p.row0 as usize + r };
    let valid = row < n;
    let w = p.w as *const u8;
    let groups = k / DEQUANT_GROUP;
    let mut g = thread::thread_idx_x() as usize;
    while g < groups {
        let v = if valid { W::group(w, n, k, row, g) } else { [f32::NAN; 8] };
        let at = r * k + DEQUANT_GROUP * g;
        if p.half != 0 {
            let h = |i: usize| f32_to_f16(v[i]) as u32 | (f32_to_f16(v[i + 1]) as u32) << 16;
            *((p.out as *mut u16).add(at) as *mut V4) = V4([h(0), h(2), h(4), h(6)]);
        } else {
            let o = (p.out as *mut f32).add(at) as *mut V4;
            *o = V4([v[0].to_bits(), v[1].to_bits(), v[2].to_bits(), v[3].to_bits()]);
            *o.add(1) = V4([v[4].to_bits(), v[5].to_bits(), v[6].to_bits(), v[7].to_bits()]);
        }
        g += thread::block_dim_x() as usize;
    }
}

/// Rows of planar `Q8_0` weights to f32 / f16. See the module docs.
#[kernel]
pub unsafe fn dequant_rows_q8_0(p: DequantParams) {
    dequant::<Q8_0>(p)
}

/// Rows of `Q4_K` weights to f32 / f16. See the module docs.
#[kernel]
pub unsafe fn dequant_rows_q4_k(p: DequantParams) {
    dequant::<Q4K>(p)
}

/// Rows of planar `Q6_K` weights to f32 / f16. See the module docs.
#[kernel]
pub unsafe fn dequant_rows_q6_k(p: DequantParams) {
    dequant::<Q6K>(p)
}
