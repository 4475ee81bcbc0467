//! The vlan plugin: the pod gets an 802.1Q link with `vlanId` on the node's `master` (or the pod's, with
//! `linkInContainer`), MTU at most the master's, addresses from IPAM. The shared path of the link plugins is
//! `cnicore::podlink`; a kernel without 8021q gets an error naming CONFIG_VLAN_8021Q, the node unchanged.

use cnicore::netlink::{KindData, LinkKind};
use cnicore::podlink::{self, Addresses, Master, MasterLink};
use cnicore::spec::{ipam, plugin_main, validate_ifname, CniResult, Command, Context, Dns, Error, Plugin, Result};
use serde::Deserialize;

/// 802.1Q VLAN IDs (0 is accepted, as by the reference: priority tagging).
const VLAN_MAX: i64 = 4094;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    #[serde(default)]
    master: Option<String>,
    #[serde(default, rename = "vlanId")]
    vlan_id: Option<i64>,
    #[serde(default)]
    mtu: Option<i64>,
    #[serde(default)]
    link_in_container: bool,
}

#[derive(Debug)]
struct Config {
    master: String,
    vlan_id: u16,
    mtu: Option<u32>,
    in_container: bool,
    dns: Option<Dns>,
}

impl Config {
    fn load(ctx: &Context) -> Result<Config> {
        let raw: RawConf = ctx.parse_conf()?;
        let master = raw.master.filter(|m| !m.is_empty()).ok_or_else(|| {
            Error::config("\"master\" field is required. It specifies the host interface name to create the VLAN for")
        })?;
        validate_ifname(&master).map_err(|e| Error::config(format!("invalid master: {}", e.msg)))?;
        let vlan_id = match raw.vlan_id.unwrap_or(0) {
            id @ 0..=VLAN_MAX => id as u16,
            id => return Err(Error::config(format!("invalid VLAN ID {id} (must be between 0 and 4094 inclusive)"))),
        };
        let mtu = match raw.mtu {
            None | Some(0) => None,
            Some(m) if (68..=65535).contains(&m) => Some(m as u32),
            Some(m) => return Err(Error::config(format!("invalid MTU {m}, must be [0, master MTU] and at least 68"))),
        };
        if !podlink::ipam_configured(ctx)? {
            return Err(Error::config("vlan needs an ipam section with a type"));
        }
        Ok(Config { master, vlan_id, mtu, in_container: raw.link_in_container, dns: ctx.conf.dns.clone() })
    }

    /// What podlink needs of the link: on the configured master, its MTU at most the master's, with IPAM.
    fn master_link(&self) -> MasterLink {
        MasterLink {
            kind: "vlan",
            master: Some(Master::Named(self.master.clone())),
            in_container: self.in_container,
            mtu: self.mtu,
            mtu_at_most_master: true,
            layer3: true,
            dns: self.dns.clone(),
        }
    }
}

struct Vlan;

impl Plugin for Vlan {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let conf = Config::load(ctx)?;
        conf.master_link().add(ctx, LinkKind::Vlan { id: conf.vlan_id }, None, Addresses::Ipam)
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        ctx.load_for_teardown(Config::load)?;
        podlink::del(ctx, "vlan", true)
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let conf = Config::load(ctx)?;
        let ifname = ctx.env.ifname.as_str();
        let link = conf.master_link().check(ctx, "vlan: Required prevResult missing", |data| match data {
            KindData::Vlan { id } if *id == conf.vlan_id => Ok(()),
            KindData::Vlan { id } => Err(Error::internal(format!(
                "Error: container interface {ifname} has vlan id {id}, expected {}",
                conf.vlan_id
            ))),
            _ => Err(cnicore::check::not_of_kind(ifname, "vlan")),
        })?;
        match conf.mtu {
            Some(mtu) if mtu != link.mtu => Err(Error::internal(format!(
                "Error: configured MTU of {ifname} is {mtu}, current value is {}",
                link.mtu
            ))),
            _ => Ok(()),
        }
    }

    /// The reference has no GC; ours hands it to IPAM.
    fn gc(&self, ctx: &Context) -> Result<()> {
        Config::load(ctx)?;
        ipam::exec(ctx, Command::Gc)
    }

    fn status(&self, ctx: &Context) -> Result<()> {
        Config::load(ctx)?;
        ipam::exec(ctx, Command::Status)
    }
}

fn main() {
    plugin_main("CNI vlan plugin (cni-plugins-rs)", &Vlan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::codes;
    use serde_json::{json, Value};

    fn load(conf: Value) -> Result<Config> {
        Config::load(&Context::for_test(Command::Add, serde_json::to_vec(&conf).unwrap(), ""))
    }

    fn base() -> Value {
        json!({"cniVersion":"1.1.0","name":"n","type":"vlan","master":"eth0","vlanId":100,"ipam":{"type":"host-local"}})
    }

    #[test]
    fn config() {
        let c = load(base()).unwrap();
        assert_eq!((c.master.as_str(), c.vlan_id, c.mtu), ("eth0", 100, None));
        let mut zero = base();
        zero.as_object_mut().unwrap().remove("vlanId");
        assert_eq!(load(zero).unwrap().vlan_id, 0);
    }

    #[test]
    fn bad_inputs_are_config_errors() {
        let mut no_master = base();
        no_master.as_object_mut().unwrap().remove("master");
        let mut no_ipam = base();
        no_ipam.as_object_mut().unwrap().remove("ipam");
        let mut cases = vec![no_master, no_ipam];
        for (key, value) in [
            ("vlanId", json!(4095)),
            ("vlanId", json!(-1)),
            ("vlanId", json!("100")),
            ("master", json!("x/y")),
            ("mtu", json!(-1)),
        ] {
            let mut c = base();
            c[key] = value;
            cases.push(c);
        }
        for c in cases {
            let e = load(c.clone()).unwrap_err();
            assert!([codes::INVALID_CONFIG, codes::DECODE].contains(&e.code), "{c}: {e:?}");
        }
    }
}
