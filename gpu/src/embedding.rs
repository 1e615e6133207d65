//! Row gathers and scatters: the embedding lookup (rows of a token table widened to f32), f16
//! rows gathered as they are (the paged KV cache's), the row blend (weighted sums of table
//! rows: the vision tower's interpolated position embeddings) and the row scatter that places
//! image embeddings and DeepStack features into a sequence.
//!
//! # Parameters ([`EmbeddingParams`], [`BlendRowsParams`])
//! `table [vocab, hidden]` (f32/f16/bf16 by kernel), `ids [rows]` u32 (validated `< vocab` by the
//! host when they come from it; an id made on the device that is out of range gives a NaN row,
//! never a read past the table), `out [rows, hidden]` f32. The blend takes `per_row` ids and
//! f32 weights per output row.
//!
//! # Thread mapping
//! One block of `ROW_THREADS` per output row (grid = rows); threads stride over `hidden`.
//!
//! # Safety
//! The launcher validates buffer sizes and the ids. No barriers.

use crate::math::{Bf16, WeightElem, F16};
use crate::params::{BlendRowsParams, EmbeddingParams, ScatterRowsParams};
use cuda_std::{kernel, thread};

#[inline(always)]
unsafe fn embedding<W: WeightElem>(p: EmbeddingParams) {
    let r = thread::block_idx_x() as usize;
    let hidden = p.hidden as usize;
    let id = *(p.ids as *const u32).add(r) as usize;
    let dst = (p.out as *mut f32).add(r * hidden);
    let valid = id < p.vocab as usize;
    let src = (p.table as *const W).add(if valid { id * hidden } else { 0 });
    let mut i = thread::thread_idx_x() as usize;
    while i < hidden {
        *dst.add(i) = if valid { (*src.add(i)).to_f32() } else { f32::NAN };
        i += thread::block_dim_x() as usize;
    }
}

/// Embedding lookup from an f32 table. See the module docs.
#[kernel]
pub unsafe fn embedding_f32(p: EmbeddingParams) {
    embedding::<f32>(p)
}

/// Embedding lookup from an f16 table. See the module docs.
#[kernel]
pub unsafe fn embedding_f16(p: EmbeddingParams) {
    embedding::<F16>(p)
}

/// Embedding lookup from a bf16 table. See the module docs.
#[kernel]
pub unsafe fn embedding_bf16(p: EmbeddingParams) {
    embedding::<Bf16>(p)
}

/// `out[r, :] = table[ids[r], :]` for f16 rows kept f16 (`out [rows, hidden]` f16, `hidden` a
/// multiple of 8): a prefill chunk's keys and values gathered from the paged KV cache for the
/// flash kernels, as they are stored. An id `>= vocab` gives a NaN row.
///
/// Thread mapping: one thread per 16-byte chunk of the output (grid-stride over `rows ·
/// hidden / 8`), so a row of 2 KiB is 128 threads' single vector load and store.
///
/// Safety: the launcher checks the sizes and that `hidden` is a multiple of 8 (rows of whole,
/// 16-byte aligned vectors in buffers the pool aligns to 256 bytes).
#[kernel]
pub unsafe fn gather_rows_f16(p: EmbeddingParams) {
    let per_row = p.hidden as usize / 8;
    let total = p.rows as usize * per_row;
    let (ids, table, out) = (p.ids as *const u32, p.table as *const [u32; 4], p.out as *mut [u32; 4]);
    let stride = (thread::grid_dim_x() * thread::block_dim_x()) as usize;
    let mut i = (thread::block_idx_x() * thread::block_dim_x() + thread::thread_idx_x()) as usize;
    while i < total {
        let (r, c) = (i / per_row, i % per_row);
        let id = *ids.add(r) as usize;
        *out.add(i) = if id < p.vocab as usize { *table.add(id * per_row + c) } else { [0x7e00_7e00; 4] };
        i += stride;
    }
}

/// `out[r] = Σ_j weights[r · per_row + j] · table[ids[r · per_row + j]]` over an f32 table, the
/// terms added in order of `j` (as the host composite does). See the module docs.
#[kernel]
pub unsafe fn blend_rows_f32(p: BlendRowsParams) {
    let r = thread::block_idx_x() as usize;
    let (width, per_row, vocab) = (p.width as usize, p.per_row as usize, p.vocab as usize);
    let (ids, weights) = ((p.ids as *const u32).add(r * per_row), (p.weights as *const f32).add(r * per_row));
    let (table, dst) = (p.table as *const f32, (p.out as *mut f32).add(r * width));
    let mut i = thread::thread_idx_x() as usize;
    while i < width {
        let mut acc = 0.0f32;
        for j in 0..per_row {
            let id = *ids.add(j) as usize;
            acc += if id < vocab { *table.add(id * width + i) * *weights.add(j) } else { f32::NAN };
        }
        *dst.add(i) = acc;
        i += thread::block_dim_x() as usize;
    }
}

/// `out[rows[i]] = src[i]` (or `+=` when `add`), one block per scattered row, threads striding
/// over `width`. Row indices are distinct (image-token positions), so blocks never collide.
#[kernel]
pub unsafe fn scatter_rows_f32(p: ScatterRowsParams) {
    let i = thread::block_idx_x() as usize;
    let width = p.width as usize;
    let r = *(p.rows as *const u32).add(i) as usize;
    let src = (p.src as *const f32).add(i * width);
    let dst = (p.out as *mut f32).add(r * width);
    let mut c = thread::thread_idx_x() as usize;
    while c < width {
        let v = *src.add(c);
        *dst.add(c) = if p.add != 0 { *dst.add(c) + v } else { v };
        c += thread::block_dim_x() as usize;
    }
}
