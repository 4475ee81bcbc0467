//! The figures of fabricd (issue 16), run by scripts/bench-fabric.sh (ignored by the test suite: these are
//! measurements, not tests). Prints a markdown table on stdout and, with FABRIC_BENCH_OUT set, writes it there.
//!
//! - join convergence: a new lease written to etcd -> the route to it present on every peer (5 agents), over
//!   20 joins; the clock starts before `etcdctl put` is spawned, so the figure includes that process's start.
//! - cold start, at 1,000 and at 5,000 peers (issue 22: Kubernetes' limit): the peers' leases already in
//!   etcd (loaded before the clock starts, one `etcdctl txn` per 128 puts) -> one agent started -> all its
//!   routes, neighbours and FDB entries programmed, read back from netlink every 10 ms; the agent's CPU time
//!   (utime + stime) until then, and its RSS right after.
//! - a join seen by that agent: one more lease written -> its route programmed on the agent.
//! - RSS and CPU of that agent while idle, its etcd requests per minute (its counter), etcd's own RSS.
//! - the same join convergence and cold start for a dual-stack cluster (IPv4 and IPv6 underlay, both
//!   families' routes on every peer; N dual-stack peers: 2N routes, neighbours and FDB entries).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use cnicore::netlink::{IpFamily, RT_TABLE_MAIN};
use netns_tests::fabric::{metric, segment_ip, segment_ip6, wait_for, Cluster};
use netns_tests::{json, Value};

const PROTO: Option<u8> = Some(75);

fn vxlan_lease(public_ip: Ipv4Addr) -> String {
    let [a, b, c, d] = public_ip.octets();
    json!({ "PublicIP": public_ip.to_string(), "PublicIPv6": null, "BackendType": "vxlan",
            "BackendData": { "VNI": 1, "VtepMAC": format!("0e:fa:{a:02x}:{b:02x}:{c:02x}:{d:02x}") } })
    .to_string()
}

/// A dual-stack lease as flanneld writes it (the IPv6 VTEP MAC unique per peer, any unicast one).
fn dual_lease(public_ip: Ipv4Addr, public_ipv6: Ipv6Addr, n: u32) -> String {
    let mut lease: Value = serde_json::from_str(&vxlan_lease(public_ip)).unwrap();
    lease["PublicIPv6"] = json!(public_ipv6.to_string());
    lease["BackendV6Data"] =
        json!({ "VNI": 1, "VtepMAC": format!("0e:fb:00:{:02x}:{:02x}:{:02x}", n >> 16, (n >> 8) & 0xff, n & 0xff) });
    lease.to_string()
}

/// The number of fabricd's routes of `family` in a node.
fn our_routes(nl: &mut cnicore::netlink::Netlink, family: IpFamily) -> Vec<ipnet::IpNet> {
    nl.routes(family, RT_TABLE_MAIN).unwrap().into_iter().filter(|r| r.protocol == PROTO).map(|r| r.dst).collect()
}

/// Join convergence over 20 joins to 5 agents: (p50, p99).
fn join_convergence(dual: bool) -> (Duration, Duration) {
    let mut cluster = if dual { Cluster::dual(1) } else { Cluster::new(1) };
    cluster.start_etcd(&config(dual), None);
    for _ in 0..5 {
        cluster.add_node(0, &[]);
    }
    for node in &mut cluster.nodes {
        node.start();
    }
    for node in &cluster.nodes {
        node.wait_ready(Duration::from_secs(15));
    }
    let mut sockets: Vec<_> = cluster.nodes.iter().map(|n| n.node.netlink()).collect();
    let mut samples = Vec::new();
    for join in 0..20u8 {
        let subnet: ipnet::IpNet = format!("10.200.{join}.0/24").parse().unwrap();
        let subnet6: ipnet::IpNet = format!("fd00:10:0:{:x}::/64", 0xc800 + join as u32).parse().unwrap();
        let (key, value) = if dual {
            let key = format!("/coreos.com/network/subnets/10.200.{join}.0-24&{}-64", subnet6.addr());
            (key, dual_lease(segment_ip(0, 100 + join), segment_ip6(0, 100 + join), 0x10000 + join as u32))
        } else {
            (format!("/coreos.com/network/subnets/10.200.{join}.0-24"), vxlan_lease(segment_ip(0, 100 + join)))
        };
        let start = Instant::now();
        let out = cluster.etcdctl(&["put", &key, &value]);
        assert!(out.status.success());
        let done = wait_for(Duration::from_secs(10), || {
            sockets.iter_mut().all(|nl| {
                our_routes(nl, IpFamily::V4).contains(&subnet)
                    && (!dual || our_routes(nl, IpFamily::V6).contains(&subnet6))
            })
        });
        assert!(done.is_some(), "join {join} did not converge");
        samples.push(start.elapsed());
        cluster.etcdctl(&["del", &key]);
        wait_for(Duration::from_secs(10), || {
            sockets.iter_mut().all(|nl| !our_routes(nl, IpFamily::V4).contains(&subnet))
        });
    }
    samples.sort();
    (percentile(&samples, 50.0), percentile(&samples, 99.0))
}

fn config(dual: bool) -> Value {
    if dual {
        json!({ "EnableIPv6": true, "Network": "10.0.0.0/8", "SubnetLen": 24, "IPv6Network": "fd00:10::/48",
                "Backend": { "Type": "vxlan" } })
    } else {
        json!({ "Network": "10.0.0.0/8", "SubnetLen": 24, "Backend": { "Type": "vxlan" } })
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn cpu_time((user, system): (Duration, Duration)) -> String {
    format!("{} + {}", ms(user), ms(system))
}

fn proc_field(pid: u32, file: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    text.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
}

/// (utime, stime) of `pid`, in clock ticks.
fn user_system_ticks(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (field(11), field(12))
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let (user, system) = user_system_ticks(pid);
    user + system
}

/// Peer `i`'s lease key and value, as flanneld writes them (peer `peers` is the one that joins later). Public
/// addresses are outside the cluster's Network: fabricd refuses a lease whose node address is a pod's.
fn peer_lease(i: u32, dual: bool) -> (String, String) {
    let ip = Ipv4Addr::new(172, 20, (i / 250) as u8, (i % 250 + 1) as u8);
    let key = format!("/coreos.com/network/subnets/10.{}.{}.0-24", 1 + i / 256, i % 256);
    if dual {
        let ip6 = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, (i >> 16) as u16, i as u16 + 1);
        (format!("{key}&fd00:10:0:{:x}::-64", i + 1), dual_lease(ip, ip6, i))
    } else {
        (key, vxlan_lease(ip))
    }
}

/// Peer `i`'s subnets (IPv4, and IPv6 in a dual-stack cluster).
fn peer_subnets(i: u32, dual: bool) -> Vec<ipnet::IpNet> {
    let mut subnets = vec![format!("10.{}.{}.0/24", 1 + i / 256, i % 256).parse().unwrap()];
    if dual {
        subnets.push(format!("fd00:10:0:{:x}::/64", i + 1).parse().unwrap());
    }
    subnets
}

/// Writes peers 0..`peers`' leases: one `etcdctl txn` per 128 puts (etcd's default `--max-txn-ops`).
fn load_leases(cluster: &Cluster, peers: u32, dual: bool) {
    let etcd = cluster.etcd.as_ref().unwrap();
    let started = Instant::now();
    let leases: Vec<(String, String)> = (0..peers).map(|i| peer_lease(i, dual)).collect();
    for batch in leases.chunks(128) {
        // No compares, the puts, no failure ops; values quoted as Go's strconv.Unquote reads them.
        let mut script = String::from("\n");
        for (key, value) in batch {
            script.push_str(&format!("put {key} {value:?}\n"));
        }
        script.push_str("\n\n");
        let out = etcd.ctl_in_with_stdin(&cluster.infra, &["txn"], script.as_bytes());
        assert!(out.status.success(), "etcdctl txn: {}", String::from_utf8_lossy(&out.stderr));
    }
    let keys = cluster.etcdctl(&["get", "--prefix", "--keys-only", "/coreos.com/network/subnets/"]);
    let count = String::from_utf8_lossy(&keys.stdout).lines().filter(|l| !l.is_empty()).count();
    assert_eq!(count, peers as usize, "leases in etcd");
    eprintln!("{peers} leases written in {:?}", started.elapsed());
}

/// The figures of one agent's cold start with `peers` leases in etcd.
struct ColdStart {
    elapsed: Duration,
    /// The agent's utime and stime from its start to the end of the cold start.
    cpu: (Duration, Duration),
    /// VmRSS right after the cold start.
    rss_after: String,
    /// One more lease written -> its routes on the agent.
    join: Duration,
    /// VmRSS and VmHWM after the idle period (IPv4 only: None for dual stack).
    idle_rss: Option<(String, String)>,
    idle_cpu_percent: Option<f64>,
    requests_per_minute: Option<f64>,
    etcd_rss: String,
}

const IDLE: Duration = Duration::from_secs(30);

fn cold_start(peers: u32, dual: bool) -> ColdStart {
    let mut cluster = if dual { Cluster::dual(1) } else { Cluster::new(1) };
    cluster.start_etcd(&config(dual), None);
    load_leases(&cluster, peers, dual);
    let index = cluster.add_node(0, &[]);
    let node = &mut cluster.nodes[index];
    let mut nl = node.node.netlink();
    let links: &[(&str, IpFamily)] = if dual {
        &[("flannel.1", IpFamily::V4), ("flannel-v6.1", IpFamily::V6)]
    } else {
        &[("flannel.1", IpFamily::V4)]
    };
    let start = Instant::now();
    node.start();
    let programmed = wait_for(Duration::from_secs(120), || {
        links.iter().all(|&(name, family)| {
            // Routes first: the cheapest dump, and the last to be complete.
            if our_routes(&mut nl, family).len() < peers as usize {
                return false;
            }
            let Ok(Some(link)) = nl.link_by_name(name) else { return false };
            let neighbours = nl.neighbours(family, Some(link.index)).unwrap().len();
            let fdb = nl.fdb(link.index).unwrap().iter().filter(|e| e.dst.is_some()).count();
            neighbours >= peers as usize && fdb >= peers as usize
        })
    });
    assert!(programmed.is_some(), "cold start with {peers} peers (dual {dual}) did not converge: {}", node.log());
    let elapsed = start.elapsed();
    let pid = node.agent.as_ref().unwrap().id();
    let hz = 100.0; // USER_HZ
    let (user, system) = user_system_ticks(pid);
    let cpu = (Duration::from_secs_f64(user as f64 / hz), Duration::from_secs_f64(system as f64 / hz));
    let rss_after = proc_field(pid, "status", "VmRSS:").unwrap_or_default();
    eprintln!("{}", node.log());

    // A join seen by this agent (the clock starts before etcdctl is spawned, as in join_convergence).
    let (key, value) = peer_lease(peers, dual);
    let subnets = peer_subnets(peers, dual);
    let start = Instant::now();
    let out = cluster.etcdctl(&["put", &key, &value]);
    assert!(out.status.success());
    let seen = wait_for(Duration::from_secs(10), || {
        subnets.iter().all(|subnet| {
            let family = if subnet.addr().is_ipv4() { IpFamily::V4 } else { IpFamily::V6 };
            our_routes(&mut nl, family).contains(subnet)
        })
    });
    assert!(seen.is_some(), "join after the cold start with {peers} peers not seen");
    let join = start.elapsed();

    let node = &cluster.nodes[index];
    let (mut idle_rss, mut idle_cpu_percent, mut requests_per_minute) = (None, None, None);
    if !dual {
        std::thread::sleep(Duration::from_secs(2));
        let requests_before = metric(&node.metrics(), "fabricd_etcd_requests_total");
        let ticks_before = cpu_ticks(pid);
        std::thread::sleep(IDLE);
        let ticks = cpu_ticks(pid) - ticks_before;
        let requests_after = metric(&node.metrics(), "fabricd_etcd_requests_total");
        idle_rss = Some((
            proc_field(pid, "status", "VmRSS:").unwrap_or_default(),
            proc_field(pid, "status", "VmHWM:").unwrap_or_default(),
        ));
        idle_cpu_percent = Some(ticks as f64 / hz / IDLE.as_secs_f64() * 100.0);
        if let (Some(before), Some(after)) = (requests_before, requests_after) {
            requests_per_minute = Some((after - before) * 60.0 / IDLE.as_secs_f64());
        }
        let status = node.run(&["status"]);
        eprintln!("status: {}", status.stdout_text.lines().last().unwrap_or(""));
    }
    let etcd_rss = proc_field(cluster.etcd.as_ref().unwrap().pid(), "status", "VmRSS:").unwrap_or_default();
    ColdStart { elapsed, cpu, rss_after, join, idle_rss, idle_cpu_percent, requests_per_minute, etcd_rss }
}

/// A row of the table: the figure, its values at 1,000 and at 5,000 peers, the goal.
fn push_row(rows: &mut Vec<[String; 4]>, figure: &str, [at_1000, at_5000]: [String; 2], goal: &str) {
    rows.push([figure.to_string(), at_1000, at_5000, goal.to_string()]);
}

#[test]
#[ignore = "benchmark: scripts/bench-fabric.sh"]
fn figures() {
    // figure, at 1,000 peers, at 5,000 peers, goal
    let mut rows: Vec<[String; 4]> = Vec::new();
    let none = || "—".to_string();

    // Join convergence across 5 agents, IPv4 then dual stack (a cluster of 5: no peer count).
    let (p50, p99) = join_convergence(false);
    rows.push([
        "join convergence p50 (lease written -> route on all 5 peers, 20 joins)".into(),
        ms(p50),
        none(),
        "≤ 1 s p99".into(),
    ]);
    rows.push(["join convergence p99".into(), ms(p99), none(), "≤ 1 s".into()]);
    let (p50, p99) = join_convergence(true);
    rows.push([
        "dual stack: join convergence p50 (routes of both families on all 5 peers)".into(),
        ms(p50),
        none(),
        "≤ 1 s p99".into(),
    ]);
    rows.push(["dual stack: join convergence p99".into(), ms(p99), none(), "≤ 1 s".into()]);

    // One agent's cold start, then a join it sees, then the agent idle: at 1,000 and at 5,000 peers.
    let v4 = [cold_start(1000, false), cold_start(5000, false)];
    let both = |f: &dyn Fn(&ColdStart) -> String| [f(&v4[0]), f(&v4[1])];
    let mut row = |figure: &str, values: [String; 2], goal: &str| push_row(&mut rows, figure, values, goal);
    row(
        "cold start: N peers in etcd -> N routes + neighbours + FDB entries (agent start to done)",
        both(&|c| ms(c.elapsed)),
        "≤ 1 s at 1,000",
    );
    row("agent CPU time for that cold start: user + system (10 ms ticks)", both(&|c| cpu_time(c.cpu)), "");
    row("agent RSS right after the cold start", both(&|c| c.rss_after.clone()), "");
    row("join seen by that agent (lease written -> its route programmed)", both(&|c| ms(c.join)), "≤ 1 s");
    row(
        "agent RSS, idle with N peers (peak during cold start)",
        both(&|c| c.idle_rss.as_ref().map(|(rss, hwm)| format!("{rss} (peak {hwm})")).unwrap_or_default()),
        "≤ 20 MB at 1,000",
    );
    row(
        &format!("agent CPU, idle with N peers (over {} s, resync every 10 s)", IDLE.as_secs()),
        both(&|c| c.idle_cpu_percent.map(|p| format!("{p:.2} % of one core")).unwrap_or_default()),
        "",
    );
    row(
        "etcd requests per node per minute, steady state (TTL 24 h, renew margin 60 min)",
        both(&|c| c.requests_per_minute.map(|r| format!("{r:.1} (+1 watch stream)")).unwrap_or_default()),
        "",
    );
    row("etcd's RSS holding N leases (+ the config), 1 agent watching", both(&|c| c.etcd_rss.clone()), "");
    drop(v4);

    // Dual stack: N peers with both families, 2N routes, neighbours and FDB entries.
    let dual = [cold_start(1000, true), cold_start(5000, true)];
    let both = |f: &dyn Fn(&ColdStart) -> String| [f(&dual[0]), f(&dual[1])];
    let mut row = |figure: &str, values: [String; 2], goal: &str| push_row(&mut rows, figure, values, goal);
    row(
        "dual stack: cold start, N peers -> 2N routes + neighbours + FDB entries (both families)",
        both(&|c| ms(c.elapsed)),
        "≤ 1 s at 1,000",
    );
    row("dual stack: agent CPU time for that cold start: user + system", both(&|c| cpu_time(c.cpu)), "");
    row("dual stack: agent RSS right after the cold start", both(&|c| c.rss_after.clone()), "≤ 20 MB at 1,000");
    row("dual stack: join seen by that agent (routes of both families)", both(&|c| ms(c.join)), "≤ 1 s");

    let mut table = String::from("| figure | N = 1,000 peers | N = 5,000 peers | goal |\n| --- | --- | --- | --- |\n");
    for [figure, at_1000, at_5000, goal] in &rows {
        table.push_str(&format!("| {figure} | {at_1000} | {at_5000} | {goal} |\n"));
    }
    println!("{table}");
    if let Some(path) = std::env::var_os("FABRIC_BENCH_OUT") {
        std::fs::write(path, &table).unwrap();
    }
}
