//! A serde `Deserializer` that drives `RawConfig`'s derived `Deserialize` and records every field
//! path it is asked for (`primary.tab`, `profiles.*.agent`, `leads[].name`). It lets a test compare
//! the structs with `fleetd.example.yaml` without a hand-kept list that could drift.

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};

use crate::config::raw::RawConfig;

/// serde-saphyr's `Spanned<T>` asks for a newtype of this name, then reads a map whose first key
/// is `SPANNED_MARKER`; it is transparent for our paths.
const SPANNED: &str = "__yaml_spanned";
const SPANNED_MARKER: &str = "__serde_saphyr_private_spanned";

pub(super) fn collect() -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let de = Collector {
        path: String::new(),
        out: &mut out,
        spanned: false,
    };
    <RawConfig as de::Deserialize>::deserialize(de).map_err(|e| e.0)?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// Why the walk stopped early (then the test sees too few fields and prints this).
#[derive(Debug)]
struct Stop(String);
impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Stop {}
impl de::Error for Stop {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Stop(msg.to_string())
    }
}

struct Collector<'a> {
    path: String,
    out: &'a mut Vec<String>,
    /// Set inside `Spanned`'s newtype: the next `deserialize_any` must present its
    /// `{value, referenced, defined}` form so `value` keeps our path.
    spanned: bool,
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

impl<'de> de::Deserializer<'de> for Collector<'_> {
    type Error = Stop;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        if self.spanned {
            // serde-saphyr's marker key first, then the three parts of the span.
            let keys = [SPANNED_MARKER, "value", "referenced", "defined"]
                .map(str::to_owned)
                .to_vec();
            let values = ["\u{0}m", &self.path, "\u{0}r", "\u{0}d"]
                .map(str::to_owned)
                .to_vec();
            return v.visit_map(Fields {
                keys,
                values,
                out: self.out,
                i: 0,
            });
        }
        v.visit_u64(1)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        v: V,
    ) -> Result<V::Value, Stop> {
        v.visit_newtype_struct(Collector {
            spanned: name == SPANNED,
            ..self
        })
    }
    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        v.visit_bool(false)
    }
    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        v.visit_str("a:b")
    }
    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        v.visit_str("a:b")
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        v.visit_some(self)
    }
    fn deserialize_unit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        v.visit_unit()
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        v.visit_unit()
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Stop> {
        let first = variants.first().copied().unwrap_or_default();
        v.visit_enum(first.into_deserializer())
    }
    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        v.visit_seq(OneElement {
            inner: Some(Collector {
                path: format!("{}[]", self.path),
                out: self.out,
                spanned: false,
            }),
        })
    }
    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Stop> {
        let path = join(&self.path, "*");
        v.visit_map(Fields {
            keys: vec!["x:y".to_owned()],
            values: vec![path],
            out: self.out,
            i: 0,
        })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Stop> {
        let values: Vec<String> = fields.iter().map(|f| join(&self.path, f)).collect();
        for value in &values {
            self.out.push(value.clone());
        }
        let keys = fields.iter().map(|f| (*f).to_owned()).collect();
        v.visit_map(Fields {
            keys,
            values,
            out: self.out,
            i: 0,
        })
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf
        unit_struct tuple tuple_struct identifier
    }
}

struct OneElement<'a> {
    inner: Option<Collector<'a>>,
}

impl<'de> SeqAccess<'de> for OneElement<'_> {
    type Error = Stop;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Stop> {
        match self.inner.take() {
            Some(c) => seed.deserialize(c).map(Some),
            None => Ok(None),
        }
    }
}

struct Fields<'a> {
    keys: Vec<String>,
    values: Vec<String>,
    out: &'a mut Vec<String>,
    i: usize,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = Stop;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Stop> {
        match self.keys.get(self.i) {
            Some(k) => seed.deserialize(k.clone().into_deserializer()).map(Some),
            None => Ok(None),
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Stop> {
        let path = self.values.get(self.i).cloned().unwrap_or_default();
        self.i += 1;
        // The marker and the location parts of a Spanned are not config keys: give them the
        // shape serde-saphyr's own test uses.
        if path.starts_with('\u{0}') {
            let location = serde_json::json!({"line": 1, "column": 1});
            return seed
                .deserialize(location)
                .map_err(|e| Stop(format!("{path:?}: {e}")));
        }
        let at = path.clone();
        seed.deserialize(Collector {
            path,
            out: self.out,
            spanned: false,
        })
        .map_err(|Stop(e)| Stop(format!("{at}: {e}")))
    }
}
