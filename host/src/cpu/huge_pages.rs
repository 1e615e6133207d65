//! Weights in transparent huge pages.
//!
//! A decode step on the CPU streams every weight once, so it runs at the memory bandwidth its
//! reads reach. Read through the file's mapping (as llama.cpp reads a GGUF file), the weights
//! sit in 4 KiB pages: the hardware prefetchers stop at each page boundary and every page
//! costs a TLB entry. Copied once at load into anonymous memory advised for transparent huge
//! pages (`MADV_HUGEPAGE`, 2 MiB aligned), the same stream reads faster: on a 2-core AMD EPYC a
//! plain two-thread read of a 1.1 GB GGUF file measured 30.8 GB/s mapped, 27.4 in 4 KiB
//! anonymous pages and 33.2 in huge pages (medians of 20 alternating rounds; BENCHMARKS.md).
//!
//! The copy costs load time (the kernel zeroes each huge page it faults in): done in 2 MiB
//! pieces on rayon's threads, a 1.1 GB Q4_K_M file's whole `bench` run (load, 4-token prompt,
//! one token) took 0.97-1.35 s against 0.78-1.07 s through the mapping (2.7-6.9 s copied on
//! one thread).
//!
//! The copy is taken only where it can help: tensors of at least [`MIN_BYTES`], on Linux, when
//! the kernel's transparent huge pages are not `never`; `QWEN3_VL_HUGE_PAGES=0` keeps the
//! file's mapping (an A/B switch). A copy that cannot be made (no memory for the mapping, the
//! advice refused) is logged once and the mapping kept.

use crate::MappedBytes;
use std::sync::Arc;

/// The huge page size this module aligns to (x86-64 and aarch64 with 4 KiB base pages).
pub const HUGE: usize = 2 << 20;

/// The smallest tensor copied: below two huge pages there is little to save.
pub const MIN_BYTES: usize = 2 * HUGE;

static SWITCH: crate::switch::Switch = crate::switch::Switch::new("QWEN3_VL_HUGE_PAGES");

/// Whether tensors of `len` bytes go into huge pages on this process.
pub fn wanted(len: usize) -> bool {
    len >= MIN_BYTES && SWITCH.on() && available()
}

/// Whether the kernel gives transparent huge pages to memory that asks (its mode is `always`
/// or `madvise`); read once.
fn available() -> bool {
    static MODE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| {
        if !cfg!(target_os = "linux") {
            return false;
        }
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        let on = mode.contains("[always]") || mode.contains("[madvise]");
        if !on {
            log::debug!("weights stay in the files' mappings: transparent huge pages are off ({:?})", mode.trim());
        }
        on
    })
}

/// A copy of `bytes` in anonymous memory advised for huge pages, starting on a huge page
/// boundary (so also aligned for every element type).
pub fn copy(bytes: &[u8]) -> std::io::Result<MappedBytes> {
    let mut map = memmap2::MmapMut::map_anon(bytes.len() + HUGE)?;
    let offset = (HUGE - map.as_ptr() as usize % HUGE) % HUGE;
    #[cfg(target_os = "linux")]
    map.advise(memmap2::Advice::HugePage)?;
    // in huge-page pieces on rayon's threads: each first touch faults in (and the kernel
    // zeroes) a 2 MiB page, so the pieces fault in parallel
    use rayon::prelude::*;
    map[offset..offset + bytes.len()].par_chunks_mut(HUGE).zip(bytes.par_chunks(HUGE)).for_each(|(d, s)| d.copy_from_slice(s));
    let map = map.make_read_only()?;
    Ok(MappedBytes::new(Arc::new(map), offset, bytes.len()).expect("the copy lies inside its mapping"))
}

/// `bytes` moved into huge pages when [`wanted`], else `None` (the caller keeps what it has).
/// A failed copy is logged once.
pub fn moved(what: &str, bytes: &[u8]) -> Option<MappedBytes> {
    if !wanted(bytes.len()) {
        return None;
    }
    match copy(bytes) {
        Ok(m) => Some(m),
        Err(e) => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| log::warn!("{} ({} bytes) stays in 4 KiB pages, the huge-page copy failed: {}", what, bytes.len(), e));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_exact_and_start_on_a_huge_page() {
        for len in [1usize, 4095, HUGE + 3, 2 * HUGE + 17] {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let m = copy(&src).unwrap();
            assert_eq!(m.bytes(), &src[..], "len {}", len);
            assert_eq!(m.bytes().as_ptr() as usize % HUGE, 0, "len {}", len);
        }
    }

    /// A Q8_0 weight past [`MIN_BYTES`] through the CPU backend: moved where this machine's
    /// kernel offers huge pages (its blocks then start on a huge page), and the product over it
    /// is bit for bit the product over the same blocks left where they were.
    #[test]
    fn a_large_quantized_weight_moves_and_multiplies_the_same() {
        use crate::{Backend, Blocks, DType, Tensor};
        let (n, k) = (2048usize, 2048usize);
        let mut s = 12345u32;
        let mut blocks = Vec::with_capacity(n * k / 32 * 34);
        for _ in 0..n * k / 32 {
            blocks.extend_from_slice(&0x2c00u16.to_le_bytes()); // scale 1/16
            for _ in 0..32 {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                blocks.push(s as u8);
            }
        }
        assert!(blocks.len() >= MIN_BYTES);
        let b = crate::cpu::CpuBackend::new(Some(1)).unwrap();
        let moved = b.upload_blocks(&[n, k], DType::Q8_0, Blocks::Owned(blocks.clone())).unwrap();
        let kept = Tensor::cpu_blocks(&[n, k], DType::Q8_0, Blocks::Owned(blocks.clone())).unwrap();
        let bytes = moved.as_cpu_blocks("test").unwrap();
        assert_eq!(bytes, &blocks[..]);
        assert_eq!(bytes.as_ptr() as usize % HUGE == 0, wanted(blocks.len()), "moved exactly when huge pages are wanted");
        let x = b.upload_f32(&[2, k], &(0..2 * k).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect::<Vec<_>>()).unwrap();
        let (y1, y2) = (b.linear(&x, &moved, None).unwrap(), b.linear(&x, &kept, None).unwrap());
        let (y1, y2) = (y1.as_cpu_f32("test").unwrap(), y2.as_cpu_f32("test").unwrap());
        assert!(y1.iter().zip(y2).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn small_tensors_stay_put() {
        assert!(!wanted(MIN_BYTES - 1));
        assert!(moved("t", &[1, 2, 3]).is_none());
    }
}
