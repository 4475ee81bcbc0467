//! `tap`: a persistent tap device in the pod (for a VM's NIC), as the reference v1.9: `multiQueue`, `owner`,
//! `group`, `mac` (config, then `CNI_ARGS` `MAC`, then `runtimeConfig.mac`), `mtu`, `bridge` (a bridge inside
//! the pod to make the tap a port of), IPAM optional. Made with the `/dev/net/tun` ioctls in the pod's
//! namespace ([`cnicore::tuntap`]), never an `ip` process.

use cnicore::failpoint;
use cnicore::netlink::Netlink;
use cnicore::netns::NetNs;
use cnicore::spec::{ipam, plugin_main, CniResult, Command, Context, Dns, Error, ErrorContext, Errors, Interface};
use cnicore::spec::{truncate_for_msg as truncate, IpConfig, Result, Verbs};
use cnicore::tuntap::{self, TapOptions, IFF_MULTI_QUEUE, IFF_NO_PI, IFF_VNET_HDR};
use cnicore::undo::Undo;
use serde::Deserialize;

/// Where SELinux is mounted when the node runs it.
const SELINUX_FS: &str = "/sys/fs/selinux/enforce";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfIn {
    #[serde(default)]
    multi_queue: bool,
    #[serde(default)]
    mtu: i64,
    #[serde(default)]
    mac: String,
    #[serde(default)]
    owner: Option<u32>,
    #[serde(default)]
    group: Option<u32>,
    #[serde(default)]
    selinux_context: String,
    #[serde(default)]
    bridge: String,
    /// The reference declares `args` as an empty struct: any object, ignored.
    #[serde(default)]
    #[allow(dead_code)]
    args: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    runtime_config: Option<RuntimeIn>,
}

#[derive(Deserialize)]
struct RuntimeIn {
    #[serde(default)]
    mac: String,
}

#[derive(Debug)]
struct Config {
    options: TapOptions,
    mtu: Option<u32>,
    mac: Option<[u8; 6]>,
    bridge: Option<String>,
    ipam_type: Option<String>,
    dns: Dns,
}

impl Config {
    fn load(ctx: &Context) -> Result<Config> {
        let conf: ConfIn = ctx.parse_conf()?;
        if !matches!(ctx.conf.args, None | Some(serde_json::Value::Object(_))) {
            return Err(Error::config("args must be an object"));
        }
        ctx.env.args.check_known(&["MAC"])?;
        let mut mac = conf.mac;
        if let Some(m) = ctx.env.args.get("MAC").filter(|m| !m.is_empty()) {
            mac = m.to_string();
        }
        if let Some(m) = conf.runtime_config.map(|r| r.mac).filter(|m| !m.is_empty()) {
            mac = m;
        }
        let mac = match mac.is_empty() {
            true => None,
            false => Some(cnicore::mac::parse(&mac)?),
        };
        let mtu = match conf.mtu {
            0 => None,
            // The kernel's bounds for a tap.
            m @ 68..=65521 => Some(m as u32),
            m => return Err(Error::config(format!("invalid mtu {m}: a tap takes 68 to 65521"))),
        };
        let bridge = match conf.bridge.is_empty() {
            true => None,
            false => {
                cnicore::spec::validate_ifname(&conf.bridge)
                    .map_err(|e| Error::config(format!("bridge: {}", e.msg)))?;
                Some(conf.bridge)
            }
        };
        if !conf.selinux_context.is_empty() {
            if std::path::Path::new(SELINUX_FS).exists() {
                // The label of a tap is that of the process that makes it: the reference execs `ip` under it.
                return Err(Error::config(format!(
                    "selinuxContext {:?}: labelling the tap is not supported by this plugin on a node running SELinux",
                    truncate(&conf.selinux_context)
                )));
            }
            cnicore::warn!("selinuxContext ignored: SELinux is not enabled on this node");
        }
        // The reference's two ways of making the tap give different flags: netlink (owner and group both set)
        // a vnet header, `ip tuntap` (otherwise) no packet information; both take multi_queue.
        let flags = match (conf.owner.is_some() && conf.group.is_some(), conf.multi_queue) {
            (true, false) => IFF_VNET_HDR,
            (true, true) => IFF_VNET_HDR | IFF_MULTI_QUEUE | IFF_NO_PI,
            (false, false) => IFF_NO_PI,
            (false, true) => IFF_NO_PI | IFF_MULTI_QUEUE,
        };
        let ipam_type = ctx.conf.ipam_type_if_any()?.map(str::to_string);
        Ok(Config {
            options: TapOptions { flags, owner: conf.owner, group: conf.group },
            mtu,
            mac,
            bridge,
            ipam_type,
            dns: ctx.conf.dns.clone().unwrap_or_default(),
        })
    }
}

fn add(ctx: &Context) -> Result<CniResult> {
    let conf = Config::load(ctx)?;
    let pod_ns = ctx.open_netns()?;
    let mut pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    let ifname = ctx.env.ifname.as_str();
    if pod.link_by_name(ifname).context("failed to look at the pod's links")?.is_some() {
        return Err(Error::internal(format!("an interface named {ifname:?} already exists in the pod")));
    }
    let bridge = match &conf.bridge {
        None => None,
        Some(name) => {
            let link = pod.link_by_name(name).context("failed to look up the bridge")?;
            match link {
                Some(l) if l.kind.as_deref() == Some("bridge") => Some(l),
                Some(_) => return Err(Error::config(format!("{name:?} in the pod is not a bridge"))),
                None => return Err(Error::config(format!("failed to get bridge {name}: Link not found"))),
            }
        }
    };
    if let Some(t) = &conf.ipam_type {
        ipam::find_plugin(t, &ctx.env.path)?;
    }
    let mut undo = Undo::default();
    let outcome = apply(ctx, &conf, &pod_ns, &mut pod, bridge.map(|b| b.index), &mut undo);
    if outcome.is_err() {
        undo.rollback();
    }
    outcome
}

fn apply<'a>(
    ctx: &'a Context,
    conf: &Config,
    pod_ns: &'a NetNs,
    pod: &mut Netlink,
    bridge: Option<u32>,
    undo: &mut Undo<'a>,
) -> Result<CniResult> {
    let ifname = ctx.env.ifname.as_str();
    let sandbox = ctx.netns()?.display().to_string();
    let mut result = CniResult::default();
    if conf.ipam_type.is_some() {
        let lease = ipam::add_undoable(ctx, undo)?;
        failpoint::hit("tap/after-ipam");
        result.ips = lease.ips.into_iter().map(|ip| IpConfig { interface: Some(0), ..ip }).collect();
        result.routes = lease.routes;
    }

    pod_ns
        .run(|| tuntap::create_tap(ifname, conf.options))
        .context("failed to enter the pod's netns")?
        .with_context(|| format!("failed to create tap {ifname:?}"))?;
    undo.push(format!("delete tap {ifname:?}"), move || {
        let mut nl = Netlink::in_netns(pod_ns).context("netlink")?;
        nl.delete_link_by_name(ifname).map(|_| ()).context("netlink")
    });
    failpoint::hit("tap/after-create");

    let link = pod.require_link(ifname).with_context(|| format!("failed to find tap {ifname:?}"))?;
    if let Some(mtu) = conf.mtu {
        pod.set_mtu(link.index, mtu).with_context(|| format!("failed to set the MTU of {ifname:?} to {mtu}"))?;
    }
    if let Some(mac) = conf.mac {
        let text = cnicore::mac::format(&mac);
        pod.set_mac(link.index, mac).with_context(|| format!("failed to set the MAC of {ifname:?} to {text}"))?;
    }
    if let Some(bridge) = bridge {
        pod.set_master(link.index, bridge)
            .with_context(|| format!("failed to set tap {ifname} as a port of bridge {:?}", conf.bridge))?;
    }
    if result.ips.is_empty() {
        pod.set_up(link.index).with_context(|| format!("failed to set {ifname:?} up"))?;
    } else {
        cnicore::iface::configure(pod_ns, pod, ifname, link.index, &result, false)?;
        failpoint::hit("tap/after-addresses");
    }
    let link = pod.require_link(ifname).with_context(|| format!("failed to find tap {ifname:?}"))?;
    let mac = link.mac.map(|m| cnicore::mac::format(&m)).unwrap_or_default();
    result.interfaces = vec![Interface { name: ifname.to_string(), mac, sandbox, ..Default::default() }];
    result.dns = conf.dns.clone();
    Ok(result)
}

fn del(ctx: &Context) -> Result<()> {
    let conf = ctx.load_for_teardown(Config::load)?;
    let mut errors = Errors::new();
    if conf.ipam_type.is_some() {
        errors.record(ipam::exec(ctx, Command::Del));
    }
    errors.record(delete_tap(ctx));
    errors.into_result()
}

/// Deletes the pod's tap `CNI_IFNAME`; nothing to do without the netns or the link. A link of that name that is
/// not a tun/tap device is not ours and stays.
fn delete_tap(ctx: &Context) -> Result<()> {
    let Some(pod_ns) = ctx.open_netns_if_exists()? else { return Ok(()) };
    let ifname = ctx.env.ifname.as_str();
    let mut pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    let Some(link) = pod.link_by_name(ifname).context("netlink")? else { return Ok(()) };
    if link.kind.as_deref() != Some("tun") {
        cnicore::warn!("{ifname:?} in the pod is not a tap; left in place");
        return Ok(());
    }
    match pod.delete_link(link.index) {
        Err(e) if cnicore::netlink::is_not_found(&e) => Ok(()),
        other => other.with_context(|| format!("failed to delete {ifname:?}")),
    }
}

fn check(ctx: &Context) -> Result<()> {
    let conf = Config::load(ctx)?;
    let pod_ns = ctx.open_netns()?;
    ipam::exec_if(conf.ipam_type.is_some(), ctx, Command::Check)?;
    let prev = ctx.prev_result()?.ok_or_else(|| Error::config("Required prevResult missing"))?;
    let mut pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    cnicore::check::pod_interface(ctx, &prev, &mut pod, Some("tun"))
}

/// Nothing of its own to collect; GC is passed on to IPAM, as the spec asks.
fn gc(ctx: &Context) -> Result<()> {
    ipam::exec_if(Config::load(ctx)?.ipam_type.is_some(), ctx, Command::Gc)
}

fn status(ctx: &Context) -> Result<()> {
    ipam::exec_if(Config::load(ctx)?.ipam_type.is_some(), ctx, Command::Status)
}

fn main() {
    plugin_main(
        concat!("CNI tap plugin (cnicore) v", env!("CARGO_PKG_VERSION")),
        &Verbs::new(add, del, check).gc(gc).status(status),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::codes;
    use serde_json::json;

    fn load(extra: serde_json::Value, cni_args: &str) -> Result<Config> {
        let mut conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "tap"});
        conf.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        Config::load(&Context::for_test(cnicore::spec::Command::Add, conf.to_string(), cni_args))
    }

    #[test]
    fn mac_precedence() {
        let conf = json!({"mac": "02:00:00:00:00:01"});
        assert_eq!(load(conf.clone(), "").unwrap().mac, Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(load(conf.clone(), "MAC=02:00:00:00:00:02").unwrap().mac, Some([2, 0, 0, 0, 0, 2]));
        let mut both = conf;
        both["runtimeConfig"] = json!({"mac": "02:00:00:00:00:03"});
        assert_eq!(load(both, "MAC=02:00:00:00:00:02").unwrap().mac, Some([2, 0, 0, 0, 0, 3]));
        assert!(load(json!({}), "FOO=1").unwrap_err().msg.contains("unknown args"));
    }

    #[test]
    fn flags_of_the_reference() {
        let flags = |c| load(c, "").unwrap().options.flags;
        assert_eq!(flags(json!({})), IFF_NO_PI);
        assert_eq!(flags(json!({"multiQueue": true})), IFF_NO_PI | IFF_MULTI_QUEUE);
        assert_eq!(flags(json!({"owner": 1000})), IFF_NO_PI);
        assert_eq!(flags(json!({"owner": 1000, "group": 100})), IFF_VNET_HDR);
        assert_eq!(
            flags(json!({"owner": 1000, "group": 100, "multiQueue": true})),
            IFF_VNET_HDR | IFF_MULTI_QUEUE | IFF_NO_PI
        );
    }

    #[test]
    fn refusals() {
        for (conf, needle) in [
            (json!({"mtu": 20}), "mtu"),
            (json!({"mtu": 70000}), "mtu"),
            (json!({"mac": "01:00:00:00:00:01"}), "multicast"),
            (json!({"bridge": "a/b"}), "bridge"),
            (json!({"owner": -1}), "owner"),
            (json!({"args": 3}), "args"),
        ] {
            let e = load(conf.clone(), "").unwrap_err();
            assert_eq!(e.code, codes::INVALID_CONFIG, "{conf}");
            assert!(e.msg.contains(needle), "{conf}: {}", e.msg);
        }
    }
}
