//! The figures of fabricd (issue 16), run by scripts/bench-fabric.sh (ignored by the test suite: these are
//! measurements, not tests). Prints a markdown table on stdout and, with FABRIC_BENCH_OUT set, writes it there.
//!
//! - join convergence: a new lease written to etcd -> the route to it present on every peer (5 agents), over
//!   20 joins; the clock starts before `etcdctl put` is spawned, so the figure includes that process's start.
//! - cold start: 1,000 peers' leases already in etcd -> one agent started -> all 1,000 routes, neighbours
//!   and FDB entries programmed.
//! - RSS and CPU of that agent while idle with 1,000 peers, and its etcd requests per minute (its counter).
//! - the same join convergence and cold start for a dual-stack cluster (IPv4 and IPv6 underlay, both
//!   families' routes on every peer; 1,000 dual-stack peers: 2,000 routes, neighbours and FDB entries).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use cnicore::netlink::{IpFamily, RT_TABLE_MAIN};
use netns_tests::fabric::{segment_ip, segment_ip6, wait_for, Cluster};
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

fn config_dual() -> Value {
    config(true)
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

fn proc_field(pid: u32, file: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    text.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

fn metric(node: &netns_tests::fabric::FabricNode, name: &str) -> Option<f64> {
    let out = node.node.exec("curl", &["-s", "http://127.0.0.1:9799/metrics"], &[], b"");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} ")).and_then(|v| v.parse().ok()))
}

#[test]
#[ignore = "benchmark: scripts/bench-fabric.sh"]
fn figures() {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let config = config(false);

    // Join convergence, IPv4 then dual stack.
    let (p50, p99) = join_convergence(false);
    rows.push((
        "join convergence p50 (lease written -> route on all 5 peers, 20 joins)".into(),
        ms(p50),
        "≤ 1 s p99".into(),
    ));
    rows.push(("join convergence p99".into(), ms(p99), "≤ 1 s".into()));
    let (p50, p99) = join_convergence(true);
    rows.push((
        "dual stack: join convergence p50 (routes of both families on all 5 peers)".into(),
        ms(p50),
        "≤ 1 s p99".into(),
    ));
    rows.push(("dual stack: join convergence p99".into(), ms(p99), "≤ 1 s".into()));

    // Cold start with 1,000 peers, then the idle agent.
    {
        let mut cluster = Cluster::new(1);
        cluster.start_etcd(&config, None);
        let endpoint = cluster.etcd.as_ref().unwrap().endpoint.clone();
        let started = Instant::now();
        let peers = 1000u32;
        let mut pending = Vec::new();
        for i in 0..peers {
            let ip = Ipv4Addr::new(10, 99, (i / 250) as u8, (i % 250 + 1) as u8);
            let key = format!("/coreos.com/network/subnets/10.{}.{}.0-24", 1 + i / 256, i % 256);
            let mut command = netns_tests::upstream::clean_command(&cluster.infra, "etcdctl");
            command.env("ETCDCTL_API", "3").arg(format!("--endpoints={endpoint}")).args([
                "put",
                &key,
                &vxlan_lease(ip),
            ]);
            command.stdout(std::process::Stdio::null());
            pending.push(command.spawn().unwrap());
            if pending.len() == 50 {
                for mut child in pending.drain(..) {
                    assert!(child.wait().unwrap().success());
                }
            }
        }
        for mut child in pending.drain(..) {
            assert!(child.wait().unwrap().success());
        }
        eprintln!("1,000 leases written in {:?}", started.elapsed());
        let index = cluster.add_node(0, &[]);
        let node = &mut cluster.nodes[index];
        let mut nl = node.node.netlink();
        let start = Instant::now();
        node.start();
        let programmed = wait_for(Duration::from_secs(60), || {
            let routes = nl.routes(IpFamily::V4, RT_TABLE_MAIN).unwrap().iter().filter(|r| r.protocol == PROTO).count();
            if routes < peers as usize {
                return false;
            }
            let Ok(Some(link)) = nl.link_by_name("flannel.1") else { return false };
            let neighbours = nl.neighbours(IpFamily::V4, Some(link.index)).unwrap().len();
            let fdb = nl.fdb(link.index).unwrap().iter().filter(|e| e.dst.is_some()).count();
            neighbours >= peers as usize && fdb >= peers as usize
        });
        assert!(programmed.is_some(), "cold start did not converge: {}", node.log());
        let cold = start.elapsed();
        rows.push((
            "cold start, 1,000 peers in etcd -> 1,000 routes + neighbours + FDB entries (agent start to done)".into(),
            ms(cold),
            "≤ 1 s".into(),
        ));
        let log = node.log();
        eprintln!("{log}");

        let pid = node.agent.as_ref().unwrap().id();
        std::thread::sleep(Duration::from_secs(2));
        let requests_before = metric(node, "fabricd_etcd_requests_total");
        let ticks_before = cpu_ticks(pid);
        let idle = Duration::from_secs(30);
        std::thread::sleep(idle);
        let ticks = cpu_ticks(pid) - ticks_before;
        let requests_after = metric(node, "fabricd_etcd_requests_total");
        let rss = proc_field(pid, "status", "VmRSS:").unwrap_or_default();
        let hwm = proc_field(pid, "status", "VmHWM:").unwrap_or_default();
        let hz = 100.0; // USER_HZ
        let cpu = ticks as f64 / hz / idle.as_secs_f64() * 100.0;
        rows.push((
            "agent RSS, idle with 1,000 peers (peak during cold start)".into(),
            format!("{rss} (peak {hwm})"),
            "≤ 20 MB".into(),
        ));
        rows.push((
            format!("agent CPU, idle with 1,000 peers (over {} s, resync every 10 s)", idle.as_secs()),
            format!("{cpu:.2} % of one core"),
            String::new(),
        ));
        if let (Some(before), Some(after)) = (requests_before, requests_after) {
            let per_minute = (after - before) * 60.0 / idle.as_secs_f64();
            rows.push((
                "etcd requests per node per minute, steady state (TTL 24 h, renew margin 60 min)".into(),
                format!("{per_minute:.1} (+1 watch stream)"),
                String::new(),
            ));
        }
        let status = node.run(&["status"]);
        eprintln!("status: {}", status.stdout_text.lines().last().unwrap_or(""));
    }

    // Cold start with 1,000 dual-stack peers.
    {
        let mut cluster = Cluster::dual(1);
        cluster.start_etcd(&config_dual(), None);
        let endpoint = cluster.etcd.as_ref().unwrap().endpoint.clone();
        let peers = 1000u32;
        let mut pending = Vec::new();
        for i in 0..peers {
            let ip = Ipv4Addr::new(10, 99, (i / 250) as u8, (i % 250 + 1) as u8);
            let ip6 = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, i as u16 + 1);
            let key =
                format!("/coreos.com/network/subnets/10.{}.{}.0-24&fd00:10:0:{:x}::-64", 1 + i / 256, i % 256, i + 1);
            let mut command = netns_tests::upstream::clean_command(&cluster.infra, "etcdctl");
            command.env("ETCDCTL_API", "3").arg(format!("--endpoints={endpoint}")).args([
                "put",
                &key,
                &dual_lease(ip, ip6, i),
            ]);
            command.stdout(std::process::Stdio::null());
            pending.push(command.spawn().unwrap());
            if pending.len() == 50 {
                for mut child in pending.drain(..) {
                    assert!(child.wait().unwrap().success());
                }
            }
        }
        for mut child in pending.drain(..) {
            assert!(child.wait().unwrap().success());
        }
        let index = cluster.add_node(0, &[]);
        let node = &mut cluster.nodes[index];
        let mut nl = node.node.netlink();
        let start = Instant::now();
        node.start();
        let programmed = wait_for(Duration::from_secs(60), || {
            if our_routes(&mut nl, IpFamily::V4).len() < peers as usize
                || our_routes(&mut nl, IpFamily::V6).len() < peers as usize
            {
                return false;
            }
            [("flannel.1", IpFamily::V4), ("flannel-v6.1", IpFamily::V6)].into_iter().all(|(name, family)| {
                let Ok(Some(link)) = nl.link_by_name(name) else { return false };
                let neighbours = nl.neighbours(family, Some(link.index)).unwrap().len();
                let fdb = nl.fdb(link.index).unwrap().iter().filter(|e| e.dst.is_some()).count();
                neighbours >= peers as usize && fdb >= peers as usize
            })
        });
        assert!(programmed.is_some(), "dual-stack cold start did not converge: {}", node.log());
        rows.push((
            "dual stack: cold start, 1,000 peers -> 2,000 routes + neighbours + FDB entries (both families)".into(),
            ms(start.elapsed()),
            "≤ 1 s".into(),
        ));
        let pid = node.agent.as_ref().unwrap().id();
        let rss = proc_field(pid, "status", "VmRSS:").unwrap_or_default();
        rows.push(("dual stack: agent RSS with 1,000 peers".into(), rss, "≤ 20 MB".into()));
    }

    let mut table = String::from("| figure | measured | goal |\n| --- | --- | --- |\n");
    for (figure, value, goal) in &rows {
        table.push_str(&format!("| {figure} | {value} | {goal} |\n"));
    }
    println!("{table}");
    if let Some(path) = std::env::var_os("FABRIC_BENCH_OUT") {
        std::fs::write(path, &table).unwrap();
    }
    let _: Option<Value> = None;
}
