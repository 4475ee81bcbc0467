//! flannel's `subnet.env`, written by the node agent (fabricd, flanneld) and read by the `flannel` CNI plugin.
//!
//! flanneld writes (`WriteSubnetFile`), in this order, the lines of each family it runs and then the common ones:
//! `FLANNEL_NETWORK` and `FLANNEL_SUBNET` (IPv4), `FLANNEL_IPV6_NETWORK` and `FLANNEL_IPV6_SUBNET` (IPv6),
//! `FLANNEL_MTU`, `FLANNEL_IPMASQ`. A subnet is written as the node's first address with the subnet's length
//! (`10.244.3.1/24`, `fd00:1::1/64`); an IPv6-only node's file has no IPv4 line at all. The plugin reads a
//! network line as a comma-separated list. fabricd adds `FABRIC_LEASE` (the etcd lease holding the subnet, so
//! that a node whose address changed recognises its own lease); readers ignore what they do not know.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::spec::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubnetEnv {
    /// `FLANNEL_NETWORK`: the IPv4 cluster networks.
    pub networks: Vec<Ipv4Net>,
    /// `FLANNEL_SUBNET`: the node's IPv4 subnet as written (first address and length, e.g. 10.244.3.1/24).
    pub subnet: Option<Ipv4Net>,
    /// `FLANNEL_IPV6_NETWORK`: the IPv6 cluster networks.
    pub ipv6_networks: Vec<Ipv6Net>,
    /// `FLANNEL_IPV6_SUBNET`: the node's IPv6 subnet as written (first address and length, e.g. fd00:1::1/64).
    pub ipv6_subnet: Option<Ipv6Net>,
    pub mtu: Option<u32>,
    pub ipmasq: Option<bool>,
    pub lease: Option<i64>,
}

/// The prefix type of one family.
trait Prefix: Sized {
    const FAMILY: &'static str;
    fn of(net: IpNet) -> Option<Self>;
}

impl Prefix for Ipv4Net {
    const FAMILY: &'static str = "IPv4";
    fn of(net: IpNet) -> Option<Self> {
        if let IpNet::V4(net) = net {
            Some(net)
        } else {
            None
        }
    }
}

impl Prefix for Ipv6Net {
    const FAMILY: &'static str = "IPv6";
    fn of(net: IpNet) -> Option<Self> {
        if let IpNet::V6(net) = net {
            Some(net)
        } else {
            None
        }
    }
}

fn bad_value(key: &str, value: &str, why: impl std::fmt::Display) -> Error {
    Error::config(format!("{key}: {:?}: {why}", crate::spec::truncate_for_msg(value)))
}

/// A prefix of the family `key` is for.
fn prefix<P: Prefix>(key: &str, value: &str) -> Result<P> {
    let net: IpNet = value.parse().map_err(|e| bad_value(key, value, e))?;
    P::of(net).ok_or_else(|| bad_value(key, value, format!("not an {} prefix", P::FAMILY)))
}

fn prefixes<P: Prefix>(key: &str, value: &str) -> Result<Vec<P>> {
    value.split(',').map(str::trim).filter(|v| !v.is_empty()).map(|v| prefix(key, v)).collect()
}

fn list<P: std::fmt::Display>(nets: &[P]) -> String {
    nets.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")
}

/// A subnet as flanneld writes it: its first address, with the subnet's length.
fn first_v4(subnet: Ipv4Net) -> Ipv4Net {
    let first = Ipv4Addr::from(u32::from(subnet.network()).wrapping_add(1));
    Ipv4Net::new(first, subnet.prefix_len()).expect("the length of a valid prefix")
}

fn first_v6(subnet: Ipv6Net) -> Ipv6Net {
    let first = Ipv6Addr::from(u128::from(subnet.network()).wrapping_add(1));
    Ipv6Net::new(first, subnet.prefix_len()).expect("the length of a valid prefix")
}

impl SubnetEnv {
    /// A file with only the common lines; add each family the node runs with [`SubnetEnv::with_v4`] and
    /// [`SubnetEnv::with_v6`].
    pub fn new(mtu: u32, ipmasq: bool, lease: Option<i64>) -> SubnetEnv {
        SubnetEnv { mtu: Some(mtu), ipmasq: Some(ipmasq), lease, ..SubnetEnv::default() }
    }

    /// The IPv4 lines: `subnet` is the node's subnet (written as its first address).
    pub fn with_v4(mut self, network: Ipv4Net, subnet: Ipv4Net) -> SubnetEnv {
        self.networks = vec![network];
        self.subnet = Some(first_v4(subnet));
        self
    }

    /// The IPv6 lines: `subnet` is the node's subnet (written as its first address).
    pub fn with_v6(mut self, network: Ipv6Net, subnet: Ipv6Net) -> SubnetEnv {
        self.ipv6_networks = vec![network];
        self.ipv6_subnet = Some(first_v6(subnet));
        self
    }

    /// The file for an IPv4 node.
    pub fn v4(network: Ipv4Net, subnet: Ipv4Net, mtu: u32, ipmasq: bool, lease: Option<i64>) -> SubnetEnv {
        SubnetEnv::new(mtu, ipmasq, lease).with_v4(network, subnet)
    }

    /// The file as flanneld writes it (its order, `%t` for the bool), then `FABRIC_LEASE` in hex.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if !self.networks.is_empty() {
            text.push_str(&format!("FLANNEL_NETWORK={}\n", list(&self.networks)));
        }
        if let Some(subnet) = self.subnet {
            text.push_str(&format!("FLANNEL_SUBNET={subnet}\n"));
        }
        if !self.ipv6_networks.is_empty() {
            text.push_str(&format!("FLANNEL_IPV6_NETWORK={}\n", list(&self.ipv6_networks)));
        }
        if let Some(subnet) = self.ipv6_subnet {
            text.push_str(&format!("FLANNEL_IPV6_SUBNET={subnet}\n"));
        }
        if let Some(mtu) = self.mtu {
            text.push_str(&format!("FLANNEL_MTU={mtu}\n"));
        }
        if let Some(ipmasq) = self.ipmasq {
            text.push_str(&format!("FLANNEL_IPMASQ={ipmasq}\n"));
        }
        if let Some(lease) = self.lease {
            text.push_str(&format!("FABRIC_LEASE={lease:x}\n"));
        }
        text
    }

    /// Reads the variables: a malformed value of a known one, or a prefix of the other family, is an invalid
    /// config error naming the variable; unknown lines are ignored; a repeated variable keeps its last value.
    pub fn parse(text: &str) -> Result<SubnetEnv> {
        let mut env = SubnetEnv::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else { continue };
            match key {
                "FLANNEL_NETWORK" => env.networks = prefixes(key, value)?,
                "FLANNEL_SUBNET" => env.subnet = Some(prefix(key, value)?),
                "FLANNEL_IPV6_NETWORK" => env.ipv6_networks = prefixes(key, value)?,
                "FLANNEL_IPV6_SUBNET" => env.ipv6_subnet = Some(prefix(key, value)?),
                // As flannel's ParseUint: decimal digits only, no sign.
                "FLANNEL_MTU" => {
                    if !value.bytes().all(|b| b.is_ascii_digit()) {
                        return Err(bad_value(key, value, "not a decimal number"));
                    }
                    env.mtu = Some(value.parse().map_err(|e| bad_value(key, value, e))?)
                }
                // As flannel: anything but "true" is false.
                "FLANNEL_IPMASQ" => env.ipmasq = Some(value == "true"),
                "FABRIC_LEASE" => env.lease = i64::from_str_radix(value, 16).ok(),
                _ => {}
            }
        }
        Ok(env)
    }

    /// What a CNI plugin needs and the file lacks (flannel's list), empty when complete.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.networks.is_empty() && self.ipv6_networks.is_empty() {
            missing.extend(["FLANNEL_NETWORK", "FLANNEL_IPV6_NETWORK"]);
        }
        if self.subnet.is_none() && self.ipv6_subnet.is_none() {
            missing.extend(["FLANNEL_SUBNET", "FLANNEL_IPV6_SUBNET"]);
        }
        if self.mtu.is_none() {
            missing.push("FLANNEL_MTU");
        }
        if self.ipmasq.is_none() {
            missing.push("FLANNEL_IPMASQ");
        }
        missing
    }

    /// Each family the file names is whole: its subnet and its networks together, the subnet inside one of
    /// them (what flanneld always writes; anything else would give pods routes that miss their own subnet).
    pub fn check_families(&self) -> Result<()> {
        fn check<P: Copy + std::fmt::Display>(
            (network_key, networks): (&str, &[P]),
            (subnet_key, subnet): (&str, Option<P>),
            contains: impl Fn(&P, &P) -> bool,
        ) -> Result<()> {
            match (networks.is_empty(), subnet) {
                (true, None) => Ok(()),
                (true, Some(subnet)) => Err(Error::config(format!("{subnet_key}={subnet} without {network_key}"))),
                (false, None) => Err(Error::config(format!("{network_key}={} without {subnet_key}", list(networks)))),
                (false, Some(subnet)) if networks.iter().any(|n| contains(n, &subnet)) => Ok(()),
                (false, Some(subnet)) => {
                    Err(Error::config(format!("{subnet_key}={subnet} is not inside {network_key}={}", list(networks))))
                }
            }
        }
        check(("FLANNEL_NETWORK", &self.networks), ("FLANNEL_SUBNET", self.subnet), |n, s| n.contains(s))?;
        check(("FLANNEL_IPV6_NETWORK", &self.ipv6_networks), ("FLANNEL_IPV6_SUBNET", self.ipv6_subnet), |n, s| {
            n.contains(s)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::codes;

    fn v4(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn v6(s: &str) -> Ipv6Net {
        s.parse().unwrap()
    }

    // The files below are byte for byte what flanneld's WriteSubnetFile writes for these leases (its format
    // strings: "FLANNEL_NETWORK=%s\nFLANNEL_SUBNET=%s\n", "FLANNEL_IPV6_NETWORK=%s\nFLANNEL_IPV6_SUBNET=%s\n",
    // "FLANNEL_MTU=%d\nFLANNEL_IPMASQ=%t\n", each subnet incremented to its first address).
    const FLANNELD_V4: &str =
        "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.3.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
    const FLANNELD_DUAL: &str = "FLANNEL_NETWORK=10.42.0.0/16\nFLANNEL_SUBNET=10.42.0.1/24\nFLANNEL_IPV6_NETWORK=2001:cafe:42::/56\nFLANNEL_IPV6_SUBNET=2001:cafe:42::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
    const FLANNELD_V6: &str =
        "FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:11::1/64\nFLANNEL_MTU=1430\nFLANNEL_IPMASQ=false\n";

    #[test]
    fn renders_what_flanneld_writes_and_reads_it_back() {
        let ipv4 = SubnetEnv::v4(v4("10.244.0.0/16"), v4("10.244.3.0/24"), 1450, true, None);
        assert_eq!(ipv4.render(), FLANNELD_V4);
        let dual = SubnetEnv::new(1450, true, None)
            .with_v4(v4("10.42.0.0/16"), v4("10.42.0.0/24"))
            .with_v6(v6("2001:cafe:42::/56"), v6("2001:cafe:42::/64"));
        assert_eq!(dual.render(), FLANNELD_DUAL);
        let ipv6 = SubnetEnv::new(1430, false, None).with_v6(v6("fc00::/48"), v6("fc00:0:0:11::/64"));
        assert_eq!(ipv6.render(), FLANNELD_V6);
        for (text, env) in [(FLANNELD_V4, &ipv4), (FLANNELD_DUAL, &dual), (FLANNELD_V6, &ipv6)] {
            let parsed = SubnetEnv::parse(text).unwrap();
            assert_eq!(&parsed, env, "{text}");
            assert!(parsed.missing().is_empty(), "{text}");
            parsed.check_families().unwrap();
        }
        assert_eq!(ipv6.subnet, None);
        assert!(ipv6.networks.is_empty());
        assert_eq!(ipv6.ipv6_subnet, Some(v6("fc00:0:0:11::1/64")));
    }

    #[test]
    fn fabricd_lease_round_trips() {
        let env = SubnetEnv::v4(v4("10.244.0.0/16"), v4("10.244.3.0/24"), 1450, true, Some(0x1234));
        let text = env.render();
        assert_eq!(text, format!("{FLANNELD_V4}FABRIC_LEASE=1234\n"));
        assert_eq!(SubnetEnv::parse(&text).unwrap(), env);
        // A lease id that is not hex is not fabricd's: ignored, the rest read.
        assert_eq!(SubnetEnv::parse("FABRIC_LEASE=zz\nFLANNEL_MTU=1\n").unwrap().lease, None);
    }

    #[test]
    fn reads_as_flannels_plugin_reads() {
        let env = SubnetEnv::parse(
            "FLANNEL_NETWORK=10.1.0.0/16,10.2.0.0/16\r\nFLANNEL_IPV6_SUBNET=fd00:1::1/64\nFLANNEL_IPMASQ=yes\nOTHER=1\nnoise\n",
        )
        .unwrap();
        assert_eq!(env.networks, vec![v4("10.1.0.0/16"), v4("10.2.0.0/16")]);
        assert_eq!(env.ipmasq, Some(false), "anything but true is false");
        assert_eq!(env.missing(), vec!["FLANNEL_MTU"]);
        assert_eq!(SubnetEnv::default().missing().len(), 6);
        let later = SubnetEnv::parse("FLANNEL_MTU=1400\nFLANNEL_MTU=1300\n").unwrap();
        assert_eq!(later.mtu, Some(1300));
    }

    #[test]
    fn malformed_values_are_invalid_config_naming_the_variable() {
        for (text, says) in [
            ("FLANNEL_MTU=big\n", "FLANNEL_MTU: \"big\""),
            ("FLANNEL_MTU=+5\n", "FLANNEL_MTU: \"+5\""),
            ("FLANNEL_MTU=4294967296\n", "FLANNEL_MTU"),
            ("FLANNEL_SUBNET=10.1.1.300/24\n", "FLANNEL_SUBNET: \"10.1.1.300/24\""),
            ("FLANNEL_SUBNET=fd00::1/64\n", "FLANNEL_SUBNET: \"fd00::1/64\": not an IPv4 prefix"),
            ("FLANNEL_NETWORK=10.1.0.0/16,fd00::/48\n", "FLANNEL_NETWORK: \"fd00::/48\": not an IPv4 prefix"),
            ("FLANNEL_IPV6_NETWORK=fd00::/48,10.1.0.0/16\n", "FLANNEL_IPV6_NETWORK: \"10.1.0.0/16\": not an IPv6"),
            ("FLANNEL_IPV6_SUBNET=10.1.1.1/24\n", "FLANNEL_IPV6_SUBNET: \"10.1.1.1/24\": not an IPv6 prefix"),
            ("FLANNEL_IPV6_SUBNET=fd00::g/64\n", "FLANNEL_IPV6_SUBNET: \"fd00::g/64\""),
            ("FLANNEL_IPV6_SUBNET=fd00::1/129\n", "FLANNEL_IPV6_SUBNET"),
            ("FLANNEL_IPV6_SUBNET=fd00::1\n", "FLANNEL_IPV6_SUBNET"),
        ] {
            let e = SubnetEnv::parse(text).unwrap_err();
            assert_eq!(e.code, codes::INVALID_CONFIG, "{text}");
            assert!(e.msg.starts_with(says), "{text}: {}", e.msg);
        }
    }

    #[test]
    fn each_family_must_be_whole_and_coherent() {
        let base = "FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
        for (lines, says) in [
            ("FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.2.0.1/24\n", "FLANNEL_SUBNET=10.2.0.1/24 is not inside"),
            ("FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.0.0.1/8\n", "FLANNEL_SUBNET=10.0.0.1/8 is not inside"),
            (
                "FLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_IPV6_SUBNET=fd67::1/64\n",
                "FLANNEL_IPV6_SUBNET=fd67::1/64 is not inside FLANNEL_IPV6_NETWORK=fd66::/56",
            ),
            (
                "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_IPV6_SUBNET=fd66::1/64\n",
                "FLANNEL_NETWORK=10.1.0.0/16 without FLANNEL_SUBNET",
            ),
            (
                "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.0.1/24\nFLANNEL_IPV6_SUBNET=fd66::1/64\n",
                "FLANNEL_IPV6_SUBNET=fd66::1/64 without FLANNEL_IPV6_NETWORK",
            ),
        ] {
            let env = SubnetEnv::parse(&format!("{lines}{base}")).unwrap();
            assert!(env.missing().is_empty(), "{lines}");
            let e = env.check_families().unwrap_err();
            assert_eq!(e.code, codes::INVALID_CONFIG, "{lines}");
            assert!(e.msg.contains(says), "{lines}: {}", e.msg);
        }
        // Several networks: the subnet lies in one of them.
        let env =
            SubnetEnv::parse(&format!("FLANNEL_NETWORK=10.1.0.0/16,10.2.0.0/16\nFLANNEL_SUBNET=10.2.7.1/24\n{base}"))
                .unwrap();
        env.check_families().unwrap();
    }
}
