//! The one-shot commands: `status`, `cleanup`, and the hidden `acquire` (a client for tests).

use crate::backend;
use crate::cli::Cli;
use crate::dataplane::diff::{Change, DeviceChange};
use crate::dataplane::Dataplane;
use crate::error::{ConfigError, Error, Result};
use crate::family::Family;
use crate::flannel::SubnetKey;
use crate::log::{log, summary};
use crate::node;
use crate::plan::PeerPath;
use crate::source::NodeIdentity;

/// Own lease, each peer and how it is reached (or why it is refused), what differs; exit 3 when something does.
pub async fn status(cli: &Cli) -> Result<i32> {
    let (mut dataplane, identity) = cli.open_dataplane()?;
    let cluster = cli.source().current(&identity, cli.previous()).await?;
    let underlay = dataplane.underlay().map_err(|e| Error::netlink("finding the underlay", e))?;
    let lease = cluster.lease.map(|token| format!("lease {token}")).unwrap_or_else(|| "static".into());
    let addresses: Vec<String> =
        Family::ALL.iter().filter_map(|f| identity.public(*f)).map(|a| a.to_string()).collect();
    let networks: Vec<String> = cluster.config.networks().iter().map(|n| n.to_string()).collect();
    println!(
        "node {} on {}: subnet {} ({lease}), backend {}, network {}",
        addresses.join(" "),
        underlay.name,
        cluster.subnet,
        cluster.config.backend.type_name(),
        networks.join(" ")
    );
    let report = dataplane.reconcile(&cluster, true).map_err(|e| Error::netlink("reading the data plane", e))?;
    println!("peers: {} ({} refused)", cluster.peers.len(), report.refused().count());
    for (key, peer) in &cluster.peers {
        for subnet in key.subnets() {
            let family = Family::of(subnet.addr());
            let how = match report.paths.get(&subnet) {
                Some(PeerPath::Direct { gateway }) => format!("route via {gateway}"),
                Some(PeerPath::Overlay { endpoint, port, id }) => {
                    let port = port.map(|p| format!(" port {p}")).unwrap_or_default();
                    let id = id.map(|id| format!(" ({id})")).unwrap_or_default();
                    format!("{} to {endpoint}{port}{id}", cluster.config.backend.type_name())
                }
                Some(PeerPath::Refused(reason)) => format!("REFUSED: {reason}"),
                Some(PeerPath::Unrouted) => "not routed by fabricd (backend alloc)".to_string(),
                None => format!("not used ({family} is not enabled)"),
            };
            let node = peer.attrs.public(family).or(peer.attrs.node_address());
            let node = node.map(|a| a.to_string()).unwrap_or_else(|| "(no address)".into());
            println!("  {subnet} node {node}: {how}");
        }
    }
    let mut ours = 0;
    for family in Family::ALL {
        ours += dataplane
            .netlink()
            .routes(family, cnicore::netlink::RT_TABLE_MAIN)
            .map_err(|e| Error::netlink("reading the routes", e))?
            .into_iter()
            .filter(|r| r.protocol == Some(crate::underlay::ROUTE_PROTOCOL))
            .count();
    }
    println!("routes made by fabricd: {ours}");
    if report.changes.is_empty() {
        println!("in sync with the wanted state");
        Ok(0)
    } else {
        println!("differs from the wanted state ({}):", report.changes.len());
        for change in &report.changes {
            println!("  {change}");
        }
        Ok(3)
    }
}

/// Acquires (or finds) the lease of the node at --public-ip and prints it; touches nothing on the node.
pub async fn acquire(cli: &Cli) -> Result<i32> {
    if cli.public_ip.is_none() && cli.public_ipv6.is_none() {
        return Err(ConfigError::AcquireWithoutPublicIp.into());
    }
    let identity = NodeIdentity { public_ip: cli.public_ip, public_ipv6: cli.public_ipv6 };
    let (subnet, lease) = cli.source().acquire(&identity, cli.previous()).await?;
    println!("{subnet} {lease}");
    Ok(0)
}

/// Removes everything fabricd made on this node, and its lease; exit 1 when some part failed. Each step runs
/// whatever the others came to.
pub async fn cleanup(cli: &Cli) -> Result<i32> {
    let (mut dataplane, identity) = cli.open_dataplane()?;
    let (subnet, devices, left) = leave_cluster(cli, &identity).await;
    let removed = remove_data_plane(&mut dataplane, devices, subnet)?;
    let masq = match cnicore::firewall::node_masq::teardown() {
        Ok(()) => true,
        Err(e) => {
            log!(error, "{}", Error::cni("removing the masquerade", e));
            false
        }
    };
    let files = cli.files();
    let restored = restore_node(&files);
    let removed_files = remove_files(&files);
    Ok(if left && removed && masq && restored && removed_files { 0 } else { 1 })
}

/// Releases the node's lease; the node's subnet (the store's, else the one subnet.env remembers), the
/// config's devices, and whether the store answered.
async fn leave_cluster(cli: &Cli, identity: &NodeIdentity) -> (Option<SubnetKey>, Vec<String>, bool) {
    let source = cli.source();
    match source.current(identity, cli.previous()).await {
        Ok(cluster) => {
            let devices = Family::ALL.into_iter().filter_map(|f| cluster.config.backend.device_name(f)).collect();
            let released = match source.release(&cluster).await {
                Ok(true) => {
                    log!(info, "released the lease of {}", cluster.subnet);
                    true
                }
                Ok(false) => true,
                Err(e) => {
                    log!(error, "releasing the lease of {}: {e}", cluster.subnet);
                    false
                }
            };
            (Some(cluster.subnet), devices, released)
        }
        Err(e) => {
            log!(warn, "{e}: cleaning up the node only");
            (cli.previous().subnet, Vec::new(), false)
        }
    }
}

/// Removes fabricd's routes and devices (a device of ours under any backend's options: a vxlan device of any
/// VNI, of either family), and the bridge's gateway address in the node's subnet; false when the address could
/// not be removed.
fn remove_data_plane(dataplane: &mut Dataplane, mut devices: Vec<String>, subnet: Option<SubnetKey>) -> Result<bool> {
    let links = dataplane.netlink().links().map_err(|e| Error::netlink("listing links", e))?;
    for link in links {
        if backend::any_owns_link(&link.name, link.kind.as_deref()) && !devices.contains(&link.name) {
            devices.push(link.name);
        }
    }
    let mut removed = dataplane.cleanup(&devices).map_err(|e| Error::netlink("removing the data plane", e))?;
    // The bridge's gateway address in the node's subnet, given by the conflist fabricd wrote: left, it would
    // make the next pod on a new subnet fail ("cbr0 already has an IP address different from ...").
    let subnets = subnet.map(|s| s.subnets()).unwrap_or_default();
    let ok = match remove_gateway_addresses(dataplane, &subnets) {
        Ok(gone) => {
            removed.extend(gone);
            true
        }
        Err(e) => {
            log!(error, "{}", Error::netlink(format!("removing the addresses of {}", node::BRIDGE), e));
            false
        }
    };
    log!(info, "removed {} objects: {}", removed.len(), summary(&removed));
    Ok(ok)
}

/// Puts back the sysctls the agent changed and removes the nat tables it made; false on failure.
fn restore_node(files: &node::Files) -> bool {
    match node::restore(&files.node_record()) {
        Ok(restored) => {
            for change in restored {
                match change {
                    node::Changed::Sysctl { name, before } => log!(info, "put back {name}={before}"),
                    node::Changed::Table { family, name } => {
                        log!(info, "removed table {family} {name} (made for the masquerade, left empty)")
                    }
                }
            }
            true
        }
        Err(e) => {
            log!(error, "putting back what the agent changed on the node: {e}");
            false
        }
    }
}

/// Removes the conflist and subnet.env; false when one could not be removed.
fn remove_files(files: &node::Files) -> bool {
    let mut ok = true;
    for path in [files.conflist_path(), files.subnet_file.clone()] {
        match std::fs::remove_file(&path) {
            Ok(()) => log!(info, "removed {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                log!(error, "{}", Error::io(path.display().to_string(), e));
                ok = false;
            }
        }
    }
    ok
}

/// Removes the addresses inside `subnets` from the conflist's bridge (absent bridge: nothing to do).
fn remove_gateway_addresses(dataplane: &mut Dataplane, subnets: &[ipnet::IpNet]) -> std::io::Result<Vec<Change>> {
    let nl = dataplane.netlink();
    let Some(bridge) = nl.links()?.into_iter().find(|l| l.name == node::BRIDGE) else { return Ok(Vec::new()) };
    let mut removed = Vec::new();
    for address in nl.addresses(Some(bridge.index))? {
        if subnets.iter().any(|s| s.contains(&address.addr.addr())) {
            nl.del_address(bridge.index, address.addr)?;
            removed
                .push(Change::Device(DeviceChange::RemoveAddress { name: node::BRIDGE.into(), address: address.addr }));
        }
    }
    Ok(removed)
}
