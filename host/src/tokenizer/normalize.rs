//! The NFC normalizer, as Hugging Face `tokenizers` computes it.
//!
//! Its Unicode data is older (Unicode 9) than that of the `unicode-normalization` crate: it
//! leaves alone the characters it does not know, such as combining marks encoded since, which
//! then act as starters that stop reordering and composition. So text is cut at every character
//! outside [`NORMALIZER_KNOWN`] (probed from `tokenizers` itself), and only the parts between them
//! are normalized. On the characters both know, the two agree (Unicode keeps normalization
//! stable for assigned characters).

use super::unicode_tables::NORMALIZER_KNOWN;
use std::borrow::Cow;
use std::cmp::Ordering;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// `text` in NFC, as the reference normalizer gives it.
pub(super) fn nfc(text: &str) -> Cow<'_, str> {
    // Text in NFC for the newer data is in NFC for the older: its parts between unknown
    // characters are (prefixes and suffixes of text in NFC are in NFC).
    if text.is_ascii() || is_nfc_quick(text.chars()) == IsNormalized::Yes {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if !known(c) {
            out.extend(text[start..i].nfc());
            out.push(c);
            start = i + c.len_utf8();
        }
    }
    out.extend(text[start..].nfc());
    Cow::Owned(out)
}

/// Whether the reference normalizer acts on `c` in some context.
fn known(c: char) -> bool {
    let cp = c as u32;
    NORMALIZER_KNOWN
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                Ordering::Less
            } else if lo > cp {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composes_and_reorders_what_the_reference_knows() {
        assert!(matches!(nfc("plain ascii"), Cow::Borrowed(_)));
        assert!(matches!(nfc("café 中文"), Cow::Borrowed(_)));
        assert_eq!(nfc("cafe\u{301}"), "café");
        assert_eq!(nfc("\u{212b}"), "\u{c5}");
        // Hangul jamo compose into a syllable.
        assert_eq!(nfc("\u{1100}\u{1161}\u{11a8}"), "\u{ac01}");
        // Combining classes 230 (acute) and 220 (dot below) are put in order.
        assert_eq!(nfc("q\u{301}\u{323}"), "q\u{323}\u{301}");
    }

    #[test]
    fn leaves_alone_what_the_reference_does_not_know() {
        // U+1715 (Unicode 14, class 9) would move before U+1DDC (class 230) with newer data.
        assert_eq!(nfc("\u{1ddc}\u{1715}"), "\u{1ddc}\u{1715}");
        // U+1ABF (Unicode 13, class 220) blocks the composition of e and U+0301 for the reference.
        assert_eq!(nfc("e\u{1abf}\u{301}"), "e\u{1abf}\u{301}");
        // U+11938 (Unicode 13) = U+11935 U+11930, unknown: neither composed nor decomposed.
        assert_eq!(nfc("\u{11935}\u{11930}a\u{301}"), "\u{11935}\u{11930}á");
        assert_eq!(nfc("\u{11938}e\u{301}"), "\u{11938}é");
        assert!(!known('\u{1715}') && known('\u{301}') && known('e') && !known('中'));
    }
}
