//! The shared path of the plugins that give a pod one link of a kind the kernel makes on a parent ("master")
//! link, or on none: macvlan, ipvlan, vlan and dummy. ADD looks up the master (on the node, or in the pod with
//! `linkInContainer`), creates the link straight into the pod under `CNI_IFNAME`, then runs IPAM and configures
//! the interface, deleting the link and releasing the lease on failure. DEL releases the lease and deletes the
//! link if it is of the plugin's kind; CHECK compares the pod with `prevResult`
//! ([`crate::check::pod_link_of_kind`]).
//!
//! bridge and ptp share the veth pair's pieces: [`create_veth`] (the pod end made in the pod under its final
//! name), [`find_pod_veth`] for DEL, [`require_free_name`] and [`random_veth_name`].

use std::io;

use ipnet::IpNet;

use crate::ip::is_global_unicast;
use crate::netlink::kinds::{is_unsupported_kind, missing_support};
use crate::netlink::{
    is_exists, is_not_found, refusal, IpFamily, KindData, Link, LinkKind, MacvlanMode, Netlink, NewLink, RT_TABLE_MAIN,
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
    for family in IpFamily::ALL {
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

/// Where a master-link plugin's master is.
pub enum Master {
    /// The configured name (or, for ipvlan chained without one, the single interface of `prevResult`).
    Named(String),
    /// The interface of the default route where the master lives, as the reference picks it.
    DefaultRoute,
}

/// What a master-link plugin (macvlan, ipvlan, vlan) says about its pod link; the verbs' bodies are
/// [`MasterLink::add`], [`del`] and [`MasterLink::check`]. Each plugin only parses its config, names the kind
/// with its options ([`NewLink`]'s kind) and tells its own options apart at CHECK.
pub struct MasterLink {
    /// The kind as netlink names it (`macvlan`): what DEL deletes and CHECK expects.
    pub kind: &'static str,
    /// The master; `None` (ipvlan's CHECK without a configured master): not looked at.
    pub master: Option<Master>,
    /// The master is a link of the pod's namespace, not the node's (`linkInContainer`).
    pub in_container: bool,
    pub mtu: Option<u32>,
    /// The MTU may not exceed the master's (macvlan, ipvlan, vlan: [`check_mtu`]).
    pub mtu_at_most_master: bool,
    /// An IPAM plugin is configured ([`ipam_configured`]).
    pub layer3: bool,
    /// `dns` of the config, which replaces IPAM's in the result.
    pub dns: Option<Dns>,
}

impl MasterLink {
    fn master_name(&self, sockets: &mut Sockets) -> Result<Option<String>> {
        match &self.master {
            None => Ok(None),
            Some(Master::Named(name)) => Ok(Some(name.clone())),
            Some(Master::DefaultRoute) => default_route_interface(sockets.master_side(self.in_container)).map(Some),
        }
    }

    /// ADD: the master looked up (its MTU the bound of ours where the kind has it), then a link of `kind` on
    /// it with `mac`, made in the pod ([`add`]).
    pub fn add(&self, ctx: &Context, kind: LinkKind, mac: Option<[u8; 6]>, addresses: Addresses) -> Result<CniResult> {
        let mut sockets = Sockets::open(ctx)?;
        let name = match self.master_name(&mut sockets)? {
            Some(name) => name,
            None => default_route_interface(sockets.master_side(self.in_container))?,
        };
        let master = lookup_master(sockets.master_side(self.in_container), &name)?;
        if self.mtu_at_most_master {
            check_mtu(self.mtu, &master)?;
        }
        if let LinkKind::Ipvlan { mode } = kind {
            let pod_netns = sockets.pod_ns.path().to_path_buf();
            let master_side = sockets.master_side(self.in_container);
            crate::ipvlan_port::require_mode(mode, &master, master_side, &pod_netns, !self.in_container)?;
        }
        let attachment = Attachment {
            ctx,
            link: NewLink { kind, parent: Some(master.index), mtu: self.mtu, mac },
            in_container: self.in_container,
            addresses,
            dns: self.dns.clone(),
        };
        add(attachment, &mut sockets)
    }

    /// CHECK: IPAM's CHECK, the master still there, and the pod link as `prevResult` has it, of the plugin's
    /// kind, its own options judged by `expected` ([`crate::check::pod_link_of_kind`]); `no_prev_result` is the
    /// plugin's message for a CHECK without `prevResult`. The pod link, for the plugin's further checks.
    pub fn check(
        &self,
        ctx: &Context,
        no_prev_result: &str,
        expected: impl FnOnce(&KindData) -> Result<()>,
    ) -> Result<Link> {
        let mut sockets = Sockets::open(ctx)?;
        let master = self.master_name(&mut sockets)?;
        ipam::exec_if(self.layer3, ctx, Command::Check)?;
        let prev = ctx.prev_result()?.ok_or_else(|| Error::config(no_prev_result))?;
        if let Some(master) = master {
            lookup_master(sockets.master_side(self.in_container), &master)?;
        }
        crate::check::pod_link_of_kind(ctx, &prev, self.kind, expected)
    }
}

/// ADD of one attachment: the link in the pod, then its addresses. On failure nothing is left: the link is
/// deleted and the lease released.
pub fn add(attachment: Attachment, sockets: &mut Sockets) -> Result<CniResult> {
    let ctx = attachment.ctx;
    let ifname = ctx.env.ifname.as_str();
    require_free_name(&mut sockets.pod, ctx)?;
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

/// The error of an ADD that finds `CNI_IFNAME` taken in the pod.
pub fn already_in_pod(ctx: &Context) -> Error {
    let netns = ctx.env.netns.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
    Error::internal(format!("an interface named {:?} already exists in netns {netns:?}", ctx.env.ifname))
}

/// Refuses an ADD whose `CNI_IFNAME` is taken in the pod, before anything is made.
pub fn require_free_name(pod: &mut Netlink, ctx: &Context) -> Result<()> {
    if pod.link_by_name(&ctx.env.ifname).context("failed to look at the pod's links")?.is_some() {
        return Err(already_in_pod(ctx));
    }
    Ok(())
}

/// Creates the link directly in the pod under its final name: one request where the reference makes it under a
/// temporary name and renames it.
///
/// Kernels before 6.15 (Debian's 6.1 and 6.12 among them) look the name of a link created from the node into
/// another namespace up in the node's namespace, so a node link of that name (the node's own `eth0`, on most
/// nodes) makes the kernel answer EEXIST although the pod has none: then the link is made under a temporary name
/// and renamed in the pod, as the reference always does. Newer kernels look in the pod, and take the first path.
fn create(attachment: &Attachment, sockets: &mut Sockets) -> Result<Link> {
    let ctx = attachment.ctx;
    let ifname = ctx.env.ifname.as_str();
    let kind = &attachment.link.kind;
    let from_node = !attachment.in_container && attachment.link.parent.is_some();
    let created = create_named(attachment, sockets, ifname, from_node);
    match created {
        Ok(()) => {}
        Err(e) if is_exists(&e) && from_node => {
            require_free_name(&mut sockets.pod, ctx)?;
            return create_renamed(attachment, sockets);
        }
        Err(e) => return Err(create_error(attachment, sockets, &e)),
    }
    sockets
        .pod
        .require_link(ifname)
        .with_context(|| format!("failed to find the new {} {ifname:?} in the pod", kind.name()))
}

/// One creation request for the attachment's link named `name`, sent from the node into the pod (`from_node`)
/// or in the pod.
fn create_named(attachment: &Attachment, sockets: &mut Sockets, name: &str, from_node: bool) -> std::io::Result<()> {
    if from_node {
        let Sockets { node, pod_ns, .. } = sockets;
        node.create_kind(name, &attachment.link, Some(pod_ns))
    } else {
        sockets.pod.create_kind(name, &attachment.link, None)
    }
}

/// The CNI error for a creation the kernel refused. EOPNOTSUPP is also a master refusing the kind (loopback
/// carries no VLANs): the kernel's reason tells. EEXIST for a vlan is its VLAN ID taken on the master; for the
/// others a pod link of the same name made since the look before.
fn create_error(attachment: &Attachment, sockets: &mut Sockets, e: &std::io::Error) -> Error {
    let kind = &attachment.link.kind;
    if is_unsupported_kind(e) && refusal::reason().is_none_or(|r| r == UNKNOWN_KIND) {
        Error::internal(missing_support(kind)).with_details(format!("creating a {} link answered: {e}", kind.name()))
    } else if is_exists(e) && !matches!(kind, LinkKind::Vlan { .. }) {
        already_in_pod(attachment.ctx)
    } else {
        refused(attachment, sockets, e)
    }
}

/// The older kernels' path of [`create`]: the link made in the pod under a random temporary name, then renamed
/// (it is still down, as a rename needs); deleted again if the rename fails.
fn create_renamed(attachment: &Attachment, sockets: &mut Sockets) -> Result<Link> {
    let ifname = attachment.ctx.env.ifname.as_str();
    let kind = attachment.link.kind.name();
    let temporary = random_veth_name()?;
    if let Err(e) = create_named(attachment, sockets, &temporary, true) {
        return Err(create_error(attachment, sockets, &e));
    }
    let link = sockets
        .pod
        .require_link(&temporary)
        .with_context(|| format!("failed to find the new {kind} {temporary:?} in the pod"))?;
    if let Err(e) = sockets.pod.rename(link.index, ifname) {
        let deleted = sockets.pod.delete_link(link.index).context("netlink");
        crate::spec::report_rollback(format!("delete {temporary:?}"), deleted);
        return Err(if is_exists(&e) {
            already_in_pod(attachment.ctx)
        } else {
            Error::os(format!("failed to rename the new {kind} {temporary:?} to {ifname:?}"), e)
        });
    }
    sockets.pod.require_link(ifname).with_context(|| format!("failed to find the new {kind} {ifname:?} in the pod"))
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

/// Attempts at a free random host veth name.
const VETH_NAME_ATTEMPTS: usize = 10;

/// The veth pair of bridge and ptp (as the reference's `ip.SetupVeth`): `CNI_IFNAME` created directly in the
/// pod (with `pod_mac` when given), `veth<random>` on the node; returns the host end.
pub fn create_veth(
    node: &mut Netlink,
    pod: &mut Netlink,
    pod_ns: &NetNs,
    ctx: &Context,
    mtu: Option<u32>,
    pod_mac: Option<[u8; 6]>,
) -> Result<Link> {
    let ifname = ctx.env.ifname.as_str();
    for _ in 0..VETH_NAME_ATTEMPTS {
        let name = random_veth_name()?;
        match node.create_veth(&name, ifname, pod_ns, mtu, pod_mac) {
            Ok(host) => return Ok(host),
            // Either the pod's name is taken (a concurrent ADD?) or, rarely, the random host name.
            Err(e) if is_exists(&e) => require_free_name(pod, ctx)?,
            Err(e) => return Err(Error::os("failed to make veth pair", e)),
        }
    }
    Err(Error::internal("failed to find a unique veth name"))
}

/// The pod end of one of our veth pairs (bridge, ptp), with the global unicast addresses it has: what DEL
/// deletes and releases.
pub struct PodVeth {
    netlink: Netlink,
    index: u32,
    pub addresses: Vec<IpNet>,
}

impl PodVeth {
    /// Deletes the pod end, which deletes the host end, its addresses and host routes with it.
    pub fn delete(mut self, ifname: &str) -> Result<()> {
        delete_link(&mut self.netlink, self.index, ifname)
    }
}

/// DEL's look at the pod: its `CNI_IFNAME` if the netns and the link are still there and the link is the pod
/// end of one of our veth pairs (its peer a veth in the node namespace whose own peer it is); anything else
/// under that name is not ours to delete. A netns path that no longer exists, or a file that is no longer a
/// namespace (left behind after the namespace was unmounted), means the pod's network is gone.
pub fn find_pod_veth(ctx: &Context) -> Result<Option<PodVeth>> {
    let Some(path) = &ctx.env.netns else { return Ok(None) };
    let pod_ns = match NetNs::open(path) {
        Ok(pod_ns) => pod_ns,
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::InvalidInput) => return Ok(None),
        Err(e) => return Err(Error::os(format!("failed to open netns {:?}", path.display().to_string()), e)),
    };
    let ifname = ctx.env.ifname.as_str();
    let mut pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod namespace")?;
    let Some(link) = pod.link_by_name(ifname).with_context(|| format!("failed to look up {ifname:?}"))? else {
        return Ok(None);
    };
    if link.kind.as_deref() != Some("veth") || !peer_is_on_node(link.index, link.peer_index) {
        crate::warn!("{ifname:?} in the pod is not a veth connected to this node; leaving it alone");
        return Ok(None);
    }
    let addresses =
        pod.addresses(Some(link.index)).with_context(|| format!("failed to get IP addresses of {ifname:?}"))?;
    let addresses = addresses.into_iter().map(|a| a.addr).filter(|a| is_global_unicast(a.addr())).collect();
    Ok(Some(PodVeth { netlink: pod, index: link.index, addresses }))
}

/// True if the veth peer `peer_index` is, in the node namespace, a veth whose own peer is `pod_index`.
fn peer_is_on_node(pod_index: u32, peer_index: Option<u32>) -> bool {
    let Some(peer_index) = peer_index else { return false };
    let Ok(mut node) = Netlink::new() else { return false };
    match node.link_by_index(peer_index) {
        Ok(Some(peer)) => peer.kind.as_deref() == Some("veth") && peer.peer_index == Some(pod_index),
        _ => false,
    }
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
