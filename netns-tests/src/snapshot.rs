//! Snapshots of everything a plugin can change on a node, to prove that a call changed nothing (bad input) or
//! that everything was removed again (DEL, churn).
//!
//! A [`NodeSnapshot`] of a namespace holds, as text lines per section: links (name, kind, up, MTU,
//! master, promiscuous and all-multicast mode, transmit queue length, MAC, bridge port flags), addresses, routes of every table and family, the iptables and ip6tables
//! rulesets (`iptables-save`, counters and comments dropped), the nftables ruleset (counters dropped), the
//! qdiscs and tc filters of every link, the sysctls the plugins write, and the files under given state
//! directories (path, type, size, mode). [`assert_unchanged`] prints what differs, section by section.
//!
//! Links, addresses, qdiscs, filters and sysctls are read in-process (netlink, /proc/sys); routes, iptables and
//! nft are read with one process each (`ip -d route show table all`, `iptables-save`, `ip6tables-save`,
//! `nft list ruleset`), none of which creates a table as a side effect.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use cnicore::tc::handle;
use cnicore::tc::QdiscKind;

use crate::TestNetns;

/// Sysctls of the namespace that plugins set (bridge: forwarding, bridge-nf-call; portmap: route_localnet).
const GLOBAL_SYSCTLS: &[&str] = &[
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv4/conf/default/route_localnet",
    "net/ipv6/conf/all/forwarding",
    "net/ipv6/conf/default/forwarding",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/bridge/bridge-nf-call-arptables",
    "net/core/somaxconn",
];

/// Per-link sysctls plugins set (`<link>` is replaced by each link's name).
const LINK_SYSCTLS: &[&str] = &[
    "net/ipv4/conf/<link>/route_localnet",
    "net/ipv4/conf/<link>/forwarding",
    "net/ipv4/conf/<link>/arp_notify",
    "net/ipv6/conf/<link>/forwarding",
    "net/ipv6/conf/<link>/accept_ra",
    "net/ipv6/conf/<link>/accept_dad",
    "net/ipv6/conf/<link>/disable_ipv6",
    "net/ipv4/conf/<link>/arp_filter",
];

/// The state of one namespace (and some directories) at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSnapshot {
    /// Section name → its lines, in dump order (files sorted by path).
    sections: BTreeMap<&'static str, Vec<String>>,
}

impl NodeSnapshot {
    /// Reads the state of `ns` and the files under `state_dirs` (missing directories are recorded as such).
    pub fn take(ns: &TestNetns, state_dirs: &[&Path]) -> NodeSnapshot {
        let mut sections = BTreeMap::new();
        let mut netlink = ns.netlink();
        let links = netlink.links().unwrap_or_else(|e| panic!("links of {}: {e}", ns.name));
        let names: HashMap<u32, String> = links.iter().map(|l| (l.index, l.name.clone())).collect();
        let name_of = |index: u32| names.get(&index).cloned().unwrap_or_else(|| format!("#{index}"));

        sections.insert(
            "links",
            links
                .iter()
                .map(|l| {
                    let mac = l.mac.map(|m| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"));
                    let port =
                        l.bridge_port.as_ref().map(|p| format!(" hairpin={} isolated={}", p.hairpin, p.isolated));
                    format!(
                        "{} kind={} up={} mtu={} master={} promisc={} allmulti={} txqlen={} mac={}{}",
                        l.name,
                        l.kind.as_deref().unwrap_or("-"),
                        l.up,
                        l.mtu,
                        l.master.map(name_of).unwrap_or_else(|| "-".into()),
                        l.promisc,
                        l.allmulti,
                        l.txqlen,
                        mac.unwrap_or_else(|| "-".into()),
                        port.unwrap_or_default()
                    )
                })
                .collect(),
        );

        // Flags (tentative, DAD) change by themselves; the address set is what plugins change.
        let addresses = netlink.addresses(None).unwrap_or_else(|e| panic!("addresses of {}: {e}", ns.name));
        sections.insert(
            "addresses",
            addresses.iter().map(|a| format!("{} {} scope={:?}", name_of(a.index), a.addr, a.scope)).collect(),
        );

        let mut tc = Vec::new();
        for link in &links {
            let qdiscs = netlink.qdiscs(Some(link.index)).unwrap_or_else(|e| panic!("qdiscs of {}: {e}", link.name));
            for q in qdiscs {
                let options = match &q.kind {
                    QdiscKind::Tbf(Some(t)) => {
                        format!(" rate={} buffer={} limit={}", t.rate, t.buffer, t.limit)
                    }
                    _ => String::new(),
                };
                tc.push(format!(
                    "qdisc {} {} handle={:x} parent={:x}{options}",
                    link.name,
                    q.kind.name(),
                    q.handle,
                    q.parent
                ));
                let parents = match q.kind {
                    _ if q.handle == 0 => vec![],
                    QdiscKind::Ingress => vec![handle::INGRESS],
                    QdiscKind::Clsact => vec![handle::CLSACT_INGRESS, handle::CLSACT_EGRESS],
                    _ => vec![q.handle],
                };
                for parent in parents {
                    match netlink.filters(link.index, parent) {
                        Ok(filters) => tc.extend(filters.iter().map(|f| {
                            let redirects: Vec<String> = f.redirects.iter().map(|r| name_of(r.ifindex)).collect();
                            format!(
                                "filter {} parent={:x} handle={:x} prio={} protocol={:x} kind={} redirect={}",
                                link.name,
                                f.parent,
                                f.handle,
                                f.prio,
                                f.protocol,
                                f.kind,
                                redirects.join(",")
                            )
                        })),
                        Err(e) => tc.push(format!("filter {} parent={parent:x}: {e}", link.name)),
                    }
                }
            }
        }
        sections.insert("tc", tc);

        let sysctls = ns.run(|| {
            let mut names: Vec<String> = GLOBAL_SYSCTLS.iter().map(|s| s.to_string()).collect();
            for link in &links {
                names.extend(LINK_SYSCTLS.iter().map(|s| s.replace("<link>", &link.name)));
            }
            names
                .into_iter()
                .filter_map(|name| cnicore::sysctl::read(&name).ok().map(|v| format!("{name}={}", v.trim())))
                .collect::<Vec<_>>()
        });
        sections.insert("sysctls", sysctls);

        // `linkdown` follows the carrier of the link (a bridge without ports loses it a moment after it is
        // made): state, not configuration.
        let routes = command_lines(ns, "ip", &["-d", "route", "show", "table", "all"]);
        sections.insert("routes", routes.into_iter().map(|r| r.replace(" linkdown", "")).collect());
        sections.insert("iptables", iptables_lines(ns, "iptables-save"));
        sections.insert("ip6tables", iptables_lines(ns, "ip6tables-save"));
        sections.insert("nftables", nft_lines(ns));

        let mut files = Vec::new();
        for dir in state_dirs {
            list_files(dir, &mut files);
        }
        // Directory listings come in no particular order; every other section is in the kernel's or the
        // tool's own (stable) order, which matters for rules.
        files.sort();
        sections.insert("files", files);

        NodeSnapshot { sections }
    }

    /// Takes snapshots until two in a row are equal (IPv6 link-local addresses and their routes appear a
    /// moment after a link comes up), for at most `timeout`; returns the last one.
    ///
    /// IPv6 duplicate address detection adds a `local` route when it completes (a second or so after the link
    /// came up): the wait also lasts until no address of the namespace is tentative. The link-local address
    /// itself only appears once the kernel's linkwatch has seen the carrier (up to a second after it came on),
    /// so the wait also lasts while a link has its carrier but not yet its operational state.
    pub fn settled(ns: &TestNetns, state_dirs: &[&Path], timeout: Duration) -> NodeSnapshot {
        let deadline = Instant::now() + timeout;
        let mut netlink = ns.netlink();
        let mut unsettled = || {
            let addresses = netlink.addresses(None).unwrap_or_else(|e| panic!("addresses of {}: {e}", ns.name));
            let links = netlink.links().unwrap_or_else(|e| panic!("links of {}: {e}", ns.name));
            // A carrier linkwatch has not handled yet: no link-local address so far.
            addresses.iter().any(|a| a.is_tentative()) || links.iter().any(|l| l.up && l.carrier && !l.oper_up)
        };
        let mut last = NodeSnapshot::take(ns, state_dirs);
        loop {
            std::thread::sleep(Duration::from_millis(50));
            // Checked before the snapshot: DAD completing between the two would go unseen.
            let quiet = !unsettled();
            let next = NodeSnapshot::take(ns, state_dirs);
            if (quiet && next == last) || Instant::now() >= deadline {
                return next;
            }
            last = next;
        }
    }

    /// The lines of one section (`links`, `addresses`, `routes`, `iptables`, `ip6tables`, `nftables`, `tc`,
    /// `sysctls`, `files`).
    pub fn section(&self, name: &str) -> &[String] {
        self.sections.get(name).map(Vec::as_slice).unwrap_or_default()
    }

    /// What changed from `self` to `after`, readable (`-` gone, `+` new, per section); `None` when nothing did.
    pub fn diff(&self, after: &NodeSnapshot) -> Option<String> {
        let mut out = String::new();
        for (name, before) in &self.sections {
            let after = after.section(name);
            let (gone, new) = (minus(before, after), minus(after, before));
            if gone.is_empty() && new.is_empty() {
                if before.as_slice() != after {
                    out.push_str(&format!("  {name}: the same lines in another order:\n"));
                    out.extend(after.iter().map(|line| format!("    {line}\n")));
                }
                continue;
            }
            out.push_str(&format!("  {name}:\n"));
            for line in gone {
                out.push_str(&format!("    - {line}\n"));
            }
            for line in new {
                out.push_str(&format!("    + {line}\n"));
            }
        }
        (!out.is_empty()).then_some(out)
    }
}

/// Panics with a readable diff unless the two snapshots are equal.
pub fn assert_unchanged(before: &NodeSnapshot, after: &NodeSnapshot) {
    if let Some(diff) = before.diff(after) {
        panic!("the node changed:\n{diff}");
    }
}

/// The lines of `a` that are not in `b`, counting repeats.
fn minus<'a>(a: &'a [String], b: &[String]) -> Vec<&'a String> {
    let mut left: HashMap<&String, usize> = HashMap::new();
    for line in b {
        *left.entry(line).or_default() += 1;
    }
    a.iter()
        .filter(|line| match left.get_mut(line) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .collect()
}

/// The non-empty output lines of `program args` run in `ns`; a missing program or a failure is one line saying
/// so (it then shows up in a diff only if it changes).
fn command_lines(ns: &TestNetns, program: &str, args: &[&str]) -> Vec<String> {
    let mut command = ns.command(program);
    command.args(args).env("LC_ALL", "C");
    match command.output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
        Ok(out) => vec![format!("{program} failed: {}", String::from_utf8_lossy(&out.stderr).trim())],
        Err(e) => vec![format!("{program} unavailable: {e}")],
    }
}

/// `iptables-save` without its comment lines (`# Generated by ...` carries a time) and chain counters.
fn iptables_lines(ns: &TestNetns, program: &str) -> Vec<String> {
    command_lines(ns, program, &[])
        .into_iter()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match (l.strip_prefix(':'), l.rfind(" [")) {
            (Some(_), Some(at)) if l.ends_with(']') => l[..at].to_string(),
            _ => l,
        })
        .collect()
}

/// `nft list ruleset` with packet and byte counters blanked.
fn nft_lines(ns: &TestNetns) -> Vec<String> {
    command_lines(ns, "nft", &["list", "ruleset"])
        .into_iter()
        .map(|line| {
            let mut words: Vec<&str> = line.split_whitespace().collect();
            for i in 1..words.len() {
                if matches!(words[i - 1], "packets" | "bytes") {
                    words[i] = "_";
                }
            }
            words.join(" ")
        })
        .collect()
}

/// Every entry under `dir` (recursively, symlinks not followed): path, type, size (files), mode, link target.
fn list_files(dir: &Path, out: &mut Vec<String>) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            out.push(format!("{}: {}", dir.display(), e.kind()));
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o7777;
        let kind = meta.file_type();
        if kind.is_dir() {
            out.push(format!("{}/ dir mode={mode:o}", path.display()));
            list_files(&path, out);
        } else if kind.is_symlink() {
            let target = fs::read_link(&path).map(|t| t.display().to_string()).unwrap_or_default();
            out.push(format!("{} symlink -> {target}", path.display()));
        } else {
            out.push(format!("{} file size={} mode={mode:o} links={}", path.display(), meta.len(), meta.nlink()));
        }
    }
}
