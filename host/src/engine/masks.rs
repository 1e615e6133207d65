//! The masks of allowed next tokens for a step's rows under constraints (grammars), computed on
//! the host while the device runs the step's forward, and handed to the device sampler with
//! the pick (`Backend::sample_step`'s `mask`).

use super::Seq;
use rayon::prelude::*;

/// Fills `out` (`[seqs.len(), words]` u32) with the mask of allowed next tokens of each sequence
/// `running[seqs[i]]` (distinct indices): all ones for one without constraints; several masked
/// sequences in parallel (a grammar's mask takes tens of microseconds). Returns which ones
/// failed: their constraint could not give a mask (logged here; their row is all ones, and the
/// caller drops the token drawn and ends the sequence with `Stop::Constraint`), so one broken
/// grammar fails its own sequence, not the step.
pub(super) fn fill_masks(running: &mut [Seq], seqs: &[usize], words: usize, out: &mut [u32]) -> Vec<bool> {
    debug_assert_eq!(out.len(), seqs.len() * words);
    let mut row_of: Vec<Option<usize>> = vec![None; running.len()];
    for (i, &s) in seqs.iter().enumerate() {
        row_of[s] = Some(i);
    }
    let mut rows: Vec<Option<&mut [u32]>> = out.chunks_mut(words.max(1)).map(Some).collect();
    let mut jobs = Vec::new();
    for (s, seq) in running.iter_mut().enumerate() {
        let Some(i) = row_of[s] else { continue };
        let Some(row) = rows[i].take() else { continue };
        if seq.sampler.masks() {
            jobs.push((i, seq.id, &mut seq.sampler, row));
        } else {
            row.fill(u32::MAX);
        }
    }
    let fill = |(i, id, sampler, row): (usize, u64, &mut crate::generate::Sampler, &mut [u32])| {
        match sampler.fill_mask(row) {
            Ok(()) => None,
            Err(e) => {
                log::error!("engine: sequence {}: its constraint gave no mask of allowed tokens: {}", id, e);
                row.fill(u32::MAX);
                Some(i)
            }
        }
    };
    let bad: Vec<usize> = if jobs.len() > 1 { jobs.into_par_iter().filter_map(fill).collect() } else { jobs.into_iter().filter_map(fill).collect() };
    let mut failed = vec![false; seqs.len()];
    for i in bad {
        failed[i] = true;
    }
    failed
}
