//! Byte-level BPE: the GPT-2 byte alphabet and the merge loop, with a cache of encoded pieces.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

/// The byte alphabet of byte-level BPE, both ways: printable Latin-1 bytes stand for themselves,
/// the other 68 bytes for the characters U+0100..=U+0143, in byte order.
pub(super) struct ByteAlphabet {
    chars: [char; 256],
    bytes: [Option<u8>; 0x144],
}

impl ByteAlphabet {
    pub(super) fn new() -> ByteAlphabet {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        let mut alphabet = ByteAlphabet { chars: ['\0'; 256], bytes: [None; 0x144] };
        let mut next_extra = 0x100u32;
        for b in 0..=255u8 {
            let c = if printable(b) {
                b as char
            } else {
                next_extra += 1;
                char::from_u32(next_extra - 1).expect("U+0100..=U+0143 are characters")
            };
            alphabet.chars[b as usize] = c;
            alphabet.bytes[c as usize] = Some(b);
        }
        alphabet
    }

    /// The character that stands for `byte`.
    pub(super) fn char_of(&self, byte: u8) -> char {
        self.chars[byte as usize]
    }

    /// The bytes that a token written in the alphabet stands for, or `None` when one of its
    /// characters is not in the alphabet.
    pub(super) fn token_bytes(&self, token: &str) -> Option<Vec<u8>> {
        token.chars().map(|c| self.bytes.get(c as usize).copied().flatten()).collect()
    }
}

/// A multiplicative hasher for the merge table, whose keys are two token ids in one `u64`.
#[derive(Default)]
pub(super) struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

/// Merges by pair of token ids (`left << 32 | right`): the merge's rank and the merged token.
pub(super) type MergeMap = HashMap<u64, (u32, u32), BuildHasherDefault<PairHasher>>;

pub(super) fn pair_key(left: u32, right: u32) -> u64 {
    u64::from(left) << 32 | u64::from(right)
}

/// Pieces up to this many bytes are cached, up to [`CACHE_ENTRIES`] of them.
const CACHE_PIECE_BYTES: usize = 64;
const CACHE_ENTRIES: usize = 100_000;

/// The BPE model: token ids of the single bytes, the merges, and a cache of encoded pieces.
pub(super) struct Bpe {
    byte_ids: [u32; 256],
    merges: MergeMap,
    cache: Mutex<HashMap<String, Vec<u32>>>,
}

/// One symbol of a word being merged; symbols form a linked list through `prev` and `next`.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: usize,
    next: usize,
    merged_away: bool,
}

const NONE: usize = usize::MAX;

impl Bpe {
    pub(super) fn new(byte_ids: [u32; 256], merges: MergeMap) -> Bpe {
        Bpe { byte_ids, merges, cache: Mutex::new(HashMap::new()) }
    }

    /// The merges `(left, right)` in rank order.
    pub(super) fn merges(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32, u32)> = self.merges.iter().map(|(&k, &(rank, _))| (rank, (k >> 32) as u32, k as u32)).collect();
        v.sort_unstable();
        v.into_iter().map(|(_, l, r)| (l, r)).collect()
    }

    /// Appends the token ids of `piece` (one pre-tokenizer piece, as raw text) to `out`.
    pub(super) fn encode(&self, piece: &str, out: &mut Vec<u32>) {
        let cacheable = piece.len() <= CACHE_PIECE_BYTES;
        if cacheable {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(ids) = cache.get(piece) {
                out.extend_from_slice(ids);
                return;
            }
        }
        let start = out.len();
        self.merge(piece.as_bytes(), out);
        if cacheable {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if cache.len() < CACHE_ENTRIES {
                cache.insert(piece.to_string(), out[start..].to_vec());
            }
        }
    }

    /// The merge loop: starting from one symbol per byte, repeatedly applies the merge of lowest
    /// rank among adjacent pairs (the leftmost pair on a tie), until no pair has a merge.
    fn merge(&self, bytes: &[u8], out: &mut Vec<u32>) {
        let n = bytes.len();
        let mut symbols: Vec<Symbol> = (0..n)
            .map(|i| Symbol {
                id: self.byte_ids[bytes[i] as usize],
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
                merged_away: false,
            })
            .collect();
        // Candidate merges as (rank, position of the left symbol, merged id), smallest first.
        let mut queue = BinaryHeap::new();
        let candidate = |symbols: &[Symbol], left: usize| {
            let right = symbols[left].next;
            if right == NONE {
                return None;
            }
            let key = pair_key(symbols[left].id, symbols[right].id);
            self.merges.get(&key).map(|&(rank, id)| Reverse((rank, left, id)))
        };
        for i in 0..n.saturating_sub(1) {
            queue.extend(candidate(&symbols, i));
        }
        while let Some(Reverse((rank, left, id))) = queue.pop() {
            // Skip entries made stale by earlier merges around this position.
            if symbols[left].merged_away || candidate(&symbols, left) != Some(Reverse((rank, left, id))) {
                continue;
            }
            let right = symbols[left].next;
            symbols[right].merged_away = true;
            let after = symbols[right].next;
            symbols[left].id = id;
            symbols[left].next = after;
            if after != NONE {
                symbols[after].prev = left;
            }
            let before = symbols[left].prev;
            if before != NONE {
                queue.extend(candidate(&symbols, before));
            }
            queue.extend(candidate(&symbols, left));
        }
        let mut i = if n == 0 { NONE } else { 0 };
        while i != NONE {
            out.push(symbols[i].id);
            i = symbols[i].next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_a_bijection_onto_its_characters() {
        let alphabet = ByteAlphabet::new();
        assert_eq!(alphabet.char_of(b'a'), 'a');
        assert_eq!(alphabet.char_of(b' '), 'Ġ');
        assert_eq!(alphabet.char_of(b'\n'), 'Ċ');
        assert_eq!(alphabet.char_of(0), '\u{100}');
        assert_eq!(alphabet.char_of(0xad), '\u{143}');
        for b in 0..=255u8 {
            let token = alphabet.char_of(b).to_string();
            assert_eq!(alphabet.token_bytes(&token), Some(vec![b]));
        }
        assert_eq!(alphabet.token_bytes("ĠhiĊ"), Some(b" hi\n".to_vec()));
        assert_eq!(alphabet.token_bytes("<|im_end|>"), Some(b"<|im_end|>".to_vec()));
        assert_eq!(alphabet.token_bytes("中"), None);
        assert_eq!(alphabet.token_bytes("\u{ad}"), None);
    }

    #[test]
    fn merges_lowest_rank_first_and_leftmost_on_ties() {
        // Ids: bytes a=0, b=1; "ab"=2, "aa"=3, "aaa"=4, "aab"=5.
        let mut byte_ids = [9; 256];
        byte_ids[b'a' as usize] = 0;
        byte_ids[b'b' as usize] = 1;
        let mut merges = MergeMap::default();
        merges.insert(pair_key(0, 0), (0, 3));
        merges.insert(pair_key(0, 1), (1, 2));
        merges.insert(pair_key(3, 0), (2, 4));
        merges.insert(pair_key(3, 1), (3, 5));
        let bpe = Bpe::new(byte_ids, merges);
        let encode = |s: &str| {
            let mut out = Vec::new();
            bpe.encode(s, &mut out);
            out
        };
        assert_eq!(encode(""), Vec::<u32>::new());
        assert_eq!(encode("ab"), [2]);
        assert_eq!(encode("aab"), [5]);
        assert_eq!(encode("aaa"), [4]);
        assert_eq!(encode("aaaa"), [3, 3]);
        assert_eq!(encode("aaab"), [3, 2]);
        assert_eq!(encode("bab"), [1, 2]);
        assert_eq!(encode("aaab"), [3, 2], "cached");
    }
}
