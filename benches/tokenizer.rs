//! Tokenizer benchmark: `cargo bench --bench tokenizer`, and beside Hugging Face's `tokenizers`
//! crate (0.22, Oniguruma, as Python's) in the same run:
//! `cargo bench --features hf-tokenizers --bench tokenizer`.
//!
//! Corpus: the repository's own .rs, .md and .py files (English prose and code, one document
//! per file) interleaved with Chinese documents of about 4 KB, words sampled from the
//! vocabulary's CJK tokens with a fixed seed (half as many bytes). Rows: loading tokenizer.json,
//! encoding (MB/s and tokens/s, one call per document; also each kind of text alone and one
//! 2.6 KB document), decoding whole documents, streaming decoding (one id at a time), and 1 MiB
//! of spaces plus 768 KiB of "\n \t" (the regex engines' backtracking). Each row is the best of
//! `TOKENIZER_BENCH_ROUNDS` (default 3) timed passes after a warm-up pass, on one thread. With
//! the library, the run also checks that both give the same ids and texts.

use qwen3_vl::Tokenizer;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's .rs, .md and .py files (not fixtures, not build output), sorted by path.
fn sources(dir: &Path, out: &mut Vec<String>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if !name.starts_with('.') && !["target", "fixtures"].contains(&name.as_str()) {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") || name.ends_with(".md") || name.ends_with(".py") {
            if let Ok(text) = std::fs::read_to_string(&p) {
                out.push(text);
            }
        }
    }
}

/// Chinese documents of about 4 KB, `bytes` in all: words sampled from the vocabulary's CJK
/// tokens, with punctuation, line breaks and numbers between some of them.
fn chinese(tok: &Tokenizer, bytes: usize) -> Vec<String> {
    let cjk = |c: char| ('\u{4e00}'..='\u{9fff}').contains(&c);
    let words: Vec<String> = (0..tok.vocab_size() as u32)
        .filter_map(|id| tok.decode(&[id], false).ok())
        .filter(|w| !w.is_empty() && w.chars().all(cjk))
        .collect();
    assert!(words.len() > 10_000, "{} CJK tokens", words.len());
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut docs = Vec::new();
    let mut total = 0;
    while total < bytes {
        let mut doc = String::new();
        while doc.len() < 4096 {
            doc.push_str(&words[next(words.len())]);
            match next(12) {
                0 => doc.push('。'),
                1 => doc.push('，'),
                2 => doc.push_str("。\n"),
                3 => doc.push_str(&next(3000).to_string()),
                _ => {}
            }
        }
        total += doc.len();
        docs.push(doc);
    }
    docs
}

/// The best time of `rounds` passes after a warm-up, and the last pass's result.
fn best<T>(rounds: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut out = f();
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let t = Instant::now();
        out = f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    (best, out)
}

/// What one implementation measured: seconds per row, and the ids and texts to compare.
struct Run {
    load: f64,
    encode: f64,
    english: f64,
    chinese: f64,
    document: f64,
    decode: f64,
    stream: f64,
    spaces: f64,
    ids: Vec<Vec<u32>>,
    texts: Vec<String>,
    space_ids: Vec<u32>,
}

/// The test texts, by kind.
struct Corpus {
    mixed: Vec<String>,
    english: Vec<String>,
    chinese: Vec<String>,
    document: String,
    spaces: String,
}

/// Times one implementation, given as load, encode, decode and stream-decode functions.
fn run<T>(
    rounds: usize,
    c: &Corpus,
    load: impl Fn() -> T,
    encode: impl Fn(&T, &str) -> Vec<u32>,
    decode: impl Fn(&T, &[u32]) -> String,
    stream: impl Fn(&T, &[u32]) -> usize,
) -> Run {
    let t = Instant::now();
    let tok = load();
    let load = t.elapsed().as_secs_f64();
    let all = |docs: &[String]| docs.iter().map(|d| encode(&tok, d)).collect::<Vec<_>>();
    let (english, _) = best(rounds, || all(&c.english));
    let (chinese, _) = best(rounds, || all(&c.chinese));
    let (document, _) = best(rounds, || (0..100).map(|_| encode(&tok, &c.document).len()).sum::<usize>());
    let (encode_s, ids) = best(rounds, || all(&c.mixed));
    let (decode_s, texts) = best(rounds, || ids.iter().map(|ids| decode(&tok, ids)).collect::<Vec<_>>());
    let (stream_s, _) = best(rounds, || ids.iter().map(|ids| stream(&tok, ids)).sum::<usize>());
    let t = Instant::now();
    let space_ids = encode(&tok, &c.spaces);
    let spaces = t.elapsed().as_secs_f64();
    Run { load, encode: encode_s, english, chinese, document: document / 100.0, decode: decode_s, stream: stream_s, spaces, ids, texts, space_ids }
}

fn ours(rounds: usize, c: &Corpus, path: &Path) -> Run {
    run(
        rounds,
        c,
        || Tokenizer::from_file(path).unwrap(),
        |t, s| t.encode(s),
        |t, ids| t.decode(ids, false).unwrap(),
        |t, ids| {
            let mut d = t.stream_decoder(false);
            ids.iter().map(|&id| d.push(id).unwrap().len()).sum::<usize>() + d.finish().len()
        },
    )
}

#[cfg(feature = "hf-tokenizers")]
fn library(rounds: usize, c: &Corpus, path: &Path) -> Option<Run> {
    Some(run(
        rounds,
        c,
        || tokenizers::Tokenizer::from_file(path).unwrap(),
        |t, s| t.encode_fast(s, false).unwrap().get_ids().to_vec(),
        |t, ids| t.decode(ids, false).unwrap(),
        // its streaming decoder: no flush at the end, text held back while it ends in U+FFFD
        |t, ids| {
            let mut d = t.decode_stream(false);
            ids.iter().map(|&id| d.step(id).unwrap().map_or(0, |s| s.len())).sum::<usize>()
        },
    ))
}

#[cfg(not(feature = "hf-tokenizers"))]
fn library(_: usize, _: &Corpus, _: &Path) -> Option<Run> {
    None
}

fn main() {
    let rounds: usize = std::env::var("TOKENIZER_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let path = root().join("tests/fixtures/tokenizer/tokenizer.json");
    let tok = Tokenizer::from_file(&path).unwrap();

    let mut english = Vec::new();
    sources(&root(), &mut english);
    let english_bytes: usize = english.iter().map(String::len).sum();
    let chinese = chinese(&tok, english_bytes / 2);
    // interleaved, so that neither kind of text has the caches to itself
    let mut mixed = Vec::new();
    for i in 0..english.len().max(chinese.len()) {
        mixed.extend(english.get(i).cloned());
        mixed.extend(chinese.get(i).cloned());
    }
    let document = english.iter().find(|d| (2000..3000).contains(&d.len())).expect("a document of 2 to 3 KB").clone();
    let spaces = format!("{}x{}", " ".repeat(1 << 20), "\n \t".repeat(1 << 18));
    let c = Corpus { mixed, english, chinese, document, spaces };
    let mb = |docs: &[String]| docs.iter().map(String::len).sum::<usize>() as f64 / 1e6;
    println!(
        "corpus: {} documents, {:.2} MB ({:.2} MB English/code, {:.2} MB Chinese); {} threads available, one used",
        c.mixed.len(),
        mb(&c.mixed),
        mb(&c.english),
        mb(&c.chinese),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let runs: Vec<(&str, Run)> = std::iter::once(("qwen3-vl", ours(rounds, &c, &path))).chain(library(rounds, &c, &path).map(|r| ("tokenizers 0.22", r))).collect();
    let tokens = runs[0].1.ids.iter().map(Vec::len).sum::<usize>() as f64 / 1e6;
    println!("{:.3} M tokens", tokens);
    print!("{:<34}", "");
    for (name, _) in &runs {
        print!(" {:>16}", name);
    }
    println!();
    let row = |label: &str, f: &dyn Fn(&Run) -> f64, digits: usize| {
        print!("{:<34}", label);
        for (_, r) in &runs {
            print!(" {:>16.*}", digits, f(r));
        }
        println!();
    };
    row("load tokenizer.json (s)", &|r| r.load, 3);
    row("encode, mixed (MB/s)", &|r| mb(&c.mixed) / r.encode, 2);
    row("encode, mixed (M tokens/s)", &|r| tokens / r.encode, 2);
    row("encode, English/code (MB/s)", &|r| mb(&c.english) / r.english, 2);
    row("encode, Chinese (MB/s)", &|r| mb(&c.chinese) / r.chinese, 2);
    row(&format!("encode, one {}-byte document (us)", c.document.len()), &|r| r.document * 1e6, 1);
    row("decode (M tokens/s)", &|r| tokens / r.decode, 2);
    row("stream decode (M tokens/s)", &|r| tokens / r.stream, 2);
    row("white space, 1.8 MB (s)", &|r| r.spaces, 3);

    assert!(runs[0].1.texts == c.mixed, "decoding gives the text back");
    for (name, r) in &runs[1..] {
        let differ = runs[0].1.ids.iter().zip(&r.ids).filter(|(a, b)| a != b).count();
        println!("{}: {} of {} documents encode differently, white space {}", name, differ, c.mixed.len(), if r.space_ids == runs[0].1.space_ids { "the same" } else { "DIFFERENT" });
        assert!(differ == 0 && r.space_ids == runs[0].1.space_ids && r.texts == runs[0].1.texts, "{} disagrees", name);
    }
}
