//! Progress bars on stderr (indicatif) for work that takes seconds: loading weights, quantizing,
//! benchmark runs. They are drawn only on a terminal (indicatif's stderr target draws nothing
//! into a pipe or a log file) and never with -q; elsewhere a finished bar leaves one line, so a
//! log still says what was done and how long it took.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Instant;

/// One bar: `label [#####.....] 52% 1.10/2.10 GiB 0:01 ETA 0:01` (bytes) or `label [##...] 3/8
/// runs` (counts).
pub struct Progress {
    bar: ProgressBar,
    label: String,
    start: Instant,
    /// -q: no summary line either.
    quiet: bool,
}

impl Progress {
    /// A bar over `total` bytes.
    pub fn bytes(label: &str, total: u64) -> Progress {
        Progress::new(label, total, "{msg} [{bar:30}] {percent:>3}% {binary_bytes}/{binary_total_bytes} {elapsed} ETA {eta}")
    }

    /// A bar over `total` items named `unit` (`runs`, `tensors`).
    pub fn count(label: &str, total: u64, unit: &str) -> Progress {
        let template = format!("{{msg}} [{{bar:30}}] {{pos}}/{{len}} {} {{elapsed}} ETA {{eta}}", unit);
        Progress::new(label, total, &template)
    }

    fn new(label: &str, total: u64, template: &str) -> Progress {
        let quiet = super::logger::quiet();
        let live = !quiet && std::io::stderr().is_terminal();
        let target = if live { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        let style = ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("#>.");
        bar.set_style(style);
        bar.set_message(label.to_string());
        Progress { bar, label: label.to_string(), start: Instant::now(), quiet }
    }

    /// Sets how much is done and the total (the total may grow as work is discovered).
    pub fn set(&self, done: u64, total: u64) {
        if self.bar.length() != Some(total) {
            self.bar.set_length(total);
        }
        self.bar.set_position(done);
    }

    /// The text after the bar (a rate, ...).
    pub fn message(&self, text: &str) {
        self.bar.set_message(format!("{} {}", self.label, text));
    }

    /// One more item done.
    pub fn inc(&self) {
        self.bar.inc(1);
    }

    /// `n` more items (or bytes) done.
    pub fn add(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Clears the live bar; the caller reports what was done in its own words.
    pub fn clear(&self) {
        self.bar.finish_and_clear();
    }

    /// The work is all done: clears the live bar and leaves one line, `label: 8 runs in 4.0 s`.
    pub fn finish(&self, unit: &str) {
        self.bar.finish_and_clear();
        let done = self.bar.length().unwrap_or_else(|| self.bar.position());
        if !self.quiet {
            eprintln!("{}: {} {} in {:.1} s", self.label, done, unit, self.start.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // an error path that never finished the bar leaves no half-drawn line behind
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}
