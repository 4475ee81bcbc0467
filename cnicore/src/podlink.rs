//! The shared path of the plugins that give a pod one link of a kind the kernel makes on a parent ("master")
//! link, or on none: macvlan, ipvlan, vlan and dummy. ADD looks up the master (on the node, or in the pod with
//! `linkInContainer`), creates the link straight into the pod under `CNI_IFNAME`, then runs IPAM and configures
//! the interface, deleting the link and releasing the lease on failure. DEL releases the lease and deletes the
//! link if it is of the plugin's kind; CHECK compares the pod with `prevResult`
//! ([`crate::check::pod_link_of_kind`]).

use crate::netlink::kinds::{is_unsupported_kind, missing_support};
use crate::netlink::{
    is_exists, is_not_found, refusal, IpFamily, Link, LinkKind, MacvlanMode, Netlink, NewLink, RT_TABLE_MAIN,
};
use crate::netns::NetNs;
use crate::spec::{ipam, CniResult, Command, Context, Dns, Error, ErrorContext, Errors, Interface, Result};
use crate::{failpoint, sysctl};

/// Where the pod's addresses come from.
pub enum Addresses {
    /// None: a layer-2 link, only brought up.
    None,
    /// From the IPAM plugin of the config.
    Ipam,
    /// From `prevResult` (ipvlan chained after another plugin without an `ipam` section of its own).
    Given(CniResult),
}

/// One pod link to add.
pub struct Attachment<'a> {
    pub ctx: &'a Context,
    pub link: NewLink,
    /// The master is a link of the pod's namespace, not the node's (`linkInContainer`).
    pub in_container: bool,
    pub addresses: Addresses,
    /// `dns` of the config, which replaces IPAM's in the result (as the reference does).
    pub dns: Option<Dns>,
}

/// The sockets of an ADD: in the node's namespace and in the pod's.
pub struct Sockets {
    pub pod_ns: NetNs,
    pub node: Netlink,
    pub pod: Netlink,
}

impl Sockets {
    pub fn open(ctx: &Context) -> Result<Sockets> {
        let pod_ns = ctx.open_netns()?;
        let node = Netlink::new().context("failed to open netlink in the node namespace")?;
        let pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod namespace")?;
        Ok(Sockets { pod_ns, node, pod })
    }

    /// The socket of the namespace the master lives in.
    pub fn master_side(&mut self, in_container: bool) -> &mut Netlink {
        if in_container {
            &mut self.pod
        } else {
            &mut self.node
        }
    }
}

/// The interface of the first default route of `nl`'s namespace (IPv4 first, then IPv6), as the reference
/// picks a `master` that is not configured.
pub fn default_route_interface(nl: &mut Netlink) -> Result<String> {
    for family in [IpFamily::V4, IpFamily::V6] {
        let routes = nl.routes(family, RT_TABLE_MAIN).context("failed to list routes")?;
        if let Some(oif) = routes.iter().filter(|r| r.dst.prefix_len() == 0).find_map(|r| r.oif) {
            let link = nl.link_by_index(oif).context("failed to look up the default route's interface")?;
            if let Some(link) = link {
                return Ok(link.name);
            }
        }
    }
    Err(Error::internal("no default route interface found"))
}

/// The master link called `name`.
pub fn lookup_master(nl: &mut Netlink, name: &str) -> Result<Link> {
    nl.link_by_name(name)
        .with_context(|| format!("failed to lookup master {name:?}"))?
        .ok_or_else(|| Error::internal(format!("failed to lookup master {name:?}: Link not found")))
}

/// Refuses an `mtu` above the master's, as the reference does ("invalid MTU 9000, must be [0, master MTU(1500)]").
pub fn check_mtu(mtu: Option<u32>, master: &Link) -> Result<()> {
    match mtu {
        Some(mtu) if mtu > master.mtu => {
            Err(Error::config(format!("invalid MTU {mtu}, must be [0, master MTU({})]", master.mtu)))
        }
        _ => Ok(()),
    }
}

/// ADD of one attachment: the link in the pod, then its addresses. On failure nothing is left: the link is
/// deleted and the lease released.
pub fn add(attachment: Attachment, sockets: &mut Sockets) -> Result<CniResult> {
    let ctx = attachment.ctx;
    let ifname = ctx.env.ifname.as_str();
    if sockets.pod.link_by_name(ifname).context("failed to look at the pod's links")?.is_some() {
        return Err(already_in_pod(ctx));
    }
    if matches!(attachment.addresses, Addresses::Ipam) {
        // A missing IPAM plugin is known before anything is touched.
        ipam::find_plugin(ctx.conf.ipam_type()?, &ctx.env.path)?;
    }
    let pod_link = create(&attachment, sockets)?;
    failpoint::hit(&format!("{}/after-link", attachment.link.kind.name()));
    let mut leased = false;
    let outcome = configure(&attachment, sockets, &pod_link, &mut leased);
    if outcome.is_err() {
        if leased {
            crate::spec::report_rollback("release the IPAM lease", ipam::exec(ctx, Command::Del));
        }
        let deleted =
            sockets.pod.delete_link(pod_link.index).or_else(|e| if is_not_found(&e) { Ok(()) } else { Err(e) });
        crate::spec::report_rollback(format!("delete {ifname:?}"), deleted.context("netlink"));
    }
    outcome
}

fn already_in_pod(ctx: &Context) -> Error {
    let netns = ctx.env.netns.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
    Error::internal(format!("an interface named {:?} already exists in netns {netns:?}", ctx.env.ifname))
}

/// Creates the link directly in the pod under its final name (the kernel checks names in the namespace the
/// link is created in, so a node link of the same name is no obstacle).
fn create(attachment: &Attachment, sockets: &mut Sockets) -> Result<Link> {
    let ctx = attachment.ctx;
    let ifname = ctx.env.ifname.as_str();
    let kind = &attachment.link.kind;
    let created = if attachment.in_container || attachment.link.parent.is_none() {
        sockets.pod.create_kind(ifname, &attachment.link, None)
    } else {
        let Sockets { node, pod_ns, .. } = sockets;
        node.create_kind(ifname, &attachment.link, Some(pod_ns))
    };
    match created {
        Ok(()) => {}
        // EOPNOTSUPP is also a master refusing the kind (loopback carries no VLANs): the kernel's reason tells.
        Err(e) if is_unsupported_kind(&e) && refusal::reason().is_none_or(|r| r == UNKNOWN_KIND) => {
            return Err(Error::internal(missing_support(kind))
                .with_details(format!("creating a {} link answered: {e}", kind.name())))
        }
        // EEXIST for a vlan is its VLAN ID taken on the master; for the others a pod link of the same name made
        // since the look above.
        Err(e) if is_exists(&e) && !matches!(kind, LinkKind::Vlan { .. }) => return Err(already_in_pod(ctx)),
        Err(e) => return Err(refused(attachment, sockets, &e)),
    }
    sockets
        .pod
        .require_link(ifname)
        .with_context(|| format!("failed to find the new {} {ifname:?} in the pod", kind.name()))
}

/// The extended ACK message of a kernel that does not know the link kind asked for.
const UNKNOWN_KIND: &str = "Unknown device type";

/// The error for a link the kernel refused to create: the kind, its master, the kernel's errno and reason,
/// and what the refusal means where it is known.
fn refused(attachment: &Attachment, sockets: &mut Sockets, e: &std::io::Error) -> Error {
    let kind = &attachment.link.kind;
    let described = refusal::describe(e);
    let Some(parent) = attachment.link.parent else {
        return Error::internal(format!("failed to create {}: the kernel refused it with {described}", kind.name()));
    };
    let master = match sockets.master_side(attachment.in_container).link_by_index(parent) {
        Ok(Some(link)) => link.name,
        _ => format!("#{parent}"),
    };
    let hint = match (kind, e.raw_os_error()) {
        (LinkKind::Macvlan { .. } | LinkKind::Ipvlan { .. }, Some(libc::EBUSY)) => format!(
            "; {master:?} is taken by links of another kind or is a bridge or bond port (a master carries either \
             macvlan or ipvlan links)"
        ),
        (LinkKind::Vlan { id }, Some(libc::EEXIST)) => format!("; {master:?} already has a link for VLAN {id}"),
        (LinkKind::Macvlan { mode: MacvlanMode::Passthru, .. }, Some(libc::EINVAL)) => {
            format!("; a passthru macvlan must be the only macvlan of {master:?}")
        }
        _ => String::new(),
    };
    Error::internal(format!(
        "failed to create {} on {master:?}: the kernel refused it with {described}{hint}",
        kind.name()
    ))
}

/// Addresses and routes from IPAM or `prevResult`, or just the link up; the result.
fn configure(attachment: &Attachment, sockets: &mut Sockets, link: &Link, leased: &mut bool) -> Result<CniResult> {
    let ctx = attachment.ctx;
    let ifname = ctx.env.ifname.as_str();
    let interface = Interface {
        name: ifname.to_string(),
        mac: link.mac.map(|m| crate::mac::format(&m)).unwrap_or_default(),
        sandbox: ctx.netns()?.display().to_string(),
        ..Default::default()
    };
    let given = match &attachment.addresses {
        Addresses::None => None,
        Addresses::Ipam => {
            let lease = ipam::add(ctx)?;
            *leased = true;
            failpoint::hit(&format!("{}/after-ipam", attachment.link.kind.name()));
            Some(lease)
        }
        Addresses::Given(prev) => Some(prev.clone()),
    };
    let mut result = CniResult { interfaces: vec![interface], ..Default::default() };
    match given {
        None => sockets.pod.set_up(link.index).with_context(|| format!("failed to set {ifname:?} up"))?,
        Some(lease) => {
            if lease.ips.is_empty() {
                return Err(Error::internal("IPAM plugin returned missing IP config"));
            }
            result.ips = lease.ips;
            result.routes = lease.routes;
            for ip in &mut result.ips {
                ip.interface = Some(0);
            }
            if result.ips.iter().any(|ip| ip.address.addr().is_ipv6()) {
                // Unsolicited neighbour advertisements on link-up, as the reference turns on.
                let key = format!("net/ipv6/conf/{ifname}/ndisc_notify");
                let _ = sockets.pod_ns.run(|| sysctl::write(&key, "1"));
            }
            crate::iface::configure(&sockets.pod_ns, &mut sockets.pod, ifname, link.index, &result, false)?;
        }
    }
    result.dns = attachment.dns.clone().unwrap_or_default();
    Ok(result)
}

/// DEL: the lease (if `ipam`), then the pod's `CNI_IFNAME` if it is a link of `kind`. A missing netns or link
/// is no error; a link of another kind under that name is left alone.
pub fn del(ctx: &Context, kind: &str, ipam: bool) -> Result<()> {
    let mut errors = Errors::new();
    // Both mostly wait (IPAM is a process, a link deletion waits for the kernel): at the same time, unless the
    // IPAM plugin needs the link to release (dhcp), which `ipam::teardown` knows.
    let link: ipam::TeardownStep = Box::new(|| delete_pod_link(ctx, kind));
    for outcome in ipam::teardown(ctx, ipam, Some(link), Vec::new()) {
        errors.record(outcome);
    }
    errors.into_result()
}

fn delete_pod_link(ctx: &Context, kind: &str) -> Result<()> {
    let Some(pod_ns) = ctx.open_netns_if_exists()? else { return Ok(()) };
    let ifname = ctx.env.ifname.as_str();
    let mut pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod namespace")?;
    let Some(link) = pod.link_by_name(ifname).with_context(|| format!("failed to look up {ifname:?}"))? else {
        return Ok(());
    };
    if link.kind.as_deref() != Some(kind) {
        crate::warn!("{ifname:?} in the pod is not a {kind} link; leaving it alone");
        return Ok(());
    }
    delete_link(&mut pod, link.index, ifname)
}

/// Deletes the pod's link `index` (`ifname`, for the error); a link already gone counts as deleted, as DEL
/// wants.
pub fn delete_link(pod: &mut Netlink, index: u32, ifname: &str) -> Result<()> {
    match pod.delete_link(index) {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(Error::os(format!("failed to delete {ifname:?}"), e)),
    }
}

/// True when an IPAM plugin is configured. An absent or empty `ipam` section means a layer-2 attachment, as
/// in the reference; a section with settings but no (valid) `type` is a mistake and an error.
pub fn ipam_configured(ctx: &Context) -> Result<bool> {
    match &ctx.conf.ipam {
        None | Some(serde_json::Value::Null) => Ok(false),
        Some(serde_json::Value::Object(o)) if o.is_empty() => Ok(false),
        Some(serde_json::Value::Object(_)) => ctx.conf.ipam_type().map(|_| true),
        Some(_) => Err(Error::config("ipam must be an object")),
    }
}

/// A free-looking host veth name as the reference makes them: `veth` and 8 random hex digits.
pub fn random_veth_name() -> Result<String> {
    let mut bytes = [0u8; 4];
    // SAFETY: the buffer is valid for its length; getrandom(2) writes at most that many bytes.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(Error::os("failed to generate a random veth name", std::io::Error::last_os_error()));
    }
    Ok(format!("veth{:02x}{:02x}{:02x}{:02x}", bytes[0], bytes[1], bytes[2], bytes[3]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::codes;
    use serde_json::json;

    fn ctx(conf: serde_json::Value) -> Context {
        Context::for_test(Command::Add, serde_json::to_vec(&conf).unwrap(), "")
    }

    #[test]
    fn ipam_section_as_the_reference_reads_it() {
        let base = json!({"cniVersion": "1.1.0", "name": "n", "type": "macvlan"});
        assert!(!ipam_configured(&ctx(base.clone())).unwrap());
        let with = |ipam: serde_json::Value| {
            let mut conf = base.clone();
            conf["ipam"] = ipam;
            ipam_configured(&ctx(conf))
        };
        assert!(!with(json!({})).unwrap());
        assert!(!with(serde_json::Value::Null).unwrap());
        assert!(with(json!({"type": "host-local"})).unwrap());
        assert_eq!(with(json!({"subnet": "10.0.0.0/24"})).unwrap_err().code, codes::INVALID_CONFIG);
        assert_eq!(with(json!("host-local")).unwrap_err().code, codes::INVALID_CONFIG);
    }

    #[test]
    fn mtu_at_most_the_masters() {
        let master = Link { index: 2, name: "eth0".into(), mtu: 1500, up: true, ..Link::default() };
        assert!(check_mtu(None, &master).is_ok() && check_mtu(Some(1500), &master).is_ok());
        let e = check_mtu(Some(9000), &master).unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (codes::INVALID_CONFIG, "invalid MTU 9000, must be [0, master MTU(1500)]")
        );
    }

    #[test]
    fn veth_names_look_like_the_references() {
        let name = random_veth_name().unwrap();
        assert_eq!(name.len(), 12);
        assert!(name.starts_with("veth") && name[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
    }
}
