//! `macspoofchk`: frames entering the bridge from the pod's port must carry the pod's MAC, in the reference
//! layout so that either implementation cleans up after the other: table `bridge nat`, base chain
//! `PREROUTING` (filter, prerouting, priority -300) with `iifname <host veth> jump cni-br-iface-<id>`, and
//! `cni-br-iface-<id>-mac` returning for the pod's MAC and dropping the rest; every rule commented
//! `macspoofchk-<id>` with `<id>` = `<containerID>-<ifname>`.
//!
//! The rules go to `nft -j -f -` as JSON, so no name needs quoting and nothing from the input is parsed as
//! nft syntax. Setup is one transaction; teardown lists the table once and deletes what exists in one more.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use cnicore::spec::{Error, Result};
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
        apply(&commands).map_err(|e| Error::internal(format!("failed to setup spoof-check: {e}")))
    }

    /// Removes the attachment's rule and chains; what is already gone is not an error.
    pub fn teardown(&self) -> Result<()> {
        let fail = |e: String| Error::internal(format!("failed to teardown spoof-check: {e}"));
        let Some(table) = list_table().map_err(fail)? else { return Ok(()) };
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
        apply(&commands).map_err(fail)
    }
}

/// `nft` from PATH, else the usual sbin directories (runtimes often give plugins an empty PATH).
fn nft() -> PathBuf {
    cnicore::firewall::find_binary("nft").unwrap_or_else(|| PathBuf::from("nft"))
}

/// One `nft -j -f -` transaction.
fn apply(commands: &[Value]) -> std::result::Result<(), String> {
    let input = json!({"nftables": commands}).to_string();
    let out = run_nft(&["-j", "-f", "-"], input.as_bytes())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(())
}

/// The `bridge nat` table as JSON, or None when it does not exist.
fn list_table() -> std::result::Result<Option<Value>, String> {
    let out = run_nft(&["-j", "list", "table", FAMILY, TABLE], b"")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("No such file or directory") {
            return Ok(None);
        }
        return Err(stderr.trim().to_string());
    }
    serde_json::from_slice(&out.stdout).map(Some).map_err(|e| format!("cannot parse nft output: {e}"))
}

fn run_nft(args: &[&str], stdin: &[u8]) -> std::result::Result<std::process::Output, String> {
    use std::io::Write;
    let mut child = Command::new(nft())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft: {e}"))?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin).map_err(|e| format!("writing to nft: {e}"))?;
    }
    child.wait_with_output().map_err(|e| format!("waiting for nft: {e}"))
}
