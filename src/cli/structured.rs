//! Structured-output flags: `generate` and `chat` take `--json-schema FILE`, `--regex R` and
//! `--grammar FILE` (Lark), one of them; `bench` takes `--json-schema FILE`. The grammar is
//! compiled once (before the weights load, so a bad one fails fast) and constrains every reply.

use super::load::CliResult;
use qwen3_vl::generate::grammar::{Grammar, GrammarConstraint, GrammarSpec, Grammars};
use qwen3_vl::generate::sampling::Constraint;
use qwen3_vl::generate::Sampler;
use qwen3_vl::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;

/// What the reply must match (at most one of these).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct StructuredArgs {
    /// Constrain the reply to JSON that validates against the JSON schema in FILE.
    #[clap(long, value_name = "FILE", conflicts_with_all = ["regex", "grammar"])]
    pub json_schema: Option<PathBuf>,
    /// Constrain the reply to text that the regular expression R matches whole (Rust regex
    /// syntax).
    #[clap(long, value_name = "R", conflicts_with = "grammar")]
    pub regex: Option<String>,
    /// Constrain the reply to the Lark grammar in FILE (llguidance's syntax; `start:` is the
    /// top rule).
    #[clap(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

impl StructuredArgs {
    /// The spec the flags name, read from its file (`None` without one).
    pub fn spec(&self) -> CliResult<Option<GrammarSpec>> {
        let read = |p: &PathBuf, flag: &str| std::fs::read_to_string(p).map_err(|e| format!("{} {}: {}", flag, p.display(), e));
        Ok(if let Some(p) = &self.json_schema {
            Some(GrammarSpec::json_schema_text(&read(p, "--json-schema")?).map_err(|e| format!("--json-schema {}: {}", p.display(), e))?)
        } else if let Some(r) = &self.regex {
            Some(GrammarSpec::Regex(r.clone()))
        } else {
            self.grammar.as_ref().map(|p| read(p, "--grammar")).transpose()?.map(GrammarSpec::Lark)
        })
    }

    /// The compiled grammar of the flags for `tok` (`None` without one); errors name the flag.
    pub fn compile(&self, tok: &Tokenizer) -> CliResult<Option<Arc<Grammar>>> {
        let Some(spec) = self.spec()? else { return Ok(None) };
        let flag = if self.json_schema.is_some() { "--json-schema" } else if self.regex.is_some() { "--regex" } else { "--grammar" };
        let g = Grammars::new(tok)?.compile(&spec).map_err(|e| format!("{}: {}", flag, e))?;
        log::debug!("{}: compiled in {:.1} ms", flag, g.compile_secs() * 1e3);
        Ok(Some(g))
    }
}

/// `sampler` constrained by `grammar` from its start, if there is one.
pub fn constrain(sampler: Sampler, grammar: Option<&Arc<Grammar>>) -> Sampler {
    match grammar {
        Some(g) => sampler.with_constraint(g.constraint()),
        None => sampler,
    }
}

/// For benchmarks: `grammar` over and over. Once a reply is complete and the end of sequence
/// taken, the next token starts the grammar again, so every token of a long run is drawn under
/// its mask.
pub struct Restarting {
    grammar: Arc<Grammar>,
    now: GrammarConstraint,
    eos: u32,
}

impl Restarting {
    pub fn new(grammar: Arc<Grammar>, eos: u32) -> Restarting {
        Restarting { now: grammar.matcher(), grammar, eos }
    }
}

impl Constraint for Restarting {
    fn fill_mask(&mut self, words: &mut [u32]) -> qwen3_vl::Result<()> {
        self.now.fill_mask(words)
    }

    fn accept(&mut self, token: u32) -> qwen3_vl::Result<()> {
        self.now.accept(token)?;
        if token == self.eos {
            self.now = self.grammar.matcher();
        }
        Ok(())
    }
}

/// `bench --json-schema FILE`: the schema compiled for the checkpoint's tokenizer (found beside
/// the model as `generate` finds it), with its end-of-sequence id.
pub fn bench_schema(path: &std::path::Path, tok: &Tokenizer) -> CliResult<(Arc<Grammar>, u32)> {
    let args = StructuredArgs { json_schema: Some(path.to_path_buf()), ..Default::default() };
    let g = args.compile(tok)?.expect("a schema was given");
    Ok((g, qwen3_vl::generate::grammar::end_of_sequence(tok)?))
}
