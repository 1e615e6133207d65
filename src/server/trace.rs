//! A timeline of a replica's model loop, for finding where a loaded server's time goes: with
//! `QWEN3_VL_STEP_TRACE=PATH` set, replica N writes `PATH.N` (tab-separated, one line per loop
//! turn): when the turn began (ms since the loop started), the time taking new jobs (waiting
//! for one when idle included), in the engine's step, and handing out its events (text, the
//! streams), then the step's rows, the sequences running and waiting, and the prompt rows and
//! images the step read, and whether it recorded a decode step (a CUDA graph). A diagnostic aid: nothing is written without the variable.

use host::engine::EngineStats;
use std::io::Write;
use std::time::Instant;

pub struct StepTrace {
    out: std::io::BufWriter<std::fs::File>,
    origin: Instant,
    last: EngineStats,
}

impl StepTrace {
    /// The trace of replica `replica` when `QWEN3_VL_STEP_TRACE` names a path (a file that
    /// cannot be made is logged and no trace kept).
    pub fn from_env(replica: usize) -> Option<StepTrace> {
        let path = format!("{}.{}", std::env::var("QWEN3_VL_STEP_TRACE").ok().filter(|p| !p.is_empty())?, replica);
        match std::fs::File::create(&path) {
            Ok(f) => {
                let mut out = std::io::BufWriter::new(f);
                let _ = writeln!(out, "t_ms\tadmit_ms\tstep_ms\tevents_ms\trows\trunning\twaiting\tprefill_rows\timages\trecorded");
                log::info!("writing the step trace of replica {} to {}", replica, path);
                Some(StepTrace { out, origin: Instant::now(), last: EngineStats::default() })
            }
            Err(e) => {
                log::warn!("QWEN3_VL_STEP_TRACE: cannot create {}: {}; no step trace", path, e);
                None
            }
        }
    }

    /// One loop turn that began at `begin`, its step starting at `step` and ending at
    /// `events`, its events handed out by `end`; `st` the engine's counts after it.
    pub fn turn(&mut self, begin: Instant, step: Instant, events: Instant, end: Instant, st: &EngineStats) {
        let ms = |a: Instant, b: Instant| b.duration_since(a).as_secs_f64() * 1e3;
        let _ = writeln!(
            self.out,
            "{:.3}\t{:.3}\t{:.3}\t{:.3}\t{}\t{}\t{}\t{}\t{}\t{}",
            ms(self.origin, begin),
            ms(begin, step),
            ms(step, events),
            ms(events, end),
            st.last_batch,
            st.running,
            st.waiting,
            st.prefill_rows - self.last.prefill_rows,
            st.vision_images - self.last.vision_images,
            st.decode_recordings - self.last.decode_recordings
        );
        self.last = *st;
    }
}
