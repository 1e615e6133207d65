//! Recorded work (CUDA graphs) and device timing marks.
//!
//! [`CudaBackend::record_op`] captures what a closure launches on the backend's stream into a
//! graph (relaxed capture mode, so the pool may still allocate), with the pool serving the
//! recording thread from an arena the graph keeps (see `pool.rs`); replaying launches the
//! instantiated graph with one driver call. Capture fails on anything that needs the host in
//! the middle (a synchronization, a download): then the recording is discarded, the reason
//! logged once, and the caller runs plain launches.

use super::launch::{cuda_err, OkOrCuda};
use super::pool::Arena;
use super::CudaBackend;
use crate::backend::{Mark, Recording};
use crate::{Error, Result};
use cust::event::{Event, EventFlags};
use std::sync::Arc;

/// An instantiated graph and the memory its nodes use.
struct CudaRecording {
    exec: cust::sys::CUgraphExec,
    graph: cust::sys::CUgraph,
    arena: Arc<Arena>,
    ctx: cust::context::Context,
}

// SAFETY: graph handles may be used from any thread once the context is current there, which
// every use below ensures.
unsafe impl Send for CudaRecording {}

impl Drop for CudaRecording {
    fn drop(&mut self) {
        let _ = cust::context::CurrentContext::set_current(&self.ctx);
        // SAFETY: both handles were created by the driver and are destroyed once, here.
        unsafe {
            cust::sys::cuGraphExecDestroy(self.exec);
            cust::sys::cuGraphDestroy(self.graph);
        }
        self.arena.release();
    }
}

impl CudaBackend {
    pub(super) fn record_op(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<Option<Recording>> {
        let l = self.enter()?;
        let stream = l.stream;
        let begin = unsafe { cust::sys::cuStreamBeginCapture_v2(stream, cust::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) };
        if let Err(e) = begin.ok_or_cuda("cuStreamBeginCapture") {
            log::warn!("cannot record a CUDA graph ({}); using plain launches", e);
            return Ok(None);
        }
        let arena = self.pool.begin_recording();
        let ran = f();
        self.pool.end_recording();
        let mut graph: cust::sys::CUgraph = std::ptr::null_mut();
        let ended = unsafe { cust::sys::cuStreamEndCapture(stream, &mut graph) }.ok_or_cuda("cuStreamEndCapture");
        let failure = match (ran, ended) {
            (Ok(()), Ok(())) => None,
            (Err(e), _) | (Ok(()), Err(e)) => Some(e),
        };
        if let Some(e) = failure {
            if !graph.is_null() {
                unsafe { cust::sys::cuGraphDestroy(graph) };
            }
            arena.release();
            log::warn!("recording the decode step as a CUDA graph failed ({}); using plain launches", e);
            return Ok(None);
        }
        let mut exec: cust::sys::CUgraphExec = std::ptr::null_mut();
        if let Err(e) = unsafe { cust::sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.ok_or_cuda("cuGraphInstantiateWithFlags") {
            unsafe { cust::sys::cuGraphDestroy(graph) };
            arena.release();
            log::warn!("instantiating the recorded CUDA graph failed ({}); using plain launches", e);
            return Ok(None);
        }
        Ok(Some(Recording(Box::new(CudaRecording { exec, graph, arena, ctx: self.ctx.clone() }))))
    }

    pub(super) fn replay_op(&self, r: &Recording) -> Result<()> {
        let rec = r.0.downcast_ref::<CudaRecording>().ok_or_else(|| Error::Device { op: "replay", msg: "the recording was not made by the CUDA backend".into() })?;
        let l = self.enter()?;
        unsafe { cust::sys::cuGraphLaunch(rec.exec, l.stream) }.ok_or_cuda("cuGraphLaunch")
    }

    pub(super) fn mark_op(&self) -> Result<Mark> {
        self.enter()?;
        let ev = Event::new(EventFlags::DEFAULT).map_err(|e| cuda_err("cuEventCreate", e))?;
        ev.record(&self.stream).map_err(|e| cuda_err("cuEventRecord", e))?;
        Ok(Mark { host: std::time::Instant::now(), device: Some(Box::new(ev)) })
    }

    pub(super) fn seconds_between_op(&self, a: &Mark, b: &Mark) -> Result<f64> {
        self.enter()?;
        fn event(m: &Mark) -> Option<&Event> {
            m.device.as_ref().and_then(|d| d.downcast_ref::<Event>())
        }
        match (event(a), event(b)) {
            (Some(ea), Some(eb)) => {
                eb.synchronize().map_err(|e| cuda_err("cuEventSynchronize", e))?;
                let ms = eb.elapsed_time_f32(ea).map_err(|e| cuda_err("cuEventElapsedTime", e))?;
                Ok(ms as f64 / 1e3)
            }
            _ => Err(Error::Device { op: "seconds_between", msg: "marks were not made by the CUDA backend".into() }),
        }
    }
}
