//! A step's prefill chunks as one attention: each chunk's query rows see, causally, its own
//! sequence's keys where a paged cache holds them (its earlier tokens, then its own). Made once
//! per step on the host (checked there) and uploaded, so every layer's
//! [`crate::Backend::attention_chunks`] reuses it, as [`crate::Pages`] is reused.
//!
//! A device runs all chunks as one masked flash attention: the keys of every chunk gathered one
//! after another, a block-diagonal [`BlockMask`] (chunk `c`'s rows see chunk `c`'s keys only)
//! and a cursor giving each query row the last gathered key it sees (its position in its
//! sequence, offset by where the chunk's keys start). Per chunk separately, a step of many short
//! prompts (a loaded server) launched a take, three gathers, the flash kernel and a write per
//! chunk and layer.

use crate::backend::AttnParams;
use crate::{Backend, BlockMask, Error, Result, Tensor};
use gpu::params::{CURSOR_FIELDS, CURSOR_ROW};

/// A step's prefill chunks (see the module docs).
pub struct Chunks {
    /// Per chunk: its first query row (of the op's `q`), rows, and keys (earlier ones included).
    parts: Vec<(usize, usize, usize)>,
    /// Per chunk: its slots, u32 `[keys]` on the backend.
    ids: Vec<Tensor>,
    /// Every chunk's slots one after the other, u32 `[Σ keys]`.
    all_ids: Tensor,
    /// u32 `[Σ rows, CURSOR_FIELDS]`: at `CURSOR_ROW` the last gathered key each row sees (the
    /// other fields 0).
    cursor: Tensor,
    /// Chunk `c`'s rows × chunk `c`'s gathered keys.
    mask: BlockMask,
}

impl Chunks {
    /// Chunk `c` has `chunks[c].0` query rows (the rows of `q` after those of the chunks before)
    /// and sees the keys at cache rows `chunks[c].1` (its last `chunks[c].0` are its own rows);
    /// `ids[c]` holds those slots on `b` (u32 `[keys]`). Checks that every chunk has a row and
    /// at least as many keys as rows, then uploads the rest to `b`.
    pub fn new(b: &dyn Backend, chunks: &[(usize, &[u32])], ids: Vec<Tensor>) -> Result<Chunks> {
        const OP: &str = "prefill chunks";
        if chunks.is_empty() || ids.len() != chunks.len() {
            return Err(Error::Limit { op: OP, msg: format!("{} chunks with {} slot tensors (at least one chunk)", chunks.len(), ids.len()) });
        }
        let (mut parts, mut all, mut cursor) = (Vec::with_capacity(chunks.len()), Vec::new(), Vec::new());
        let (mut row0, mut key0) = (0usize, 0usize);
        for (c, (&(rows, slots), id)) in chunks.iter().zip(&ids).enumerate() {
            let keys = slots.len();
            if rows == 0 || keys < rows || id.shape() != [keys] {
                return Err(Error::Limit { op: OP, msg: format!("chunk {}: {} rows, {} keys, slots {:?} (a chunk needs a row, its rows among its keys)", c, rows, keys, id.shape()) });
            }
            parts.push((row0, rows, keys));
            all.extend_from_slice(slots);
            for i in 0..rows {
                let mut f = [0u32; CURSOR_FIELDS];
                f[CURSOR_ROW] = u32::try_from(key0 + keys - rows + i).map_err(|_| Error::Limit { op: OP, msg: format!("{} keys exceed u32", key0 + keys) })?;
                cursor.extend_from_slice(&f);
            }
            row0 += rows;
            key0 += keys;
        }
        let bounds = |f: fn(&(usize, usize, usize)) -> usize| -> Vec<usize> {
            std::iter::once(0).chain(parts.iter().scan(0, |s, p| {
                *s += f(p);
                Some(*s)
            })).collect()
        };
        let n = parts.len();
        let allowed: Vec<bool> = (0..n * n).map(|i| i / n == i % n).collect();
        let mask = BlockMask::new(b, &bounds(|p| p.1), &bounds(|p| p.2), &allowed)?;
        let all_ids = b.upload_u32(&[key0], &all)?;
        let cursor = b.upload_u32(&[row0, CURSOR_FIELDS], &cursor)?;
        Ok(Chunks { parts, ids, all_ids, cursor, mask })
    }

    /// The number of chunks.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Query rows of all chunks.
    pub fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.1).sum()
    }

    /// Keys of all chunks (the length of [`Chunks::all_ids`]).
    pub fn keys(&self) -> usize {
        self.parts.iter().map(|p| p.2).sum()
    }

    /// Chunk `c`'s first query row, rows and keys.
    pub fn part(&self, c: usize) -> (usize, usize, usize) {
        self.parts[c]
    }

    /// Chunk `c`'s slots (u32 `[keys]`).
    pub fn ids(&self, c: usize) -> &Tensor {
        &self.ids[c]
    }

    /// Every chunk's slots, one after the other (u32 `[keys()]`).
    pub fn all_ids(&self) -> &Tensor {
        &self.all_ids
    }

    /// Per query row, the last key of [`Chunks::all_ids`]'s gather it sees (u32 `[rows(),
    /// CURSOR_FIELDS]`, at `CURSOR_ROW`).
    pub fn cursor(&self) -> &Tensor {
        &self.cursor
    }

    /// Chunk `c`'s rows see chunk `c`'s keys only.
    pub fn mask(&self) -> &BlockMask {
        &self.mask
    }
}

/// The default body of [`Backend::attention_chunks`] (the CPU path and the test oracle): one
/// [`Backend::attention_slots`] per chunk, written into its rows.
pub fn attention_chunks_composite<B: Backend + ?Sized>(b: &B, q: &Tensor, k_pool: &Tensor, v_pool: &Tensor, scales: Option<&Tensor>, chunks: &Chunks, scale: f32) -> Result<Tensor> {
    let (t, heads, d) = chunks_dims(q, chunks)?;
    let params = |c: usize| {
        let (_, rows, keys) = chunks.part(c);
        AttnParams { kv_len: keys, q_pos0: keys - rows, causal: true, scale }
    };
    if chunks.len() == 1 {
        return b.attention_slots(q, k_pool, v_pool, scales, chunks.ids(0), params(0));
    }
    let mut parts = Vec::with_capacity(chunks.len());
    for c in 0..chunks.len() {
        let (r0, rows, _) = chunks.part(c);
        parts.push((r0, b.attention_slots(&b.take_rows(q, r0, rows)?, k_pool, v_pool, scales, chunks.ids(c), params(c))?));
    }
    join_rows(b, [t, heads, d], parts)
}

/// One `[t, heads, d]` tensor of attention outputs from `parts` (first row, `[rows, heads,
/// d]`) that cover its rows: a single part of all `t` rows as it is, else each written into
/// its rows of a new tensor.
pub fn join_rows<B: Backend + ?Sized>(b: &B, [t, heads, d]: [usize; 3], mut parts: Vec<(usize, Tensor)>) -> Result<Tensor> {
    match parts.len() {
        0 => Err(Error::Limit { op: "attention rows", msg: "a step with no rows".into() }),
        1 if parts[0].0 == 0 && parts[0].1.shape()[0] == t => Ok(parts.remove(0).1),
        _ => {
            let mut out = b.zeros(&[t, heads, d])?;
            for (r0, o) in &parts {
                b.write_rows(&mut out, *r0, o)?;
            }
            Ok(out)
        }
    }
}

/// `(t, heads, d)` of `q`, checked to be `[chunks.rows(), heads, d]`.
pub fn chunks_dims(q: &Tensor, chunks: &Chunks) -> Result<(usize, usize, usize)> {
    match q.shape() {
        &[t, heads, d] if t == chunks.rows() => Ok((t, heads, d)),
        s => Err(Error::shape("attention_chunks", &[s], format!("q must be [{} rows of the chunks, heads, head_dim]", chunks.rows()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuBackend;

    #[test]
    fn cursor_and_mask_follow_the_chunks() {
        let b = CpuBackend::new(Some(1)).unwrap();
        let (s0, s1) = (vec![7u32, 8, 9], vec![1u32, 2, 3, 4, 5]);
        let ids = vec![b.upload_u32(&[3], &s0).unwrap(), b.upload_u32(&[5], &s1).unwrap()];
        // chunk 0: a new prompt of 3 rows; chunk 1: 2 rows after 3 earlier tokens
        let c = Chunks::new(&b, &[(3, &s0), (2, &s1)], ids).unwrap();
        assert_eq!((c.len(), c.rows(), c.keys()), (2, 5, 8));
        assert_eq!(c.part(1), (3, 2, 5));
        assert_eq!(b.download_u32(c.all_ids()).unwrap(), vec![7, 8, 9, 1, 2, 3, 4, 5]);
        let rows: Vec<u32> = b.download_u32(c.cursor()).unwrap().chunks(CURSOR_FIELDS).map(|r| r[CURSOR_ROW]).collect();
        assert_eq!(rows, vec![0, 1, 2, 6, 7]);
        assert_eq!((c.mask().q_bounds(), c.mask().k_bounds()), (&[0usize, 3, 5][..], &[0usize, 3, 8][..]));
    }

    #[test]
    fn bad_chunks_are_refused() {
        let b = CpuBackend::new(Some(1)).unwrap();
        let s = vec![1u32, 2];
        let id = || vec![b.upload_u32(&[2], &s).unwrap()];
        for (rows, what) in [(0usize, "no rows"), (3, "more rows than keys")] {
            assert!(Chunks::new(&b, &[(rows, &s)], id()).is_err(), "{}", what);
        }
        assert!(Chunks::new(&b, &[(1, &s)], vec![b.upload_u32(&[1], &[1]).unwrap()]).is_err(), "slots of another length");
        assert!(Chunks::new(&b, &[], vec![]).is_err(), "no chunks");
    }
}
