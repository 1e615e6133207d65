//! Stop strings over streamed text: text is released as soon as it can no longer be the start
//! of a stop string, so a stream never shows a stop string, nor anything after it.

/// Finds the first occurrence of any stop string in text that arrives in pieces.
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not released: it ends with what could be a stop string's beginning.
    held: String,
    stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new(), stopped: false }
    }

    /// Adds `text`; returns the text now safe to release and whether a stop string was found
    /// (then the text before it is released and everything after is dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.held.push_str(text);
        // 1. a complete stop string: release what precedes the earliest one
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            self.stopped = true;
            return (out, true);
        }
        // 2. otherwise hold back the longest tail that begins some stop string
        let keep = self.partial_tail();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// The text still held back (at the end of generation it is released).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop string.
    fn partial_tail(&self) -> usize {
        let h = &self.held;
        let mut best = 0;
        for s in &self.stops {
            let max = s.len().saturating_sub(1).min(h.len());
            for n in (best + 1..=max).rev() {
                let start = h.len() - n;
                if h.is_char_boundary(start) && s.as_bytes().starts_with(&h.as_bytes()[start..]) {
                    best = n;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (text, stop) = m.push(p);
            out.push_str(&text);
            if stop {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stops_across_pieces_and_releases_false_starts() {
        assert_eq!(run(&["END"], &["hello E", "N", "D more"]), ("hello ".into(), true));
        assert_eq!(run(&["END"], &["hello E", "N", "d"]), ("hello ENd".into(), false));
        assert_eq!(run(&["\n\n", "###"], &["a\n", "b##", "#c"]), ("a\nb".into(), true));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), true));
    }

    #[test]
    fn releases_text_as_soon_as_it_cannot_start_a_stop() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("abc"), ("abc".into(), false));
        assert_eq!(m.push("xST"), ("x".into(), false));
        assert_eq!(m.push("x"), ("STx".into(), false));
    }
}
