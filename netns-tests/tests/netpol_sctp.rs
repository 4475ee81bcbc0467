//! NetworkPolicy `ports` with `protocol: SCTP`, judged on real SCTP associations (issue 37). This machine's
//! kernel has no SCTP; the VM lane's Debian 6.1 and 6.12 do (module `sctp`, loaded when the first SCTP socket
//! is made), so the test runs there (scripts/vm-lane.sh lists it for both kernels). On a kernel without SCTP
//! it says it is skipped; in the lane (`CNI_TEST_KERNEL_LANE=1`) a kernel without SCTP fails it.
//!
//! The node is the netpol suite's kubenet node (bridge chain, dual stack, `cni-netpol run --static`) with
//! pods `x/a` (SCTP servers on 80 and 81), `y/a` and `y/b`. With no policy every association is made (the
//! baseline: SCTP works through the node). Then `x/a` admits SCTP 80 from `y/a` only, and `x/a`'s egress and
//! `y`'s ingress are denied outright, so that the INIT-ACK and the answer's DATA chunks reach `y/a` only as
//! replies (connection tracking): `y/a` → `x/a` SCTP 80 is an association with data both ways; SCTP 81, TCP 80
//! and `y/b` → `x/a` SCTP 80 are dropped (no association within the wait); both families.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use netns_tests::linkrig::{in_kernel_lane, kernel_release};
use netns_tests::netpol::{namespaces_json, policy, reaches, PolicyNode, Proto};
use netns_tests::{json, TestNetns, Value};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const IPPROTO_SCTP: i32 = 132;

/// A one-to-one style SCTP socket (`SOCK_STREAM`, `IPPROTO_SCTP`) of the family of `addr`, made in `ns`.
fn sctp_socket(ns: &TestNetns, v6: bool) -> std::io::Result<Socket> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    ns.run(|| Socket::new(domain, Type::STREAM, Some(Protocol::from(IPPROTO_SCTP))))
}

/// True when this kernel makes SCTP sockets; false after saying the test is skipped. In the VM lane a kernel
/// without SCTP fails the test.
fn skip_without_sctp() -> bool {
    let ns = TestNetns::new("sctp");
    let made = sctp_socket(&ns, false);
    match made {
        Ok(_) => false,
        Err(e) => {
            assert!(!in_kernel_lane(), "the VM lane's kernel ({}) has no SCTP ({e}): CONFIG_IP_SCTP", kernel_release());
            eprintln!("skipped: this kernel ({}) has no SCTP ({e}; CONFIG_IP_SCTP)", kernel_release());
            true
        }
    }
}

/// An SCTP server in a pod (both families) that reads the client's "hi" and answers "ok" on each association;
/// stopped on drop.
struct SctpServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SctpServer {
    fn start(ns: &TestNetns, port: u16) -> SctpServer {
        let listener = sctp_socket(ns, true).unwrap_or_else(|e| panic!("SCTP socket in {}: {e}", ns.name));
        listener.set_only_v6(false).expect("dual-stack listener");
        listener.set_reuse_address(true).expect("SO_REUSEADDR");
        let any = SockAddr::from(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port));
        listener.bind(&any).unwrap_or_else(|e| panic!("SCTP bind {port} in {}: {e}", ns.name));
        listener.listen(16).expect("listen");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((association, _)) => answer(association),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        SctpServer { stop, thread: Some(thread) }
    }
}

/// Reads the client's greeting and answers it.
fn answer(mut association: Socket) {
    let _ = association.set_nonblocking(false);
    let _ = association.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 2];
    if association.read_exact(&mut buf).is_ok() && &buf == b"hi" {
        let _ = association.write_all(b"ok");
    }
}

impl Drop for SctpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Whether an SCTP association from `from` to `to` is set up within `wait` and carries "hi" there and "ok"
/// back.
fn sctp_reaches(from: &TestNetns, to: SocketAddr, wait: Duration) -> bool {
    let Ok(mut socket) = sctp_socket(from, to.is_ipv6()) else { return false };
    if socket.connect_timeout(&SockAddr::from(to), wait).is_err() {
        return false;
    }
    let _ = socket.set_read_timeout(Some(wait));
    let mut answer = [0u8; 2];
    socket.write_all(b"hi").is_ok() && socket.read_exact(&mut answer).is_ok() && &answer == b"ok"
}

#[test]
fn sctp_ports_on_real_associations() {
    if skip_without_sctp() {
        return;
    }
    let mut node = PolicyNode::empty(false);
    for (namespace, name) in [("x", "a"), ("y", "a"), ("y", "b")] {
        let pod = node.add_pod(namespace, name);
        node.pods.push(pod);
    }
    let server = &node.pod("x/a");
    let _servers: Vec<SctpServer> = [80, 81].map(|port| SctpServer::start(&server.netns, port)).into();
    let cluster = |policies: &[Value]| {
        let pods: Vec<Value> = node.pods.iter().map(|p| p.json()).collect();
        json!({"namespaces": namespaces_json(), "pods": pods, "policies": policies})
    };
    node.write_cluster(&cluster(&[]));
    let _agent = node.start_agent();
    netns_tests::wait_for(Duration::from_secs(10), || node.applied() > 0).expect("the agent's first table");

    let (y_a, y_b) = (&node.pod("y/a").netns, &node.pod("y/b").netns);
    let allowed = netns_tests::scaled(Duration::from_secs(3));
    let denied = netns_tests::scaled(Duration::from_millis(1500));
    for v6 in [false, true] {
        for port in [80, 81] {
            let to = SocketAddr::new(server.ip(v6), port);
            assert!(sctp_reaches(y_a, to, allowed), "no policy: y/a -> x/a SCTP {port} (v6 {v6})");
            assert!(sctp_reaches(y_b, to, allowed), "no policy: y/b -> x/a SCTP {port} (v6 {v6})");
        }
    }

    let policies = [
        policy(
            "x",
            "a-sctp-80-from-y-a",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "a"}}}],
            "ports": [{"protocol": "SCTP", "port": 80}]}]}),
        ),
        policy("y", "deny-ingress", json!({"podSelector": {}})),
    ];
    node.apply(&cluster(&policies));
    for v6 in [false, true] {
        let to = |port| SocketAddr::new(server.ip(v6), port);
        // x/a's egress and y/a's ingress are denied: the association's INIT-ACK and the "ok" pass as replies.
        assert!(sctp_reaches(y_a, to(80), allowed), "y/a -> x/a SCTP 80, with conntrack's replies (v6 {v6})");
        assert!(!sctp_reaches(y_a, to(81), denied), "SCTP 81 is not admitted (v6 {v6})");
        assert!(!reaches(y_a, to(80), Proto::Tcp, denied), "TCP 80 is not SCTP 80 (v6 {v6})");
        assert!(!sctp_reaches(y_b, to(80), denied), "y/b is no peer of x/a (v6 {v6})");
        // x/a's egress is denied: it starts no association of its own towards y/a (not a reply).
        assert!(!reaches(&server.netns, SocketAddr::new(node.pod("y/a").ip(v6), 80), Proto::Tcp, denied));
    }
    let ruleset = node.kubenet.node.exec("nft", &["list", "table", "inet", "cni-netpol"], &[], b"");
    let ruleset = String::from_utf8_lossy(&ruleset.stdout);
    assert!(ruleset.contains("sctp"), "the SCTP rule in the agent's table:\n{ruleset}");
}
