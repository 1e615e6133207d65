//! Small uploads without a stream synchronization: a ring of page-locked host memory the bytes
//! are copied into, then copied to the device asynchronously on the backend's stream.
//!
//! A copy from pageable memory must finish before the caller may touch its buffer again, so a
//! plain upload waits for the whole stream: a decode step's four small writes (token ids,
//! cursors, block tables, key counts) cost ~15-60 µs of host time on an H200 host, during which
//! the device idles. Here the caller's bytes go into the ring first; the device copy is queued
//! behind the work before it and the call returns. Each copy records an event; a region of the
//! ring is reused only after the copies that read it have finished (the oldest first: one
//! stream, so events complete in order).
//!
//! Copies queued while the stream records a graph would be captured with the ring's address
//! and replay whatever the ring holds later: the backend does not stage then (see
//! `CudaBackend::copy_in`).

use super::launch::OkOrCuda;
use crate::Result;
use cust::sys::{CUevent, CUstream};
use std::collections::VecDeque;
use std::sync::Mutex;

/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_NO_TIMING: u32 = 2;

/// The ring (see the module docs).
pub(super) struct Staging {
    ring: Mutex<Ring>,
}

struct Ring {
    base: *mut u8,
    cap: usize,
    /// Where the next region starts.
    head: usize,
    /// Regions `[start, end)` whose device copies are queued, oldest first, with their events.
    inflight: VecDeque<(usize, usize, CUevent)>,
    /// Events no copy uses.
    spare: Vec<CUevent>,
}

// SAFETY: the ring's memory and events are only touched under the mutex; the driver API is
// thread-safe.
unsafe impl Send for Staging {}
unsafe impl Sync for Staging {}

impl Staging {
    /// A ring of `cap` bytes of page-locked memory in the current context, or why not.
    pub(super) fn new(cap: usize) -> Result<Staging> {
        let mut base: *mut std::os::raw::c_void = std::ptr::null_mut();
        // SAFETY: an out-parameter for a new host allocation of `cap` bytes
        unsafe { cust::sys::cuMemAllocHost_v2(&mut base, cap) }.ok_or_cuda("cuMemAllocHost (upload staging)")?;
        Ok(Staging { ring: Mutex::new(Ring { base: base as *mut u8, cap, head: 0, inflight: VecDeque::new(), spare: Vec::new() }) })
    }

    /// The largest upload staged; larger ones take the synchronous path.
    pub(super) fn max_bytes(&self) -> usize {
        self.lock().cap / 4
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Copies `src` into the ring, calls `copy(staged)` to queue the device copy that reads it on
    /// `stream`, and records an event after it; `src` may be reused as soon as this returns.
    /// `src` must not be longer than [`Staging::max_bytes`].
    pub(super) fn stage(&self, src: &[u8], stream: CUstream, copy: impl FnOnce(*const u8) -> Result<()>) -> Result<()> {
        let mut r = self.lock();
        assert!(src.len() <= r.cap / 4, "staged uploads are small");
        let len = (src.len() + 63) / 64 * 64;
        let start = if r.head + len > r.cap { 0 } else { r.head };
        // the copies still reading [start, start + len): wait for them, the oldest first
        while r.inflight.iter().any(|&(s, e, _)| s < start + len && start < e) {
            let (_, _, ev) = r.inflight.pop_front().expect("an overlapping copy is queued");
            // SAFETY: `ev` is a live event recorded on the stream
            let waited = unsafe { cust::sys::cuEventSynchronize(ev) }.ok_or_cuda("cuEventSynchronize (upload staging)");
            r.spare.push(ev);
            waited?;
        }
        // SAFETY: `start + src.len() ≤ cap`, inside the ring, which no queued copy reads now
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), r.base.add(start), src.len()) };
        copy(unsafe { r.base.add(start) } as *const u8)?;
        let ev = match r.spare.pop() {
            Some(ev) => ev,
            None => {
                let mut ev: CUevent = std::ptr::null_mut();
                // SAFETY: an out-parameter for a new event
                unsafe { cust::sys::cuEventCreate(&mut ev, EVENT_NO_TIMING) }.ok_or_cuda("cuEventCreate (upload staging)")?;
                ev
            }
        };
        // SAFETY: a live event and the backend's live stream
        if let Err(e) = unsafe { cust::sys::cuEventRecord(ev, stream) }.ok_or_cuda("cuEventRecord (upload staging)") {
            r.spare.push(ev);
            // without an event the region cannot be tracked: wait for the copy itself
            unsafe { cust::sys::cuStreamSynchronize(stream) }.ok_or_cuda("cuStreamSynchronize (upload staging)")?;
            return Err(e);
        }
        r.inflight.push_back((start, start + len, ev));
        r.head = start + len;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // the backend makes its context current before dropping this (see `CudaBackend`'s Drop)
        let r = self.ring.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, _, ev) in r.inflight.drain(..) {
            // SAFETY: live events; the copies must finish before the memory goes
            unsafe {
                cust::sys::cuEventSynchronize(ev);
                cust::sys::cuEventDestroy_v2(ev);
            }
        }
        for ev in r.spare.drain(..) {
            // SAFETY: a live event no copy uses
            unsafe { cust::sys::cuEventDestroy_v2(ev) };
        }
        // SAFETY: the ring's allocation, no longer read by any copy
        unsafe { cust::sys::cuMemFreeHost(r.base as *mut _) };
    }
}
