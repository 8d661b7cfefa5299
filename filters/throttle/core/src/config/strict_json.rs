//! JSON parsing that notices repeated object keys. `serde_json::Value` keeps
//! the last of two equal keys without a word; a configuration that says
//! `"rate": "5/s"` and later `"rate": "500/s"` is a mistake we report, naming
//! the field, like an unknown field.

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parses `bytes`; returns the value and the paths of repeated keys
/// (`rules[0].rate`).
pub fn parse(bytes: &[u8]) -> Result<(Value, Vec<String>), serde_json::Error> {
    let duplicates = RefCell::new(Vec::new());
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Seed {
        path: String::new(),
        duplicates: &duplicates,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok((value, duplicates.into_inner()))
}

struct Seed<'a> {
    path: String,
    duplicates: &'a RefCell<Vec<String>>,
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            let seed = Seed {
                path: format!("{}[{}]", self.path, out.len()),
                duplicates: self.duplicates,
            };
            match seq.next_element_seed(seed)? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.path)
            };
            let value = map.next_value_seed(Seed {
                path: path.clone(),
                duplicates: self.duplicates,
            })?;
            if out.insert(key, value).is_some() {
                self.duplicates.borrow_mut().push(path);
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_keys_are_named_at_any_depth() {
        let (v, d) = parse(
            br#"{"a": 1, "rules": [{"rate": "5/s", "rate": "500/s", "m": {"x": 1, "x": 2}}], "a": 2}"#,
        )
        .unwrap();
        assert_eq!(d, vec!["rules[0].rate", "rules[0].m.x", "a"]);
        assert_eq!(v["a"], 2, "the value is still the last, as serde_json's");
    }

    #[test]
    fn same_values_as_serde_json_otherwise() {
        let text = br#"{"n": -5, "f": 1.5, "big": 18446744073709551615, "s": "\u00e9", "l": [null, true, {}]}"#;
        let (v, d) = parse(text).unwrap();
        assert!(d.is_empty());
        assert_eq!(v, serde_json::from_slice::<Value>(text).unwrap());
    }

    #[test]
    fn trailing_garbage_and_bad_json_fail() {
        assert!(parse(b"{} x").is_err());
        assert!(parse(b"{\"a\": ").is_err());
    }
}
