//! Go's `encoding/gob`, as much of it as `net/rpc` between the dhcp plugin and its daemon uses: the reference
//! speaks it, so our plugin works with their daemon and their plugin with ours.
//!
//! A stream is a sequence of messages, each its byte count then a type ID: a negative ID defines that type
//! (a `wireType`), a positive one carries a value of it. Unsigned integers are one byte below 128, else their
//! byte count negated and the big-endian bytes; signed ones are folded into the low bit. A struct is its
//! non-zero fields as (field-number delta, value) ending with a 0; a top-level value that is not a struct
//! has a 0 before it. Types are defined once per stream, IDs from 65 (the builtins are below).

use std::collections::HashMap;
use std::io::{self, Read};

const T_BOOL: i64 = 1;
const T_INT: i64 = 2;
const T_UINT: i64 = 3;
const T_FLOAT: i64 = 4;
const T_BYTES: i64 = 5;
const T_STRING: i64 = 6;
const FIRST_USER_ID: i64 = 65;
/// Messages are configs and results; this bounds a hostile peer.
const MAX_MESSAGE: u64 = 4 << 20;

/// A value as decoded (structs keep their field names) or to be encoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Bytes(Vec<u8>),
    Str(String),
    Struct(Vec<(String, Value)>),
    Slice(Vec<Value>),
    /// A type with its own encoding (GobEncoder, BinaryMarshaler, TextMarshaler), as its bytes.
    Encoded(Vec<u8>),
}

impl Value {
    /// A struct's field by name.
    pub fn field(&self, name: &str) -> Option<&Value> {
        match self {
            Value::Struct(fields) => fields.iter().find(|(n, _)| n == name).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn str(&self, name: &str) -> String {
        match self.field(name) {
            Some(Value::Str(s)) => s.clone(),
            _ => String::new(),
        }
    }

    pub fn bytes(&self, name: &str) -> Vec<u8> {
        match self.field(name) {
            Some(Value::Bytes(b) | Value::Encoded(b)) => b.clone(),
            Some(Value::Str(s)) => s.as_bytes().to_vec(),
            _ => Vec::new(),
        }
    }

    pub fn int(&self, name: &str) -> Option<i64> {
        match self.field(name) {
            Some(Value::Int(i)) => Some(*i),
            Some(Value::Uint(u)) => i64::try_from(*u).ok(),
            _ => None,
        }
    }

    pub fn list(&self, name: &str) -> &[Value] {
        match self.field(name) {
            Some(Value::Slice(items)) => items,
            _ => &[],
        }
    }

    fn is_zero(&self) -> bool {
        match self {
            Value::Bool(b) => !b,
            Value::Int(i) => *i == 0,
            Value::Uint(u) => *u == 0,
            Value::Float(f) => *f == 0.0,
            Value::Bytes(b) | Value::Encoded(b) => b.is_empty(),
            Value::Str(s) => s.is_empty(),
            Value::Slice(items) => items.is_empty(),
            // Go writes a struct field whatever it holds.
            Value::Struct(_) => false,
        }
    }
}

/// A Go type, for encoding: named composite types get a definition in the stream.
#[derive(Debug, Clone)]
pub enum Type {
    Int,
    Uint,
    Bytes,
    Str,
    Struct(&'static str, Vec<(&'static str, Type)>),
    Slice(&'static str, Box<Type>),
}

fn put_uint(out: &mut Vec<u8>, x: u64) {
    if x <= 0x7f {
        out.push(x as u8);
        return;
    }
    let bytes = x.to_be_bytes();
    let skip = (x.leading_zeros() / 8) as usize;
    out.push((-((8 - skip) as i8)) as u8);
    out.extend_from_slice(&bytes[skip..]);
}

fn put_int(out: &mut Vec<u8>, i: i64) {
    let x = if i < 0 { ((!i as u64) << 1) | 1 } else { (i as u64) << 1 };
    put_uint(out, x);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_uint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// One stream's encoder: remembers the types it has defined.
#[derive(Default)]
pub struct Encoder {
    defined: HashMap<&'static str, i64>,
    next_id: i64,
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder { defined: HashMap::new(), next_id: FIRST_USER_ID }
    }

    fn message(out: &mut Vec<u8>, body: &[u8]) {
        put_uint(out, body.len() as u64);
        out.extend_from_slice(body);
    }

    /// The type's ID, defining it (and what it refers to) in `out` first if this stream has not yet.
    fn define(&mut self, out: &mut Vec<u8>, ty: &Type) -> i64 {
        let name = match ty {
            Type::Int => return T_INT,
            Type::Uint => return T_UINT,
            Type::Bytes => return T_BYTES,
            Type::Str => return T_STRING,
            Type::Struct(n, _) | Type::Slice(n, _) => *n,
        };
        if let Some(id) = self.defined.get(name) {
            return *id;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.defined.insert(name, id);
        let common = |b: &mut Vec<u8>| {
            // CommonType{Name, Id}
            b.push(1);
            put_bytes(b, name.as_bytes());
            b.push(1);
            put_int(b, id);
            b.push(0);
        };
        let mut def = Vec::new();
        put_int(&mut def, -id);
        match ty {
            Type::Struct(_, fields) => {
                let ids: Vec<i64> = fields.iter().map(|(_, t)| self.define(out, t)).collect();
                def.push(3); // wireType.StructT
                def.push(1); // structType.CommonType
                common(&mut def);
                if !fields.is_empty() {
                    def.push(1); // structType.Field
                    put_uint(&mut def, fields.len() as u64);
                    for ((fname, _), fid) in fields.iter().zip(ids) {
                        def.push(1);
                        put_bytes(&mut def, fname.as_bytes());
                        def.push(1);
                        put_int(&mut def, fid);
                        def.push(0);
                    }
                }
                def.push(0);
            }
            Type::Slice(_, elem) => {
                let elem_id = self.define(out, elem);
                def.push(2); // wireType.SliceT
                def.push(1);
                common(&mut def);
                def.push(1); // sliceType.Elem
                put_int(&mut def, elem_id);
                def.push(0);
            }
            _ => unreachable!("builtins return early"),
        }
        def.push(0);
        Self::message(out, &def);
        id
    }

    /// Appends `value`, of type `ty`, to `out` as one message (after any type definitions it needs).
    pub fn encode(&mut self, out: &mut Vec<u8>, ty: &Type, value: &Value) -> io::Result<()> {
        let id = self.define(out, ty);
        let mut body = Vec::new();
        put_int(&mut body, id);
        if !matches!(ty, Type::Struct(..)) {
            body.push(0);
        }
        encode_value(&mut body, ty, value)?;
        Self::message(out, &body);
        Ok(())
    }
}

fn mismatch(ty: &Type, value: &Value) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("gob: cannot encode {value:?} as {ty:?}"))
}

fn encode_value(out: &mut Vec<u8>, ty: &Type, value: &Value) -> io::Result<()> {
    match (ty, value) {
        (Type::Int, Value::Int(i)) => put_int(out, *i),
        (Type::Uint, Value::Uint(u)) => put_uint(out, *u),
        (Type::Bytes, Value::Bytes(b)) => put_bytes(out, b),
        (Type::Str, Value::Str(s)) => put_bytes(out, s.as_bytes()),
        (Type::Slice(_, elem), Value::Slice(items)) => {
            put_uint(out, items.len() as u64);
            for item in items {
                encode_value(out, elem, item)?;
            }
        }
        (Type::Struct(_, fields), Value::Struct(values)) => {
            let mut last: i64 = -1;
            for (index, (name, fty)) in fields.iter().enumerate() {
                let Some(v) = values.iter().find(|(n, _)| n == name).map(|(_, v)| v) else { continue };
                if v.is_zero() {
                    continue;
                }
                put_uint(out, (index as i64 - last) as u64);
                last = index as i64;
                encode_value(out, fty, v)?;
            }
            out.push(0);
        }
        _ => return Err(mismatch(ty, value)),
    }
    Ok(())
}

/// A type as the peer defined it.
#[derive(Debug, Clone)]
enum Wire {
    Struct(Vec<(String, i64)>),
    Slice(i64),
    Array(i64),
    Map(i64, i64),
    Encoded,
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("gob: {}", msg.into()))
}

/// A cursor over one message.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn byte(&mut self) -> io::Result<u8> {
        let (&b, rest) = self.0.split_first().ok_or_else(|| bad("message ends early"))?;
        self.0 = rest;
        Ok(b)
    }

    fn uint(&mut self) -> io::Result<u64> {
        let first = self.byte()?;
        if first <= 0x7f {
            return Ok(u64::from(first));
        }
        let n = (first as i8).unsigned_abs() as usize;
        if n > 8 || self.0.len() < n {
            return Err(bad("bad unsigned integer"));
        }
        let (bytes, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(bytes.iter().fold(0, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn int(&mut self) -> io::Result<i64> {
        let x = self.uint()?;
        Ok(if x & 1 == 1 { !((x >> 1) as i64) } else { (x >> 1) as i64 })
    }

    fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let n = usize::try_from(self.uint()?).map_err(|_| bad("length"))?;
        if self.0.len() < n {
            return Err(bad("bytes past the message's end"));
        }
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(b.to_vec())
    }

    fn string(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| bad("string is not UTF-8"))
    }

    /// Reads struct fields: `each(field number, self)` for each present one.
    fn fields(&mut self, mut each: impl FnMut(usize, &mut Self) -> io::Result<()>) -> io::Result<()> {
        let mut field: i64 = -1;
        loop {
            let delta = self.uint()?;
            if delta == 0 {
                return Ok(());
            }
            field =
                field.checked_add(i64::try_from(delta).map_err(|_| bad("field delta"))?).ok_or_else(|| bad("field"))?;
            each(field as usize, self)?;
        }
    }

    /// CommonType{Name, Id}: the ID.
    fn common(&mut self) -> io::Result<i64> {
        let mut id = 0;
        self.fields(|f, c| {
            match f {
                0 => drop(c.string()?),
                1 => id = c.int()?,
                _ => return Err(bad("CommonType field")),
            }
            Ok(())
        })?;
        Ok(id)
    }
}

/// One stream's decoder: the types the peer has defined so far.
#[derive(Default)]
pub struct Decoder {
    types: HashMap<i64, Wire>,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// The next value in the stream, `None` at its clean end.
    pub fn next(&mut self, r: &mut impl Read) -> io::Result<Option<Value>> {
        loop {
            let Some(len) = read_uint(r)? else { return Ok(None) };
            if len > MAX_MESSAGE {
                return Err(bad(format!("message of {len} bytes")));
            }
            let mut buf = vec![0u8; len as usize];
            r.read_exact(&mut buf)?;
            let mut c = Cursor(&buf);
            let id = c.int()?;
            if id < 0 {
                let wire = wire_type(&mut c)?;
                self.types.insert(-id, wire);
                continue;
            }
            let is_struct = matches!(self.types.get(&id), Some(Wire::Struct(_)));
            if !is_struct && c.uint()? != 0 {
                return Err(bad("a single value without its 0"));
            }
            return self.value(&mut c, id, 0).map(Some);
        }
    }

    fn value(&self, c: &mut Cursor, id: i64, depth: usize) -> io::Result<Value> {
        if depth > 32 {
            return Err(bad("nested too deep"));
        }
        Ok(match id {
            T_BOOL => Value::Bool(c.uint()? != 0),
            T_INT => Value::Int(c.int()?),
            T_UINT => Value::Uint(c.uint()?),
            T_FLOAT => Value::Float(f64::from_bits(c.uint()?.swap_bytes())),
            T_BYTES => Value::Bytes(c.bytes()?),
            T_STRING => Value::Str(c.string()?),
            _ => match self.types.get(&id).ok_or_else(|| bad(format!("unknown type id {id}")))? {
                Wire::Encoded => Value::Encoded(c.bytes()?),
                Wire::Slice(elem) | Wire::Array(elem) => {
                    let n = c.uint()?;
                    if n > c.0.len() as u64 {
                        return Err(bad("more elements than bytes"));
                    }
                    (0..n).map(|_| self.value(c, *elem, depth + 1)).collect::<io::Result<_>>().map(Value::Slice)?
                }
                Wire::Map(k, v) => {
                    let n = c.uint()?;
                    if n > c.0.len() as u64 {
                        return Err(bad("more entries than bytes"));
                    }
                    let mut pairs = Vec::new();
                    for _ in 0..n {
                        pairs.push(Value::Slice(vec![self.value(c, *k, depth + 1)?, self.value(c, *v, depth + 1)?]));
                    }
                    Value::Slice(pairs)
                }
                Wire::Struct(fields) => {
                    let mut values = Vec::new();
                    c.fields(|f, c| {
                        let (name, fid) = fields.get(f).ok_or_else(|| bad("field number past the struct"))?;
                        values.push((name.clone(), self.value(c, *fid, depth + 1)?));
                        Ok(())
                    })?;
                    Value::Struct(values)
                }
            },
        })
    }
}

/// A message's byte count, `None` at a clean end of the stream.
fn read_uint(r: &mut impl Read) -> io::Result<Option<u64>> {
    let mut first = [0u8; 1];
    if r.read(&mut first)? == 0 {
        return Ok(None);
    }
    if first[0] <= 0x7f {
        return Ok(Some(u64::from(first[0])));
    }
    let n = (first[0] as i8).unsigned_abs() as usize;
    if n > 8 {
        return Err(bad("bad message length"));
    }
    let mut bytes = [0u8; 8];
    r.read_exact(&mut bytes[..n])?;
    Ok(Some(bytes[..n].iter().fold(0, |acc, &b| (acc << 8) | u64::from(b))))
}

fn wire_type(c: &mut Cursor) -> io::Result<Wire> {
    let mut wire = None;
    c.fields(|f, c| {
        wire = Some(match f {
            0 => {
                let (mut elem, mut _len) = (0, 0);
                c.fields(|f, c| {
                    match f {
                        0 => drop(c.common()?),
                        1 => elem = c.int()?,
                        2 => _len = c.int()?,
                        _ => return Err(bad("arrayType field")),
                    }
                    Ok(())
                })?;
                Wire::Array(elem)
            }
            1 => {
                let mut elem = 0;
                c.fields(|f, c| {
                    match f {
                        0 => drop(c.common()?),
                        1 => elem = c.int()?,
                        _ => return Err(bad("sliceType field")),
                    }
                    Ok(())
                })?;
                Wire::Slice(elem)
            }
            2 => struct_type(c)?,
            3 => {
                let (mut key, mut elem) = (0, 0);
                c.fields(|f, c| {
                    match f {
                        0 => drop(c.common()?),
                        1 => key = c.int()?,
                        2 => elem = c.int()?,
                        _ => return Err(bad("mapType field")),
                    }
                    Ok(())
                })?;
                Wire::Map(key, elem)
            }
            4..=6 => {
                c.fields(|f, c| match f {
                    0 => c.common().map(drop),
                    _ => Err(bad("gobEncoderType field")),
                })?;
                Wire::Encoded
            }
            _ => return Err(bad("wireType field")),
        });
        Ok(())
    })?;
    wire.ok_or_else(|| bad("empty type definition"))
}

/// A wireType's structType: its fields' names and type ids.
fn struct_type(c: &mut Cursor) -> io::Result<Wire> {
    let mut fields = Vec::new();
    c.fields(|f, c| {
        match f {
            0 => drop(c.common()?),
            1 => {
                let n = c.uint()?;
                if n > c.0.len() as u64 {
                    return Err(bad("more fields than bytes"));
                }
                for _ in 0..n {
                    let (mut name, mut id) = (String::new(), 0);
                    c.fields(|f, c| {
                        match f {
                            0 => name = c.string()?,
                            1 => id = c.int()?,
                            _ => return Err(bad("fieldType field")),
                        }
                        Ok(())
                    })?;
                    fields.push((name, id));
                }
            }
            _ => return Err(bad("structType field")),
        }
        Ok(())
    })?;
    Ok(Wire::Struct(fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_as_go_writes_them() {
        let enc = |f: fn(&mut Vec<u8>, i64), v| {
            let mut b = Vec::new();
            f(&mut b, v);
            b
        };
        let uint = |b: &mut Vec<u8>, v: i64| put_uint(b, v as u64);
        // From the encoding/gob documentation.
        assert_eq!(enc(uint, 7), [7]);
        assert_eq!(enc(uint, 256), [0xfe, 0x01, 0x00]);
        assert_eq!(enc(put_int, -129), [0xfe, 0x01, 0x01]);
        assert_eq!(enc(put_int, 7), [14]);
        for v in [0i64, 1, -1, 127, 128, -1000, i64::MAX, i64::MIN] {
            let b = enc(put_int, v);
            assert_eq!(Cursor(&b).int().unwrap(), v);
        }
    }
}
