//! A minimal synchronous D-Bus client: enough of the wire protocol for the firewalld backend (method calls
//! with string arguments, answers of type `s` or `b`, errors), over one unix socket.
//!
//! Why not a crate: `zbus` brings an async runtime and ~60 crates into a process that makes four calls, and
//! the `dbus` crate links libdbus. The subset used here is small and fixed: the SASL `EXTERNAL` handshake,
//! `Hello`, then method calls, reading messages until the reply whose serial matches (signals such as
//! `NameAcquired` are skipped). Messages are written little-endian; replies are read in either byte order.
//!
//! The bus is the system bus at `DBUS_SYSTEM_BUS_ADDRESS` (default `unix:path=/run/dbus/system_bus_socket`),
//! as libdbus and godbus (the reference plugin) find it.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// The system bus when `DBUS_SYSTEM_BUS_ADDRESS` is unset.
pub const DEFAULT_SYSTEM_BUS: &str = "unix:path=/run/dbus/system_bus_socket";
/// How long one call may take: firewalld answers within milliseconds, but applies its rules before it does.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Bigger replies are not ours to read (firewalld's answers are a few hundred bytes).
const MAX_MESSAGE: usize = 1 << 20;

const METHOD_CALL: u8 = 1;
const METHOD_RETURN: u8 = 2;
const ERROR: u8 = 3;

const FIELD_PATH: u8 = 1;
const FIELD_INTERFACE: u8 = 2;
const FIELD_MEMBER: u8 = 3;
const FIELD_ERROR_NAME: u8 = 4;
const FIELD_REPLY_SERIAL: u8 = 5;
const FIELD_DESTINATION: u8 = 6;
const FIELD_SIGNATURE: u8 = 8;

/// Why a call failed.
#[derive(Debug)]
pub enum CallError {
    /// The bus could not be reached or spoke something else.
    Io(io::Error),
    /// The callee answered with a D-Bus error: its name and message.
    Remote { name: String, message: String },
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Io(e) => write!(f, "{e}"),
            CallError::Remote { name, message } => write!(f, "{name}: {message}"),
        }
    }
}

impl From<io::Error> for CallError {
    fn from(e: io::Error) -> CallError {
        CallError::Io(e)
    }
}

/// A value of a reply body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Str(String),
    Bool(bool),
}

/// The system bus address of this process's environment.
pub fn system_bus_address() -> String {
    std::env::var("DBUS_SYSTEM_BUS_ADDRESS").ok().filter(|a| !a.is_empty()).unwrap_or_else(|| DEFAULT_SYSTEM_BUS.into())
}

/// The socket of a D-Bus address: the first `unix:path=` or `unix:abstract=` entry.
fn socket_of(address: &str) -> io::Result<UnixStream> {
    for entry in address.split(';') {
        let Some(params) = entry.strip_prefix("unix:") else { continue };
        for param in params.split(',') {
            if let Some(path) = param.strip_prefix("path=") {
                return UnixStream::connect(PathBuf::from(unescape(path)?));
            }
            if let Some(name) = param.strip_prefix("abstract=") {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(unescape(name)?.as_bytes())?;
                return UnixStream::connect_addr(&addr);
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("no unix socket in D-Bus address {address:?}")))
}

/// D-Bus address values escape bytes as `%xx`.
fn unescape(value: &str) -> io::Result<String> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, "bad %-escape in D-Bus address");
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value.get(i + 1..i + 3).ok_or_else(bad)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// One authenticated connection to a bus.
pub struct Connection {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    serial: u32,
}

impl Connection {
    /// Connects to `address`, authenticates as this process's uid and says `Hello`.
    pub fn open(address: &str) -> Result<Connection, CallError> {
        let stream = socket_of(address)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        let writer = stream.try_clone()?;
        let mut connection = Connection { reader: BufReader::new(stream), writer, serial: 0 };
        connection.authenticate()?;
        connection.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "Hello", &[])?;
        Ok(connection)
    }

    fn authenticate(&mut self) -> io::Result<()> {
        let uid = nix::unistd::getuid().as_raw().to_string();
        let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
        self.writer.write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())?;
        let mut line = String::new();
        self.reader.by_ref().take(512).read_line(&mut line)?;
        if !line.starts_with("OK ") {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("D-Bus authentication refused: {:?}", line.trim()),
            ));
        }
        self.writer.write_all(b"BEGIN\r\n")
    }

    /// Calls `interface.member` on `path` of `destination` with string arguments; the reply's values.
    pub fn call(
        &mut self,
        destination: &str,
        path: &str,
        interface: &str,
        member: &str,
        args: &[&str],
    ) -> Result<Vec<Value>, CallError> {
        self.serial += 1;
        let serial = self.serial;
        let message = encode_call(serial, destination, path, interface, member, args);
        self.writer.write_all(&message)?;
        loop {
            let reply = self.read_message()?;
            match reply.kind {
                METHOD_RETURN if reply.reply_serial == Some(serial) => return Ok(reply.body),
                ERROR if reply.reply_serial == Some(serial) => {
                    let message = match reply.body.first() {
                        Some(Value::Str(text)) => text.clone(),
                        _ => String::new(),
                    };
                    return Err(CallError::Remote { name: reply.error_name.unwrap_or_default(), message });
                }
                // Signals and replies to nothing we asked.
                _ => continue,
            }
        }
    }

    fn read_message(&mut self) -> io::Result<Message> {
        let mut fixed = [0u8; 16];
        self.reader.read_exact(&mut fixed)?;
        let little = match fixed[0] {
            b'l' => true,
            b'B' => false,
            _ => return Err(protocol("bad byte-order mark")),
        };
        let u32_at = |b: &[u8], at: usize| {
            let bytes = [b[at], b[at + 1], b[at + 2], b[at + 3]];
            if little {
                u32::from_le_bytes(bytes)
            } else {
                u32::from_be_bytes(bytes)
            }
        };
        let body_len = u32_at(&fixed, 4) as usize;
        let fields_len = u32_at(&fixed, 12) as usize;
        let total = 16 + align(fields_len, 8) + body_len;
        if total > MAX_MESSAGE {
            return Err(protocol("message too large"));
        }
        let mut buf = fixed.to_vec();
        buf.resize(total, 0);
        self.reader.read_exact(&mut buf[16..])?;
        decode(&buf, little, fixed[1], fields_len)
    }
}

fn protocol(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("D-Bus protocol error: {what}"))
}

fn align(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Zero bytes up to the next multiple of `to` (the wire format's alignment padding).
fn pad_to(buf: &mut Vec<u8>, to: usize) {
    buf.resize(align(buf.len(), to), 0);
}

/// A decoded message: what a caller needs of it.
#[derive(Debug)]
struct Message {
    kind: u8,
    reply_serial: Option<u32>,
    error_name: Option<String>,
    body: Vec<Value>,
}

// ---- encoding ----

struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn pad(&mut self, to: usize) {
        pad_to(&mut self.buf, to);
    }

    fn u32(&mut self, v: u32) {
        self.pad(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn string(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    fn signature(&mut self, s: &str) {
        self.buf.push(s.len() as u8);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    /// One header field: `(code, variant)`, each struct aligned to 8.
    fn field(&mut self, code: u8, signature: &str, value: &str) {
        self.pad(8);
        self.buf.push(code);
        self.signature(signature);
        match signature {
            "g" => self.signature(value),
            _ => self.string(value),
        }
    }
}

/// A METHOD_CALL message with string arguments, little-endian.
fn encode_call(serial: u32, destination: &str, path: &str, interface: &str, member: &str, args: &[&str]) -> Vec<u8> {
    let mut body = Writer { buf: Vec::new() };
    for arg in args {
        body.string(arg);
    }
    let mut fields = Writer { buf: Vec::new() };
    // Offsets count from the message start; the fields array starts at 16, which is 8-aligned.
    fields.field(FIELD_PATH, "o", path);
    fields.field(FIELD_INTERFACE, "s", interface);
    fields.field(FIELD_MEMBER, "s", member);
    fields.field(FIELD_DESTINATION, "s", destination);
    if !args.is_empty() {
        fields.field(FIELD_SIGNATURE, "g", &"s".repeat(args.len()));
    }
    let mut out = vec![b'l', METHOD_CALL, 0, 1];
    out.extend_from_slice(&(body.buf.len() as u32).to_le_bytes());
    out.extend_from_slice(&serial.to_le_bytes());
    out.extend_from_slice(&(fields.buf.len() as u32).to_le_bytes());
    out.extend_from_slice(&fields.buf);
    pad_to(&mut out, 8);
    out.extend_from_slice(&body.buf);
    out
}

// ---- decoding ----

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
    little: bool,
}

impl Reader<'_> {
    fn pad(&mut self, to: usize) -> io::Result<()> {
        self.at = align(self.at, to);
        if self.at > self.buf.len() {
            return Err(protocol("truncated message"));
        }
        Ok(())
    }

    fn bytes(&mut self, n: usize) -> io::Result<&[u8]> {
        let end =
            self.at.checked_add(n).filter(|end| *end <= self.buf.len()).ok_or_else(|| protocol("truncated message"))?;
        let out = &self.buf[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.bytes(1)?[0])
    }

    fn u32(&mut self) -> io::Result<u32> {
        self.pad(4)?;
        let b = self.bytes(4)?;
        let bytes = [b[0], b[1], b[2], b[3]];
        Ok(if self.little { u32::from_le_bytes(bytes) } else { u32::from_be_bytes(bytes) })
    }

    fn text(&mut self, len: usize) -> io::Result<String> {
        let text = String::from_utf8(self.bytes(len)?.to_vec()).map_err(|_| protocol("string is not UTF-8"))?;
        self.bytes(1)?; // the terminating NUL
        Ok(text)
    }

    fn string(&mut self) -> io::Result<String> {
        let len = self.u32()? as usize;
        self.text(len)
    }

    fn signature(&mut self) -> io::Result<String> {
        let len = self.u8()? as usize;
        self.text(len)
    }

    /// One value of a basic type; `None` for types the caller has no use for (skipped).
    fn value(&mut self, code: u8) -> io::Result<Option<Value>> {
        match code {
            b's' | b'o' => self.string().map(|s| Some(Value::Str(s))),
            b'g' => self.signature().map(|s| Some(Value::Str(s))),
            b'b' => self.u32().map(|v| Some(Value::Bool(v != 0))),
            b'u' | b'i' | b'h' => self.u32().map(|v| Some(Value::Str(v.to_string()))),
            b'y' => self.u8().map(|_| None),
            b'n' | b'q' => {
                self.pad(2)?;
                self.bytes(2).map(|_| None)
            }
            b'x' | b't' | b'd' => {
                self.pad(8)?;
                self.bytes(8).map(|_| None)
            }
            _ => Err(protocol("unsupported type in message")),
        }
    }
}

fn decode(buf: &[u8], little: bool, kind: u8, fields_len: usize) -> io::Result<Message> {
    let mut r = Reader { buf, at: 16, little };
    let fields_end = 16 + fields_len;
    let mut message = Message { kind, reply_serial: None, error_name: None, body: Vec::new() };
    let mut signature = String::new();
    while r.at < fields_end {
        r.pad(8)?;
        let code = r.u8()?;
        let sig = r.signature()?;
        let &[type_code] = sig.as_bytes() else { return Err(protocol("header field of a container type")) };
        let value = r.value(type_code)?;
        match (code, value) {
            (FIELD_REPLY_SERIAL, Some(Value::Str(v))) => message.reply_serial = v.parse().ok(),
            (FIELD_ERROR_NAME, Some(Value::Str(v))) => message.error_name = Some(v),
            (FIELD_SIGNATURE, Some(Value::Str(v))) => signature = v,
            _ => {}
        }
    }
    r.pad(8)?;
    // Bodies of other shapes (arrays, structs) are not read: a caller of those gets no values.
    if signature.bytes().all(|c| b"sogbuihynqxtd".contains(&c)) {
        for code in signature.bytes() {
            if let Some(value) = r.value(code)? {
                message.body.push(value);
            }
        }
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_encoding_byte_for_byte() {
        let m = encode_call(
            2,
            "org.fedoraproject.FirewallD1",
            "/org/fedoraproject/FirewallD1",
            "org.fedoraproject.FirewallD1.zone",
            "addSource",
            &["trusted", "10.88.0.2/32"],
        );
        // Fixed header: little-endian, METHOD_CALL, no flags, version 1, body length, serial.
        assert_eq!(&m[..12], &[b'l', 1, 0, 1, 29, 0, 0, 0, 2, 0, 0, 0]);
        let fields_len = u32::from_le_bytes([m[12], m[13], m[14], m[15]]) as usize;
        assert_eq!(m.len(), 16 + align(fields_len, 8) + 29);
        // The first field: code 1, signature "o", the path.
        assert_eq!(&m[16..20], &[FIELD_PATH, 1, b'o', 0]);
        assert_eq!(&m[20..24], &29u32.to_le_bytes());
        assert_eq!(&m[24..53], b"/org/fedoraproject/FirewallD1");
        // The body: two strings, the second aligned to 4.
        assert_eq!(&m[m.len() - 29..], b"\x07\0\0\0trusted\0\x0c\0\0\x0010.88.0.2/32\0");
        // And it decodes back as a message of our own.
        let decoded = decode(&m, true, METHOD_CALL, fields_len).unwrap();
        assert_eq!(decoded.body, vec![Value::Str("trusted".into()), Value::Str("10.88.0.2/32".into())]);
    }

    /// A big-endian ERROR reply as libdbus would send it: error name, reply serial, signature, message.
    #[test]
    fn decodes_big_endian_errors() {
        let mut fields = Vec::new();
        let push_field = |fields: &mut Vec<u8>, code: u8, sig: u8, value: &[u8]| {
            pad_to(fields, 8);
            fields.extend_from_slice(&[code, 1, sig, 0]);
            fields.extend_from_slice(value);
        };
        let name = b"org.fedoraproject.FirewallD1.Exception";
        let mut v = (name.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(name);
        v.push(0);
        push_field(&mut fields, FIELD_ERROR_NAME, b's', &v);
        push_field(&mut fields, FIELD_REPLY_SERIAL, b'u', &7u32.to_be_bytes());
        push_field(&mut fields, FIELD_SIGNATURE, b'g', &[1, b's', 0]);
        let text = b"ZONE_ALREADY_SET: '10.88.0.2/32' already bound to 'trusted'";
        let mut body = (text.len() as u32).to_be_bytes().to_vec();
        body.extend_from_slice(text);
        body.push(0);
        let mut m = vec![b'B', ERROR, 1, 1];
        m.extend_from_slice(&(body.len() as u32).to_be_bytes());
        m.extend_from_slice(&9u32.to_be_bytes());
        m.extend_from_slice(&(fields.len() as u32).to_be_bytes());
        m.extend_from_slice(&fields);
        pad_to(&mut m, 8);
        m.extend_from_slice(&body);
        let decoded = decode(&m, false, ERROR, fields.len()).unwrap();
        assert_eq!(decoded.reply_serial, Some(7));
        assert_eq!(decoded.error_name.as_deref(), Some("org.fedoraproject.FirewallD1.Exception"));
        assert_eq!(decoded.body, vec![Value::Str(String::from_utf8(text.to_vec()).unwrap())]);
    }

    #[test]
    fn truncated_messages_are_errors() {
        let m = encode_call(1, "d", "/p", "i.f", "m", &["x"]);
        let fields_len = u32::from_le_bytes([m[12], m[13], m[14], m[15]]) as usize;
        assert!(decode(&m[..m.len() - 3], true, METHOD_RETURN, fields_len).is_err());
    }

    #[test]
    fn addresses() {
        assert_eq!(unescape("/run/dbus/system%5fbus").unwrap(), "/run/dbus/system_bus");
        assert!(unescape("%zz").is_err());
        assert!(socket_of("tcp:host=localhost,port=1").is_err());
    }
}
