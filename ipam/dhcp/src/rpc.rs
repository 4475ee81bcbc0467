//! Plugin to daemon: Go's `net/rpc` over the daemon's unix socket, as the reference speaks it (an HTTP
//! `CONNECT /_goRPC_`, then gob: a `Request{ServiceMethod, Seq}` and the plugin's `skel.CmdArgs`; back a
//! `Response{ServiceMethod, Seq, Error}` and the reply, a `current.Result` for `DHCP.Allocate`). So their
//! plugin works with our daemon and ours with theirs.

use crate::gob::{Decoder, Encoder, Type, Value};
use cnicore::spec::{CniResult, Dns, Error, Interface, IpConfig, Result, Route};
use ipnet::IpNet;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::net::UnixStream;

const RPC_PATH: &str = "/_goRPC_";
const CONNECTED: &str = "200 Connected to Go RPC";

/// What the plugin sends: its environment and config (`skel.CmdArgs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    pub method: String,
    pub container_id: String,
    /// Absolute: the daemon may run in another directory.
    pub netns: String,
    pub ifname: String,
    /// `CNI_ARGS` as the runtime sent it.
    pub args: String,
    pub path: String,
    /// The network config as the plugin read it.
    pub stdin: Vec<u8>,
}

fn s() -> Type {
    Type::Str
}

fn header_type(name: &'static str) -> Type {
    let mut fields = vec![("ServiceMethod", s()), ("Seq", Type::Uint)];
    if name == "Response" {
        fields.push(("Error", s()));
    }
    Type::Struct(name, fields)
}

fn args_type() -> Type {
    Type::Struct(
        "CmdArgs",
        vec![
            ("ContainerID", s()),
            ("Netns", s()),
            ("IfName", s()),
            ("Args", s()),
            ("Path", s()),
            ("StdinData", Type::Bytes),
        ],
    )
}

fn ipnet_type() -> Type {
    Type::Struct("IPNet", vec![("IP", Type::Bytes), ("Mask", Type::Bytes)])
}

fn strings_type() -> Type {
    Type::Slice("[]string", Box::new(s()))
}

/// `types/100.Result` (its v1.9 fields; an older peer ignores the ones it lacks, as gob matches by name).
fn result_type() -> Type {
    let interface = Type::Struct(
        "Interface",
        vec![("Name", s()), ("Mac", s()), ("Mtu", Type::Int), ("Sandbox", s()), ("SocketPath", s()), ("PciID", s())],
    );
    let ip =
        Type::Struct("IPConfig", vec![("Interface", Type::Int), ("Address", ipnet_type()), ("Gateway", Type::Bytes)]);
    let route = Type::Struct(
        "Route",
        vec![
            ("Dst", ipnet_type()),
            ("GW", Type::Bytes),
            ("MTU", Type::Int),
            ("AdvMSS", Type::Int),
            ("Priority", Type::Int),
            ("Table", Type::Int),
            ("Scope", Type::Int),
        ],
    );
    let dns = Type::Struct(
        "DNS",
        vec![("Nameservers", strings_type()), ("Domain", s()), ("Search", strings_type()), ("Options", strings_type())],
    );
    Type::Struct(
        "Result",
        vec![
            ("CNIVersion", s()),
            ("Interfaces", Type::Slice("[]*Interface", Box::new(interface))),
            ("IPs", Type::Slice("[]*IPConfig", Box::new(ip))),
            ("Routes", Type::Slice("[]*Route", Box::new(route))),
            ("DNS", dns),
        ],
    )
}

fn empty_type() -> Type {
    Type::Struct("struct {}", vec![])
}

fn st(fields: Vec<(&str, Value)>) -> Value {
    Value::Struct(fields.into_iter().map(|(n, v)| (n.to_string(), v)).collect())
}

fn text(v: &str) -> Value {
    Value::Str(v.to_string())
}

/// An address as Go's `net.IP` holds it: IPv4 in its 16-byte form.
fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn ipnet_value(net: &IpNet) -> Value {
    let mask = match net {
        IpNet::V4(n) => n.netmask().octets().to_vec(),
        IpNet::V6(n) => n.netmask().octets().to_vec(),
    };
    st(vec![("IP", Value::Bytes(ip_bytes(net.addr()))), ("Mask", Value::Bytes(mask))])
}

fn opt_int(v: Option<impl Into<i64>>) -> Value {
    Value::Int(v.map_or(0, Into::into))
}

fn strings(v: &[String]) -> Value {
    Value::Slice(v.iter().map(|s| text(s)).collect())
}

/// A result as the reference daemon answers (`cniVersion` 1.0.0, which every reference plugin reads).
pub fn result_value(r: &CniResult) -> Value {
    let interfaces = r
        .interfaces
        .iter()
        .map(|i| {
            st(vec![
                ("Name", text(&i.name)),
                ("Mac", text(&i.mac)),
                ("Mtu", opt_int(i.mtu)),
                ("Sandbox", text(&i.sandbox)),
                ("SocketPath", text(&i.socket_path)),
                ("PciID", text(&i.pci_id)),
            ])
        })
        .collect();
    let ips = r
        .ips
        .iter()
        .map(|ip| {
            let mut f = vec![("Address", ipnet_value(&ip.address))];
            if let Some(i) = ip.interface {
                f.push(("Interface", Value::Int(i as i64)));
            }
            if let Some(gw) = ip.gateway {
                f.push(("Gateway", Value::Bytes(ip_bytes(gw))));
            }
            st(f)
        })
        .collect();
    let routes = r
        .routes
        .iter()
        .map(|rt| {
            let mut f = vec![("Dst", ipnet_value(&rt.dst))];
            if let Some(gw) = rt.gw {
                f.push(("GW", Value::Bytes(ip_bytes(gw))));
            }
            f.extend([
                ("MTU", opt_int(rt.mtu)),
                ("AdvMSS", opt_int(rt.advmss)),
                ("Priority", opt_int(rt.priority)),
                ("Table", opt_int(rt.table)),
                ("Scope", opt_int(rt.scope)),
            ]);
            st(f)
        })
        .collect();
    st(vec![
        ("CNIVersion", text("1.0.0")),
        ("Interfaces", Value::Slice(interfaces)),
        ("IPs", Value::Slice(ips)),
        ("Routes", Value::Slice(routes)),
        (
            "DNS",
            st(vec![
                ("Nameservers", strings(&r.dns.nameservers)),
                ("Domain", text(&r.dns.domain)),
                ("Search", strings(&r.dns.search)),
                ("Options", strings(&r.dns.options)),
            ]),
        ),
    ])
}

fn ip_of(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b).ok()?))),
        16 => {
            let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?);
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        }
        _ => None,
    }
}

fn ipnet_of(v: &Value) -> Option<IpNet> {
    let ip = ip_of(&v.bytes("IP"))?;
    let mask = v.bytes("Mask");
    let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
    // A 16-byte mask of an IPv4 network starts with 96 ones.
    let prefix = if ip.is_ipv4() && mask.len() == 16 { ones.checked_sub(96)? } else { ones };
    IpNet::new(ip, u8::try_from(prefix).ok()?).ok()
}

fn small<T: TryFrom<i64>>(v: &Value, name: &str) -> Option<T> {
    v.int(name).filter(|i| *i != 0).and_then(|i| T::try_from(i).ok())
}

fn strings_of(v: &Value, name: &str) -> Vec<String> {
    v.list(name).iter().filter_map(|s| if let Value::Str(s) = s { Some(s.clone()) } else { None }).collect()
}

/// The result a daemon answered, ours or the reference's.
pub fn result_of_value(v: &Value) -> Result<CniResult> {
    let bad = |what: &str| Error::decode(format!("the DHCP daemon's result has a bad {what}"));
    let interfaces = v
        .list("Interfaces")
        .iter()
        .map(|i| Interface {
            name: i.str("Name"),
            mac: i.str("Mac"),
            mtu: small(i, "Mtu"),
            sandbox: i.str("Sandbox"),
            socket_path: i.str("SocketPath"),
            pci_id: i.str("PciID"),
        })
        .collect();
    let mut ips = Vec::new();
    for ip in v.list("IPs") {
        let address = ip.field("Address").and_then(ipnet_of).ok_or_else(|| bad("address"))?;
        let gateway = match ip.bytes("Gateway") {
            b if b.is_empty() => None,
            b => Some(ip_of(&b).ok_or_else(|| bad("gateway"))?),
        };
        let interface = ip.int("Interface").and_then(|i| usize::try_from(i).ok());
        ips.push(IpConfig { address, gateway, interface });
    }
    let mut routes = Vec::new();
    for r in v.list("Routes") {
        let dst = r.field("Dst").and_then(ipnet_of).ok_or_else(|| bad("route"))?;
        let gw = match r.bytes("GW") {
            b if b.is_empty() => None,
            b => Some(ip_of(&b).ok_or_else(|| bad("route gateway"))?),
        };
        let mut route = Route::new(dst, gw);
        route.mtu = small(r, "MTU");
        route.advmss = small(r, "AdvMSS");
        route.priority = small(r, "Priority");
        route.table = small(r, "Table");
        route.scope = small(r, "Scope");
        routes.push(route);
    }
    let dns = match v.field("DNS") {
        Some(d) => Dns {
            nameservers: strings_of(d, "Nameservers"),
            domain: d.str("Domain"),
            search: strings_of(d, "Search"),
            options: strings_of(d, "Options"),
        },
        None => Dns::default(),
    };
    Ok(CniResult { interfaces, ips, routes, dns })
}

/// Reads an HTTP head byte by byte (no read past it: the gob stream follows), at most 4 KiB.
fn read_head(r: &mut impl Read) -> io::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !(head.ends_with(b"\n\n") || head.ends_with(b"\r\n\r\n")) {
        if head.len() > 4096 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "HTTP head over 4 KiB"));
        }
        if r.read(&mut byte)? == 0 {
            let what = if head.is_empty() { "connection closed" } else { "connection closed in the HTTP head" };
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, what));
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// Why a call did not reach a daemon: DEL tolerates this one.
pub struct Unreachable(pub Error);

/// What a call can end in: the daemon's error (`Ok`), or no daemon to ask (`Err`).
pub type CallError = std::result::Result<Error, Unreachable>;

/// Calls `request.method` on the daemon at `socket_path`: the reply (`None` for an empty one).
pub fn call(socket_path: &str, request: &Request) -> std::result::Result<Option<CniResult>, CallError> {
    let mut stream = UnixStream::connect(socket_path).map_err(|e| {
        Err(Unreachable(Error::new(
            cnicore::spec::codes::TRY_AGAIN,
            format!("error dialing DHCP daemon at {socket_path}: {e}"),
        )))
    })?;
    let method = &request.method;
    let io_err = |e: io::Error| Ok(Error::io(format!("error calling {method} on {socket_path}: {e}")));
    stream.write_all(format!("CONNECT {RPC_PATH} HTTP/1.0\n\n").as_bytes()).map_err(io_err)?;
    let head = read_head(&mut stream).map_err(io_err)?;
    if !head.lines().next().is_some_and(|l| l.ends_with(CONNECTED)) {
        return Err(Ok(Error::io(format!(
            "error dialing DHCP daemon at {socket_path}: unexpected HTTP response {:?}",
            head.lines().next().unwrap_or_default()
        ))));
    }
    let mut out = Vec::new();
    let mut enc = Encoder::new();
    let header = st(vec![("ServiceMethod", text(method)), ("Seq", Value::Uint(0))]);
    let args = st(vec![
        ("ContainerID", text(&request.container_id)),
        ("Netns", text(&request.netns)),
        ("IfName", text(&request.ifname)),
        ("Args", text(&request.args)),
        ("Path", text(&request.path)),
        ("StdinData", Value::Bytes(request.stdin.clone())),
    ]);
    enc.encode(&mut out, &header_type("Request"), &header).map_err(io_err)?;
    enc.encode(&mut out, &args_type(), &args).map_err(io_err)?;
    stream.write_all(&out).map_err(io_err)?;
    let mut dec = Decoder::new();
    let mut next = || -> io::Result<Value> {
        dec.next(&mut stream)?.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "no answer"))
    };
    let response = next().map_err(io_err)?;
    let reply = next().map_err(io_err)?;
    let error = response.str("Error");
    if !error.is_empty() {
        return Err(Ok(Error::internal(format!("error calling {method}: {error}"))));
    }
    match reply.field("IPs").or(reply.field("CNIVersion")) {
        Some(_) => result_of_value(&reply).map(Some).map_err(Ok),
        None => Ok(None),
    }
}

/// The daemon's side of one connection: every call on it, answered by `handle`.
pub fn serve(mut stream: UnixStream, handle: impl Fn(&Request) -> Result<Option<CniResult>>) -> io::Result<()> {
    let head = match read_head(&mut stream) {
        // A connection closed before a word: a readiness probe (the plugin's STATUS).
        Err(e) if e.to_string() == "connection closed" => return Ok(()),
        other => other?,
    };
    let request_line = head.lines().next().unwrap_or_default().to_string();
    if !request_line.starts_with("CONNECT ") {
        stream.write_all(
            b"HTTP/1.0 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n405 must CONNECT\n",
        )?;
        return Ok(());
    }
    stream.write_all(format!("HTTP/1.0 {CONNECTED}\n\n").as_bytes())?;
    let (mut dec, mut enc) = (Decoder::new(), Encoder::new());
    while let Some(header) = dec.next(&mut stream)? {
        let args =
            dec.next(&mut stream)?.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "no arguments"))?;
        let request = Request {
            method: header.str("ServiceMethod"),
            container_id: args.str("ContainerID"),
            netns: args.str("Netns"),
            ifname: args.str("IfName"),
            args: args.str("Args"),
            path: args.str("Path"),
            stdin: args.bytes("StdinData"),
        };
        let (error, reply) = match handle(&request) {
            Ok(Some(result)) => (String::new(), Some(result)),
            Ok(None) => (String::new(), None),
            Err(e) => (e.msg, None),
        };
        let seq = match header.field("Seq") {
            Some(Value::Uint(u)) => *u,
            _ => 0,
        };
        let response =
            st(vec![("ServiceMethod", text(&request.method)), ("Seq", Value::Uint(seq)), ("Error", text(&error))]);
        let mut out = Vec::new();
        enc.encode(&mut out, &header_type("Response"), &response)?;
        match reply {
            Some(result) => enc.encode(&mut out, &result_type(), &result_value(&result))?,
            None => enc.encode(&mut out, &empty_type(), &Value::Struct(vec![]))?,
        }
        stream.write_all(&out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    fn to_hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// What Go's net/rpc client sends for `DHCP.Allocate` (Go 1.19 encoding/gob, CmdArgs with libcni 1.2's
    /// `NetnsOverride`), made by `testdata/gobgen.go request`.
    const GO_REQUEST: &str = "2fff81030101075265717565737401ff82000102010d536572766963654d6574686f64010c000103536571010600000012ff82010d444843502e416c6c6f63617465006cff8303010107436d644172677301ff84000107010b436f6e7461696e65724944010c0001054e65746e73010c00010649664e616d65010c00010441726773010c00010450617468010c00010d4e65746e734f76657272696465010c000109537464696e44617461010a00000037ff8401026331010c2f72756e2f6e65746e732f7001046574683001034b3d56010c2f6f70742f636e692f62696e02077b2261223a317d00";

    /// What Go's net/rpc server answers: a `Response` (Seq 5) and a `types/100.Result` with an address, a
    /// gateway and an on-link route with a priority (`testdata/gobgen.go response`).
    const GO_RESPONSE: &str = "3aff8103010108526573706f6e736501ff82000103010d536572766963654d6574686f64010c00010353657101060001054572726f72010c00000014ff82010d444843502e416c6c6f6361746501050051ff8303010106526573756c7401ff84000105010a434e4956657273696f6e010c00010a496e746572666163657301ff8800010349507301ff8e000106526f7574657301ff92000103444e5301ff9400000020ff87020101115b5d2a6d61696e2e496e7465726661636501ff880001ff8600004aff85030102ff8600010601044e616d65010c0001034d6163010c0001034d7475010400010753616e64626f78010c00010a536f636b657450617468010c0001055063694944010c0000001fff8d020101105b5d2a6d61696e2e4950436f6e66696701ff8e0001ff8a000033ff89030102ff8a0001030109496e7465726661636501040001074164647265737301ff8c00010747617465776179010a00000023ff8b0301010549504e657401ff8c00010201024950010a0001044d61736b010a0000001cff910201010d5b5d2a6d61696e2e526f75746501ff920001ff90000050ff8f030102ff90000107010344737401ff8c0001024757010a0001034d545501040001064164764d535301040001085072696f7269747901040001055461626c65010400010553636f7065010400000046ff9303010103444e5301ff94000104010b4e616d657365727665727301ff96000106446f6d61696e010c00010653656172636801ff960001074f7074696f6e7301ff9600000016ff95020101085b5d737472696e6701ff9600010c000064ff840105312e302e30020102011000000000000000000000ffff0a4d00140104ffffff0000011000000000000000000000ffff0a4d00010001010101040a0900000104ffff000000011000000000000000000000ffff00000000030e02fe01fa00010000";

    #[test]
    fn decodes_what_go_clients_send() {
        let bytes = hex(GO_REQUEST);
        let mut r = &bytes[..];
        let mut dec = Decoder::new();
        let header = dec.next(&mut r).unwrap().unwrap();
        assert_eq!(header.str("ServiceMethod"), "DHCP.Allocate");
        assert_eq!(header.field("Seq"), None, "Seq 0 is not sent");
        let args = dec.next(&mut r).unwrap().unwrap();
        assert_eq!(args.str("ContainerID"), "c1");
        assert_eq!(args.str("Netns"), "/run/netns/p");
        assert_eq!(args.str("IfName"), "eth0");
        assert_eq!(args.str("Args"), "K=V");
        assert_eq!(args.str("Path"), "/opt/cni/bin");
        assert_eq!(args.bytes("StdinData"), br#"{"a":1}"#);
        assert!(dec.next(&mut r).unwrap().is_none());
    }

    #[test]
    fn decodes_what_go_servers_answer() {
        let bytes = hex(GO_RESPONSE);
        let mut r = &bytes[..];
        let mut dec = Decoder::new();
        let response = dec.next(&mut r).unwrap().unwrap();
        assert_eq!(response.field("Seq"), Some(&Value::Uint(5)));
        let result = result_of_value(&dec.next(&mut r).unwrap().unwrap()).unwrap();
        let json = result.to_json(cnicore::spec::Version::V110).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"cniVersion": "1.1.0", "ips": [{"address": "10.77.0.20/24", "gateway": "10.77.0.1"}],
                "routes": [{"dst": "10.9.0.0/16", "gw": "0.0.0.0", "priority": 7, "scope": 253}], "dns": {}})
        );
    }

    /// Our encoding of the same request, byte for byte what Go sends, but for the type names and
    /// definitions' order (Go defines a struct before the types it refers to; decoders take either).
    #[test]
    fn encodes_a_request_as_go_does() {
        let mut out = Vec::new();
        let mut enc = Encoder::new();
        let header = st(vec![("ServiceMethod", text("DHCP.Allocate")), ("Seq", Value::Uint(0))]);
        enc.encode(&mut out, &header_type("Request"), &header).unwrap();
        let args = st(vec![
            ("ContainerID", text("c1")),
            ("Netns", text("/run/netns/p")),
            ("IfName", text("eth0")),
            ("Args", text("K=V")),
            ("Path", text("/opt/cni/bin")),
            ("StdinData", Value::Bytes(br#"{"a":1}"#.to_vec())),
        ]);
        enc.encode(&mut out, &args_type(), &args).unwrap();
        // The Request definition and value are Go's, byte for byte (CmdArgs differs: Go's has NetnsOverride).
        let go = hex(GO_REQUEST);
        let first_two = 1 + 0x2f + 1 + 0x12;
        assert_eq!(to_hex(&out[..first_two]), to_hex(&go[..first_two]));
        // Our round trip.
        let mut r = &out[..];
        let mut dec = Decoder::new();
        assert_eq!(dec.next(&mut r).unwrap().unwrap().str("ServiceMethod"), "DHCP.Allocate");
        let back = dec.next(&mut r).unwrap().unwrap();
        assert_eq!(back.bytes("StdinData"), br#"{"a":1}"#);
        assert_eq!(back.str("Netns"), "/run/netns/p");
    }

    /// Hostile peers: every truncation and many random corruptions of Go's messages give values or errors,
    /// never a panic or a huge allocation.
    #[test]
    fn corrupt_streams_are_errors() {
        let mut rand = crate::packet::xorshift(0x9e37_79b9_7f4a_7c15);
        for fixture in [GO_REQUEST, GO_RESPONSE] {
            let good = hex(fixture);
            let mut inputs: Vec<Vec<u8>> = (0..good.len()).map(|n| good[..n].to_vec()).collect();
            for _ in 0..3000 {
                let mut b = good.clone();
                for _ in 0..1 + rand() % 4 {
                    let i = (rand() as usize) % b.len();
                    b[i] = rand() as u8;
                }
                inputs.push(b);
            }
            for input in inputs {
                let mut r = &input[..];
                let mut dec = Decoder::new();
                while let Ok(Some(v)) = dec.next(&mut r) {
                    let _ = result_of_value(&v);
                }
            }
        }
    }

    /// Everything but zeros comes back: gob sends no zero value, so an `interface` index 0 is lost between
    /// Go peers too (dhcp results name no interface).
    #[test]
    fn result_round_trip() {
        let json = serde_json::json!({"cniVersion": "1.1.0",
            "interfaces": [{"name": "veth1"}, {"name": "eth0", "mac": "02:00:00:00:00:01", "sandbox": "/run/netns/p"}],
            "ips": [{"address": "10.77.0.20/24", "gateway": "10.77.0.1", "interface": 1},
                    {"address": "fd00::5/64"}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.77.0.1", "priority": 5}, {"dst": "10.9.8.0/24", "scope": 253}],
            "dns": {"nameservers": ["10.0.0.53"], "search": ["example"]}});
        let result = CniResult::from_json(&json).unwrap();
        let mut out = Vec::new();
        Encoder::new().encode(&mut out, &result_type(), &result_value(&result)).unwrap();
        let back = result_of_value(&Decoder::new().next(&mut &out[..]).unwrap().unwrap()).unwrap();
        assert_eq!(back, result);
    }
}
