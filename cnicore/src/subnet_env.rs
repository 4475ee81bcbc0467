//! flannel's `subnet.env`, written by the node agent (fabricd, flanneld) and read by the `flannel` CNI plugin:
//! `FLANNEL_NETWORK` (one network, or several comma-separated), `FLANNEL_SUBNET` (the node's first address
//! with the subnet's length), `FLANNEL_IPV6_NETWORK`, `FLANNEL_IPV6_SUBNET`, `FLANNEL_MTU`, `FLANNEL_IPMASQ`.
//! fabricd adds `FABRIC_LEASE` (the etcd lease holding the subnet, so that a node whose address changed
//! recognises its own lease); readers ignore what they do not know.

use ipnet::{IpNet, Ipv4Net};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubnetEnv {
    pub networks: Vec<IpNet>,
    /// The node's subnet as written (first address and length, e.g. 10.244.3.1/24).
    pub subnet: Option<IpNet>,
    pub ipv6_networks: Vec<IpNet>,
    pub ipv6_subnet: Option<IpNet>,
    pub mtu: Option<u32>,
    pub ipmasq: Option<bool>,
    pub lease: Option<i64>,
}

fn nets(value: &str) -> Result<Vec<IpNet>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| v.parse().map_err(|e| format!("{v:?}: {e}")))
        .collect()
}

impl SubnetEnv {
    /// The file for an IPv4 node: `subnet` is the node's subnet (written as its first address).
    pub fn v4(network: Ipv4Net, subnet: Ipv4Net, mtu: u32, ipmasq: bool, lease: Option<i64>) -> SubnetEnv {
        let first = std::net::Ipv4Addr::from(u32::from(subnet.network()) + 1);
        SubnetEnv {
            networks: vec![IpNet::V4(network)],
            subnet: Some(IpNet::V4(Ipv4Net::new(first, subnet.prefix_len()).expect("valid length"))),
            mtu: Some(mtu),
            ipmasq: Some(ipmasq),
            lease,
            ..SubnetEnv::default()
        }
    }

    pub fn render(&self) -> String {
        let list = |nets: &[IpNet]| nets.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",");
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

    /// Reads the variables; a malformed value of a known one is an error, unknown lines are ignored.
    pub fn parse(text: &str) -> Result<SubnetEnv, String> {
        let mut env = SubnetEnv::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else { continue };
            let bad = |e: String| format!("{key}: {e}");
            match key {
                "FLANNEL_NETWORK" => env.networks = nets(value).map_err(bad)?,
                "FLANNEL_SUBNET" => env.subnet = Some(value.parse().map_err(|e| bad(format!("{value:?}: {e}")))?),
                "FLANNEL_IPV6_NETWORK" => env.ipv6_networks = nets(value).map_err(bad)?,
                "FLANNEL_IPV6_SUBNET" => {
                    env.ipv6_subnet = Some(value.parse().map_err(|e| bad(format!("{value:?}: {e}")))?)
                }
                "FLANNEL_MTU" => env.mtu = Some(value.parse().map_err(|e| bad(format!("{value:?}: {e}")))?),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_flannel_reading() {
        let env =
            SubnetEnv::v4("10.244.0.0/16".parse().unwrap(), "10.244.3.0/24".parse().unwrap(), 1450, true, Some(0x1234));
        let text = env.render();
        assert_eq!(text, "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.3.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\nFABRIC_LEASE=1234\n");
        assert_eq!(SubnetEnv::parse(&text).unwrap(), env);
        assert!(env.missing().is_empty());
        let dual = SubnetEnv::parse(
            "FLANNEL_NETWORK=10.1.0.0/16,10.2.0.0/16\nFLANNEL_IPV6_SUBNET=fd00:1::1/64\nFLANNEL_IPMASQ=yes\nOTHER=1\n",
        )
        .unwrap();
        assert_eq!(dual.networks.len(), 2);
        assert_eq!(dual.ipmasq, Some(false));
        assert_eq!(dual.missing(), vec!["FLANNEL_MTU"]);
        assert!(SubnetEnv::parse("FLANNEL_MTU=big\n").unwrap_err().contains("FLANNEL_MTU"));
        assert_eq!(SubnetEnv::default().missing().len(), 6);
    }
}
