//! The character classes of the Qwen pre-tokenizer pattern: a leaf that the generated tables
//! (`unicode_tables.rs`) and the splitter (`pretokenize.rs`) both use.

/// The classes of characters that the pattern tells apart.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Class {
    /// `\p{L}`
    Letter,
    /// `\p{N}`
    Number,
    /// `\s`
    Space,
    /// Everything else: punctuation, symbols, marks, emoji, controls, unassigned code points.
    Other,
}
