//! `macspoofchk`: frames entering the bridge from the pod's port must carry the pod's MAC, in the reference
//! layout so that either implementation cleans up after the other: table `bridge nat`, base chain
//! `PREROUTING` (filter, prerouting, priority -300) with `iifname <host veth> jump cni-br-iface-<id>`, and
//! `cni-br-iface-<id>-mac` returning for the pod's MAC and dropping the rest; every rule commented
//! `macspoofchk-<id>` with `<id>` = `<containerID>-<ifname>`.
//!
//! The rules go to `nft -j -f -` as JSON, so no name needs quoting and nothing from the input is parsed as
//! nft syntax. Setup is one transaction; teardown lists the table once and deletes what exists in one more.

use cnicore::firewall::nftables;
use cnicore::spec::Result;
use serde_json::{json, Value};

const FAMILY: &str = "bridge";
const TABLE: &str = "nat";
const BASE_CHAIN: &str = "PREROUTING";

pub struct SpoofCheck {
    ref_id: String,
}

impl SpoofCheck {
    pub fn new(container_id: &str, ifname: &str) -> SpoofCheck {
        SpoofCheck { ref_id: format!("{container_id}-{ifname}") }
    }

    fn iface_chain(&self) -> String {
        format!("cni-br-iface-{}", self.ref_id)
    }

    fn mac_chain(&self) -> String {
        format!("cni-br-iface-{}-mac", self.ref_id)
    }

    fn comment(&self) -> String {
        format!("macspoofchk-{}", self.ref_id)
    }

    fn rule(&self, chain: &str, expr: Value) -> Value {
        json!({"add": {"rule": {"family": FAMILY, "table": TABLE, "chain": chain, "comment": self.comment(), "expr": expr}}})
    }

    /// Only frames from `mac` may enter the bridge through `host_veth`.
    pub fn setup(&self, host_veth: &str, mac: &str) -> Result<()> {
        let chain = |name: &str| json!({"family": FAMILY, "table": TABLE, "name": name});
        let (iface, mac_chain) = (self.iface_chain(), self.mac_chain());
        let commands = vec![
            json!({"add": {"table": {"family": FAMILY, "name": TABLE}}}),
            json!({"add": {"chain": {"family": FAMILY, "table": TABLE, "name": BASE_CHAIN,
                "type": "filter", "hook": "prerouting", "prio": -300, "policy": "accept"}}}),
            json!({"add": {"chain": chain(&iface)}}),
            json!({"add": {"chain": chain(&mac_chain)}}),
            json!({"flush": {"chain": chain(&iface)}}),
            json!({"flush": {"chain": chain(&mac_chain)}}),
            self.rule(
                BASE_CHAIN,
                json!([
                {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": host_veth}},
                {"jump": {"target": iface}}]),
            ),
            self.rule(&iface, json!([{"jump": {"target": mac_chain}}])),
            self.rule(
                &mac_chain,
                json!([
                {"match": {"op": "==", "left": {"payload": {"protocol": "ether", "field": "saddr"}}, "right": mac}},
                {"return": null}]),
            ),
            self.rule(&mac_chain, json!([{"drop": null}])),
        ];
        nftables::apply_json(&commands).map_err(|e| e.to_error("failed to setup spoof-check"))
    }

    /// Removes the attachment's rule and chains; what is already gone is not an error.
    pub fn teardown(&self) -> Result<()> {
        const WHAT: &str = "failed to teardown spoof-check";
        let Some(table) = nftables::list(&["table", FAMILY, TABLE]).map_err(|e| e.to_error(WHAT))? else {
            return Ok(());
        };
        let items = table.get("nftables").and_then(Value::as_array).cloned().unwrap_or_default();
        let (iface, mac_chain) = (self.iface_chain(), self.mac_chain());
        let comment = self.comment();
        let mut commands = Vec::new();
        for item in &items {
            if let Some(rule) = item.get("rule") {
                let ours = rule["chain"] == BASE_CHAIN && rule["comment"] == comment.as_str();
                if let (true, Some(handle)) = (ours, rule["handle"].as_u64()) {
                    commands.push(json!({"delete": {"rule": {"family": FAMILY, "table": TABLE, "chain": BASE_CHAIN, "handle": handle}}}));
                }
            }
        }
        // The iface chain jumps to the mac chain, so it goes first.
        for name in [&iface, &mac_chain] {
            let exists = items.iter().any(|i| i.get("chain").is_some_and(|c| c["name"] == name.as_str()));
            if exists {
                commands.push(json!({"delete": {"chain": {"family": FAMILY, "table": TABLE, "name": name}}}));
            }
        }
        if commands.is_empty() {
            return Ok(());
        }
        nftables::apply_json(&commands).map_err(|e| e.to_error(WHAT))
    }
}
