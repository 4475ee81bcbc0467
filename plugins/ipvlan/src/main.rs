//! The ipvlan plugin: the pod gets an ipvlan link (mode l2, l3 or l3s) on `master`: configured, else the single
//! interface of `prevResult` when chained, else the node's default-route interface. Its addresses come from
//! IPAM, or from `prevResult` when chained without an `ipam` section. The shared path of the link plugins is
//! `cnicore::podlink`; a kernel without ipvlan gets an error naming CONFIG_IPVLAN, the node unchanged.

use cnicore::netlink::{IpvlanMode, KindData, LinkKind};
use cnicore::podlink::{self, Addresses, Master, MasterLink};
use cnicore::spec::{ipam, plugin_main, validate_ifname, CniResult, Command, Context, Dns, Error, Plugin, Result};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    #[serde(default)]
    master: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    mtu: Option<i64>,
    #[serde(default)]
    link_in_container: bool,
}

#[derive(Debug)]
struct Config {
    master: Option<String>,
    mode: IpvlanMode,
    mtu: Option<u32>,
    in_container: bool,
    layer3: bool,
    dns: Option<Dns>,
}

fn mode_from_str(mode: &str) -> Result<IpvlanMode> {
    match mode {
        "" | "l2" => Ok(IpvlanMode::L2),
        "l3" => Ok(IpvlanMode::L3),
        "l3s" => Ok(IpvlanMode::L3s),
        other => Err(Error::config(format!("unknown ipvlan mode: {:?}", cnicore::spec::truncate_for_msg(other)))),
    }
}

impl Config {
    fn load(ctx: &Context) -> Result<Config> {
        let raw: RawConf = ctx.parse_conf()?;
        let master = raw.master.filter(|m| !m.is_empty());
        if let Some(master) = &master {
            validate_ifname(master).map_err(|e| Error::config(format!("invalid master: {}", e.msg)))?;
        }
        let mtu = match raw.mtu {
            None | Some(0) => None,
            Some(m) if (68..=65535).contains(&m) => Some(m as u32),
            Some(m) => return Err(Error::config(format!("invalid MTU {m}: must be between 68 and 65535"))),
        };
        Ok(Config {
            master,
            mode: mode_from_str(raw.mode.as_deref().unwrap_or(""))?,
            mtu,
            in_container: raw.link_in_container,
            layer3: podlink::ipam_configured(ctx)?,
            dns: ctx.conf.dns.clone(),
        })
    }

    /// What podlink needs of the link. The MTU is bounded by the master's, as macvlan's: the kernel accepts an
    /// ipvlan above it on 6.1 (seen in the VM lane), and packets above the master's MTU are then lost; the
    /// reference does not check.
    fn master_link(&self, master: Option<Master>) -> MasterLink {
        MasterLink {
            kind: "ipvlan",
            master,
            in_container: self.in_container,
            mtu: self.mtu,
            mtu_at_most_master: true,
            layer3: self.layer3,
            dns: self.dns.clone(),
        }
    }
}

struct Ipvlan;

impl Plugin for Ipvlan {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let conf = Config::load(ctx)?;
        let prev = ctx.prev_result()?;
        // Chained without IPAM: the addresses the previous plugin got.
        let addresses = match &prev {
            Some(prev) if !conf.layer3 && !prev.ips.is_empty() => Addresses::Given(prev.clone()),
            _ if conf.layer3 => Addresses::Ipam,
            _ => return Err(Error::config("ipvlan needs an ipam section, or a prevResult with IPs")),
        };
        let master = match (&conf.master, &prev) {
            (Some(master), _) => Master::Named(master.clone()),
            (None, None) => Master::DefaultRoute,
            (None, Some(prev)) => match prev.interfaces.as_slice() {
                [only] if !only.name.is_empty() => Master::Named(only.name.clone()),
                _ => return Err(Error::config("chained master failure. PrevResult lacks a single named interface")),
            },
        };
        conf.master_link(Some(master)).add(ctx, LinkKind::Ipvlan { mode: conf.mode }, None, addresses)
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        let conf = ctx.load_for_teardown(Config::load)?;
        podlink::del(ctx, "ipvlan", conf.layer3)
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let conf = Config::load(ctx)?;
        // The master is looked at only when configured (chained, it is the previous plugin's interface).
        let master = conf.master.clone().map(Master::Named);
        conf.master_link(master).check(ctx, "Required prevResult missing", |data| match data {
            KindData::Ipvlan { mode } if *mode == conf.mode => Ok(()),
            KindData::Ipvlan { mode } => {
                Err(cnicore::check::mode_mismatch("ipvlan", &mode.to_string(), &conf.mode.to_string()))
            }
            _ => Err(cnicore::check::not_of_kind(&ctx.env.ifname, "ipvlan")),
        })?;
        Ok(())
    }

    /// The reference has no GC; ours hands it to IPAM.
    fn gc(&self, ctx: &Context) -> Result<()> {
        ipam::exec_if(Config::load(ctx)?.layer3, ctx, Command::Gc)
    }

    fn status(&self, ctx: &Context) -> Result<()> {
        ipam::exec_if(Config::load(ctx)?.layer3, ctx, Command::Status)
    }
}

fn main() {
    plugin_main("CNI ipvlan plugin (cni-plugins-rs)", &Ipvlan)
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
        json!({"cniVersion":"1.1.0","name":"n","type":"ipvlan","master":"eth0","ipam":{"type":"host-local"}})
    }

    #[test]
    fn modes() {
        assert_eq!(load(base()).unwrap().mode, IpvlanMode::L2);
        for (name, mode) in [("l2", IpvlanMode::L2), ("l3", IpvlanMode::L3), ("l3s", IpvlanMode::L3s)] {
            let mut c = base();
            c["mode"] = name.into();
            assert_eq!(load(c).unwrap().mode, mode);
        }
    }

    #[test]
    fn bad_inputs_are_config_errors() {
        for (key, value) in [
            ("mode", json!("bridge")),
            ("mode", json!(1)),
            ("master", json!("a b")),
            ("mtu", json!(-5)),
            ("mtu", json!(1 << 20)),
            ("ipam", json!({"subnet": "10.0.0.0/24"})),
        ] {
            let mut c = base();
            c[key] = value;
            let e = load(c.clone()).unwrap_err();
            assert!([codes::INVALID_CONFIG, codes::DECODE].contains(&e.code), "{c}: {e:?}");
        }
    }
}
