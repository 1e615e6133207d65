//! CPU linear layer with block-quantized weights (`Q8_0`, `Q4_K`, `Q6_K`):
//! `out[m, n] = a[m, k] · w[n, k]ᵀ (+ bias)`, as llama.cpp computes it: the activations are
//! quantized once per call to 8-bit blocks ([`Q8Acts`]: blocks of 32 against `Q8_0`, 256
//! against the K-quants), then every output is a sum of exact integer block dot products scaled
//! in f32.
//!
//! The work is split over tasks of consecutive weight rows (output columns); a task reads its
//! weight rows once, and for each block unpacks the weights once for all `m` activation rows.
//! The per-block kernels run on the best instruction set of this CPU ([`QIsa::detect`]):
//! AVX-512 VNNI, AVX-VNNI or AVX2 on x86-64 (`cpu/simd/quant`), else the scalar reference
//! ([`crate::quant::act::dot_row`]). On AVX-512 VNNI, several activation rows (prefill) take
//! register-blocked kernels over interleaved weight panels (`cpu/simd/quant/panel.rs`).
//! [`linear_on`] forces a path (tests, benchmarks).

use crate::quant::act::{self, Q8Acts};
use crate::DType;
use super::pool;
pub use super::qisa::QIsa;

/// Tasks per thread (slack for threads slowed by a busy machine).
const TASKS_PER_THREAD: usize = 8;

/// `out = a · wᵀ + bias` on [`QIsa::detect`]'s path, in the current [`pool`]: `a` is
/// `[m, k]`, `w` the `n` rows of `k` values of block type `wt` (`n · row_bytes(k)` bytes).
#[allow(clippy::too_many_arguments)]
pub fn linear(a: &[f32], wt: DType, w: &[u8], bias: Option<&[f32]>, m: usize, n: usize, k: usize, out: &mut [f32]) {
    linear_on(QIsa::detect(), a, wt, w, bias, m, n, k, out)
}

/// `out` shared by tasks that each write a disjoint set of its elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint columns of `out` and nobody reads it meanwhile (see `linear_on`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// # Safety
    /// `i` inside `out`, and no other task accesses element `i` meanwhile.
    #[inline(always)]
    unsafe fn write(self, i: usize, v: f32) {
        *self.0.add(i) = v;
    }
}

/// [`linear`] on a given path.
///
/// # Panics
/// If this CPU cannot run `isa`, `wt` is not a block type, `k` is not a whole number of its
/// blocks, or the slices are shorter than the shapes say (the backend checks all of these).
#[allow(clippy::too_many_arguments)]
pub fn linear_on(isa: QIsa, a: &[f32], wt: DType, w: &[u8], bias: Option<&[f32]>, m: usize, n: usize, k: usize, out: &mut [f32]) {
    assert!(isa.is_available(), "quantized linear: this CPU cannot run the {} path", isa.name());
    let block = Q8Acts::block_for(wt).expect("quantized linear: a block type");
    let row_bytes = wt.row_bytes(k).expect("quantized linear: whole blocks");
    assert!(a.len() >= m * k && out.len() >= m * n && w.len() >= n * row_bytes && bias.map_or(true, |b| b.len() >= n), "quantized linear: caller validated sizes");
    if m == 0 || n == 0 {
        return;
    }
    // 1. activations, once: [m, k] → int8 blocks
    let mut acts = Q8Acts::zeroed(m, k, block);
    {
        let nb = k / block;
        let mut rows: Vec<_> = acts.qs.chunks_mut(k.max(1)).zip(acts.d.chunks_mut(nb.max(1))).zip(acts.bsums.chunks_mut((k / 16).max(1))).collect();
        let one = |r: usize, ((qs, d), bs): &mut ((&mut [i8], &mut [f32]), &mut [i16])| quantize_row_on(isa, &a[r * k..(r + 1) * k], block, qs, d, bs);
        if m <= 4 {
            // a few rows (decode): not worth a job
            rows.iter_mut().enumerate().for_each(|(r, row)| one(r, row));
        } else {
            pool::chunks_mut(&mut rows, 1, |r, row| one(r, &mut row[0]));
        }
    }
    if k == 0 {
        for row in out[..m * n].chunks_mut(n) {
            row.iter_mut().enumerate().for_each(|(c, o)| *o = bias.map_or(0.0, |b| b[c]));
        }
        return;
    }
    // 2. tasks of consecutive weight rows
    let tasks = pool::threads() * TASKS_PER_THREAD;
    let chunk = ((n + tasks - 1) / tasks).max(4);
    let optr = OutPtr(out.as_mut_ptr());
    let acts = &acts;
    pool::for_each_init(
        (n + chunk - 1) / chunk,
        || vec![0.0f32; chunk * m],
        |scratch, t| {
            let c0 = t * chunk;
            let cols = chunk.min(n - c0);
            let rows = &w[c0 * row_bytes..(c0 + cols) * row_bytes];
            let res = &mut scratch[..cols * m];
            dots_on(isa, wt, rows, row_bytes, acts, res);
            // row by row into `out` (contiguous runs: a column-wise copy took a fifth of a
            // 256-token prefill, one cache line and page per value)
            for r in 0..m {
                for j in 0..cols {
                    let b = bias.map_or(0.0, |b| b[c0 + j]);
                    // SAFETY: r < m, c0 + j < n: inside `out`; columns c0..c0 + cols belong to
                    // this task only.
                    unsafe { optr.write(r * n + c0 + j, res[r * cols + j] + b) };
                }
            }
        },
    );
}

/// Quantizes one activation row on `isa` (every path gives the same bits).
fn quantize_row_on(isa: QIsa, x: &[f32], block: usize, qs: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        QIsa::Avx512Vnni | QIsa::AvxVnni | QIsa::Avx2 => super::simd::quant::quantize_row(x, block, qs, d, bs),
        _ => act::quantize_row(x, block, qs, d, bs),
    }
}

/// `res[r · cols + j]` = dot of weight row `j` of `rows` (`cols` rows) with activation row `r`.
fn dots_on(isa: QIsa, wt: DType, rows: &[u8], row_bytes: usize, acts: &Q8Acts, res: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        QIsa::Avx512Vnni | QIsa::AvxVnni | QIsa::Avx2 => super::simd::quant::dots(isa, wt, rows, row_bytes, acts, res),
        _ => {
            let (m, cols) = (acts.rows, rows.len() / row_bytes);
            for (j, row) in rows.chunks_exact(row_bytes).enumerate() {
                for r in 0..m {
                    res[r * cols + j] = act::dot_row(wt, row, acts, r);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant;

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// `out[r, c]` against the f64 product of the dequantized weights with the dequantized
    /// activations (what the integer math computes exactly).
    fn check_against_reference(isa: QIsa, wt: DType, m: usize, n: usize, k: usize) {
        let a = pseudo(m * k, 1);
        let mut wf = pseudo(n * k, 2);
        // varied magnitudes per row and block, so scales differ
        for (i, v) in wf.iter_mut().enumerate() {
            *v *= 0.2 + ((i / 32) % 7) as f32 * 0.3;
        }
        let bias = pseudo(n, 3);
        let w = quant::quantize_vec(wt, &wf).unwrap();
        let wd = quant::dequantize_vec(wt, &w, n * k).unwrap();
        let block = Q8Acts::block_for(wt).unwrap();
        let qa = Q8Acts::quantize(&a, m, k, block);
        let mut out = vec![f32::NAN; m * n];
        super::super::pool::in_test_pool(|| linear_on(isa, &a, wt, &w, Some(&bias), m, n, k, &mut out));
        for r in 0..m {
            let (qs, d, _) = qa.row(r);
            for c in 0..n {
                let mut want = bias[c] as f64;
                for i in 0..k {
                    want += wd[c * k + i] as f64 * (qs[i] as f64 * d[i / block] as f64);
                }
                let got = out[r * n + c] as f64;
                assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{} {}: {} vs {} at [{}, {}] of {:?}", isa.name(), wt, got, want, r, c, (m, n, k));
            }
        }
    }

    /// `Q8_0` rows that end inside a 256-value chunk (the panels' last chunk is partial), with
    /// row counts around the panels' register tile and columns past a whole panel.
    #[test]
    fn q8_0_rows_of_partial_chunks_match_the_reference() {
        for isa in QIsa::available() {
            for &(m, n, k) in &[(4, 17, 800), (7, 33, 96), (9, 16, 288), (2, 3, 32)] {
                check_against_reference(isa, DType::Q8_0, m, n, k);
            }
        }
    }

    /// Every path against the f64 product of the dequantized weights with the dequantized
    /// activations (what the integer math computes exactly), for every type and odd shapes.
    #[test]
    fn every_path_matches_the_reference_for_all_block_types() {
        let paths = QIsa::available();
        assert!(paths.contains(&QIsa::Scalar) && paths.contains(&QIsa::detect()));
        for &wt in &[DType::Q8_0, DType::Q4K, DType::Q6K] {
            for &(m, n, k) in &[(1, 1, 256), (1, 37, 512), (2, 5, 256), (3, 17, 768), (5, 64, 512), (16, 9, 256), (33, 20, 1024), (64, 7, 256)] {
                for isa in &paths {
                    check_against_reference(*isa, wt, m, n, k);
                }
            }
        }
    }
}
