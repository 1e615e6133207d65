//! How fast the server finishes requests, for `Retry-After`: requests finished per second of
//! busy time over a recent window, batching included (16 requests that finish together count
//! 16). A refused client is told to come back after the queue ahead of it has drained at that
//! rate.
//!
//! The clock that matters is the engines' busy time (some sequence running or waiting), not
//! the wall clock: an idle hour between two bursts says nothing about how fast the next burst
//! drains. A request's span on that clock runs from its arrival (its end less its latency) to
//! its end, so a single burst of 16 requests that all took 4 s gives 4 per second, not 16 per
//! however-long-ago-they-finished.

use std::collections::VecDeque;
use std::time::Instant;

/// Busy seconds of history the rate is measured over.
const WINDOW: f64 = 30.0;
/// Finished requests remembered at most (a server finishing more per window measures over
/// the latest ones).
const MAX_EVENTS: usize = 4096;
/// The longest Retry-After given.
const MAX_RETRY: u64 = 3600;

/// The drain rate's state (see the module docs).
#[derive(Debug, Default)]
pub struct DrainRate {
    /// Seconds some engine was busy, up to `last`.
    busy: f64,
    last: Option<Instant>,
    /// Whether some engine was busy at `last`.
    was_busy: bool,
    /// Finished requests as (start, end) on the busy clock, oldest end first.
    done: VecDeque<(f64, f64)>,
    /// The busy clock at the last finish.
    last_end: f64,
}

impl DrainRate {
    /// Advances the busy clock to `now` (busy since the last call if it was then).
    fn advance(&mut self, now: Instant) {
        if let Some(last) = self.last {
            if self.was_busy {
                self.busy += now.saturating_duration_since(last).as_secs_f64();
            }
        }
        self.last = Some(now);
    }

    /// Whether some engine is busy from `now` on.
    pub fn set_busy(&mut self, now: Instant, busy: bool) {
        self.advance(now);
        self.was_busy = busy;
    }

    /// A request finished at `now` after `secs` since it arrived.
    pub fn finished(&mut self, now: Instant, secs: f64) {
        self.advance(now);
        let end = self.busy;
        self.done.push_back(((end - secs.max(0.0)).max(0.0), end));
        self.last_end = end;
        if self.done.len() > MAX_EVENTS {
            self.done.pop_front();
        }
    }

    /// Requests finished per busy second over the window (`None`: none finished in it).
    pub fn rate(&mut self, now: Instant) -> Option<f64> {
        self.advance(now);
        let from = self.busy - WINDOW;
        while self.done.front().is_some_and(|&(_, end)| end < from) {
            self.done.pop_front();
        }
        let start = self.done.iter().map(|&(s, _)| s).fold(f64::INFINITY, f64::min);
        if self.done.is_empty() {
            return None;
        }
        let span = (self.busy - start.max(from)).max(1e-3);
        Some(self.done.len() as f64 / span)
    }

    /// Seconds after which a client refused with `ahead` requests queued may try again: `ahead`
    /// at the measured rate, at least 1. With nothing finished in the window, the busy time
    /// since the last finish (the running requests have taken that long already), at most the
    /// window.
    pub fn retry_after(&mut self, now: Instant, ahead: usize) -> u64 {
        let secs = match self.rate(now) {
            Some(rate) => ahead as f64 / rate,
            None => (self.busy - self.last_end).min(WINDOW),
        };
        (secs.ceil() as u64).clamp(1, MAX_RETRY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_that_drains_in_4_s_says_4_s() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut r = DrainRate::default();
        r.set_busy(at(0.0), true);
        // 16 requests run together and all finish after 4 s
        for _ in 0..16 {
            r.finished(at(4.0), 4.0);
        }
        r.set_busy(at(4.0), false);
        // an idle hour later, 16 are queued again: they drain in about 4 s
        r.set_busy(at(3604.0), true);
        assert_eq!(r.retry_after(at(3604.0), 16), 4);
        assert_eq!(r.retry_after(at(3604.0), 1), 1, "at least 1 s");
    }

    #[test]
    fn a_steady_stream_measures_over_the_window() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut r = DrainRate::default();
        r.set_busy(at(0.0), true);
        // two requests a second for two minutes, each 10 s long (queued and run)
        for i in 20..240 {
            r.finished(at(i as f64 * 0.5), 10.0);
        }
        let rate = r.rate(at(120.0)).unwrap();
        assert!((rate - 2.0).abs() < 0.1, "{}", rate);
        assert_eq!(r.retry_after(at(120.0), 20), 10);
    }

    #[test]
    fn nothing_finished_yet_waits_as_long_as_the_running_ones_took() {
        let t0 = Instant::now();
        let mut r = DrainRate::default();
        assert_eq!(r.retry_after(t0, 5), 1);
        r.set_busy(t0, true);
        assert_eq!(r.retry_after(t0 + Duration::from_millis(2500), 5), 3);
        assert_eq!(r.retry_after(t0 + Duration::from_secs(600), 5), WINDOW as u64);
    }
}
