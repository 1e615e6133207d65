//! Added tokens (`<|im_start|>`, `<think>`, ...): found in the raw text before anything else
//! happens to it, as Hugging Face does for added tokens that are not `normalized`.

use std::cmp::Reverse;

/// A part of the text to encode: plain text for the BPE pipeline, or one added token.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Segment<'a> {
    Text(&'a str),
    Added(u32),
}

/// The added tokens of a tokenizer, as (content, id); contents are not empty.
pub(super) struct AddedTokens {
    tokens: Vec<(String, u32)>,
}

impl AddedTokens {
    pub(super) fn new(tokens: Vec<(String, u32)>) -> AddedTokens {
        debug_assert!(tokens.iter().all(|(content, _)| !content.is_empty()));
        AddedTokens { tokens }
    }

    /// Whether `id` is an added token.
    pub(super) fn contains(&self, id: u32) -> bool {
        self.tokens.iter().any(|&(_, i)| i == id)
    }

    /// Cuts `text` at the added tokens in it: at each step the match that starts first wins,
    /// and of those the longest (leftmost-longest, non-overlapping).
    pub(super) fn split<'a>(&self, text: &'a str) -> Vec<Segment<'a>> {
        // The next occurrence of each token at or after `pos`.
        let mut next: Vec<Option<usize>> = self.tokens.iter().map(|(t, _)| text.find(t.as_str())).collect();
        let mut segments = Vec::new();
        let mut pos = 0;
        loop {
            let best = next
                .iter()
                .enumerate()
                .filter_map(|(i, at)| at.map(|at| (at, Reverse(self.tokens[i].0.len()), i)))
                .min();
            let (start, Reverse(len), i) = match best {
                Some(best) => best,
                None => break,
            };
            if start > pos {
                segments.push(Segment::Text(&text[pos..start]));
            }
            segments.push(Segment::Added(self.tokens[i].1));
            pos = start + len;
            for (j, at) in next.iter_mut().enumerate() {
                if matches!(*at, Some(at) if at < pos) {
                    *at = text[pos..].find(self.tokens[j].0.as_str()).map(|at| at + pos);
                }
            }
        }
        if pos < text.len() {
            segments.push(Segment::Text(&text[pos..]));
        }
        segments
    }
}

#[cfg(test)]
mod tests {
    use super::Segment::{Added, Text};
    use super::*;

    #[test]
    fn leftmost_longest_non_overlapping() {
        let tokens = [("<a>", 1), ("<a><b>", 2), ("<b>", 3), ("b><", 4)];
        let added = AddedTokens::new(tokens.iter().map(|&(t, id)| (t.to_string(), id)).collect());
        assert_eq!(added.split(""), []);
        assert_eq!(added.split("plain"), [Text("plain")]);
        assert_eq!(added.split("<a>"), [Added(1)]);
        assert_eq!(added.split("x<a><b>y"), [Text("x"), Added(2), Text("y")]);
        assert_eq!(added.split("<a><a>"), [Added(1), Added(1)]);
        assert_eq!(added.split("<b><a>"), [Added(3), Added(1)]);
        assert_eq!(added.split("<<b><<"), [Text("<"), Added(3), Text("<<")]);
        assert_eq!(added.split("<a> <b><a"), [Added(1), Text(" "), Added(3), Text("<a")]);
    }
}
