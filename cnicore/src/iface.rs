//! The pod side of every interface plugin: addresses, routes and sysctls of the pod interface from an IPAM
//! result (the reference's `ipam.ConfigureIface`). bridge, ptp, macvlan, ipvlan, vlan, tap, dummy and
//! host-device all configure their pod interface through [`configure`].

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use crate::netlink::{is_exists, refusal, Netlink, Route as NlRoute, Scope};
use crate::netns::NetNs;
use crate::spec::{CniResult, Error, ErrorContext, Result};
use crate::sysctl;

/// Bound on IPv6 addresses leaving the tentative state (duplicate address detection when `enabledad` is set).
const DAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Configures pod interface `ifname` (link `index`) with the IPs and routes of `result`, from the node
/// through `nl`, a socket in `pod_ns`. Addresses go on before the link comes up so that `arp_notify`
/// announces them (a gratuitous ARP) as it does.
pub fn configure(
    pod_ns: &NetNs,
    nl: &mut Netlink,
    ifname: &str,
    index: u32,
    result: &CniResult,
    enable_dad: bool,
) -> Result<()> {
    let has_v4 = result.ips.iter().any(|ip| ip.address.addr().is_ipv4());
    let has_v6 = result.ips.iter().any(|ip| ip.address.addr().is_ipv6());
    pod_ns.run(|| set_pod_sysctls(ifname, has_v4, has_v6, enable_dad)).context("failed to enter the pod netns")??;

    // IPv6 addresses are not added with IFA_F_NODAD but with accept_dad 0 (unless enabledad), so that they
    // are tentative until the kernel has joined their solicited-node groups, which is then waited for below:
    // a NODAD address is usable at once, but neighbour solicitations for it are dropped until that happens.
    for ip in &result.ips {
        nl.add_address(index, ip.address)
            .with_context(|| format!("failed to add IP addr {} to {ifname:?}", ip.address))?;
    }
    // E.g. EADDRINUSE: a macvlan whose MAC another running macvlan of its master has.
    nl.set_up(index).map_err(|e| {
        Error::internal(format!("failed to set {ifname:?} up: the kernel refused it with {}", refusal::describe(&e)))
    })?;

    // Routes without a gateway go through the first gateway of their family, as the reference does.
    let first_gateway = |v4: bool| result.ips.iter().filter_map(|ip| ip.gateway).find(|gw| gw.is_ipv4() == v4);
    for route in &result.routes {
        let gateway: Option<IpAddr> = route.gw.or_else(|| first_gateway(route.dst.addr().is_ipv4()));
        let nl_route = NlRoute {
            dst: route.dst,
            gateway,
            oif: Some(index),
            scope: route.scope.map(Scope::from).unwrap_or_default(),
            table: route.table,
            priority: route.priority,
            mtu: route.mtu,
            advmss: route.advmss,
            src: None,
            onlink: false,
            protocol: None,
        };
        match nl.add_route(&nl_route) {
            Ok(()) => {}
            Err(e) if is_exists(&e) => {}
            Err(e) => {
                let via = gateway.map(|g| format!(" via {g}")).unwrap_or_default();
                return Err(Error::os(format!("failed to add route '{}{via} dev {ifname}'", route.dst), e));
            }
        }
    }
    if has_v6 {
        nl.wait_dad_settled(index, DAD_TIMEOUT).with_context(|| format!("IPv6 addresses of {ifname:?}"))?;
    }
    Ok(())
}

/// Runs inside the pod namespace.
fn set_pod_sysctls(ifname: &str, v4: bool, v6: bool, enable_dad: bool) -> Result<()> {
    if v6 {
        // An IPv6 address needs IPv6 enabled on the interface and on lo.
        for iface in ["lo", ifname] {
            let name = format!("net/ipv6/conf/{iface}/disable_ipv6");
            match sysctl::read(&name) {
                Ok(v) if v.trim() == "0" => {}
                Ok(_) => sysctl::write(&name, "0").with_context(|| format!("failed to enable IPv6 on {iface:?}"))?,
                Err(e) => crate::warn!("failed to read {name}: {e}"),
            }
        }
        if enable_dad {
            best_effort(&format!("net/ipv6/conf/{ifname}/enhanced_dad"), "1");
            best_effort(&format!("net/ipv6/conf/{ifname}/accept_dad"), "1");
        } else {
            best_effort(&format!("net/ipv6/conf/{ifname}/accept_dad"), "0");
        }
    }
    if v4 {
        best_effort(&format!("net/ipv4/conf/{ifname}/arp_notify"), "1");
    }
    Ok(())
}

fn best_effort(name: &str, value: &str) {
    if let Err(e) = sysctl::write(name, value) {
        if e.kind() != io::ErrorKind::NotFound {
            crate::warn!("sysctl {name}={value}: {e}");
        }
    }
}
