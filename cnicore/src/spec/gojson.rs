//! JSON decoding with Go's `encoding/json` semantics, for everything a Go runtime or a hand-written conflist
//! sends us.
//!
//! The reference plugins and the runtimes that call them are Go, so what they accept is defined by
//! `encoding/json`, and runtimes rely on it: containerd's go-cni sends capability args from structs without
//! json tags (`"HostPort": 8080`, `"IngressRate": ...`). Three rules differ from serde's defaults:
//! - an object key matches a struct field exactly, else case-insensitively (Unicode simple folding);
//! - `null` for a struct field leaves it as if absent;
//! - unknown keys are ignored (serde's default too, as long as no type denies them).
//!
//! One difference is deliberate: where an object spells one field several ways (`"mtu"` and `"MTU"`), Go keeps
//! the last in document order; serde_json's map does not keep that order, so the exact spelling wins here.
//!
//! Every config type is decoded through [`from_slice`] or [`from_value`]: the rules apply to every struct
//! at every depth, with the field names serde derives (renames and aliases included), so no field needs an
//! alias list. Maps (`capabilities`, `serde_json::Value` fields) keep their keys as they are, as Go's maps do.
//! Config types must not use `#[serde(flatten)]`: serde decodes a flattened struct without its field list, so
//! its keys would match exactly only.
//!
//! Errors name the path of the offending value (`runtimeConfig.portMappings[0].HostPort: invalid type...`),
//! in the spelling the input used.

use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use serde_json::{Map, Value};
use std::cell::Cell;
use std::fmt::Write as _;

/// Decodes `T` from JSON bytes. Syntax errors carry serde_json's line and column; type errors the path.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let value: Value = serde_json::from_slice(bytes)?;
    from_value(&value)
}

/// Decodes `T` from an already parsed JSON value.
pub fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, serde_json::Error> {
    let tagged = Cell::new(false);
    T::deserialize(GoDeserializer { value, at: Path::Root, tagged: &tagged })
}

/// Go's lookup of one struct field in a JSON object: the exact key, else a key equal under case folding;
/// `null` counts as absent. For code that reads a single field from a raw object instead of a typed struct.
pub fn field<'a>(object: &'a Value, name: &str) -> Option<&'a Value> {
    member(object.as_object()?, name)
}

/// [`field`] in an object already taken apart.
pub fn member<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    let present = |v: &&Value| !v.is_null();
    object
        .get(name)
        .filter(present)
        .or_else(|| object.iter().rev().filter(|(k, _)| fold_eq(k, name)).map(|(_, v)| v).find(present))
}

/// Equality under Go's case folding (`encoding/json` uses Unicode simple folding for field names): lower-case
/// both sides, with the two letters whose fold class has a third member (ſ with s, K (Kelvin) with k) joined.
pub fn fold_eq(a: &str, b: &str) -> bool {
    fn fold(c: char) -> impl Iterator<Item = char> {
        let c = match c {
            'ſ' => 's',
            '\u{212A}' => 'k',
            c => c,
        };
        c.to_lowercase()
    }
    a.len().abs_diff(b.len()) <= 8 && a.chars().flat_map(fold).eq(b.chars().flat_map(fold))
}

/// The field a key fills, as Go picks it: the exact name, else the first field equal under folding; a key that
/// fills no field is kept as it is (and ignored by the struct).
fn canonical_key<'f>(key: &'f str, fields: &[&'static str]) -> &'f str {
    if fields.contains(&key) {
        return key;
    }
    fields.iter().copied().find(|f| fold_eq(f, key)).unwrap_or(key)
}

/// Where in the document a value is, for error messages; a chain of borrowed links up to the root.
#[derive(Clone, Copy)]
enum Path<'p> {
    Root,
    Key(&'p Path<'p>, &'p str),
    Index(&'p Path<'p>, usize),
}

impl Path<'_> {
    fn render(&self) -> String {
        let mut parts = Vec::new();
        let mut at = self;
        loop {
            match at {
                Path::Root => break,
                Path::Key(parent, key) => {
                    parts.push(Err(*key));
                    at = parent;
                }
                Path::Index(parent, index) => {
                    parts.push(Ok(*index));
                    at = parent;
                }
            }
        }
        let mut text = String::new();
        for part in parts.iter().rev() {
            match part {
                Err(key) => {
                    if !text.is_empty() {
                        text.push('.');
                    }
                    text.push_str(&super::env::truncate(key));
                }
                Ok(index) => {
                    let _ = write!(text, "[{index}]");
                }
            }
        }
        text
    }
}

/// Prefixes the first error raised below a path with that path (once: outer levels pass it on unchanged).
fn at_path(error: serde_json::Error, path: &Path, tagged: &Cell<bool>) -> serde_json::Error {
    if tagged.replace(true) || matches!(path, Path::Root) {
        return error;
    }
    de::Error::custom(format_args!("{}: {error}", path.render()))
}

struct GoDeserializer<'a, 'p> {
    value: &'a Value,
    at: Path<'p>,
    tagged: &'p Cell<bool>,
}

impl<'de> GoDeserializer<'de, '_> {
    fn visit_array<V: Visitor<'de>>(self, items: &'de [Value], visitor: V) -> Result<V::Value, serde_json::Error> {
        let mut access = Elements { items: items.iter().enumerate(), at: &self.at, tagged: self.tagged };
        let value = visitor.visit_seq(&mut access)?;
        match access.items.len() {
            0 => Ok(value),
            _ => Err(de::Error::invalid_length(items.len(), &"fewer elements in array")),
        }
    }

    fn visit_object<V: Visitor<'de>>(
        self,
        entries: Vec<Entry<'de>>,
        visitor: V,
    ) -> Result<V::Value, serde_json::Error> {
        visitor.visit_map(Entries { entries: entries.into_iter(), value: None, at: &self.at, tagged: self.tagged })
    }
}

/// One object entry: the key the visitor sees (a struct's field name), the key as the input spelled it (for
/// error paths), the value.
type Entry<'de> = (&'de str, &'de str, &'de Value);

/// Object entries as a struct sees them: keys mapped to field names, `null` dropped, one entry per field (the
/// exact spelling before any other).
fn struct_entries<'de>(object: &'de Map<String, Value>, fields: &[&'static str]) -> Vec<Entry<'de>> {
    let mut entries: Vec<Entry> = Vec::with_capacity(object.len());
    for (key, value) in object {
        if value.is_null() {
            continue;
        }
        let field = canonical_key(key, fields);
        match entries.iter_mut().find(|(f, _, _)| *f == field) {
            Some(entry) if field == key => *entry = (field, key, value),
            Some(_) => {}
            None => entries.push((field, key, value)),
        }
    }
    entries
}

macro_rules! forward_to_value {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, serde_json::Error> {
                self.value.$method(visitor)
            }
        )*
    };
}

impl<'de> Deserializer<'de> for GoDeserializer<'de, '_> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, serde_json::Error> {
        match self.value {
            Value::Array(items) => self.visit_array(items, visitor),
            Value::Object(object) => {
                let entries = object.iter().map(|(k, v)| (k.as_str(), k.as_str(), v)).collect();
                self.visit_object(entries, visitor)
            }
            scalar => scalar.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, serde_json::Error> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, serde_json::Error> {
        match self.value {
            Value::Object(object) => {
                let entries = struct_entries(object, fields);
                self.visit_object(entries, visitor)
            }
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, serde_json::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, serde_json::Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, serde_json::Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, serde_json::Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, serde_json::Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, serde_json::Error> {
        self.value.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, serde_json::Error> {
        visitor.visit_unit()
    }

    forward_to_value! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128 deserialize_f32
        deserialize_f64 deserialize_char deserialize_str deserialize_string deserialize_bytes
        deserialize_byte_buf deserialize_unit deserialize_identifier
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, serde_json::Error> {
        self.value.deserialize_unit_struct(name, visitor)
    }
}

struct Elements<'p, I> {
    items: I,
    at: &'p Path<'p>,
    tagged: &'p Cell<bool>,
}

impl<'de, I: ExactSizeIterator<Item = (usize, &'de Value)>> SeqAccess<'de> for Elements<'_, I> {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, serde_json::Error> {
        let Some((index, value)) = self.items.next() else { return Ok(None) };
        let at = Path::Index(self.at, index);
        seed.deserialize(GoDeserializer { value, at, tagged: self.tagged })
            .map(Some)
            .map_err(|e| at_path(e, &at, self.tagged))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct Entries<'de, 'p, I> {
    entries: I,
    /// The input's spelling and the value of the key just handed out.
    value: Option<(&'de str, &'de Value)>,
    at: &'p Path<'p>,
    tagged: &'p Cell<bool>,
}

impl<'de, I: Iterator<Item = Entry<'de>>> MapAccess<'de> for Entries<'de, '_, I> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, serde_json::Error> {
        let Some((field, spelled, value)) = self.entries.next() else { return Ok(None) };
        self.value = Some((spelled, value));
        let key = de::value::BorrowedStrDeserializer::<serde_json::Error>::new(field);
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, serde_json::Error> {
        let (key, value) = self.value.take().ok_or_else(|| de::Error::custom("value asked before its key"))?;
        let at = Path::Key(self.at, key);
        seed.deserialize(GoDeserializer { value, at, tagged: self.tagged }).map_err(|e| at_path(e, &at, self.tagged))
    }
}

/// serde_json's message, with a long middle cut out: its "invalid type" errors quote the offending string whole,
/// which for hostile input can be a megabyte. The end ("at line 1 column 181") is kept.
pub fn shorten_json_error(e: &serde_json::Error) -> String {
    const MAX: usize = 200;
    const TAIL: usize = 60;
    let text = e.to_string();
    if text.len() <= MAX {
        return text;
    }
    let mut head = MAX - TAIL;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - TAIL;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}…{}", &text[..head], &text[tail..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Mapping {
        #[serde(default)]
        host_port: Option<i64>,
        #[serde(default)]
        container_port: i64,
        #[serde(default)]
        protocol: String,
        #[serde(default, rename = "hostIP")]
        host_ip: Option<String>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Runtime {
        #[serde(default)]
        port_mappings: Vec<Mapping>,
        #[serde(default)]
        extra: Option<Value>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Conf {
        #[serde(default)]
        name: String,
        #[serde(default)]
        mtu: u32,
        #[serde(default)]
        runtime_config: Runtime,
    }

    fn conf(json: &str) -> Conf {
        from_slice(json.as_bytes()).unwrap()
    }

    #[test]
    fn go_field_names_match_at_every_depth() {
        let c = conf(
            r#"{"Name":"n","MTU":1400,"RuntimeConfig":{"PortMappings":[
                {"HostPort":8082,"ContainerPort":80,"Protocol":"tcp","HostIP":""}]}}"#,
        );
        assert_eq!(c.name, "n");
        assert_eq!(c.mtu, 1400);
        let m = &c.runtime_config.port_mappings[0];
        assert_eq!(
            (m.host_port, m.container_port, m.protocol.as_str(), m.host_ip.as_deref()),
            (Some(8082), 80, "tcp", Some(""))
        );
    }

    #[test]
    fn the_exact_spelling_wins_over_another() {
        assert_eq!(conf(r#"{"mtu":1,"MTU":2}"#).mtu, 1);
        assert_eq!(conf(r#"{"MTU":2,"mtu":1}"#).mtu, 1);
        assert_eq!(conf(r#"{"Mtu":2,"mtu":null}"#).mtu, 2, "a null exact key is absent");
    }

    #[test]
    fn a_repeated_key_takes_its_last_value() {
        assert_eq!(conf(r#"{"name":"a","mtu":1,"name":"b"}"#).name, "b");
    }

    #[test]
    fn null_is_absent_for_struct_fields() {
        let c = conf(r#"{"name":null,"mtu":null,"runtimeConfig":null}"#);
        assert_eq!(c, Conf::default());
        let c = conf(r#"{"runtimeConfig":{"portMappings":[{"hostPort":null,"containerPort":null,"protocol":null}]}}"#);
        assert_eq!(c.runtime_config.port_mappings, vec![Mapping::default()]);
    }

    #[test]
    fn maps_and_raw_values_keep_their_keys_and_nulls() {
        let c = conf(r#"{"runtimeConfig":{"extra":{"Key":null,"key":[1,{"A":null}]}}}"#);
        assert_eq!(c.runtime_config.extra.unwrap(), serde_json::json!({"Key":null,"key":[1,{"A":null}]}));
        let m: std::collections::BTreeMap<String, bool> = from_slice(br#"{"PortMappings":true}"#).unwrap();
        assert!(m.contains_key("PortMappings"));
    }

    #[test]
    fn unknown_keys_are_ignored() {
        assert_eq!(conf(r#"{"name":"n","whatever":{"deep":[1,2]},"Nope":null}"#).name, "n");
    }

    #[test]
    fn folding_is_unicode_simple_folding() {
        assert!(fold_eq("hostIP", "HOSTip"));
        assert!(fold_eq("kind", "\u{212A}IND"));
        assert!(fold_eq("ssl", "ſSL"));
        assert!(!fold_eq("mtu", "mtu2"));
        assert!(!fold_eq("host_port", "hostPort"));
    }

    #[test]
    fn errors_name_the_path_in_the_input_spelling() {
        let e = from_slice::<Conf>(br#"{"RuntimeConfig":{"PortMappings":[{},{"HostPort":"x"}]}}"#).unwrap_err();
        assert_eq!(e.classify(), serde_json::error::Category::Data);
        let text = e.to_string();
        assert!(text.starts_with("RuntimeConfig.PortMappings[1].HostPort: invalid type: string \"x\""), "{text}");
        let e = from_slice::<Conf>(br#"{"mtu":-1}"#).unwrap_err().to_string();
        assert!(e.starts_with("mtu: invalid value"), "{e}");
        // Syntax errors keep their position.
        let e = from_slice::<Conf>(b"{\"mtu\":").unwrap_err();
        assert_eq!(e.classify(), serde_json::error::Category::Eof);
    }

    #[test]
    fn single_field_lookup() {
        let v = serde_json::json!({"Mac":"a","mac":null,"other":1});
        assert_eq!(field(&v, "mac"), Some(&Value::from("a")), "null is absent");
        let v = serde_json::json!({"MAC":"a","mac":"b"});
        assert_eq!(field(&v, "mac"), Some(&Value::from("b")));
        assert_eq!(field(&v, "MAc"), Some(&Value::from("b")));
        assert_eq!(field(&serde_json::json!([1]), "mac"), None);
    }
}
