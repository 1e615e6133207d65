//! A checkpoint's `generation_config.json`: the sampling defaults its authors chose.
//!
//! transformers reads `do_sample`, `temperature`, `top_k`, `top_p` and `repetition_penalty`
//! from it. A file that is not a JSON object is an error naming the file (so it is fixed or
//! deleted, not silently ignored); a field of the wrong type or out of range is skipped with a
//! warning that names it and says what was expected.

use crate::generate::SamplingParams;
use crate::{Error, Result};
use serde_json::Value;
use std::path::Path;

/// The defaults a generation config gives, and what was wrong with it.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationDefaults {
    /// Greedy unless `do_sample` is true.
    pub params: SamplingParams,
    /// One line per skipped field.
    pub warnings: Vec<String>,
    /// Whether a file was found at all.
    pub found: bool,
}

impl GenerationDefaults {
    /// Greedy, from no file.
    pub fn none() -> GenerationDefaults {
        GenerationDefaults { params: SamplingParams::greedy(), warnings: Vec::new(), found: false }
    }

    /// Reads `<dir>/generation_config.json`; greedy when there is none.
    pub fn from_dir(dir: &Path) -> Result<GenerationDefaults> {
        let path = dir.join("generation_config.json");
        match std::fs::read_to_string(&path) {
            Ok(text) => GenerationDefaults::from_json(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(GenerationDefaults::none()),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// Parses the text of a generation config; `file` names it in the error and warnings.
    pub fn from_json(text: &str, file: &str) -> Result<GenerationDefaults> {
        let bad = |msg: String| Error::Config { file: file.into(), msg };
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON ({}); fix or delete the file", e)))?;
        let obj = v.as_object().ok_or_else(|| bad("is not a JSON object; fix or delete the file".into()))?;
        let mut out = GenerationDefaults { params: SamplingParams::greedy(), warnings: Vec::new(), found: true };
        let mut warnings = Vec::new();
        let mut skip = |key: &str, got: &Value, want: &str| warnings.push(format!("{}: ignoring {} = {} (expected {})", file, key, got, want));
        // 1. do_sample decides between greedy and the sampling fields
        let field = |k: &str| obj.get(k).filter(|x| !x.is_null());
        let sample = match field("do_sample") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                skip("do_sample", other, "true or false");
                false
            }
        };
        // 2. each number, range-checked
        let num = |k: &str, ok: &dyn Fn(f64) -> bool, want: &str, skip: &mut dyn FnMut(&str, &Value, &str)| -> Option<f64> {
            let x = field(k)?;
            match x.as_f64() {
                Some(f) if f.is_finite() && ok(f) => Some(f),
                _ => {
                    skip(k, x, want);
                    None
                }
            }
        };
        let temperature = num("temperature", &|t| t >= 0.0 && t <= 100.0, "a number from 0 to 100", &mut skip);
        let top_p = num("top_p", &|p| p > 0.0 && p <= 1.0, "a number above 0, at most 1", &mut skip);
        let top_k = num("top_k", &|k| k >= 0.0 && k.fract() == 0.0 && k <= 1e9, "a non-negative integer", &mut skip);
        let rep = num("repetition_penalty", &|r| r > 0.0 && r <= 100.0, "a number above 0, at most 100", &mut skip);
        if sample {
            out.params.temperature = temperature.unwrap_or(1.0) as f32;
            out.params.top_k = top_k.unwrap_or(0.0) as usize;
            out.params.top_p = top_p.unwrap_or(1.0) as f32;
        }
        out.params.repetition_penalty = rep.unwrap_or(1.0) as f32;
        out.warnings = warnings;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_fields_apply_only_with_do_sample() {
        let g = GenerationDefaults::from_json(r#"{"do_sample": true, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}"#, "g").unwrap();
        assert_eq!((g.params.temperature, g.params.top_k, g.params.top_p, g.params.repetition_penalty), (0.7, 20, 0.8, 1.05));
        assert!(g.warnings.is_empty() && g.found);
        let g = GenerationDefaults::from_json(r#"{"temperature": 0.7, "top_k": 20}"#, "g").unwrap();
        assert_eq!(g.params, SamplingParams::greedy());
    }

    #[test]
    fn bad_files_are_errors_and_bad_fields_warnings() {
        for text in ["{not json", "[1, 2]", "\"text\"", ""] {
            let e = GenerationDefaults::from_json(text, "m/generation_config.json").unwrap_err().to_string();
            assert!(e.contains("m/generation_config.json") && (e.contains("not valid JSON") || e.contains("not a JSON object")), "{}", e);
        }
        let g = GenerationDefaults::from_json(r#"{"do_sample": "yes", "temperature": -1, "top_p": 5, "top_k": 2.5, "repetition_penalty": "x"}"#, "g.json").unwrap();
        assert_eq!(g.params, SamplingParams::greedy());
        assert_eq!(g.warnings.len(), 5, "{:?}", g.warnings);
        assert!(g.warnings.iter().any(|w| w.contains("g.json") && w.contains("top_p = 5") && w.contains("at most 1")), "{:?}", g.warnings);
    }
}
