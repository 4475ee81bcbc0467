//! The kernel floor of one pod's ADD and DEL (issue 22): the kernel operations the kubenet chain (bridge +
//! host-local, portmap, bandwidth) needs for one pod, done by one process with no exec and nothing else, timed
//! step by step. What a chain of plugins costs above this is process start-up, config parsing, files, locks,
//! execs and waits: the part that is ours to remove.
//!
//! ADD, in the order the chain does it:
//! - `netns`: open the pod netns and a netlink socket in it (the node's socket is opened once, as a plugin
//!   opens its own);
//! - `veth`: a veth pair, the pod end created directly in the pod netns;
//! - `attach`: the host end enslaved to the bridge, hairpin on, set up;
//! - `pod`: the pod's address, `eth0` up, its default route (`lo` is the loopback plugin's, not timed here);
//! - `rules`: one nf_tables transaction (netlink, no `nft`/`iptables-restore` process) with what the
//!   reference iptables layout adds per pod: a masquerade chain with its two rules and the jump to it from
//!   POSTROUTING, a DNAT chain with its rule and the jump to it from PREROUTING;
//! - `tc`: an ifb with a tbf, an ingress qdisc on the host veth with the u32/mirred redirect to the ifb, a tbf at
//!   the root of the host veth.
//!
//! After the total, and not part of it: `oper up wait`, the time still left until both veth ends are
//! operationally up (what a plugin that waits for it pays).
//!
//! DEL: the veth pair deleted (the host end's qdiscs and filter go with it), the ifb deleted, and one nf_tables
//! transaction removing the two jumps and the two chains; each waits for an RCU grace period in the kernel (the
//! nf_tables one when its socket is closed, as a plugin's exit closes it). Pods take turns at three ways:
//! one after the other (`sequential`), on three threads at once (`concurrent`, the floor of a DEL that starts
//! its slow deletions together), and with the ifb returned to a pool instead of deleted (`pooled ifb`).
//!
//! Everything happens in namespaces made here (a node with a bridge `cbr0`, a pod per run), removed at the end.
//! Usage (as root): `floor [RUNS] [--tsv]` (default 30); prints a Markdown table of medians in milliseconds, or
//! with `--tsv` one line per run and step (`verb`, `step`, milliseconds) for `scripts/bench-floor.sh`.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use cnicore::netlink::{Netlink, Route};
use cnicore::netns::NetNs;
use cnicore::tc::{handle, Tbf};
use netns_tests::TestNetns;

/// One run's step durations in milliseconds, by step name.
type Steps = BTreeMap<&'static str, f64>;

fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map(|r| r.parse().expect("RUNS is a number")).unwrap_or(30);
    let tsv = args.next().as_deref() == Some("--tsv");
    let node = TestNetns::new("floor");
    let node_ns = node.netns();
    let mut nl = Netlink::in_netns(&node_ns).expect("netlink in the node");
    let bridge = nl.create_bridge("cbr0", None).expect("bridge");
    nl.add_address(bridge.index, "10.244.1.1/24".parse().expect("net")).expect("gateway address");
    nl.set_up(bridge.index).expect("bridge up");
    node.run(nft::setup_tables).expect("nft base table");

    let mut add_runs = Vec::new();
    let mut del_runs = Vec::new();
    for run in 0..runs {
        let pod = TestNetns::new("floorp");
        let (add, pod_state) = add_pod(&mut nl, &node_ns, bridge.index, &pod, run);
        // Pods take turns at the three ways of deleting, so that all see the same conditions.
        let del = match run % 3 {
            0 => del_pod(&mut nl, &node_ns, &pod_state),
            1 => del_pod_concurrently(&node_ns, &pod_state),
            _ => del_pod_pooled(&mut nl, &node_ns, &pod_state),
        };
        if tsv {
            for (verb, steps) in [("ADD", &add), ("DEL", &del)] {
                for (step, ms) in steps {
                    println!("{verb}\t{step}\t{ms:.3}");
                }
            }
        }
        add_runs.push(add);
        del_runs.push(del);
        drop(pod);
    }
    if !tsv {
        print_table(runs, &add_runs, &del_runs);
    }
}

/// What DEL needs to know of one pod.
struct PodState {
    host_veth: String,
    ifb: String,
    masq_chain: String,
    dnat_chain: String,
    jump_handles: [u64; 2],
}

fn timed<T>(steps: &mut Steps, name: &'static str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let value = f();
    *steps.entry(name).or_default() += start.elapsed().as_secs_f64() * 1000.0;
    value
}

fn add_pod(nl: &mut Netlink, node_ns: &NetNs, bridge: u32, pod: &TestNetns, n: usize) -> (Steps, PodState) {
    let mut steps = Steps::new();
    let start = Instant::now();
    let host_name = format!("vfl{n}");
    let ifb_name = format!("ifbfl{n}");
    let pod_ip = format!("10.244.1.{}", 2 + n % 250);

    let (pod_ns, mut pod_nl) = timed(&mut steps, "netns", || {
        let ns = NetNs::open(&pod.path).expect("open pod netns");
        let pod_nl = Netlink::in_netns(&ns).expect("netlink in the pod");
        (ns, pod_nl)
    });
    let host = timed(&mut steps, "veth", || nl.create_veth(&host_name, "eth0", &pod_ns, None, None).expect("veth"));
    timed(&mut steps, "attach", || {
        nl.set_master(host.index, bridge).expect("master");
        nl.set_hairpin(host.index, true).expect("hairpin");
        nl.set_up(host.index).expect("host veth up");
    });
    timed(&mut steps, "pod", || {
        let eth0 = pod_nl.require_link("eth0").expect("eth0");
        pod_nl.add_address(eth0.index, format!("{pod_ip}/24").parse().expect("net")).expect("pod address");
        pod_nl.set_up(eth0.index).expect("eth0 up");
        let default = Route {
            dst: "0.0.0.0/0".parse().expect("net"),
            gateway: Some("10.244.1.1".parse().expect("ip")),
            oif: Some(eth0.index),
            ..Route::default()
        };
        pod_nl.add_route(&default).expect("default route");
    });
    let masq_chain = format!("FLOOR-MASQ-{n}");
    let dnat_chain = format!("FLOOR-DN-{n}");
    // A socket of its own, as each plugin process has: opened and closed within the step.
    let jump_handles = timed(&mut steps, "rules", || {
        let mut nft = node_ns.run(nft::Socket::open).expect("enter the node").expect("nf_tables socket");
        nft.add_pod_rules(&masq_chain, &dnat_chain, pod_ip.parse().expect("ip")).expect("nf_tables rules")
    });
    timed(&mut steps, "tc", || {
        let tbf = Tbf::like_reference(100_000_000, 100_000_000).expect("tbf");
        let ifb = nl.create_ifb_with(&ifb_name, None, true).expect("ifb");
        nl.add_tbf(ifb.index, handle::make(1, 0), handle::ROOT, &tbf, true).expect("tbf on the ifb");
        nl.add_ingress_qdisc(host.index).expect("ingress qdisc");
        nl.add_redirect_filter(host.index, handle::INGRESS, 1, ifb.index, None).expect("redirect");
        nl.add_tbf(host.index, handle::make(1, 0), handle::ROOT, &tbf, false).expect("tbf on the host veth");
    });
    steps.insert("total", start.elapsed().as_secs_f64() * 1000.0);
    // Not part of the floor: what waiting for both veth ends to be operationally up (as the bridge plugin
    // does before it finishes the node side) costs once everything else is done.
    timed(&mut steps, "oper up wait", || {
        let eth0 = pod_nl.require_link("eth0").expect("eth0");
        pod_nl.wait_oper_up(eth0.index, Duration::from_secs(5)).expect("eth0 operationally up");
        nl.wait_oper_up(host.index, Duration::from_secs(5)).expect("host veth operationally up");
    });
    let state = PodState { host_veth: host_name, ifb: ifb_name, masq_chain, dnat_chain, jump_handles };
    (steps, state)
}

/// One deletion after the other, each on a socket opened and closed within its step: closing an nf_tables
/// socket after a transaction that deleted something waits for the RCU grace period that frees it
/// (`nft_rcv_nl_event` flushes the destroy work), as a plugin's exit does.
fn del_pod(nl: &mut Netlink, node_ns: &NetNs, pod: &PodState) -> Steps {
    let mut steps = Steps::new();
    let start = Instant::now();
    timed(&mut steps, "veth", || nl.delete_link_by_name(&pod.host_veth).expect("delete veth"));
    timed(&mut steps, "ifb", || nl.delete_link_by_name(&pod.ifb).expect("delete ifb"));
    timed(&mut steps, "rules", || del_rules(node_ns, pod));
    steps.insert("sequential", start.elapsed().as_secs_f64() * 1000.0);
    steps
}

fn del_rules(node_ns: &NetNs, pod: &PodState) {
    let mut nft = node_ns.run(nft::Socket::open).expect("enter the node").expect("nf_tables socket");
    nft.del_pod_rules(&pod.masq_chain, &pod.dnat_chain, pod.jump_handles).expect("delete nf_tables rules");
    drop(nft);
}

/// The three slow deletions at once, each on a thread with its own socket (opened before the clock starts,
/// as a plugin would open them while the first deletion waits).
fn del_pod_concurrently(node_ns: &NetNs, pod: &PodState) -> Steps {
    let mut veth_nl = Netlink::in_netns(node_ns).expect("netlink");
    let mut ifb_nl = Netlink::in_netns(node_ns).expect("netlink");
    let start = Instant::now();
    thread::scope(|scope| {
        let veth = scope.spawn(|| veth_nl.delete_link_by_name(&pod.host_veth).expect("delete veth"));
        let ifb = scope.spawn(|| ifb_nl.delete_link_by_name(&pod.ifb).expect("delete ifb"));
        del_rules(node_ns, pod);
        veth.join().expect("veth thread");
        ifb.join().expect("ifb thread");
    });
    Steps::from([("concurrent", start.elapsed().as_secs_f64() * 1000.0)])
}

/// DEL as it would be with a pool of idle ifb devices: the ifb is not deleted but emptied (its root qdisc
/// removed) and set down, ready for the next pod; the veth and the rules as in [`del_pod`]. The ifb is
/// deleted afterwards, outside the clock.
fn del_pod_pooled(nl: &mut Netlink, node_ns: &NetNs, pod: &PodState) -> Steps {
    let mut steps = Steps::new();
    let start = Instant::now();
    timed(&mut steps, "veth", || nl.delete_link_by_name(&pod.host_veth).expect("delete veth"));
    timed(&mut steps, "ifb to pool", || {
        let ifb = nl.require_link(&pod.ifb).expect("ifb");
        nl.delete_qdisc(ifb.index, handle::make(1, 0), handle::ROOT).expect("delete the ifb's tbf");
        nl.set_down(ifb.index).expect("ifb down");
    });
    timed(&mut steps, "rules", || del_rules(node_ns, pod));
    steps.insert("pooled ifb", start.elapsed().as_secs_f64() * 1000.0);
    nl.delete_link_by_name(&pod.ifb).expect("delete the pooled ifb");
    steps
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

fn print_table(runs: usize, add: &[Steps], del: &[Steps]) {
    println!("| verb | step | median (ms) |");
    println!("|---|---|---|");
    for (verb, all, order) in [
        ("ADD", add, &["netns", "veth", "attach", "pod", "rules", "tc", "total", "oper up wait"][..]),
        ("DEL", del, &["veth", "ifb", "ifb to pool", "rules", "sequential", "concurrent", "pooled ifb"][..]),
    ] {
        for step in order {
            let values: Vec<f64> = all.iter().filter_map(|s| s.get(step).copied()).collect();
            if let Some(m) = median(values) {
                println!("| {verb} | {step} | {m:.2} |");
            }
        }
    }
    println!();
    println!("({runs} pods; DEL sequential, concurrent and with a pooled ifb in turn)");
}

/// A small nf_tables netlink client: exactly the messages the floor needs, in one batch per transaction.
mod nft {
    use std::io;
    use std::net::Ipv4Addr;

    use netlink_sys::{Socket as RawSocket, SocketAddr};

    const NETLINK_NETFILTER: isize = 12;
    const NFNL_SUBSYS_NFTABLES: u16 = 10;
    const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
    const NFNL_MSG_BATCH_END: u16 = 0x11;
    const NFT_MSG_NEWCHAIN: u16 = 3;
    const NFT_MSG_DELCHAIN: u16 = 5;
    const NFT_MSG_NEWRULE: u16 = 6;
    const NFT_MSG_DELRULE: u16 = 8;
    const NFPROTO_IPV4: u8 = 2;

    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_ACK: u16 = 0x4;
    const NLM_F_ECHO: u16 = 0x8;
    const NLM_F_APPEND: u16 = 0x800;
    const NLM_F_CREATE: u16 = 0x400;
    const NLMSG_ERROR: u16 = 2;
    const NLA_F_NESTED: u16 = 0x8000;

    const TABLE: &str = "floor";
    const POSTROUTING: &str = "POSTROUTING";
    const PREROUTING: &str = "PREROUTING";

    const NF_ACCEPT: u32 = 1;
    const NFT_JUMP: u32 = -3i32 as u32;
    const NFT_REG_VERDICT: u32 = 0;
    const NFT_REG_1: u32 = 1;
    const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;

    pub struct Socket {
        socket: RawSocket,
        sequence: u32,
    }

    /// One netlink message under construction.
    struct Message {
        buf: Vec<u8>,
        nests: Vec<usize>,
    }

    impl Message {
        fn new(kind: u16, family: u8, res_id: u16, flags: u16) -> Message {
            let mut buf = Vec::with_capacity(256);
            buf.extend_from_slice(&[0; 4]);
            buf.extend_from_slice(&kind.to_ne_bytes());
            buf.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
            buf.extend_from_slice(&[0; 8]); // sequence, port
            buf.extend_from_slice(&[family, 0]); // struct nfgenmsg: family, version
            buf.extend_from_slice(&res_id.to_be_bytes());
            Message { buf, nests: Vec::new() }
        }

        fn nft(command: u16, flags: u16) -> Message {
            Message::new(NFNL_SUBSYS_NFTABLES << 8 | command, NFPROTO_IPV4, 0, flags)
        }

        fn pad(&mut self) {
            self.buf.resize((self.buf.len() + 3) & !3, 0);
        }

        fn attr(&mut self, kind: u16, value: &[u8]) -> &mut Message {
            self.buf.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
            self.buf.extend_from_slice(&kind.to_ne_bytes());
            self.buf.extend_from_slice(value);
            self.pad();
            self
        }

        fn str(&mut self, kind: u16, value: &str) -> &mut Message {
            let mut bytes = value.as_bytes().to_vec();
            bytes.push(0);
            self.attr(kind, &bytes)
        }

        fn be32(&mut self, kind: u16, value: u32) -> &mut Message {
            self.attr(kind, &value.to_be_bytes())
        }

        fn begin(&mut self, kind: u16) -> &mut Message {
            self.nests.push(self.buf.len());
            self.buf.extend_from_slice(&[0, 0]);
            self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
            self
        }

        fn end(&mut self) -> &mut Message {
            let start = self.nests.pop().expect("an open nest");
            let len = (self.buf.len() - start) as u16;
            self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
            self
        }

        /// One expression of a rule: `NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA { ... } }`.
        fn expr(&mut self, name: &str, data: impl FnOnce(&mut Message)) -> &mut Message {
            self.begin(1).str(1, name).begin(2);
            data(self);
            self.end().end()
        }

        /// `ip saddr|daddr == addr` (payload into register 1, compared).
        fn match_ip(&mut self, offset: u32, addr: Ipv4Addr, mask_len: u32) -> &mut Message {
            self.expr("payload", |m| {
                m.be32(1, NFT_REG_1).be32(2, NFT_PAYLOAD_NETWORK_HEADER).be32(3, offset).be32(4, mask_len / 8);
            });
            self.expr("cmp", |m| {
                m.be32(1, NFT_REG_1).be32(2, 0).begin(3).attr(1, &addr.octets()[..(mask_len / 8) as usize]).end();
            })
        }

        fn verdict(&mut self, code: u32, chain: Option<&str>) -> &mut Message {
            self.expr("immediate", |m| {
                m.be32(1, NFT_REG_VERDICT).begin(2).begin(2).be32(1, code);
                if let Some(chain) = chain {
                    m.str(2, chain);
                }
                m.end().end();
            })
        }

        fn rule(chain: &str, flags: u16, body: impl FnOnce(&mut Message)) -> Message {
            let mut m = Message::nft(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND | flags);
            m.str(1, TABLE).str(2, chain).begin(4);
            body(&mut m);
            m.end();
            m
        }

        fn finish(mut self, sequence: u32) -> Vec<u8> {
            let len = self.buf.len() as u32;
            self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
            self.buf[8..12].copy_from_slice(&sequence.to_ne_bytes());
            self.buf
        }
    }

    /// The base table, as iptables-nft keeps its `nat` table: made once with `nft`, not timed.
    pub fn setup_tables() -> io::Result<()> {
        let script = format!(
            "table ip {TABLE} {{\n chain {POSTROUTING} {{ type nat hook postrouting priority 100; }}\n \
             chain {PREROUTING} {{ type nat hook prerouting priority -100; }}\n}}\n"
        );
        let mut child =
            std::process::Command::new("nft").args(["-f", "-"]).stdin(std::process::Stdio::piped()).spawn()?;
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(script.as_bytes())?;
        let status = child.wait()?;
        if !status.success() {
            return Err(io::Error::other(format!("nft: {status}")));
        }
        Ok(())
    }

    impl Socket {
        pub fn open() -> io::Result<Socket> {
            let mut socket = RawSocket::new(NETLINK_NETFILTER)?;
            socket.bind_auto()?;
            Ok(Socket { socket, sequence: 0 })
        }

        /// Sends `messages` as one transaction and waits for every acknowledgement; returns the handles of
        /// the rules the kernel echoed (those sent with `NLM_F_ECHO`), in order.
        fn transaction(&mut self, messages: Vec<Message>) -> io::Result<Vec<u64>> {
            let mut datagram = Vec::new();
            self.sequence += 1;
            let begin = Message::new(NFNL_MSG_BATCH_BEGIN, 0, NFNL_SUBSYS_NFTABLES, 0);
            datagram.extend(begin.finish(self.sequence));
            let count = messages.len();
            for message in messages {
                self.sequence += 1;
                let mut message = message;
                let flags = u16::from_ne_bytes([message.buf[6], message.buf[7]]) | NLM_F_ACK;
                message.buf[6..8].copy_from_slice(&flags.to_ne_bytes());
                datagram.extend(message.finish(self.sequence));
            }
            self.sequence += 1;
            datagram.extend(Message::new(NFNL_MSG_BATCH_END, 0, NFNL_SUBSYS_NFTABLES, 0).finish(self.sequence));
            self.socket.send_to(&datagram, &SocketAddr::new(0, 0), 0)?;

            let mut acks = 0;
            let mut handles = Vec::new();
            while acks < count {
                let (reply, _) = self.socket.recv_from_full()?;
                let mut at = 0;
                while at + 16 <= reply.len() {
                    let len = u32::from_ne_bytes(reply[at..at + 4].try_into().expect("4 bytes")) as usize;
                    let kind = u16::from_ne_bytes([reply[at + 4], reply[at + 5]]);
                    let body = &reply[at + 16..at + len.max(16)];
                    if kind == NLMSG_ERROR {
                        let errno = i32::from_ne_bytes(body[0..4].try_into().expect("4 bytes"));
                        if errno != 0 {
                            return Err(io::Error::from_raw_os_error(-errno));
                        }
                        acks += 1;
                    } else if kind == NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWRULE {
                        handles.extend(rule_handle(&body[4..]));
                    }
                    at += (len + 3) & !3;
                    if len == 0 {
                        break;
                    }
                }
            }
            Ok(handles)
        }

        /// The per-pod rules of the reference iptables layout, as nf_tables objects: returns the handles of
        /// the jumps from POSTROUTING and PREROUTING.
        pub fn add_pod_rules(&mut self, masq: &str, dnat: &str, pod: Ipv4Addr) -> io::Result<[u64; 2]> {
            let chain = |name: &str| {
                let mut m = Message::nft(NFT_MSG_NEWCHAIN, NLM_F_CREATE);
                m.str(1, TABLE).str(3, name);
                m
            };
            let cluster = Ipv4Addr::new(10, 244, 0, 0);
            let messages = vec![
                chain(masq),
                Message::rule(masq, 0, |m| {
                    m.match_ip(16, cluster, 16).verdict(NF_ACCEPT, None);
                }),
                Message::rule(masq, 0, |m| {
                    m.expr("masq", |_| {});
                }),
                Message::rule(POSTROUTING, NLM_F_ECHO, |m| {
                    m.match_ip(12, pod, 32).verdict(NFT_JUMP, Some(masq));
                }),
                chain(dnat),
                Message::rule(dnat, 0, |m| {
                    m.match_ip(16, Ipv4Addr::new(192, 0, 2, 1), 32).verdict(NF_ACCEPT, None);
                }),
                Message::rule(PREROUTING, NLM_F_ECHO, |m| {
                    m.match_ip(16, Ipv4Addr::new(192, 0, 2, 1), 32).verdict(NFT_JUMP, Some(dnat));
                }),
            ];
            let handles = self.transaction(messages)?;
            match handles[..] {
                [post, pre] => Ok([post, pre]),
                _ => Err(io::Error::other(format!("expected two echoed rules, got {handles:?}"))),
            }
        }

        /// Removes what [`Socket::add_pod_rules`] added, in one transaction.
        pub fn del_pod_rules(&mut self, masq: &str, dnat: &str, jumps: [u64; 2]) -> io::Result<()> {
            let del_rule = |chain: &str, handle: Option<u64>| {
                let mut m = Message::nft(NFT_MSG_DELRULE, 0);
                m.str(1, TABLE).str(2, chain);
                if let Some(handle) = handle {
                    m.attr(3, &handle.to_be_bytes());
                }
                m
            };
            let del_chain = |name: &str| {
                let mut m = Message::nft(NFT_MSG_DELCHAIN, 0);
                m.str(1, TABLE).str(3, name);
                m
            };
            let messages = vec![
                del_rule(POSTROUTING, Some(jumps[0])),
                del_rule(PREROUTING, Some(jumps[1])),
                del_rule(masq, None), // a DELRULE without a handle flushes the chain
                del_chain(masq),
                del_rule(dnat, None),
                del_chain(dnat),
            ];
            self.transaction(messages).map(drop)
        }
    }

    /// `NFTA_RULE_HANDLE` of an echoed rule (attributes after `struct nfgenmsg`).
    fn rule_handle(mut attrs: &[u8]) -> Option<u64> {
        while attrs.len() >= 4 {
            let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
            let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & !NLA_F_NESTED;
            if len < 4 || len > attrs.len() {
                return None;
            }
            if kind == 3 && len == 12 {
                return Some(u64::from_be_bytes(attrs[4..12].try_into().ok()?));
            }
            attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
        }
        None
    }
}
