//! JSON text exactly as Python's `json.dumps` writes it, for the templates' `tojson` filter:
//! transformers replaces Jinja's own filter (which escapes HTML) with `json.dumps(x,
//! ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, and a tool's schema
//! reaches the prompt through it, so every space and escape must match.
//!
//! Python's rules: separators `", "` and `": "` (`","` between items when indenting), one
//! line per item at each level with `indent`, `[]` / `{}` for empty containers, `\"`, `\\`,
//! `\n`, `\r`, `\t`, `\b`, `\f` and `\u00XX` for the other control characters (with
//! `ensure_ascii`, every non-ASCII character as `\uXXXX`, surrogate pairs beyond the BMP),
//! floats as `repr` writes them (`1.0`, `1e-05`, `1e+16`), map keys that are not strings
//! turned into strings (`1` -> `"1"`, `true`, `null`).

use minijinja::value::{Value, ValueKind};

/// How to write: the arguments of `json.dumps` that transformers exposes.
#[derive(Clone, Debug, PartialEq)]
pub struct Style {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: a new line per item, `s` repeated per level.
    pub indent: Option<String>,
    /// Between items (`None`: `", "`, or `","` when indenting).
    pub item_separator: Option<String>,
    /// Between a key and its value (`None`: `": "`).
    pub key_separator: Option<String>,
    pub sort_keys: bool,
}

impl Default for Style {
    /// transformers' defaults: `ensure_ascii=False`, one line, Python's separators.
    fn default() -> Style {
        Style { ensure_ascii: false, indent: None, item_separator: None, key_separator: None, sort_keys: false }
    }
}

/// Why a value cannot be written (Python raises `TypeError` for the same values).
#[derive(Clone, Debug, PartialEq)]
pub struct NotSerializable(pub String);

/// `json.dumps(value)` with `style`.
pub fn dumps(value: &Value, style: &Style) -> Result<String, NotSerializable> {
    let mut w = Writer { out: String::new(), style, item_sep: style.item_separator.as_deref().unwrap_or(if style.indent.is_some() { "," } else { ", " }), key_sep: style.key_separator.as_deref().unwrap_or(": ") };
    w.value(value, 0, 0)?;
    Ok(w.out)
}

/// `json.dumps` of a serde_json value (converted as the templates see it), Python's default
/// style but without `ensure_ascii`: how vLLM writes a parsed tool call's arguments.
pub fn dumps_json(value: &serde_json::Value) -> String {
    dumps(&super::value::from_json(value), &Style::default()).unwrap_or_else(|_| value.to_string())
}

/// Nesting beyond which writing stops (Python's own limit is its recursion limit, ~1000).
const MAX_DEPTH: usize = 512;

struct Writer<'a> {
    out: String,
    style: &'a Style,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl Writer<'_> {
    fn newline(&mut self, level: usize) {
        if let Some(ind) = &self.style.indent {
            self.out.push('\n');
            for _ in 0..level {
                self.out.push_str(ind);
            }
        }
    }

    fn value(&mut self, v: &Value, level: usize, depth: usize) -> Result<(), NotSerializable> {
        if depth > MAX_DEPTH {
            return Err(NotSerializable("nesting too deep".into()));
        }
        match v.kind() {
            ValueKind::None | ValueKind::Undefined => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(v),
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter().map_err(|e| NotSerializable(e.to_string()))?.collect();
                if items.is_empty() {
                    self.out.push_str("[]");
                    return Ok(());
                }
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(self.item_sep);
                    }
                    self.newline(level + 1);
                    self.value(item, level + 1, depth + 1)?;
                }
                self.newline(level);
                self.out.push(']');
            }
            ValueKind::Map => {
                let obj = v.as_object().ok_or_else(|| NotSerializable("a map without entries".into()))?;
                let mut pairs: Vec<(String, Value)> = match obj.try_iter_pairs() {
                    Some(it) => it.map(|(k, v)| key_string(&k).map(|k| (k, v))).collect::<Result<_, _>>()?,
                    None => Vec::new(),
                };
                if self.style.sort_keys {
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if pairs.is_empty() {
                    self.out.push_str("{}");
                    return Ok(());
                }
                self.out.push('{');
                for (i, (k, item)) in pairs.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(self.item_sep);
                    }
                    self.newline(level + 1);
                    self.string(k);
                    self.out.push_str(self.key_sep);
                    self.value(item, level + 1, depth + 1)?;
                }
                self.newline(level);
                self.out.push('}');
            }
            other => return Err(NotSerializable(format!("a value of kind {} is not JSON serializable", other))),
        }
        Ok(())
    }

    fn number(&mut self, v: &Value) {
        if v.is_integer() {
            // integers of any width print as their digits
            self.out.push_str(&v.to_string());
        } else {
            let x = f64::try_from(v.clone()).unwrap_or(f64::NAN);
            self.out.push_str(&float_repr(x));
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.style.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        self.out.push_str(&format!("\\u{:04x}", u));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// A map key as `json.dumps` writes it: strings as they are; numbers, booleans and None as
/// their JSON text.
fn key_string(k: &Value) -> Result<String, NotSerializable> {
    Ok(match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_string(),
        ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::None => "null".to_string(),
        ValueKind::Number if k.is_integer() => k.to_string(),
        ValueKind::Number => float_repr(f64::try_from(k.clone()).unwrap_or(f64::NAN)),
        other => return Err(NotSerializable(format!("keys must be str, int, float, bool or None, not {}", other))),
    })
}

/// Python's `repr(float)`: the shortest digits that read back to the same value, in fixed
/// notation when the decimal exponent is from -4 to 15 (`0.0001`, `1e-05`, `1e+16`,
/// `123.0`), `NaN` / `Infinity` as `json.dumps` writes them.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.2345e-5"
    let sci = format!("{:e}", x);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // Python's point position: the value is 0.DIGITS × 10^decpt
    let decpt = exp + 1;
    if decpt > -4 && decpt <= 16 {
        let n = digits.len() as i32;
        let body = if decpt <= 0 {
            format!("0.{}{}", "0".repeat((-decpt) as usize), digits)
        } else if decpt >= n {
            format!("{}{}.0", digits, "0".repeat((decpt - n) as usize))
        } else {
            format!("{}.{}", &digits[..decpt as usize], &digits[decpt as usize..])
        };
        format!("{}{}", sign, body)
    } else {
        let m = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits.clone() };
        let e = decpt - 1;
        format!("{}{}e{}{:02}", sign, m, if e < 0 { '-' } else { '+' }, e.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(s: &str) -> Value {
        super::super::value::from_json(&serde_json::from_str(s).unwrap())
    }

    #[test]
    fn writes_as_python_json_dumps() {
        // each expected text is what Python 3's json.dumps(json.loads(input)) prints
        let d = Style::default();
        assert_eq!(dumps(&j(r#"{"b":1,"a":[true,null,"x"],"c":{}}"#), &d).unwrap(), r#"{"b": 1, "a": [true, null, "x"], "c": {}}"#);
        assert_eq!(dumps(&j(r#""é\n\u0001\"\\\t/<>&'""#), &d).unwrap(), "\"é\\n\\u0001\\\"\\\\\\t/<>&'\"");
        assert_eq!(dumps(&j(r#""\u0008\u000c\u007f""#), &d).unwrap(), "\"\\b\\f\u{7f}\"");
        let ascii = Style { ensure_ascii: true, ..Style::default() };
        assert_eq!(dumps(&j(r#""é😀""#), &ascii).unwrap(), r#""\u00e9\ud83d\ude00""#);
        let sorted = Style { sort_keys: true, indent: Some("  ".into()), ..Style::default() };
        assert_eq!(dumps(&j(r#"{"b":[1,2],"a":{},"c":[]}"#), &sorted).unwrap(), "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2\n  ],\n  \"c\": []\n}");
        let compact = Style { item_separator: Some(",".into()), key_separator: Some(":".into()), ..Style::default() };
        assert_eq!(dumps(&j(r#"{"a":[1,2]}"#), &compact).unwrap(), r#"{"a":[1,2]}"#);
    }

    #[test]
    fn floats_as_python_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345680.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (2.71875, "2.71875"),
            (100.0, "100.0"),
        ] {
            assert_eq!(float_repr(x), want, "{}", x);
        }
        assert_eq!(dumps(&j("[1.0, 2, -3, 18446744073709551615]"), &Style::default()).unwrap(), "[1.0, 2, -3, 18446744073709551615]");
    }
}
