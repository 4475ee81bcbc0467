//! The macvlan plugin: the pod gets a macvlan link on a node interface (`master`, by default the interface of
//! the node's default route), in mode bridge, private, vepa or passthru, with its addresses from IPAM (or none:
//! a layer-2 link). The shared path of the link plugins is `cnicore::podlink`.

use cnicore::netlink::{KindData, LinkKind, MacvlanMode};
use cnicore::podlink::{self, Addresses, Master, MasterLink};
use cnicore::spec::{ipam, plugin_main, validate_ifname, CniResult, Command, Context, Dns, Error, Plugin, Result};
use serde::Deserialize;
use serde_json::Value;

/// The config as written (the reference's field names).
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
    mac: Option<String>,
    #[serde(default)]
    link_in_container: bool,
    #[serde(default, rename = "bcqueuelen")]
    bc_queue_len: Option<u32>,
}

/// The validated config; nothing on the node has been looked at yet.
#[derive(Debug)]
struct Config {
    /// None: the interface of the default route, found at ADD/CHECK.
    master: Option<String>,
    mode: MacvlanMode,
    mtu: Option<u32>,
    mac: Option<[u8; 6]>,
    in_container: bool,
    bc_queue_len: Option<u32>,
    layer3: bool,
    dns: Option<Dns>,
}

fn mode_from_str(mode: &str) -> Result<MacvlanMode> {
    match mode {
        "" | "bridge" => Ok(MacvlanMode::Bridge),
        "private" => Ok(MacvlanMode::Private),
        "vepa" => Ok(MacvlanMode::Vepa),
        "passthru" => Ok(MacvlanMode::Passthru),
        other => Err(Error::config(format!("unknown macvlan mode: {:?}", cnicore::spec::truncate_for_msg(other)))),
    }
}

fn mode_name(mode: MacvlanMode) -> String {
    match mode {
        MacvlanMode::Bridge => "bridge".into(),
        MacvlanMode::Private => "private".into(),
        MacvlanMode::Vepa => "vepa".into(),
        MacvlanMode::Passthru => "passthru".into(),
        MacvlanMode::Other(m) => format!("mode {m}"),
    }
}

impl Config {
    fn load(ctx: &Context) -> Result<Config> {
        let raw: RawConf = ctx.parse_conf()?;
        ctx.env.args.check_known(&["MAC"])?;
        let master = raw.master.filter(|m| !m.is_empty());
        if let Some(master) = &master {
            validate_ifname(master).map_err(|e| Error::config(format!("invalid master: {}", e.msg)))?;
        }
        let mtu = match raw.mtu {
            None | Some(0) => None,
            Some(m) if (68..=65535).contains(&m) => Some(m as u32),
            Some(m) => return Err(Error::config(format!("invalid MTU {m}, must be [0, master MTU] and at least 68"))),
        };
        // By precedence: runtimeConfig.mac, CNI_ARGS MAC, the config's mac.
        let runtime_mac = match ctx.conf.runtime("mac") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(Error::config("runtimeConfig.mac must be a string")),
        };
        let env_mac = ctx.env.args.get("MAC").map(str::to_string);
        let mac = [runtime_mac, env_mac, raw.mac]
            .into_iter()
            .flatten()
            .find(|m| !m.is_empty())
            .map(|m| cnicore::mac::parse(&m))
            .transpose()?;
        Ok(Config {
            master,
            mode: mode_from_str(raw.mode.as_deref().unwrap_or(""))?,
            mtu,
            mac,
            in_container: raw.link_in_container,
            bc_queue_len: raw.bc_queue_len.filter(|&n| n > 0),
            layer3: podlink::ipam_configured(ctx)?,
            dns: ctx.conf.dns.clone(),
        })
    }

    /// What podlink needs of the link: on the configured master or the default route's interface, its MTU at
    /// most the master's.
    fn master_link(&self) -> MasterLink {
        MasterLink {
            kind: "macvlan",
            master: Some(self.master.clone().map_or(Master::DefaultRoute, Master::Named)),
            in_container: self.in_container,
            mtu: self.mtu,
            mtu_at_most_master: true,
            layer3: self.layer3,
            dns: self.dns.clone(),
        }
    }
}

struct Macvlan;

impl Plugin for Macvlan {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let conf = Config::load(ctx)?;
        let kind = LinkKind::Macvlan { mode: conf.mode, bc_queue_len: conf.bc_queue_len };
        let addresses = if conf.layer3 { Addresses::Ipam } else { Addresses::None };
        conf.master_link().add(ctx, kind, conf.mac, addresses)
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        let conf = ctx.load_for_teardown(Config::load)?;
        podlink::del(ctx, "macvlan", conf.layer3)
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let conf = Config::load(ctx)?;
        conf.master_link().check(ctx, "required prevResult missing", |data| match data {
            KindData::Macvlan { mode } if *mode == conf.mode => Ok(()),
            KindData::Macvlan { mode } => {
                Err(cnicore::check::mode_mismatch("macvlan", &mode_name(*mode), &mode_name(conf.mode)))
            }
            _ => Err(cnicore::check::not_of_kind(&ctx.env.ifname, "macvlan")),
        })?;
        Ok(())
    }

    /// The reference has no GC; ours hands it to IPAM so that leases of vanished attachments are freed.
    fn gc(&self, ctx: &Context) -> Result<()> {
        ipam::exec_if(Config::load(ctx)?.layer3, ctx, Command::Gc)
    }

    fn status(&self, ctx: &Context) -> Result<()> {
        ipam::exec_if(Config::load(ctx)?.layer3, ctx, Command::Status)
    }
}

fn main() {
    plugin_main("CNI macvlan plugin (cni-plugins-rs)", &Macvlan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::codes;
    use serde_json::json;

    fn load(conf: Value, args: &str) -> Result<Config> {
        Config::load(&Context::for_test(Command::Add, serde_json::to_vec(&conf).unwrap(), args))
    }

    fn base() -> Value {
        json!({"cniVersion":"1.1.0","name":"n","type":"macvlan","master":"eth0","ipam":{"type":"host-local"}})
    }

    fn with(key: &str, value: Value) -> Value {
        let mut conf = base();
        conf[key] = value;
        conf
    }

    #[test]
    fn defaults_and_modes() {
        let c = load(base(), "").unwrap();
        assert_eq!((c.mode, c.mtu, c.mac, c.layer3, c.in_container), (MacvlanMode::Bridge, None, None, true, false));
        for (name, mode) in
            [("private", MacvlanMode::Private), ("vepa", MacvlanMode::Vepa), ("passthru", MacvlanMode::Passthru)]
        {
            assert_eq!(load(with("mode", name.into()), "").unwrap().mode, mode);
        }
        let mut l2 = base();
        l2.as_object_mut().unwrap().remove("master");
        l2.as_object_mut().unwrap().remove("ipam");
        let c = load(l2, "").unwrap();
        assert!(c.master.is_none() && !c.layer3);
    }

    #[test]
    fn mac_precedence() {
        let conf = with("mac", "02:00:00:00:00:01".into());
        assert_eq!(load(conf.clone(), "").unwrap().mac, Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(load(conf.clone(), "MAC=02:00:00:00:00:02").unwrap().mac, Some([2, 0, 0, 0, 0, 2]));
        let mut both = conf;
        both["runtimeConfig"] = json!({"mac": "02:00:00:00:00:03"});
        assert_eq!(load(both, "MAC=02:00:00:00:00:02").unwrap().mac, Some([2, 0, 0, 0, 0, 3]));
    }

    #[test]
    fn bad_inputs_are_config_errors() {
        for conf in [
            with("mode", "l2".into()),
            with("mode", 4.into()),
            with("master", "a/b".into()),
            with("master", "averyveryverylongname".into()),
            with("mtu", (-1).into()),
            with("mtu", 65536.into()),
            with("mtu", "1500".into()),
            with("mac", "01:00:00:00:00:01".into()),
            with("bcqueuelen", (-1).into()),
            with("runtimeConfig", json!({"mac": 5})),
            with("ipam", json!({"subnet": "10.0.0.0/24"})),
        ] {
            let e = load(conf.clone(), "").unwrap_err();
            assert!([codes::INVALID_CONFIG, codes::DECODE].contains(&e.code), "{conf}: {e:?}");
        }
        assert!(load(base(), "FOO=1").is_err());
        assert!(load(base(), "MAC=zz").is_err());
    }
}
