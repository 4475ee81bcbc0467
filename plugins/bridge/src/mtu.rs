//! MTU inference, as kubenet does it when no `mtu` is configured.
//!
//! The MTU is the smallest MTU among the node's links that are administratively up and are not:
//! loopback, point-to-point, a bridge, a bridge port (the pods' host veths), or an ifb device.
//! Without any such link it is 1500. A veth that is not a bridge port counts: a kind node's `eth0` is one,
//! and so is the uplink of a test node namespace. Tunnels such as vxlan count too, which is the point:
//! pods behind a 1450-byte overlay get 1450.

use std::collections::HashSet;

use cnicore::netlink::Link;

pub const DEFAULT_MTU: u32 = 1500;

/// The smallest MTU that fits every uplink of the node (see the module documentation).
pub fn infer(links: &[Link]) -> u32 {
    let bridges: HashSet<u32> = links.iter().filter(|l| is_kind(l, "bridge")).map(|l| l.index).collect();
    links
        .iter()
        .filter(|l| l.up && !l.loopback && !l.pointopoint)
        .filter(|l| !is_kind(l, "bridge") && !is_kind(l, "ifb"))
        .filter(|l| !l.master.is_some_and(|m| bridges.contains(&m)))
        .map(|l| l.mtu)
        .filter(|&mtu| mtu >= 68)
        .min()
        .unwrap_or(DEFAULT_MTU)
}

fn is_kind(link: &Link, kind: &str) -> bool {
    link.kind.as_deref() == Some(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, mtu: u32, kind: Option<&str>) -> Link {
        Link { index, name: format!("l{index}"), mtu, up: true, kind: kind.map(str::to_string), ..Link::default() }
    }

    #[test]
    fn smallest_uplink() {
        let lo = Link { loopback: true, ..link(1, 65536, None) };
        let eth0 = link(2, 9000, Some("veth"));
        let vxlan = link(3, 1450, Some("vxlan"));
        let bridge = link(4, 1000, Some("bridge"));
        let port = Link { master: Some(4), ..link(5, 900, Some("veth")) };
        let down = Link { up: false, ..link(6, 500, None) };
        let ptp = Link { pointopoint: true, ..link(7, 1280, Some("wireguard")) };
        let ifb = link(8, 600, Some("ifb"));
        let all = vec![lo.clone(), eth0.clone(), vxlan, bridge, port, down, ptp, ifb];
        assert_eq!(infer(&all), 1450);
        assert_eq!(infer(&[lo.clone(), eth0]), 9000);
        assert_eq!(infer(&[lo]), DEFAULT_MTU);
        assert_eq!(infer(&[]), DEFAULT_MTU);
    }
}
