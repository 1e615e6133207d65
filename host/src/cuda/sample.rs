//! Token choice on the device (`gpu/src/sample.rs`): per-block top-k, then one pick per row
//! that writes the token id and advances the decode cursor, so a decode step needs no logits
//! on the host.

use super::launch::{ceil_div, fits_u32, need, Launcher};
use super::{CudaBackend, DeviceBuffer};
use crate::backend::DeviceSampling;
use crate::kernels::Kernel;
use crate::{ops, Error, Result, Tensor};
use gpu::params::{sample_row, sample_tile, SampleParams, CURSOR_FIELDS};

/// First-stage blocks per row for a vocabulary of `n`: each stages at most `MAX_SLICE` logits.
pub fn blocks_for(n: usize) -> usize {
    (sample_tile::BLOCKS as usize).max(ceil_div(n, sample_tile::MAX_SLICE))
}

/// Both sampling stages for `rows` rows of `logits` (row stride `ld`) whose first `n` columns
/// are the candidates, keeping `k` of them; with `mask` (`[rows, ceil(n / 32)]` u32), only the
/// ids whose bit is set.
#[allow(clippy::too_many_arguments)]
pub fn sample(l: &Launcher<'_>, logits: &DeviceBuffer, cand: &DeviceBuffer, ids: &DeviceBuffer, cursor: &DeviceBuffer, rows: usize, n: usize, ld: usize, s: &DeviceSampling, mask: Option<&DeviceBuffer>) -> Result<()> {
    sample_with(l, (logits, cand, ids, cursor), rows, n, ld, s, None, mask)
}

/// [`sample`] with each row's own settings (`settings`: `[rows, sample_row::WORDS]` u32, every
/// row's top-k at most `s.candidates()`, the launch's `k`).
#[allow(clippy::too_many_arguments)]
pub fn sample_with(l: &Launcher<'_>, (logits, cand, ids, cursor): (&DeviceBuffer, &DeviceBuffer, &DeviceBuffer, &DeviceBuffer), rows: usize, n: usize, ld: usize, s: &DeviceSampling, settings: Option<&DeviceBuffer>, mask: Option<&DeviceBuffer>) -> Result<()> {
    let kernel = Kernel::SampleTopkF32;
    let (k, blocks) = (s.candidates(), blocks_for(n));
    let mask_words = ceil_div(n, 32);
    if let Some(b) = settings {
        need(kernel, "settings", b, rows * sample_row::WORDS * 4)?;
    }
    if let Some(b) = mask {
        need(kernel, "mask", b, rows * mask_words * 4)?;
    }
    if k == 0 || k > sample_tile::MAX_K || k > n || blocks * k > sample_tile::MAX_CAND {
        return Err(Error::Limit { op: kernel.name(), msg: format!("top_k {} over {} logits needs {} candidates (at most {} of {})", k, n, blocks * k, sample_tile::MAX_K, sample_tile::MAX_CAND) });
    }
    if n > ld {
        return Err(Error::Limit { op: kernel.name(), msg: format!("{} candidates in rows of {} logits", n, ld) });
    }
    need(kernel, "logits", logits, rows * ld * 4)?;
    need(kernel, "cand", cand, rows * blocks * k * 8)?;
    need(kernel, "ids", ids, rows * 4)?;
    need(kernel, "cursor", cursor, rows * CURSOR_FIELDS * 4)?;
    let p = SampleParams {
        logits: logits.addr(),
        cand: cand.addr(),
        ids: ids.addr(),
        cursor: cursor.addr(),
        rows: fits_u32(kernel, "rows", rows)?,
        n: fits_u32(kernel, "n", n)?,
        ld: fits_u32(kernel, "ld", ld)?,
        k: k as u32,
        blocks: blocks as u32,
        temperature: if s.is_greedy() { 0.0 } else { s.temperature },
        top_p: s.top_p,
        seed: s.seed,
        row_settings: settings.map_or(0, |b| b.addr()),
        mask: mask.map_or(0, |b| b.addr()),
        mask_words: fits_u32(kernel, "mask words", mask_words)?,
    };
    if rows == 0 {
        return Ok(());
    }
    let grid_rows = fits_u32(kernel, "rows", rows)?.min(65_535);
    l.launch(kernel, [blocks as u32, grid_rows, 1], sample_tile::THREADS, &p)?;
    l.launch(Kernel::SamplePickF32, [grid_rows, 1, 1], sample_tile::THREADS, &p)
}

impl CudaBackend {
    /// The mask's buffer, after checking its shape.
    fn sample_mask<'t>(&self, op: &'static str, mask: Option<&'t Tensor>, rows: usize, n: usize) -> Result<Option<&'t DeviceBuffer>> {
        mask.map(|m| ops::sample_mask_dims(op, m, rows, n).and_then(|_| self.buffer(op, m))).transpose()
    }

    pub(super) fn sample_step_op(&self, logits: &Tensor, s: &DeviceSampling, n: usize, mask: Option<&Tensor>, ids: &mut Tensor, cursor: &mut Tensor) -> Result<()> {
        const OP: &str = "sample_step";
        let (rows, ld, n) = ops::sample_dims(logits, s, n, ids, cursor, sample_tile::MAX_K)?;
        let mask = self.sample_mask(OP, mask, rows, n)?;
        if rows > 65_535 {
            return Err(Error::Limit { op: OP, msg: format!("{} rows exceed 65535", rows) });
        }
        let l = self.enter()?;
        let cand = self.output(rows * blocks_for(n) * s.candidates() * 2)?;
        sample(&l, self.buffer(OP, logits)?, &cand, self.buffer(OP, ids)?, self.buffer(OP, cursor)?, rows, n, ld, s, mask)
    }
}

impl CudaBackend {
    pub(super) fn sample_step_rows_op(&self, logits: &Tensor, settings: &Tensor, max_k: usize, n: usize, mask: Option<&Tensor>, ids: &mut Tensor, cursor: &mut Tensor) -> Result<()> {
        const OP: &str = "sample_step_rows";
        let (rows, ld, n) = ops::sample_rows_dims(logits, settings, max_k, n, ids, cursor, sample_tile::MAX_K)?;
        let mask = self.sample_mask(OP, mask, rows, n)?;
        if rows > 65_535 {
            return Err(Error::Limit { op: OP, msg: format!("{} rows exceed 65535", rows) });
        }
        // the launch ranks max_k candidates (greedy when 1); each row picks with its own settings
        let launch = DeviceSampling { temperature: 1.0, top_k: max_k, top_p: 1.0, seed: 0 };
        let l = self.enter()?;
        let cand = self.output(rows * blocks_for(n) * max_k * 2)?;
        let bufs = (self.buffer(OP, logits)?, &cand, self.buffer(OP, ids)?, self.buffer(OP, cursor)?);
        sample_with(&l, bufs, rows, n, ld, &launch, Some(self.buffer(OP, settings)?), mask)
    }
}
