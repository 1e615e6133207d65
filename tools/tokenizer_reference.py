#!/usr/bin/env python3
"""Reference data for the Rust tokenizer (host/src/tokenizer), made with Hugging Face `tokenizers`.

    pip install tokenizers
    python3 tools/tokenizer_reference.py

It writes two files:

* tests/fixtures/tokenizer/reference.json: the ids and decodings that `tokenizers` gives for a
  varied corpus (plus seeded random strings) with tokenizer.json from the same folder, read by
  tests/tokenizer.rs;
* host/src/tokenizer/unicode_tables.rs: the code points that the regex engine of `tokenizers`
  (Oniguruma) counts as \\p{L}, \\p{N} and \\s, and those that its normalizer acts on, found
  by asking `tokenizers` about every code point, so that the Rust pre-tokenizer and normalizer
  treat characters exactly as the reference does even where its Unicode version differs.
"""

import json
import random
from pathlib import Path

import tokenizers
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizer"
TABLES = ROOT / "host" / "src" / "tokenizer" / "unicode_tables.rs"

LONG_PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. In 2023, researchers trained models with "
    "1,000,000,000 parameters on 3.5 trillion tokens; the results (see Table 2) were, frankly, "
    "astonishing! Meanwhile—somewhere in Zürich—a café served crème brûlée at 7:45 p.m. "
    "\"Isn't it lovely?\" she asked. 'Yes,' he said, 'it's the best I've had.'\n\n"
    "Vision-language models read images as patches: a 448×448 picture becomes 1024 tokens "
    "before merging. 视觉语言模型把图像切成小块。 Les modèles multimodaux sont fascinants.  "
)

CORPUS = [
    "",
    "Hello, world!",
    "Hello world",
    " Hello world",
    "hello   world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say DON'T, but we've got it and you'd agree it's John's.",
    "I'M SURE THEY'LL SAY IT'S FINE",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D 'x",
    "ſome 'ſ 'ſx ſtraße",
    "你好，世界！今天天气很好。",
    "中华人民共和国成立于1949年10月1日。",
    "日本語のテキストです。カタカナとひらがな、漢字。",
    "안녕하세요, 세계! 한국어 문장입니다.",
    "مرحبا بالعالم، هذا نص عربي.",
    "नमस्ते दुनिया, यह हिंदी पाठ है। क्षत्रिय",
    "Привет, мир! Это русский текст.",
    "Γειά σου Κόσμε",
    "שלום עולם",
    "สวัสดีชาวโลก",
    "Xin chào thế giới, tiếng Việt có dấu.",
    "😀😃😄 emoji 🎉",
    "👨‍👩‍👧‍👦 family",
    "👍🏽👍🏿 thumbs",
    "🏳️‍🌈 flag 🇯🇵🇺🇸",
    "a😀b😀c 🫠🦩🧌 𪚥龘鬱ꙮ",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{:?}\", v);\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "const f = async (x) => { await fetch(`/api/${x}`); };",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"box\">&nbsp;<a href='#'>link</a></div>",
    "    indented with spaces",
    "\tindented with a tab",
    "trailing spaces   ",
    "trailing tab\t",
    "\n\n\n",
    "line one\nline two\r\nline three\rend",
    "a\n\n\nb",
    "  \t ",
    " ",
    "x  \t y",
    "word \n\n  next",
    "spaces\u3000ideographic\u00a0nbsp\u2009thin",
    "12345678901234567890",
    "3.14159 2.71828 -0.5 1e-9",
    "1,000,000 and 1.000.000",
    "Call 555-0123 at 10:30am on 2024-01-15.",
    "①②③ Ⅻ ½ ¾ ٣٤٥ ३४५",
    "café naïve résumé",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "A\u030a \u212b \u1e9b\u0323",
    "한\u1100\u1161\u11a8 decomposed hangul",
    # Marks newer than the Unicode data of the reference normalizer, which leaves them alone.
    "e\u1abf\u0301 \u1ddc\u1715 \U00011935\U00011930 a\U0001e08f\u0323",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>assistant\n",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "<|vision_start|><|image_pad|><|image_pad|><|image_pad|><|vision_end|>Describe this image.",
    "text<|endoftext|>more",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|im_start|><|im_end|><|im_start|>",
    "<|im_start |> <|im_end|x <|im_start|",
    " <|im_end|> ",
    "!!! ??? ... --- *** ###",
    "(parentheses) [brackets] {braces}",
    "mixed中文English混合text",
    "ÄÖÜäöüß ÀÉÎÕÛ",
    "\u200b\u200d\ufeff zero width",
    "tab\tseparated\tvalues\n1\t2\t3",
    "http://example.com/path?query=1&x=y#frag",
    "email@example.com",
    "$100.00 €50 £20 ¥1000",
    "e=mc² ∑∫∂ √2 ≠ ∞",
    LONG_PARAGRAPH,
    LONG_PARAGRAPH * 3,
]

# Characters for the seeded random strings: every class the pre-tokenizer distinguishes.
FUZZ_ALPHABET = (
    list("abcXYZ") + list("0123") + list(" \t\n\r") + list("'sStTmMlLdD") + list(".,!?-_<>|")
    + ["\u3000", "\u00a0", "\u2028", "\u0085", "\u000b", "\u000c"]
    + list("中文字日本한국") + ["\u0301", "\u0308", "\u0323", "\u094d", "\u0915", "e", "\u017f", "\u1715"]
    + ["😀", "👍", "\U0001f3fd", "\u200d", "①", "٣", "½", "é", "ß"]
    + ["<|im_start|>", "<|im_end|>", "<think>", "<|image_pad|>"]
)


def fuzz_strings(count):
    rng = random.Random(20240601)
    return ["".join(rng.choice(FUZZ_ALPHABET) for _ in range(rng.randint(1, 24))) for _ in range(count)]


def encode_case(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    return {
        "text": text,
        "ids": ids,
        "decoded": tok.decode(ids, skip_special_tokens=False),
        "decoded_skip": tok.decode(ids, skip_special_tokens=True),
    }


def decode_cases(tok):
    """Id sequences that no encoding produces: byte-level tokens of cut characters, special
    tokens among them."""
    emoji = tok.encode("🫠", add_special_tokens=False).ids  # three byte-level tokens
    cjk = tok.encode("龘", add_special_tokens=False).ids  # two byte-level tokens
    im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    think = tok.token_to_id("<think>")
    hello = tok.encode("hello", add_special_tokens=False).ids
    seqs = [
        emoji[:1],
        emoji[:1] + hello,
        emoji[:1] + [im_end] + emoji[1:],
        emoji[1:] + emoji[:1],
        cjk[::-1],
        [im_start] + hello + [im_end, think] + hello,
        [tok.token_to_id("<|vision_start|>"), tok.token_to_id("<|image_pad|>"), tok.token_to_id("<|vision_end|>")],
        [],
    ]
    return [
        {
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
        }
        for ids in seqs
    ]


# Every code point but NUL (which separates probes) and the surrogates.
ALL_CHARS = [chr(c) for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000]


def to_ranges(points):
    ranges = []
    for c in sorted(points):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ranges


def class_ranges(pattern):
    """Inclusive ranges of the code points that `pattern` (one character class) matches."""
    inverse = pre_tokenizers.Split(Regex(f"[^{pattern}]+"), behavior="removed")
    return to_ranges({ord(ch) for piece, _ in inverse.pre_tokenize_str("".join(ALL_CHARS)) for ch in piece})


def normalizer_ranges():
    """Inclusive ranges of the code points that the normalizers of `tokenizers` act on: those
    that NFD changes, those in another's decomposition, and those of a non-zero combining class
    (NFD moves U+0301, class 230, from before them, or U+0316, class 220, from after them). Its
    Unicode data is older than that of the Rust crate unicode-normalization, which must leave
    every other character alone to agree."""
    nfd = normalizers.NFD()

    def nfd_each(pieces):
        out = nfd.normalize_str("\0".join(pieces)).split("\0")
        assert len(out) == len(pieces)
        return out

    known = set()
    for ch, decomposed in zip(ALL_CHARS, nfd_each(ALL_CHARS)):
        if decomposed != ch:
            known.update(map(ord, ch + decomposed))
    for probe in (lambda ch: "\u0301" + ch, lambda ch: ch + "\u0316"):
        pieces = [probe(ch) for ch in ALL_CHARS]
        known.update(ord(ch) for ch, p, d in zip(ALL_CHARS, pieces, nfd_each(pieces)) if d != p)
    return to_ranges(known)


def rust_table(name, rows, row_type, format_row, per_line):
    lines = ["#[rustfmt::skip]", f"pub(super) static {name}: [{row_type}; {len(rows)}] = ["]
    for i in range(0, len(rows), per_line):
        lines.append("    " + " ".join(format_row(*row) + "," for row in rows[i : i + per_line]))
    return lines + ["];"]


def write_tables(path):
    classes = [(lo, hi, "Letter") for lo, hi in class_ranges(r"\p{L}")]
    classes += [(lo, hi, "Number") for lo, hi in class_ranges(r"\p{N}")]
    classes += [(lo, hi, "Space") for lo, hi in class_ranges(r"\s")]
    lines = [
        f"//! Generated by tools/tokenizer_reference.py from Hugging Face `tokenizers` {tokenizers.__version__};",
        "//! do not edit. Sorted, disjoint, inclusive code point ranges.",
        "",
        "use super::class::Class::{self, Letter, Number, Space};",
        "",
        "/// \\p{L} (letters), \\p{N} (numbers) and \\s (white space) of its regex engine.",
    ]
    lines += rust_table(
        "CLASSES", sorted(classes), "(u32, u32, Class)", lambda lo, hi, c: f"(0x{lo:x}, 0x{hi:x}, {c})", 4)
    lines += ["", "/// The characters that its normalizers act on (see `normalize`)."]
    lines += rust_table(
        "NORMALIZER_KNOWN", normalizer_ranges(), "(u32, u32)", lambda lo, hi: f"(0x{lo:x}, 0x{hi:x})", 6)
    path.write_text("\n".join(lines) + "\n")


def main():
    tok = Tokenizer.from_file(str(FIXTURES / "tokenizer.json"))
    reference = {
        "tokenizers_version": tokenizers.__version__,
        "encode": [encode_case(tok, text) for text in CORPUS],
        "fuzz": [encode_case(tok, text) for text in fuzz_strings(300)],
        "decode": decode_cases(tok),
    }
    out = FIXTURES / "reference.json"
    out.write_text(json.dumps(reference, ensure_ascii=False, indent=1) + "\n")
    counts = ", ".join(f"{len(cases)} {name}" for name, cases in reference.items() if isinstance(cases, list))
    print(f"wrote {out}: {counts} cases")
    write_tables(TABLES)
    print(f"wrote {TABLES}")


if __name__ == "__main__":
    main()
