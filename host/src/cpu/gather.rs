//! Row gathers and copies on the CPU: embedding lookup and KV-cache writes.

use super::linear::Weights;
use super::pool;

/// `out[r, :] = table[ids[r], :]` widened to f32; ids were validated by the caller.
pub fn embedding(table: Weights<'_>, hidden: usize, ids: &[u32], out: &mut [f32]) {
    pool::chunks_mut(&mut out[..ids.len() * hidden], hidden.max(1), |r, row| table.widen_rows(ids[r] as usize, 1, hidden, row));
}

/// `out[r, :] = table[ids[r], :]` dequantized from block type `dt` (rows of `row_bytes` bytes);
/// ids were validated by the caller.
pub fn embedding_blocks(dt: crate::DType, table: &[u8], row_bytes: usize, hidden: usize, ids: &[u32], out: &mut [f32]) {
    pool::chunks_mut(&mut out[..ids.len() * hidden], hidden.max(1), |i, row| {
        let r = ids[i] as usize;
        crate::quant::dequantize(dt, &table[r * row_bytes..(r + 1) * row_bytes], row);
    });
}
