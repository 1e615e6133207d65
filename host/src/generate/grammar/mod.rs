//! Structured output: what a reply must match (a JSON schema, any JSON object, a regex, one of
//! a list of strings, a Lark grammar), compiled by llguidance into per-token masks.
//!
//! Use:
//! 1. [`Grammars::new`] once per tokenizer: it builds llguidance's token trie from our
//!    vocabulary (`env.rs`; about half a second for 151k ids) and holds a bounded cache of compiled
//!    grammars. Share it (it is `Sync`).
//! 2. [`Grammars::compile`] a [`GrammarSpec`]: compiled once per spec, then taken from the
//!    cache. A bad schema, regex or grammar is an [`Error::Grammar`] that names the problem.
//! 3. [`Grammar::constraint`] for each sequence, given to
//!    [`crate::generate::Sampler::with_constraint`]: the sampler masks every draw with it and
//!    tells it each token taken. A complete match allows only the end of sequence
//!    (`<|im_end|>`), so the reply stops there.
//!
//! JSON schemas compile with llguidance's options for compact JSON as Python's `json.dumps`
//! writes it (`", "` and `": "` between items, no other whitespace), so a model cannot spend
//! its tokens on whitespace; a schema's own `x-guidance` object overrides that.

mod constraint;
mod env;

pub use constraint::GrammarConstraint;
pub use env::{end_of_sequence, token_env};

use crate::{Error, Result, Tokenizer};
use llguidance::api::TopLevelGrammar;
use llguidance::{ParserFactory, TokenParser};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What a reply must match.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format` `json_object`).
    JsonObject,
    /// A JSON schema, as JSON text (see [`GrammarSpec::json_schema`]).
    JsonSchema(String),
    /// A regular expression (Rust `regex` syntax) the whole reply matches.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax (`start:` is the top rule).
    Lark(String),
}

impl GrammarSpec {
    /// A JSON schema given as a value.
    pub fn json_schema(schema: &Value) -> GrammarSpec {
        GrammarSpec::JsonSchema(schema.to_string())
    }

    /// A JSON schema given as JSON text (an error names what is wrong with the text).
    pub fn json_schema_text(text: &str) -> Result<GrammarSpec> {
        let v: Value = serde_json::from_str(text).map_err(|e| Error::Grammar { msg: format!("the JSON schema is not valid JSON: {}", e) })?;
        Ok(GrammarSpec::json_schema(&v))
    }

    /// What kind of spec this is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonObject => "json_object",
            GrammarSpec::JsonSchema(_) => "JSON schema",
            GrammarSpec::Regex(_) => "regex",
            GrammarSpec::Choice(_) => "choice",
            GrammarSpec::Lark(_) => "grammar",
        }
    }

    /// llguidance's form of the spec.
    fn top_level(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            GrammarSpec::JsonSchema(text) => {
                let v: Value = serde_json::from_str(text).map_err(|e| Error::Grammar { msg: format!("the JSON schema is not valid JSON: {}", e) })?;
                TopLevelGrammar::from_json_schema(compact(v))
            }
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Choice(list) => {
                if list.is_empty() {
                    return Err(Error::Grammar { msg: "the choice list is empty".into() });
                }
                if let Some(i) = list.iter().position(|c| c.is_empty()) {
                    return Err(Error::Grammar { msg: format!("choice {} is an empty string", i) });
                }
                // each choice as a Lark string literal (JSON string syntax)
                let alts: Vec<String> = list.iter().map(|c| Value::String(c.clone()).to_string()).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        })
    }
}

/// `schema` with llguidance's compact-JSON options, unless it sets its own `x-guidance`.
fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

/// A compiled grammar: the parser at its start, deep-cloned for each sequence. (A plain clone
/// shares llguidance's lexer behind one mutex, which serializes the masks of a batch's
/// sequences under one schema: 16 rows cost 2.3x the free step on an H100 that way.)
pub struct Grammar {
    parser: Mutex<TokenParser>,
    eos: u32,
    compile_secs: f64,
}

impl Grammar {
    /// A constraint at the start of this grammar, for one sequence.
    pub fn constraint(&self) -> Box<dyn crate::generate::sampling::Constraint> {
        Box::new(self.matcher())
    }

    /// [`Grammar::constraint`] as its own type (tests and benchmarks look inside).
    pub fn matcher(&self) -> GrammarConstraint {
        let parser = self.parser.lock().unwrap_or_else(|p| p.into_inner()).deep_clone();
        GrammarConstraint::new(parser, self.eos)
    }

    /// Seconds its compilation took.
    pub fn compile_secs(&self) -> f64 {
        self.compile_secs
    }
}

/// Grammars compiled at most this many at once are kept (least recently used go first).
pub const CACHE_GRAMMARS: usize = 64;

/// The grammar compiler of one tokenizer, with a cache of compiled grammars by spec.
pub struct Grammars {
    factory: ParserFactory,
    eos: u32,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    /// Each spec's grammar and when it was last used.
    map: HashMap<GrammarSpec, (Arc<Grammar>, u64)>,
    clock: u64,
}

impl Grammars {
    /// The compiler for `tok` (builds the token trie: do it once per tokenizer).
    pub fn new(tok: &Tokenizer) -> Result<Grammars> {
        let t0 = Instant::now();
        let env = token_env(tok)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| Error::Grammar { msg: format!("token environment: {}", e) })?;
        factory.quiet();
        log::debug!("grammar: token trie of {} ids built in {:.3} s", tok.vocab_size(), t0.elapsed().as_secs_f64());
        Ok(Grammars { factory, eos: end_of_sequence(tok)?, cache: Mutex::new(Cache::default()) })
    }

    /// `spec` compiled, from the cache when it was compiled before. Errors name the spec's kind
    /// and llguidance's reason (`JSON schema: Unknown type: strin`).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Arc<Grammar>> {
        {
            let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            c.clock += 1;
            let now = c.clock;
            if let Some((g, used)) = c.map.get_mut(spec) {
                *used = now;
                return Ok(Arc::clone(g));
            }
        }
        // compiled outside the lock: another thread may compile the same spec meanwhile
        let t0 = Instant::now();
        let top = spec.top_level()?;
        let mut parser = self.factory.create_parser(top).map_err(|e| Error::Grammar { msg: format!("{}: {}", spec.kind(), e) })?;
        for w in parser.grammar_warnings() {
            log::warn!("grammar: {}: {}", spec.kind(), w);
        }
        let compile_secs = t0.elapsed().as_secs_f64();
        log::debug!("grammar: {} compiled in {:.1} ms", spec.kind(), compile_secs * 1e3);
        let g = Arc::new(Grammar { parser: Mutex::new(parser), eos: self.eos, compile_secs });
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if c.map.len() >= CACHE_GRAMMARS {
            if let Some(oldest) = c.map.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()) {
                c.map.remove(&oldest);
            }
        }
        let now = c.clock;
        c.map.insert(spec.clone(), (Arc::clone(&g), now));
        Ok(g)
    }

    /// A constraint for one sequence from a Lark grammar (the tool-call parser's entry).
    pub fn lark_constraint(&self, grammar: &str) -> Result<Box<dyn crate::generate::sampling::Constraint>> {
        Ok(self.compile(&GrammarSpec::Lark(grammar.to_string()))?.constraint())
    }

    /// A constraint for one sequence from a JSON schema.
    pub fn json_schema_constraint(&self, schema: &Value) -> Result<Box<dyn crate::generate::sampling::Constraint>> {
        Ok(self.compile(&GrammarSpec::json_schema(schema))?.constraint())
    }

    /// The number of grammars cached.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).map.len()
    }

    /// The end-of-sequence id a complete grammar allows.
    pub fn eos(&self) -> u32 {
        self.eos
    }
}

#[cfg(test)]
mod tests;
