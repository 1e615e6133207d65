//! Decode-only steps, recorded once per batch size and replayed (CUDA graphs): a step's inputs
//! (token ids, cursors, block tables) live in tensors of a fixed size per batch size, written
//! from the host before each step, so a recording made by the first step of `n` rows replays
//! every later one. Where steps are recorded, a step's rows are padded to one of a few sizes
//! ([`padded_rows`]; the engine feeds the extra rows into a scratch block and drops their picks),
//! so a batch that drifts through every size as sequences end and join replays a handful of
//! recordings instead of recording each new size. A backend that records nothing (the CPU), a
//! model split over the device and the host, or a recording that failed run the same body as
//! plain launches, unpadded: one path either way.
//!
//! A step with rows under a constraint (a grammar) picks on the device too, with a mask of
//! allowed ids per row: the recorded part is then the forward and the logits (the recording of
//! [`Pick::Host`], which such steps share), launched first; the host computes the masks while
//! the device runs it, writes them, and the masked pick runs after it. Steps without masked
//! rows run exactly as before.

use super::paged::{PagedKv, PagedStep, StepRows};
use crate::backend::{run_recorded, DeviceSampling, Recording};
use crate::pick::mask_words;
use gpu::params::{sample_row, CURSOR_ROW};
use crate::model::Model;
use crate::{Backend, Pages, Result, Tensor};
use gpu::params::CURSOR_FIELDS;

/// Batch sizes whose inputs and recordings are kept at once (the least recently used goes; each
/// recording holds the device memory of one step of its rows, the logits included). Steps are
/// padded to [`padded_rows`], so up to 64 rows this keeps every size a step runs at.
pub const KEPT_BATCH_SIZES: usize = 12;

/// The rows a decode-only step of `n` rows runs with where steps are recorded: `n` rounded up
/// to a power of two up to 8, then to a multiple of 8 up to 64, of 16 up to 128 and of 32 beyond
/// (at most `max_batch`, or `n` if larger). A server's batch drifts through every size as
/// sequences end and join, and each new size cost a recording (capture and instantiation,
/// ~3.5 ms on an H200, against a ~2-3 ms step; 96 recordings in one 64-client load test with a
/// recording per exact size and four kept); padded, a few sizes cover every batch, at the cost
/// of at most 7 idle rows up to 64 (a step of 64 rows takes ~5% longer than one of 47).
pub fn padded_rows(n: usize, max_batch: usize) -> usize {
    let step = match n {
        0..=8 => return n.next_power_of_two().min(max_batch.max(n)),
        9..=64 => 8,
        65..=128 => 16,
        _ => 32,
    };
    ((n + step - 1) / step * step).min(max_batch.max(n))
}

/// How a step's next tokens are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pick {
    /// On the device, inside the step, with settings every row shares (greedy, or temperature,
    /// top-k / top-p and seed; each row's draw numbered by its sequence position).
    Device(DeviceSampling),
    /// On the device, inside the step, each row with its own settings (the slot's
    /// `settings`), ranking `k` candidates (the rows' largest top-k, rounded up to a power of
    /// two so that few recordings cover a server's mix).
    Rows { k: usize },
    /// On the host, from the step's logits.
    Host,
}

/// What a step produced: the next token of each row, or the rows' logits `[rows, vocab]`.
pub enum Picked {
    Tokens(Vec<u32>),
    Logits(Tensor),
}

/// The fixed-size inputs of steps of `rows` rows, and their recording.
struct Slot {
    rows: usize,
    /// `[rows]` u32: the token each row feeds.
    ids: Tensor,
    /// `[rows, 4]` u32: its (t, h, w) position and cache row.
    cursor: Tensor,
    /// `[rows, 4]` u32: each row's draw number for [`Pick::Device`] in its last field (the
    /// index of the token fed in its sequence, as [`crate::generate::Session`] numbers draws).
    draws: Tensor,
    /// `[rows, sample_row::WORDS]` u32: each row's settings for [`Pick::Rows`].
    settings: Tensor,
    /// The rows' block tables, as wide as the whole cache.
    pages: Pages,
    /// The logits of the last [`Pick::Host`] step (in the recording's memory when recorded).
    logits: Option<Tensor>,
    /// `[rows, ceil(vocab / 32)]` u32: each row's mask of allowed ids for a masked pick (made on
    /// the first masked step of this batch size).
    mask: Option<Tensor>,
    recording: Option<(Pick, Recording)>,
    /// Picks whose recording failed (not retried; plain launches instead).
    unrecordable: Vec<Pick>,
    last_used: u64,
}

/// The engine's decode-only steps (see the module docs).
pub struct DecodeSteps {
    slots: Vec<Slot>,
    clock: u64,
    record: bool,
    /// Wall time spent blocked on the steps' results (ns, all steps so far).
    wait_ns: u64,
    /// Recordings made so far (each a capture of a whole step and its instantiation).
    recordings: u64,
}

impl DecodeSteps {
    /// `record`: whether steps may be recorded (never for a model split over the device and the
    /// host: its step crosses to the host and back).
    pub fn new(record: bool) -> DecodeSteps {
        DecodeSteps { slots: Vec::new(), clock: 0, record, wait_ns: 0, recordings: 0 }
    }

    /// Turns recording on or off (off drops the recordings); the tokens are the same either way.
    pub fn set_recording(&mut self, on: bool) {
        self.record = on;
        if !on {
            for s in &mut self.slots {
                s.recording = None;
            }
        }
    }

    /// Whether steps on `b` are padded to [`padded_rows`]: where they are recorded (padding
    /// only adds work to plain launches).
    pub fn pads(&self, b: &dyn Backend) -> bool {
        self.record && b.records()
    }

    /// Wall time the host spent blocked on the steps' picks or logits so far (ns).
    pub fn wait_ns(&self) -> u64 {
        self.wait_ns
    }

    /// Recordings made so far (a new batch size, or one dropped as least recently used).
    pub fn recordings(&self) -> u64 {
        self.recordings
    }

    /// Recordings held now (for tests and logs).
    pub fn recorded(&self) -> usize {
        self.slots.iter().filter(|s| s.recording.is_some()).count()
    }

    /// The slot for steps of `rows` rows on `b`, made (and the least recently used one dropped)
    /// when there is none.
    fn slot(&mut self, b: &dyn Backend, kv: &PagedKv, rows: usize) -> Result<&mut Slot> {
        self.clock += 1;
        if let Some(i) = self.slots.iter().position(|s| s.rows == rows) {
            self.slots[i].last_used = self.clock;
            return Ok(&mut self.slots[i]);
        }
        if self.slots.len() >= KEPT_BATCH_SIZES {
            let oldest = (0..self.slots.len()).min_by_key(|&i| self.slots[i].last_used).expect("slots are kept");
            self.slots.swap_remove(oldest);
        }
        let slots_total = kv.blocks() * kv.block();
        self.slots.push(Slot {
            rows,
            ids: b.upload_u32(&[rows], &vec![0; rows])?,
            cursor: b.upload_u32(&[rows, CURSOR_FIELDS], &vec![0; rows * CURSOR_FIELDS])?,
            draws: b.upload_u32(&[rows, CURSOR_FIELDS], &vec![0; rows * CURSOR_FIELDS])?,
            settings: b.upload_u32(&[rows, sample_row::WORDS], &vec![0; rows * sample_row::WORDS])?,
            pages: Pages::with_capacity(b, kv.block(), slots_total, rows, kv.blocks())?,
            logits: None,
            mask: None,
            recording: None,
            unrecordable: Vec::new(),
            last_used: self.clock,
        });
        Ok(self.slots.last_mut().expect("pushed above"))
    }

    /// Runs the decode step of `rows` (decode rows only: each row a sequence of its own, with
    /// its blocks and the keys it sees, its own included), feeding `ids` at `cursor` (`[rows,
    /// 4]`: position, cache row), and returns the next tokens (`Pick::Device` and `Pick::Rows`,
    /// row `i`'s draw numbered `draws[i]`; `settings`: the rows' settings for `Pick::Rows`) or
    /// the logits.
    ///
    /// `masks`: for a step with rows under constraints (with `Pick::Device` or `Pick::Rows`),
    /// fills the rows' masks of allowed ids (`[rows, ceil(vocab / 32)]` words, all ones for a
    /// row without constraints); called once the step's forward is launched, so the host
    /// computes them while the device runs it. `None`: no row is masked.
    #[allow(clippy::too_many_arguments)]
    pub fn run(&mut self, m: &Model, b: &dyn Backend, kv: &mut PagedKv, rows: &StepRows, ids: &[u32], cursor: &[u32], (draws, settings): (&[u32], &[u32]), pick: Pick, masks: Option<&mut dyn FnMut(&mut [u32]) -> Result<()>>) -> Result<Picked> {
        let n = rows.decode.len();
        debug_assert!(rows.prefill.is_empty(), "a decode-only step");
        let record = self.record;
        // what the step launches (and records): a masked pick comes after the forward and logits
        let masks = masks.filter(|_| pick != Pick::Host);
        let launched = if masks.is_some() { Pick::Host } else { pick };
        let slot = self.slot(b, kv, n)?;
        // 1. the inputs, in place
        b.write_u32(&mut slot.ids, ids)?;
        b.write_u32(&mut slot.cursor, cursor)?;
        match pick {
            Pick::Device(s) if s.is_greedy() => {}
            Pick::Device(_) => b.write_u32(&mut slot.draws, &draw_cursor(draws))?,
            Pick::Rows { .. } => {
                b.write_u32(&mut slot.draws, &draw_cursor(draws))?;
                b.write_u32(&mut slot.settings, settings)?;
            }
            Pick::Host => {}
        }
        let tables: Vec<(&[u32], usize)> = rows.decode.iter().map(|(bl, keys)| (bl.as_slice(), *keys)).collect();
        slot.pages.write(b, &tables)?;
        // 2. the step: replayed, recorded then replayed, or run as plain launches
        let Slot { ids, cursor, draws, settings, pages, logits, mask, recording, unrecordable, .. } = slot;
        let (pages, vocab) = (&*pages, m.sampled_vocab());
        let mut body = || -> Result<()> {
            let x = m.text.embed_ids(b, ids)?; // [rows, hidden]
            let mut step = PagedStep::lent(kv, rows, b, pages);
            let h = m.text.forward_kv(b, x, cursor, &mut step, None)?;
            let l = m.text.logits(b, &h)?; // [rows, vocab]
            match launched {
                Pick::Device(s) => b.sample_step(&l, &s, vocab, None, ids, draws),
                Pick::Rows { k } => b.sample_step_rows(&l, settings, k, vocab, None, ids, draws),
                Pick::Host => {
                    *logits = Some(l);
                    Ok(())
                }
            }
        };
        let records = record && !unrecordable.contains(&launched) && !matches!(recording, Some((k, _)) if *k == launched);
        run_recorded(b, record, recording, unrecordable, launched, &mut body)?;
        let recorded = records && recording.is_some();
        let no_logits = || crate::Error::Device { op: "engine decode step", msg: "the step produced no logits".into() };
        // 3. a masked pick: the masks, on the host while the device runs the forward, then the pick
        if let Some(fill) = masks {
            let mut words = vec![0u32; n * mask_words(vocab)];
            fill(&mut words)?;
            match &mut *mask {
                Some(t) => b.write_u32(t, &words)?,
                none => *none = Some(b.upload_u32(&[n, mask_words(vocab)], &words)?),
            }
            let l = logits.as_ref().ok_or_else(no_logits)?;
            match pick {
                Pick::Device(s) => b.sample_step(l, &s, vocab, mask.as_ref(), ids, draws)?,
                Pick::Rows { k } => b.sample_step_rows(l, settings, k, vocab, mask.as_ref(), ids, draws)?,
                Pick::Host => {} // (no masks with a host pick: dropped above)
            }
        }
        // 4. what it produced (a download waits for the step; host picks wait in theirs)
        let waited = std::time::Instant::now();
        let out = match pick {
            Pick::Device(_) | Pick::Rows { .. } => Picked::Tokens(b.download_u32(ids)?),
            Pick::Host => Picked::Logits(logits.clone().ok_or_else(no_logits)?),
        };
        self.wait_ns += waited.elapsed().as_nanos() as u64;
        self.recordings += recorded as u64;
        Ok(out)
    }
}

/// Draw numbers as the sampler reads them: `[n, 4]` u32 cursors with each number in the row
/// field.
pub fn draw_cursor(draws: &[u32]) -> Vec<u32> {
    let mut c = vec![0; draws.len() * CURSOR_FIELDS];
    for (i, &d) in draws.iter().enumerate() {
        c[i * CURSOR_FIELDS + CURSOR_ROW] = d;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::padded_rows;

    #[test]
    fn padded_rows_round_up_to_few_sizes_within_the_batch_limit() {
        let sizes: Vec<usize> = (1..=64).map(|n| padded_rows(n, 64)).collect();
        for (n, &p) in (1..=64).zip(&sizes) {
            assert!(p >= n && p - n <= 7, "{} rows padded to {}", n, p);
        }
        let mut distinct = sizes.clone();
        distinct.dedup();
        assert_eq!(distinct, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]);
        assert_eq!(padded_rows(3, 3), 3, "never past the engine's batch limit");
        assert_eq!(padded_rows(60, 60), 60);
        assert_eq!(padded_rows(70, 64), 70, "a batch past the limit runs as it is");
        assert_eq!((padded_rows(65, 256), padded_rows(129, 256), padded_rows(250, 256)), (80, 160, 256));
    }
}
