//! The dhcp IPAM config (`ipam.daemonSocketPath`, `provide`, `request`, `priority`), the options it turns into
//! and the client ID, as the reference builds them. Read by the plugin (to fail early, before the daemon is
//! asked) and by the daemon (which acts on it).

use crate::packet::opt;
use cnicore::spec::{gojson, json_error_in, CniArgs, Error, Result};
use serde::Deserialize;

pub const DEFAULT_SOCKET_PATH: &str = "/run/cni/dhcp.sock";

#[derive(Deserialize, Default)]
struct NetConfIn {
    #[serde(default)]
    name: String,
    #[serde(default)]
    ipam: Option<IpamConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct IpamConfig {
    #[serde(default)]
    daemon_socket_path: String,
    #[serde(default)]
    provide: Vec<ProvideIn>,
    #[serde(default)]
    request: Vec<RequestIn>,
    #[serde(default)]
    priority: i64,
}

#[derive(Deserialize)]
struct ProvideIn {
    #[serde(default)]
    option: String,
    #[serde(default)]
    value: String,
    #[serde(default, rename = "fromArg")]
    from_arg: String,
}

#[derive(Deserialize)]
struct RequestIn {
    #[serde(default, rename = "skipDefault")]
    skip_default: bool,
    #[serde(default)]
    option: String,
}

/// What one invocation asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conf {
    pub name: String,
    pub socket_path: String,
    /// The options sent in DISCOVER and REQUEST besides the message type, 50, 54 and 61: one per code,
    /// sorted by code (the reference's DHCP library writes them so).
    pub options: Vec<(u8, Vec<u8>)>,
    /// The metric of the routes, 0 = unset.
    pub priority: u32,
}

/// The options the reference names in its config; any other is a decimal code.
fn option_code(name: &str) -> Result<u8> {
    let code = match name {
        "dhcp-client-identifier" => opt::CLIENT_ID,
        "subnet-mask" => opt::SUBNET_MASK,
        "routers" => opt::ROUTER,
        "host-name" => opt::HOST_NAME,
        "user-class" => opt::USER_CLASS,
        "vendor-class-identifier" => opt::CLASS_ID,
        _ if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) => name
            .parse::<u8>()
            .map_err(|_| Error::config(format!("Can not parse option {name:?}: value out of range")))?,
        _ => return Err(Error::config(format!("Can not parse option {:?}: not a known name or a number", name))),
    };
    Ok(code)
}

/// Replaces the option of the same code, else appends (the reference's `Options.Update`).
fn update(options: &mut Vec<(u8, Vec<u8>)>, code: u8, value: Vec<u8>) {
    match options.iter_mut().find(|(c, _)| *c == code) {
        Some(slot) => slot.1 = value,
        None => options.push((code, value)),
    }
}

pub fn parse(stdin: &[u8], cni_args: &CniArgs) -> Result<Conf> {
    let conf: NetConfIn = gojson::from_slice(stdin).map_err(|e| json_error_in("invalid network config", &e, stdin))?;
    let ipam = conf.ipam.unwrap_or_default();
    let mut options = Vec::new();
    for p in &ipam.provide {
        let code = option_code(&p.option)?;
        // The message itself is the daemon's: its type, requested address, server and end marker.
        if [opt::PAD, opt::END, opt::MESSAGE_TYPE, opt::REQUESTED_IP, opt::SERVER_ID, opt::PARAMETER_LIST]
            .contains(&code)
        {
            return Err(Error::config(format!("option {:?} (code {code}) cannot be provided", p.option)));
        }
        if !p.value.is_empty() {
            if p.value.len() > 255 {
                return Err(Error::config(format!("value too long for option {:?}", p.option)));
            }
            update(&mut options, code, p.value.as_bytes().to_vec());
        }
        if let Some(value) = cni_args.get(&p.from_arg).filter(|_| !p.from_arg.is_empty()) {
            if value.len() > 255 {
                return Err(Error::config(format!(
                    "value too long for option {:?} from CNI_ARGS {:?}",
                    p.option, p.from_arg
                )));
            }
            update(&mut options, code, value.as_bytes().to_vec());
        }
    }
    let mut wanted: Vec<u8> = Vec::new();
    let mut skip_default = false;
    for r in &ipam.request {
        skip_default |= r.skip_default;
        if r.option.is_empty() {
            continue;
        }
        let code = option_code(&r.option)?;
        if !wanted.contains(&code) {
            wanted.push(code);
        }
    }
    if !skip_default {
        for code in [opt::ROUTER, opt::SUBNET_MASK] {
            if !wanted.contains(&code) {
                wanted.push(code);
            }
        }
    }
    if !wanted.is_empty() {
        update(&mut options, opt::PARAMETER_LIST, wanted);
    }
    options.sort_by_key(|(c, _)| *c);
    let priority = u32::try_from(ipam.priority)
        .map_err(|_| Error::config(format!("ipam.priority {} is not a route metric", ipam.priority)))?;
    let socket_path =
        if ipam.daemon_socket_path.is_empty() { DEFAULT_SOCKET_PATH.to_string() } else { ipam.daemon_socket_path };
    // A unix socket's path holds at most 107 bytes and no NUL.
    if socket_path.len() > 107 || socket_path.contains('\0') {
        return Err(Error::config(format!(
            "ipam.daemonSocketPath {:?} is not a unix socket path (at most 107 bytes, no NUL)",
            cnicore::spec::truncate_for_msg(&socket_path)
        )));
    }
    Ok(Conf { name: conf.name, socket_path, options, priority })
}

/// What a release needs, whatever else the config holds: the network's name and the daemon's socket.
pub fn for_release(stdin: &[u8]) -> Result<(String, String)> {
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct SocketOnly {
        #[serde(default)]
        daemon_socket_path: String,
    }
    #[derive(Deserialize)]
    struct ReleaseConf {
        #[serde(default)]
        name: String,
        #[serde(default)]
        ipam: Option<SocketOnly>,
    }
    let conf: ReleaseConf =
        gojson::from_slice(stdin).map_err(|e| json_error_in("invalid network config", &e, stdin))?;
    let socket = conf.ipam.unwrap_or_default().daemon_socket_path;
    let socket = if socket.is_empty() { DEFAULT_SOCKET_PATH.to_string() } else { socket };
    Ok((conf.name, socket))
}

/// The reference's client ID: `<container ID>/<network>/<interface>`, cut to 254 bytes (option 61 holds 255
/// with its type byte).
pub fn client_id(container_id: &str, network: &str, ifname: &str) -> Vec<u8> {
    let mut id = format!("{container_id}/{network}/{ifname}").into_bytes();
    id.truncate(254);
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::parse_cni_args;

    fn conf(ipam: &str, args: &str) -> Result<Conf> {
        let stdin = format!(r#"{{"cniVersion":"1.0.0","name":"net","type":"macvlan","ipam":{ipam}}}"#);
        parse(stdin.as_bytes(), &parse_cni_args(args).unwrap())
    }

    #[test]
    fn defaults() {
        let c = conf(r#"{"type":"dhcp"}"#, "").unwrap();
        assert_eq!(c.socket_path, DEFAULT_SOCKET_PATH);
        assert_eq!(c.options, vec![(55, vec![3, 1])]);
        assert_eq!(c.name, "net");
        assert_eq!(c.priority, 0);
    }

    #[test]
    fn provide_and_request() {
        let c = conf(
            r#"{"type":"dhcp","daemonSocketPath":"/x.sock","priority":7,
                "provide":[{"option":"host-name","value":"a"},{"option":"host-name","fromArg":"K8S_POD_NAME"},
                           {"option":"60","value":"cls"}],
                "request":[{"option":"121"},{"option":"routers"},{"skipDefault":true}]}"#,
            "K8S_POD_NAME=pod-1",
        )
        .unwrap();
        assert_eq!(c.socket_path, "/x.sock");
        assert_eq!(c.priority, 7);
        assert_eq!(c.options, vec![(12, b"pod-1".to_vec()), (55, vec![121, 3]), (60, b"cls".to_vec())]);
    }

    #[test]
    fn bad_options() {
        for ipam in [
            r#"{"provide":[{"option":"nope","value":"a"}]}"#,
            r#"{"provide":[{"option":"256","value":"a"}]}"#,
            r#"{"provide":[{"option":"-1","value":"a"}]}"#,
            r#"{"provide":[{"option":"53","value":"a"}]}"#,
            r#"{"request":[{"option":"x"}]}"#,
            r#"{"priority":-1}"#,
            r#"{"daemonSocketPath":"/a\u0000b"}"#,
            r#"{"provide":"x"}"#,
        ] {
            let e = conf(ipam, "").unwrap_err();
            assert!(e.code == 7 || e.code == 6, "{ipam}: {e}");
        }
        let long = "v".repeat(256);
        assert!(conf(&format!(r#"{{"provide":[{{"option":"12","value":"{long}"}}]}}"#), "").is_err());
    }

    #[test]
    fn a_release_needs_only_the_name() {
        let stdin = br#"{"name":"net","ipam":{"provide":[{"option":"53","value":"x"}]}}"#;
        assert!(parse(stdin, &CniArgs::default()).is_err());
        assert_eq!(for_release(stdin).unwrap(), ("net".to_string(), DEFAULT_SOCKET_PATH.to_string()));
    }

    #[test]
    fn client_id_is_cut_at_254_bytes() {
        assert_eq!(client_id("c", "n", "eth0"), b"c/n/eth0");
        assert_eq!(client_id(&"x".repeat(300), "n", "eth0").len(), 254);
    }
}
