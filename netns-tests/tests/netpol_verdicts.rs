//! Verdicts an operator can read (issue 44): the agent on a kubenet node (`cni-netpol run --static`), pods
//! `x/a`, `y/a`, `y/b`, and `x/a` admitting TCP 80 from `y/a` only.
//!
//! `drops_counters_explain_and_the_rate_limit`: a denied connection (`y/b` -> `x/a` TCP 80) appears in
//! `cni-netpol drops` with both pods, the direction and the isolating policy; the allowing rule's counter and
//! the drop's counter move; `cni-netpol explain` names the rule that allows `y/a` and the isolation that drops
//! `y/b`; 2,000 denied datagrams (each a new flow) in a burst are all dropped and at most burst + rate * t of
//! them are logged (the log rule's counter and the drop log's lines). Then the NFLOG group held by another
//! socket: the agent says so once, and the drops hold.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use netns_tests::netpol::{policy, reaches, PolicyNode, Proto};
use netns_tests::{bin, json};
use netpol::drops::DropRecord;

const GROUP: &str = "77";
const RATE: u64 = 5;
const BURST: u64 = 10;

/// The rules of `chain` in the node, as `nft list chain` prints them.
fn chain(node: &PolicyNode, chain: &str) -> Vec<String> {
    let out = node.kubenet.node.exec("nft", &["list", "chain", "inet", "cni-netpol", chain], &[], b"");
    assert!(out.status.success(), "nft list chain: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().to_string()).collect()
}

/// The packets counted by the rule of `chain` whose text contains `what`.
fn counted(node: &PolicyNode, chain_name: &str, what: &str) -> u64 {
    let rules = chain(node, chain_name);
    let rule = rules.iter().find(|r| r.contains(what)).unwrap_or_else(|| panic!("no rule with {what}: {rules:#?}"));
    let after = rule.split("counter packets ").nth(1).unwrap_or_else(|| panic!("no counter: {rule}"));
    after.split(' ').next().unwrap().parse().unwrap()
}

fn cli(node: &PolicyNode, args: &[&str]) -> String {
    let run_dir = node.run_dir.display().to_string();
    let mut all = vec!["--run-dir", run_dir.as_str()];
    all.extend_from_slice(args);
    let out = node.kubenet.node.exec(bin("cni-netpol"), &all, &[], b"");
    assert!(out.status.success(), "cni-netpol {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The drop log as `cni-netpol drops` prints it.
fn drops(node: &PolicyNode) -> Vec<DropRecord> {
    cli(node, &["drops"]).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect()
}

#[test]
fn drops_counters_explain_and_the_rate_limit() {
    if !netns_tests::require("nft", netns_tests::on_path("nft"), "apt-get install nftables") {
        return;
    }
    let mut node = PolicyNode::empty(false);
    for (namespace, name) in [("x", "a"), ("y", "a"), ("y", "b")] {
        let pod = node.add_pod(namespace, name);
        node.pods.push(pod);
    }
    let allow = policy(
        "x",
        "allow-y-a",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                      "podSelector": {"matchLabels": {"pod": "a"}}}],
                            "ports": [{"port": 80, "protocol": "TCP"}]}]}),
    );
    node.write_cluster(&node.cluster(&[], std::slice::from_ref(&allow)));
    let file = node.cluster_file.display().to_string();
    let limits = ["--drop-log-group", GROUP, "--drop-log-rate", "5", "--drop-log-burst", "10"];
    let mut args = vec!["run", "--static", &file, "--interval-ms", "50"];
    args.extend(limits);
    let agent = node.start_agent_with(&args);
    netns_tests::wait_for(Duration::from_secs(10), || node.applied() > 0).expect("the agent's first table");

    let (x_a, y_a, y_b) = (node.pod("x/a"), node.pod("y/a"), node.pod("y/b"));
    let to = SocketAddr::new(x_a.ip(false), 80);
    assert!(reaches(&y_a.netns, to, Proto::Tcp, Duration::from_secs(2)), "y/a -> x/a TCP 80 is allowed");
    assert!(!reaches(&y_b.netns, to, Proto::Tcp, Duration::from_millis(700)), "y/b -> x/a TCP 80 is dropped");

    // The drop, in the log: both pods, the direction, the policy isolating x/a.
    let found = netns_tests::eventually(Duration::from_secs(5), || {
        drops(&node).into_iter().find(|d| d.src.pod.as_deref() == Some("y/b") && d.port == Some(80)).ok_or(())
    })
    .unwrap_or_else(|()| panic!("no drop of y/b -> x/a in the log: {:?}\n{}", drops(&node), node.log()));
    assert_eq!(found.dst.pod.as_deref(), Some("x/a"));
    assert_eq!((found.src.ip, found.dst.ip), (y_b.ip(false), x_a.ip(false)));
    assert_eq!((found.direction.as_str(), found.protocol.as_str()), ("ingress", "tcp"));
    assert_eq!(found.policies, ["x/allow-y-a"]);
    let same_flow = drops(&node).iter().filter(|d| d.src.pod.as_deref() == Some("y/b") && d.port == Some(80)).count();
    assert_eq!(same_flow, 1, "one line for the connection attempt (its SYN retransmissions included)");

    // The counters: the allowing rule counted y/a's packets, the drop y/b's.
    assert!(counted(&node, "ingress", "dport 80") > 0, "{:#?}", chain(&node, "ingress"));
    let dropped_before = counted(&node, "ingress", "drop");
    assert!(dropped_before > 0);

    // explain, on the view the agent put in force.
    let allowed = cli(&node, &["explain", "y/a", "x/a", "80/tcp"]);
    assert!(allowed.starts_with("ALLOWED"), "{allowed}");
    assert!(allowed.contains("ingress allowed by policy x/allow-y-a ingress rule 0"), "{allowed}");
    let denied = cli(&node, &["explain", "y/b", "x/a", "80/tcp"]);
    assert!(denied.starts_with("DROPPED"), "{denied}");
    assert!(denied.contains("dropped: no ingress rule of x/allow-y-a allows it"), "{denied}");

    // A flood: 2,000 datagrams to a denied port, each from a new socket (a new flow), in a burst.
    let logged_before = counted(&node, "ingress", "log prefix");
    let target = SocketAddr::new(x_a.ip(false), 81);
    let started = Instant::now();
    y_b.netns.run(|| {
        for _ in 0..2000 {
            let socket = UdpSocket::bind("0.0.0.0:0").expect("socket");
            socket.send_to(b"flood", target).expect("send");
        }
    });
    let elapsed = started.elapsed();
    std::thread::sleep(Duration::from_millis(1500)); // the log's lines written
    let dropped = counted(&node, "ingress", "drop") - dropped_before;
    let logged = counted(&node, "ingress", "log prefix") - logged_before;
    let bound = BURST + RATE * (elapsed.as_secs_f64().ceil() as u64);
    assert!(dropped >= 2000, "every datagram dropped: {dropped}");
    assert!(logged <= bound, "{logged} logged in {elapsed:?}: at most {bound}");
    let lines = drops(&node).iter().filter(|d| d.port == Some(81) && d.protocol == "udp").count() as u64;
    assert!(lines >= 1 && lines <= bound, "{lines} lines for the flood (at most {bound})");
    eprintln!("flood: 2000 sent in {elapsed:?}, {dropped} dropped, {logged} logged, {lines} lines");

    // The group held by another socket: the agent says so, and the drops hold.
    drop(agent);
    let holder = node.kubenet.node.run(|| netpol::nflog::Nflog::bind(GROUP.parse().unwrap())).expect("the group");
    let _agent = node.start_agent_with(&args);
    let said = netns_tests::wait_for(Duration::from_secs(10), || {
        node.log().contains("NFLOG group 77 is held by another program: drops are enforced but not logged")
    });
    assert!(said.is_some(), "{}", node.log());
    assert!(!reaches(&y_b.netns, to, Proto::Tcp, Duration::from_millis(700)), "still dropped");
    assert!(reaches(&y_a.netns, to, Proto::Tcp, Duration::from_secs(2)), "still allowed");
    drop(holder);
}
