//! JSON values as templates see them: objects keep their keys' order (as Python's `json.loads`
//! does, so that `tojson` writes a tool's schema in the order the client sent it), integers
//! stay integers and floats floats.

use indexmap::IndexMap;
use minijinja::Value;

/// A serde_json value as a template value.
pub fn from_json(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => Value::from(a.iter().map(from_json).collect::<Vec<Value>>()),
        serde_json::Value::Object(o) => map(o.iter().map(|(k, v)| (k.as_str(), from_json(v)))),
    }
}

/// A map of `pairs`, in their order.
pub fn map<'a>(pairs: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
    Value::from(pairs.into_iter().map(|(k, v)| (Value::from(k), v)).collect::<IndexMap<Value, Value>>())
}
