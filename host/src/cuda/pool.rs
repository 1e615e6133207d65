//! A caching device memory pool. Freed blocks go back to a free list keyed by their
//! (rounded) size and are handed out again, so steady-state inference makes no `cuMemAlloc`
//! calls. When an allocation fails the cache is emptied and the allocation retried once.
//!
//! While work is being recorded into a CUDA graph, the recording thread's allocations come
//! from (and go back to) an [`Arena`] of that recording: the graph holds their addresses, so
//! no one else may get those blocks until the recording is dropped ([`Arena::release`]).
//!
//! A cap ([`Pool::set_cap`], `--gpu-memory`) bounds the bytes the pool holds (blocks in use
//! plus cached ones): an allocation that would pass it first empties the cache, then fails
//! with [`Error::OutOfMemory`] naming the bytes asked for, in use and the cap.
//! Within the recording, freed blocks are reused by later allocations, as they are in plain
//! runs, so a recorded step needs no more memory than a plain one.

use crate::memory::MemoryStats;
use crate::{Error, Result};
use cust::context::{Context, CurrentContext};
use cust::memory::DevicePointer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Rounds a request up to its bucket: 512 B granules up to 1 MiB, then 1/8 of the next power
/// of two (at most 12.5% waste).
pub fn bucket(bytes: usize) -> usize {
    let bytes = bytes.max(1);
    let granule = if bytes <= 1 << 20 { 512 } else { bytes.next_power_of_two() / 8 };
    (bytes + granule - 1) / granule * granule
}

/// Rounds a request up to the 256-byte alignment the driver gives anyway: the size of the
/// allocations made while [`Pool::set_exact`] is on (weights, which are never handed back for
/// reuse by other sizes, so bucket rounding would only waste memory).
pub fn exact(bytes: usize) -> usize {
    (bytes.max(1) + 255) / 256 * 256
}

pub struct Pool {
    state: Mutex<State>,
    ctx: Context,
}

#[derive(Default)]
struct State {
    free: HashMap<usize, Vec<u64>>,
    stats: MemoryStats,
    /// Allocations are sized by [`exact`], not [`bucket`].
    exact: bool,
    /// The recording in progress, and the thread recording it.
    recording: Option<(std::thread::ThreadId, Arc<Arena>)>,
    /// At most this many bytes held (in use + cached), when set.
    cap: Option<usize>,
}

/// The blocks a recorded graph uses: reserved for it until [`Arena::release`].
pub struct Arena {
    state: Mutex<ArenaState>,
    pool: Arc<Pool>,
}

#[derive(Default)]
struct ArenaState {
    free: HashMap<usize, Vec<u64>>,
    /// The recording is gone: blocks coming back go to the pool.
    released: bool,
}

impl Arena {
    fn lock(&self) -> std::sync::MutexGuard<'_, ArenaState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns the arena's free blocks to the pool; blocks still held by tensors follow when
    /// those drop. Called when the recording that uses the blocks is destroyed.
    pub fn release(&self) {
        let free = {
            let mut st = self.lock();
            st.released = true;
            std::mem::take(&mut st.free)
        };
        for (block, ptrs) in free {
            for p in ptrs {
                self.pool.release(p, block);
            }
        }
    }

    fn give_back(&self, ptr: u64, block: usize) {
        {
            let mut st = self.lock();
            if !st.released {
                st.free.entry(block).or_default().push(ptr);
                return;
            }
        }
        self.pool.release(ptr, block);
    }
}

/// A block of device memory owned by one tensor; returns to its pool (or its recording's
/// arena) on drop.
pub struct DeviceBuffer {
    ptr: u64,
    /// Bytes asked for.
    len: usize,
    /// Bytes of the block (its bucket).
    block: usize,
    pool: Arc<Pool>,
    arena: Option<Arc<Arena>>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr, self.len)
    }
}

impl DeviceBuffer {
    /// The device address.
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// Usable bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        match &self.arena {
            Some(a) => a.give_back(self.ptr, self.block),
            None => self.pool.release(self.ptr, self.block),
        }
    }
}

impl Pool {
    pub fn new(ctx: Context) -> Arc<Pool> {
        Arc::new(Pool { state: Mutex::new(State::default()), ctx })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the free lists inconsistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `bytes` bytes (contents undefined).
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        let mut st = self.lock();
        let block = if st.exact { exact(bytes) } else { bucket(bytes) };
        let arena = match &st.recording {
            Some((thread, a)) if *thread == std::thread::current().id() => Some(Arc::clone(a)),
            _ => None,
        };
        if let Some(a) = &arena {
            let reused = a.lock().free.get_mut(&block).and_then(|v| v.pop());
            if let Some(ptr) = reused {
                return Ok(DeviceBuffer { ptr, len: bytes, block, pool: Arc::clone(self), arena });
            }
        }
        let ptr = match st.free.get_mut(&block).and_then(|v| v.pop()) {
            Some(p) => {
                st.stats.cached -= block;
                p
            }
            None => {
                // the driver allocates in the thread's current context: make it this pool's
                // (another device's backend may have been used on this thread last)
                CurrentContext::set_current(&self.ctx).map_err(|e| Error::Device { op: "cuCtxSetCurrent", msg: e.to_string() })?;
                if let Some(cap) = st.cap {
                    if st.stats.in_use + st.stats.cached + block > cap {
                        Self::free_cached(&mut st);
                    }
                    if st.stats.in_use + block > cap {
                        return Err(Error::OutOfMemory {
                            requested: bytes,
                            in_use: st.stats.in_use,
                            cached: 0,
                            msg: format!("the GPU memory budget is {} bytes (--gpu-memory); a {}-byte block would pass it", cap, block),
                        });
                    }
                }
                let p = match raw_alloc(block) {
                    Ok(p) => p,
                    Err(first) => {
                        Self::free_cached(&mut st);
                        raw_alloc(block).map_err(|e| Error::OutOfMemory {
                            requested: bytes,
                            in_use: st.stats.in_use,
                            cached: 0,
                            msg: format!("{} (first try: {})", e, first),
                        })?
                    }
                };
                st.stats.device_allocs += 1;
                p
            }
        };
        st.stats.in_use += block;
        st.stats.peak = st.stats.peak.max(st.stats.in_use);
        Ok(DeviceBuffer { ptr, len: bytes, block, pool: Arc::clone(self), arena })
    }

    /// Starts serving this thread's allocations from a new arena (see the module docs).
    pub fn begin_recording(self: &Arc<Self>) -> Arc<Arena> {
        let arena = Arc::new(Arena { state: Mutex::new(ArenaState::default()), pool: Arc::clone(self) });
        self.lock().recording = Some((std::thread::current().id(), Arc::clone(&arena)));
        arena
    }

    /// Whether this thread is recording (between [`Pool::begin_recording`] and
    /// [`Pool::end_recording`]).
    pub fn is_recording(&self) -> bool {
        matches!(&self.lock().recording, Some((t, _)) if *t == std::thread::current().id())
    }

    /// Whether any thread is recording.
    pub fn recording(&self) -> bool {
        self.lock().recording.is_some()
    }

    /// Stops serving allocations from the recording's arena (the arena keeps its blocks).
    pub fn end_recording(&self) {
        self.lock().recording = None;
    }

    fn release(&self, ptr: u64, block: usize) {
        let mut st = self.lock();
        st.stats.in_use -= block;
        st.stats.cached += block;
        st.free.entry(block).or_default().push(ptr);
    }

    /// Returns every cached block to the driver.
    pub fn empty_cache(&self) {
        let _ = CurrentContext::set_current(&self.ctx);
        Self::free_cached(&mut self.lock());
    }

    fn free_cached(st: &mut State) {
        for (_, ptrs) in st.free.drain() {
            for p in ptrs {
                // Freeing can only fail for a bad pointer or a dead context; neither is
                // recoverable here and the memory goes away with the context anyway.
                let _ = unsafe { cust::memory::cuda_free(DevicePointer::<u8>::from_raw(p)) };
            }
        }
        st.stats.cached = 0;
    }

    /// Bounds the bytes the pool holds (`None`: no bound but the device's). Fails when more is
    /// in use already.
    pub fn set_cap(&self, cap: Option<usize>) -> Result<()> {
        let _ = CurrentContext::set_current(&self.ctx);
        let mut st = self.lock();
        if let Some(c) = cap {
            if st.stats.in_use > c {
                return Err(Error::OutOfMemory { requested: 0, in_use: st.stats.in_use, cached: st.stats.cached, msg: format!("cannot cap the pool at {} bytes: more is in use already", c) });
            }
            if st.stats.in_use + st.stats.cached > c {
                Self::free_cached(&mut st);
            }
        }
        st.cap = cap;
        Ok(())
    }

    /// Sizes new allocations exactly (on while weights load) or by bucket (off, the default).
    pub fn set_exact(&self, on: bool) {
        self.lock().exact = on;
    }

    pub fn cap(&self) -> Option<usize> {
        self.lock().cap
    }

    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.empty_cache();
    }
}

fn raw_alloc(bytes: usize) -> std::result::Result<u64, cust::error::CudaError> {
    unsafe { cust::memory::cuda_malloc::<u8>(bytes).map(|p| p.as_raw()) }
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_round_up_with_bounded_waste() {
        assert_eq!(bucket(0), 512);
        assert_eq!(bucket(1), 512);
        assert_eq!(bucket(513), 1024);
        assert_eq!(bucket(1 << 20), 1 << 20);
        assert_eq!(bucket((1 << 20) + 1), (1 << 20) + (1 << 18));
        for b in [3_000_000usize, 123_456_789, 1 << 30] {
            assert!(bucket(b) >= b && bucket(b) as f64 <= b as f64 * 1.125 + 1.0);
        }
    }
}
