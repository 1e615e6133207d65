//! The pre-tokenizer split of Qwen (and GPT-4 style) tokenizers: a hand-written scanner that
//! cuts text exactly where Hugging Face's `Split` pre-tokenizer with the regex [`PATTERN`] and
//! behavior `Isolated` cuts it (Oniguruma semantics: ordered alternation, greedy quantifiers with
//! backtracking, Unicode classes as in [`super::unicode_tables`]).
//!
//! At each position the first alternative that matches wins:
//! 1. `(?i:'s|'t|'re|'ve|'m|'ll|'d)`: an English contraction, any case (`ſ` folds to `s`);
//! 2. `[^\r\n\p{L}\p{N}]?\p{L}+`: a run of letters, with one leading non-letter, non-number
//!    character other than CR and LF (a space, an apostrophe, a combining mark, ...);
//! 3. `\p{N}`: a single number character;
//! 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*`: a run of other characters, with an optional leading space
//!    and the line breaks right after it;
//! 5. `\s*[\r\n]+`: white space up to and including its last line break;
//! 6. `\s+(?!\S)`: white space up to the end of the text, or all but its last character when
//!    something other than white space follows (that character then starts the next piece);
//! 7. `\s+`: a single white-space character before something else.
//!
//! Every character matches one alternative, so the pieces cover the text without gaps.

use super::class::Class;
use super::unicode_tables::CLASSES;
use std::cmp::Ordering;

/// The regex of the `Split` pre-tokenizer that [`split`] implements.
pub(super) const PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The class of `c`, as the reference regex engine sees it.
pub(super) fn class(c: char) -> Class {
    match c {
        'a'..='z' | 'A'..='Z' => Class::Letter,
        '0'..='9' => Class::Number,
        '\t'..='\r' | ' ' => Class::Space,
        '\0'..='\x7f' => Class::Other,
        _ => {
            let cp = c as u32;
            let found = CLASSES.binary_search_by(|&(lo, hi, _)| {
                if hi < cp {
                    Ordering::Less
                } else if lo > cp {
                    Ordering::Greater
                } else {
                    Ordering::Equal
                }
            });
            found.map_or(Class::Other, |i| CLASSES[i].2)
        }
    }
}

/// The pieces of `text`, in order; their concatenation is `text`.
pub(super) fn split(text: &str) -> Pieces<'_> {
    Pieces { rest: text }
}

/// The iterator of [`split`].
pub(super) struct Pieces<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.rest.is_empty() {
            return None;
        }
        let (piece, rest) = self.rest.split_at(piece_len(self.rest));
        self.rest = rest;
        Some(piece)
    }
}

/// The length in bytes of the piece at the start of the non-empty `s`.
fn piece_len(s: &str) -> usize {
    let c = s.chars().next().expect("piece_len of an empty string");
    let first = c.len_utf8();
    let after = &s[first..];
    if c == '\'' {
        if let Some(n) = contraction_len(after) {
            return first + n;
        }
    }
    let class = class(c);
    match class {
        Class::Letter => return first + run_len(after, Class::Letter),
        Class::Number => return first,
        _ => {}
    }
    if c != '\r' && c != '\n' && starts_with(after, Class::Letter) {
        return first + run_len(after, Class::Letter);
    }
    if class == Class::Other {
        let end = first + run_len(after, Class::Other);
        return end + line_breaks_len(&s[end..]);
    }
    if c == ' ' && starts_with(after, Class::Other) {
        let end = first + run_len(after, Class::Other);
        return end + line_breaks_len(&s[end..]);
    }
    // White space: alternatives 5, 6 and 7.
    let space = run_len(s, Class::Space);
    if let Some(last_break) = s[..space].rfind(|c| c == '\r' || c == '\n') {
        return last_break + 1;
    }
    if space == s.len() {
        return space;
    }
    let last = s[..space].chars().next_back().map_or(0, char::len_utf8);
    if space > last {
        space - last
    } else {
        space
    }
}

/// The length of the contraction suffix (`s`, `t`, `re`, `ve`, `m`, `ll`, `d` in any case) at
/// the start of `s`, the text after an apostrophe.
fn contraction_len(s: &str) -> Option<usize> {
    let fold = |c: char| if c == 'ſ' { 's' } else { c.to_ascii_lowercase() };
    let mut chars = s.chars();
    let a = chars.next()?;
    if matches!(fold(a), 's' | 't' | 'm' | 'd') {
        return Some(a.len_utf8());
    }
    let b = chars.next()?;
    match (fold(a), fold(b)) {
        ('r', 'e') | ('v', 'e') | ('l', 'l') => Some(a.len_utf8() + b.len_utf8()),
        _ => None,
    }
}

fn starts_with(s: &str, wanted: Class) -> bool {
    s.chars().next().map_or(false, |c| class(c) == wanted)
}

/// The length in bytes of the run of `wanted` characters at the start of `s`.
fn run_len(s: &str, wanted: Class) -> usize {
    s.char_indices().find(|&(_, c)| class(c) != wanted).map_or(s.len(), |(i, _)| i)
}

fn line_breaks_len(s: &str) -> usize {
    s.bytes().take_while(|&b| b == b'\r' || b == b'\n').count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<&str> {
        split(text).collect()
    }

    #[test]
    fn ascii_fast_path_agrees_with_the_table() {
        for b in 0u8..128 {
            let c = b as char;
            let cp = b as u32;
            let in_table = CLASSES.iter().find(|r| r.0 <= cp && cp <= r.1).map_or(Class::Other, |r| r.2);
            assert_eq!(class(c), in_table, "{:?}", c);
        }
    }

    #[test]
    fn classes_beyond_ascii() {
        assert_eq!(class('é'), Class::Letter);
        assert_eq!(class('中'), Class::Letter);
        assert_eq!(class('\u{0301}'), Class::Other); // combining acute accent (Mn)
        assert_eq!(class('\u{094d}'), Class::Other); // Devanagari virama (Mn)
        assert_eq!(class('½'), Class::Number);
        assert_eq!(class('٣'), Class::Number);
        assert_eq!(class('\u{3000}'), Class::Space);
        assert_eq!(class('\u{85}'), Class::Space);
        assert_eq!(class('\u{200b}'), Class::Other); // zero width space is not \s
        assert_eq!(class('😀'), Class::Other);
        assert_eq!(class('\u{10ffff}'), Class::Other);
    }

    #[test]
    fn contractions_any_case() {
        assert_eq!(pieces("I'm"), ["I", "'m"]);
        assert_eq!(pieces("DON'T"), ["DON", "'T"]);
        assert_eq!(pieces("they'LL've"), ["they", "'LL", "'ve"]);
        assert_eq!(pieces("x'ſx"), ["x", "'ſ", "x"]);
        assert_eq!(pieces("'x"), ["'x"]);
        assert_eq!(pieces("'"), ["'"]);
        assert_eq!(pieces("'l"), ["'l"]);
    }

    #[test]
    fn letters_take_one_leading_character() {
        assert_eq!(pieces("Hello world"), ["Hello", " world"]);
        assert_eq!(pieces("a\tb"), ["a", "\tb"]);
        assert_eq!(pieces("a\nb"), ["a", "\n", "b"]);
        assert_eq!(pieces("a\u{3000}b"), ["a", "\u{3000}b"]);
        assert_eq!(pieces("(abc)"), ["(abc", ")"]);
        assert_eq!(pieces("क्ष"), ["क", "्ष"]);
    }

    #[test]
    fn numbers_are_single_characters() {
        assert_eq!(pieces("2024"), ["2", "0", "2", "4"]);
        assert_eq!(pieces("1,000.5"), ["1", ",", "0", "0", "0", ".", "5"]);
        assert_eq!(pieces("x1"), ["x", "1"]);
        assert_eq!(pieces(" 1"), [" ", "1"]);
    }

    #[test]
    fn punctuation_runs_keep_following_line_breaks() {
        assert_eq!(pieces("a!!\n\nb"), ["a", "!!\n\n", "b"]);
        assert_eq!(pieces(" !!\r\nz"), [" !!\r\n", "z"]);
        assert_eq!(pieces("  !"), [" ", " !"]);
        assert_eq!(pieces("😀😀 🎉"), ["😀😀", " 🎉"]);
    }

    #[test]
    fn white_space_runs() {
        assert_eq!(pieces("a \n\n b"), ["a", " \n\n", " b"]);
        assert_eq!(pieces("a  "), ["a", "  "]);
        assert_eq!(pieces("a \t\n  "), ["a", " \t\n", "  "]);
        assert_eq!(pieces("  \t b"), ["  \t", " b"]);
        assert_eq!(pieces("x  \t y"), ["x", "  \t", " y"]);
        assert_eq!(pieces("x\r\n\r\ny"), ["x", "\r\n\r\n", "y"]);
        assert_eq!(pieces("\n\n\n"), ["\n\n\n"]);
        assert_eq!(pieces("a \u{3000}1"), ["a", " ", "\u{3000}", "1"]);
        assert_eq!(pieces(" "), [" "]);
        assert_eq!(pieces(""), Vec::<&str>::new());
    }
}
