//! Block tables of a paged KV cache, as attention reads them: for each query row of a batched
//! step, the KV blocks of its sequence and how many keys it sees. Made once per step on the
//! host (checked there) and uploaded, so every layer's [`crate::Backend::attention_paged`]
//! reuses it, as a [`crate::BlockMask`] is reused.

use crate::{Backend, Error, Result, Tensor};

/// The block tables of a step's query rows (see the module docs).
pub struct Pages {
    /// Cache rows per block (a power of two).
    block: usize,
    /// Cache rows the blocks lie in.
    slots: usize,
    /// Table entries per row on the backend (the longest row's block count, at least 1, or
    /// the capacity [`Pages::with_capacity`] gave).
    stride: usize,
    /// Entries per row of the host copy: the longest row's block count, at least 1 (the
    /// backend's entries past it are stale after [`Pages::write`]: no row reads them).
    width: usize,
    /// `[rows, width]` block ids (unused entries 0).
    table: Vec<u32>,
    /// `[rows]` keys each row sees.
    lens: Vec<u32>,
    dev_table: Tensor,
    dev_lens: Tensor,
}

impl Pages {
    /// Query row `i` sees keys `0 .. rows[i].1`, held in blocks `rows[i].0` of `block` cache rows
    /// each (a power of two), in caches of `slots` rows. Checks that every row sees at least
    /// one key, that its blocks hold its keys and that every block lies inside the caches, then
    /// uploads the tables to `b`.
    pub fn new(b: &dyn Backend, block: usize, slots: usize, rows: &[(&[u32], usize)]) -> Result<Pages> {
        let stride = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(1);
        let (table, lens) = tables(block, slots, stride, rows)?;
        let dev_table = b.upload_u32(&[rows.len(), stride], &table)?;
        let dev_lens = b.upload_u32(&[rows.len()], &lens)?;
        Ok(Pages { block, slots, stride, width: stride, table, lens, dev_table, dev_lens })
    }

    /// Tables of a fixed size on `b` for `rows` query rows of at most `stride` blocks each, to be
    /// filled by [`Pages::write`] before each use: a recorded step reads them where they are.
    /// Every row sees key 0 of block 0 until then.
    pub fn with_capacity(b: &dyn Backend, block: usize, slots: usize, rows: usize, stride: usize) -> Result<Pages> {
        let stride = stride.max(1);
        let first: Vec<(&[u32], usize)> = vec![(&[0u32][..], 1); rows];
        let (table, lens) = tables(block, slots, stride, &first)?;
        let dev_table = b.upload_u32(&[rows, stride], &table)?;
        let dev_lens = b.upload_u32(&[rows], &lens)?;
        Ok(Pages { block, slots, stride, width: stride, table, lens, dev_table, dev_lens })
    }

    /// Rewrites the tables in place for `rows` (checked as [`Pages::new`] checks them; as many
    /// rows as the tables have, each of at most [`Pages::stride`] blocks).
    pub fn write(&mut self, b: &dyn Backend, rows: &[(&[u32], usize)]) -> Result<()> {
        if rows.len() != self.lens.len() {
            return Err(Error::Limit { op: "pages", msg: format!("{} rows for tables of {}", rows.len(), self.lens.len()) });
        }
        // only the columns the rows use: the kernels read a row's entries up to its key count
        // (a recorded step's table is as wide as the whole cache, ~0.4 MB for 64 rows)
        let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(1);
        if width > self.stride {
            return Err(Error::Limit { op: "pages", msg: format!("a row holds {} blocks, more than the table's {}", width, self.stride) });
        }
        let (table, lens) = tables(self.block, self.slots, width, rows)?;
        b.write_u32_cols(&mut self.dev_table, &table, width)?;
        b.write_u32(&mut self.dev_lens, &lens)?;
        self.table = table;
        self.width = width;
        self.lens = lens;
        Ok(())
    }

    /// Query rows.
    pub fn rows(&self) -> usize {
        self.lens.len()
    }

    /// Cache rows per block.
    pub fn block(&self) -> usize {
        self.block
    }

    /// Cache rows the blocks lie in (caches must have at least these).
    pub fn cache_rows(&self) -> usize {
        self.slots
    }

    /// Table entries per row.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The keys row `i` sees.
    pub fn len(&self, i: usize) -> usize {
        self.lens[i] as usize
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// The cache rows of keys `0 .. n` of row `i`.
    pub fn slots(&self, i: usize, n: usize) -> Vec<u32> {
        let (t, shift) = (&self.table[i * self.width..(i + 1) * self.width], self.block.trailing_zeros());
        (0..n).map(|j| (t[j >> shift] << shift) | (j as u32 & (self.block as u32 - 1))).collect()
    }

    /// `[rows, stride]` u32 block ids on the backend.
    pub fn table(&self) -> &Tensor {
        &self.dev_table
    }

    /// `[rows]` u32 key counts on the backend.
    pub fn lens(&self) -> &Tensor {
        &self.dev_lens
    }
}

/// The host tables of `rows` (see [`Pages::new`]) at `stride` entries a row: `[rows, stride]`
/// block ids (unused entries 0) and `[rows]` key counts, after the checks.
fn tables(block: usize, slots: usize, stride: usize, rows: &[(&[u32], usize)]) -> Result<(Vec<u32>, Vec<u32>)> {
    const OP: &str = "pages";
    let bad = |msg: String| Error::Limit { op: OP, msg };
    if block == 0 || !block.is_power_of_two() || slots > u32::MAX as usize {
        return Err(bad(format!("blocks of {} rows in caches of {} rows: the block must be a power of two", block, slots)));
    }
    let mut table = vec![0u32; rows.len() * stride];
    let mut lens = Vec::with_capacity(rows.len());
    for (i, &(blocks, len)) in rows.iter().enumerate() {
        if len == 0 || len > blocks.len() * block {
            return Err(bad(format!("row {} sees {} keys in {} blocks of {}", i, len, blocks.len(), block)));
        }
        if blocks.len() > stride {
            return Err(bad(format!("row {} holds {} blocks, more than the table's {}", i, blocks.len(), stride)));
        }
        if let Some(&id) = blocks.iter().find(|&&id| (id as usize + 1) * block > slots) {
            return Err(bad(format!("row {}: block {} lies outside the {} cache rows", i, id, slots)));
        }
        table[i * stride..i * stride + blocks.len()].copy_from_slice(blocks);
        lens.push(len as u32);
    }
    Ok((table, lens))
}

/// Rows `slots` of a cache `[cap, kv_heads, d]` (f32 or f16) as `[slots.len(), kv_heads, d]`
/// f32: a sequence's keys or values gathered out of a paged cache.
pub fn gather_cache_rows<B: Backend + ?Sized>(b: &B, cache: &Tensor, slots: &[u32]) -> Result<Tensor> {
    let (flat, row) = cache_rows(cache)?;
    b.embedding(&flat, slots)?.reshape(&[slots.len(), row[0], row[1]])
}

/// [`gather_cache_rows`] by slots already on `b`: `ids` a u32 `[n]` tensor
/// ([`Backend::embedding_gather`]).
pub fn gather_cache_rows_at<B: Backend + ?Sized>(b: &B, cache: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (flat, row) = cache_rows(cache)?;
    let n = ids.shape().first().copied().unwrap_or(0);
    b.embedding_gather(&flat, ids)?.reshape(&[n, row[0], row[1]])
}

/// A cache `[cap, kv_heads, d]` as a table of `cap` rows, and its row shape.
fn cache_rows(cache: &Tensor) -> Result<(Tensor, [usize; 2])> {
    let s = cache.shape();
    if s.len() != 3 {
        return Err(Error::shape("gather_cache_rows", &[s], "the cache must be [cap, kv_heads, d]"));
    }
    Ok((cache.reshape(&[s[0], s[1] * s[2]])?, [s[1], s[2]]))
}
