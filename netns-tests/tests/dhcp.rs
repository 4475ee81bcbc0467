//! The dhcp IPAM plugin and its daemon against a real DHCP server (Debian's dnsmasq) in a namespace of the
//! test, with ours and with the reference (1.1.1):
//!
//! ```text
//!   pod (eth0: the lease) --veth-- server (s0 10.77.0.1/24, dnsmasq)        node: the dhcp daemon
//! ```
//!
//! The daemon runs in the node namespace with its socket and state in the test's directory; it is killed by
//! PID when the test ends. Plugin and daemon speak Go's net/rpc as the reference does: the reference plugin
//! is tested with our daemon and ours with theirs. dnsmasq's own lease file is the witness: the pod's address is its entry, and the
//! entry goes when DEL releases the lease. A packet socket on the server's side records every message to
//! port 67, to show how renewals are sent (RFC 2131 §4.3.6). dnsmasq names T1 = 4 s (its shortest lease is
//! two minutes), so renewals come within the test. Build first (`cargo build -p dhcp`).

use std::fs;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netns_tests::daemon::{on_path, require};
use netns_tests::fabric::{wait_for, Daemon};
use netns_tests::upstream::{clean_command, output, reference};
use netns_tests::{bin, json, veth_between, Node, PluginOutput, TestNetns, Value};

const NETWORK: &str = "dhcpnet";
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

fn have_dnsmasq() -> bool {
    require("dnsmasq", on_path("dnsmasq"), "scripts/setup.sh installs dnsmasq-base")
}

/// A DHCP message seen by the server's side of the link.
#[derive(Debug, Clone)]
struct Seen {
    ip_dst: Ipv4Addr,
    /// The BOOTP flags (0x8000: answer by broadcast).
    flags: u16,
    kind: u8,
    ciaddr: Ipv4Addr,
    options: Vec<u8>,
    chaddr: [u8; 6],
}

/// Records what is sent to port 67 on `ifname` in `ns` until dropped.
struct Capture {
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn parse_request(p: &[u8]) -> Option<Seen> {
    if p.len() < 20 || p[0] >> 4 != 4 || p[9] != 17 {
        return None;
    }
    let ihl = usize::from(p[0] & 0xf) * 4;
    let ip_dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
    let udp = p.get(ihl..)?;
    if u16::from_be_bytes([*udp.get(2)?, *udp.get(3)?]) != 67 {
        return None;
    }
    let d = udp.get(8..)?;
    if d.len() < 240 || d[0] != 1 {
        return None;
    }
    let ciaddr = Ipv4Addr::new(d[12], d[13], d[14], d[15]);
    let flags = u16::from_be_bytes([d[10], d[11]]);
    let chaddr: [u8; 6] = d[28..34].try_into().ok()?;
    let (mut options, mut kind, mut rest) = (Vec::new(), 0, &d[240..]);
    while let Some((&code, tail)) = rest.split_first() {
        match code {
            0 => rest = tail,
            255 => break,
            _ => {
                let (&len, tail) = tail.split_first()?;
                let value = tail.get(..usize::from(len))?;
                if code == 53 {
                    kind = *value.first()?;
                }
                options.push(code);
                rest = &tail[usize::from(len)..];
            }
        }
    }
    Some(Seen { ip_dst, flags, kind, ciaddr, options, chaddr })
}

impl Capture {
    fn start(ns: &TestNetns, ifname: &str) -> Capture {
        let index = ns.netlink().require_link(ifname).expect("capture link").index;
        let fd = ns.run(|| {
            // SAFETY: plain socket(2) and bind(2) on a sockaddr_ll of ours; the descriptor is owned at once.
            unsafe {
                let fd = libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(0x0800u16.to_be()));
                assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
                let fd = OwnedFd::from_raw_fd(fd);
                let mut sll: libc::sockaddr_ll = std::mem::zeroed();
                sll.sll_family = libc::AF_PACKET as u16;
                sll.sll_protocol = 0x0800u16.to_be();
                sll.sll_ifindex = index as i32;
                let r = libc::bind(fd.as_raw_fd(), (&sll as *const libc::sockaddr_ll).cast(), size_of_val(&sll) as u32);
                assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
                let tv = libc::timeval { tv_sec: 0, tv_usec: 200_000 };
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&tv as *const libc::timeval).cast(),
                    size_of_val(&tv) as u32,
                );
                fd
            }
        });
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: recv writes at most buf.len() bytes into buf.
                    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                    if n > 0 {
                        if let Some(s) = parse_request(&buf[..n as usize]) {
                            seen.lock().unwrap().push(s);
                        }
                    }
                }
            })
        };
        Capture { seen, stop, thread: Some(thread) }
    }

    fn requests(&self, mac: [u8; 6]) -> Vec<Seen> {
        self.seen.lock().unwrap().iter().filter(|s| s.chaddr == mac).cloned().collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// dnsmasq serving 10.77.0.10-50 on `s0` of the server namespace, its lease file and log in `dir`.
struct Dnsmasq {
    leases: PathBuf,
    log: PathBuf,
    _daemon: Daemon,
}

impl Dnsmasq {
    fn start(server: &TestNetns, dir: &Path) -> Dnsmasq {
        Dnsmasq::start_with(server, dir, 4, 100, &[])
    }

    /// With T1 and T2 of `t1` and `t2` seconds (the lease is two minutes, dnsmasq's shortest).
    fn start_with(server: &TestNetns, dir: &Path, t1: u32, t2: u32, extra: &[&str]) -> Dnsmasq {
        let leases = dir.join("dnsmasq.leases");
        let log = dir.join("dnsmasq.log");
        let mut command = server.command("dnsmasq");
        command
            .args(["--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--port=0"])
            .args(["--interface=s0", "--bind-interfaces", "--user=root", "--group=root", "--log-dhcp"])
            .args(["--dhcp-authoritative", "--dhcp-range=10.77.0.10,10.77.0.50,255.255.255.0,2m"])
            .arg("--dhcp-option=option:router,10.77.0.1")
            .arg(format!("--dhcp-option=option:T1,{t1}"))
            .arg(format!("--dhcp-option=option:T2,{t2}"))
            .args(extra)
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            .arg(format!("--log-facility={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let daemon = Daemon::spawn(&mut command);
        assert!(wait_for(Duration::from_secs(10), || log.exists()).is_some(), "dnsmasq did not start");
        Dnsmasq { leases, log, _daemon: daemon }
    }

    /// (mac, ip, client id) of each lease in dnsmasq's file. dnsmasq rewrites the file in place (rewind,
    /// write, truncate), so a read can catch it half written: read until two reads agree.
    fn leases(&self) -> Vec<(String, Ipv4Addr, String)> {
        let read = || fs::read_to_string(&self.leases).unwrap_or_default();
        let mut text = read();
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(20));
            let again = read();
            if again == text {
                break;
            }
            text = again;
        }
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((f.get(1)?.to_string(), f.get(2)?.parse().ok()?, f.get(4)?.to_string()))
            })
            .collect()
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The dhcp daemon (`binary daemon`), in the node namespace, socket and state in the node's directory.
struct DhcpDaemon {
    socket: PathBuf,
    log: PathBuf,
    daemon: Daemon,
}

impl DhcpDaemon {
    fn start(node: &Node, binary: &Path, extra: &[&str], tag: &str) -> DhcpDaemon {
        let socket = node.dir().join(format!("{tag}.sock"));
        let log = node.dir().join(format!("{tag}-{}.log", netns_tests::unique_name("")));
        let mut command = clean_command(node, binary);
        command.arg("daemon").arg("-socketpath").arg(&socket).args(extra);
        command.stdout(Stdio::null()).stderr(fs::File::create(&log).expect("daemon log"));
        let daemon = Daemon::spawn(&mut command);
        // Accepting, not only there: a restarted daemon finds the socket file its predecessor left.
        let listening = || std::os::unix::net::UnixStream::connect(&socket).is_ok();
        let log_text = || fs::read_to_string(&log).unwrap_or_default();
        assert!(
            wait_for(Duration::from_secs(10), listening).is_some(),
            "the dhcp daemon did not start: {}",
            log_text()
        );
        DhcpDaemon { socket, log, daemon }
    }

    /// Our daemon, its state in the node's `state` directory (kept across restarts of the daemon).
    fn ours(node: &Node, extra: &[&str]) -> DhcpDaemon {
        let state = node.dir().join("state");
        let mut flags = vec!["-statedir", state.to_str().expect("a UTF-8 path")];
        flags.extend_from_slice(extra);
        DhcpDaemon::start(node, &bin("dhcp"), &flags, "ours")
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

struct Lan {
    node: Node,
    _server: TestNetns,
    pod: TestNetns,
    mac: [u8; 6],
    dnsmasq: Dnsmasq,
    capture: Capture,
}

impl Lan {
    fn new() -> Lan {
        Lan::with_times(4, 100)
    }

    fn with_times(t1: u32, t2: u32) -> Lan {
        let node = Node::new();
        let server = TestNetns::new("srv");
        let pod = node.pod_netns();
        veth_between(&server, &pod, "s0", "eth0", &["10.77.0.1/24".parse().unwrap()], &[]);
        let mac = pod.netlink().require_link("eth0").unwrap().mac.expect("a MAC");
        let capture = Capture::start(&server, "s0");
        let dnsmasq = Dnsmasq::start_with(&server, node.dir(), t1, t2, &[]);
        Lan { node, _server: server, pod, mac, dnsmasq, capture }
    }

    fn mac_text(&self) -> String {
        self.mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
    }

    fn conf(&self, socket: &Path) -> Value {
        json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "macvlan",
               "ipam": {"type": "dhcp", "daemonSocketPath": socket}})
    }

    fn run(&self, plugin: &Path, command: &str, conf: &Value) -> PluginOutput {
        self.run_in(plugin, command, conf, Some(&self.pod.path))
    }

    /// As the runtime calls: `netns` `None` is a DEL with `CNI_NETNS` unset (containerd's later DELs).
    fn run_in(&self, plugin: &Path, command: &str, conf: &Value, netns: Option<&Path>) -> PluginOutput {
        let mut c = clean_command(&self.node, plugin);
        c.env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", "ctr1")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/nonexistent");
        if let Some(netns) = netns {
            c.env("CNI_NETNS", netns);
        }
        output(&mut c, conf.to_string().as_bytes())
    }

    /// The leased address, checked against dnsmasq's table, then put on eth0 as an interface plugin would.
    fn expect_lease(&self, result: &Value) -> Ipv4Addr {
        let address = result["ips"][0]["address"].as_str().expect("an address");
        let ip: Ipv4Addr = address.split('/').next().unwrap().parse().unwrap();
        assert!(address.ends_with("/24"), "{result}");
        assert_eq!(result["ips"][0]["gateway"], "10.77.0.1", "{result}");
        assert_eq!(result["routes"], json!([{"dst": "0.0.0.0/0", "gw": "10.77.0.1"}]), "{result}");
        let leases = self.dnsmasq.leases();
        assert!(
            leases.iter().any(|(mac, lip, _)| *mac == self.mac_text() && *lip == ip),
            "dnsmasq's lease table {leases:?} lacks {ip} for {}",
            self.mac_text()
        );
        self.pod.ip(&["addr", "add", address, "dev", "eth0"]);
        ip
    }

    fn released(&self, ip: Ipv4Addr) -> bool {
        wait_for(Duration::from_secs(10), || !self.dnsmasq.leases().iter().any(|(_, l, _)| *l == ip)).is_some()
    }

    /// Renewals (and rebindings) seen: REQUESTs with ciaddr = `ip`.
    fn renewals(&self, ip: Ipv4Addr) -> Vec<Seen> {
        self.capture.requests(self.mac).into_iter().filter(|s| s.kind == 3 && s.ciaddr == ip).collect()
    }
}

fn client_id_hex(container: &str, ifname: &str) -> String {
    let mut bytes = vec![0u8];
    bytes.extend_from_slice(format!("{container}/{NETWORK}/{ifname}").as_bytes());
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

#[test]
fn ours_lease_renewed_unicast_and_released_on_del() {
    if !have_dnsmasq() {
        return;
    }
    let lan = Lan::new();
    let state = lan.node.dir().join("state");
    let daemon = DhcpDaemon::ours(&lan.node, &["-timeout", "3s"]);
    let conf = lan.conf(&daemon.socket);
    let out = lan.run(&bin("dhcp"), "ADD", &conf);
    let ip = lan.expect_lease(out.expect_ok());
    // The client ID as the reference builds it.
    let leases = lan.dnsmasq.leases();
    assert_eq!(leases[0].2, client_id_hex("ctr1", "eth0"), "{leases:?}");
    // The lease is saved for a restarted daemon.
    assert_eq!(fs::read_dir(&state).unwrap().count(), 1);

    // Renewed at T1 (4 s): a REQUEST unicast to the server from the leased address, ciaddr set, no
    // requested-IP (50) or server-id (54) option (RFC 2131 §4.3.6; reference #1092).
    assert!(
        wait_for(Duration::from_secs(30), || !lan.renewals(ip).is_empty()).is_some(),
        "no renewal within 30 s; daemon log:\n{}\ndnsmasq log:\n{}",
        daemon.log(),
        lan.dnsmasq.log()
    );
    let renewal = &lan.renewals(ip)[0];
    assert_eq!(renewal.ip_dst, SERVER, "renewals are unicast to the server: {renewal:?}");
    assert!(!renewal.options.contains(&50) && !renewal.options.contains(&54), "{renewal:?}");
    assert!(
        wait_for(Duration::from_secs(5), || daemon.log().contains("renewing done")).is_some(),
        "the renewal got no ACK:\n{}",
        daemon.log()
    );
    // CHECK finds the lease; a second ADD returns the same one.
    lan.run(&bin("dhcp"), "CHECK", &conf).expect_ok();
    let again = lan.run(&bin("dhcp"), "ADD", &conf);
    assert_eq!(again.expect_ok()["ips"][0]["address"], out.stdout["ips"][0]["address"]);

    // DEL: a RELEASE with ciaddr = the lease, unicast; dnsmasq frees it (reference #1278).
    lan.run(&bin("dhcp"), "DEL", &conf).expect_ok();
    assert!(lan.released(ip), "dnsmasq still lists {ip}: {:?}\n{}", lan.dnsmasq.leases(), lan.dnsmasq.log());
    let release = lan.capture.requests(lan.mac).into_iter().find(|s| s.kind == 7).expect("a DHCPRELEASE");
    assert_eq!((release.ciaddr, release.ip_dst), (ip, SERVER), "{release:?}");
    assert_eq!(fs::read_dir(&state).unwrap().count(), 0, "the state file goes with the lease");
    // CHECK now fails; DEL again succeeds.
    assert!(!lan.run(&bin("dhcp"), "CHECK", &conf).success());
    lan.run(&bin("dhcp"), "DEL", &conf).expect_ok();
    drop(daemon);
}

#[test]
fn ours_lease_kept_across_a_daemon_restart() {
    if !have_dnsmasq() {
        return;
    }
    let lan = Lan::new();
    let mut first = DhcpDaemon::ours(&lan.node, &["-timeout", "3s"]);
    let conf = lan.conf(&first.socket);
    let ip = lan.expect_lease(lan.run(&bin("dhcp"), "ADD", &conf).expect_ok());
    // Killed outright (no chance to save anything more), then started again on the same state.
    first.daemon.stop(nix::sys::signal::Signal::SIGKILL);
    let before = lan.renewals(ip).len();
    let second = DhcpDaemon::ours(&lan.node, &["-timeout", "3s"]);
    assert_eq!(second.socket, first.socket);
    // The new daemon renews the lease it found (reference #767).
    assert!(
        wait_for(Duration::from_secs(30), || lan.renewals(ip).len() > before && second.log().contains("renewing done"))
            .is_some(),
        "the restarted daemon did not renew; its log:\n{}",
        second.log()
    );
    assert!(second.log().contains("resuming the lease"), "{}", second.log());
    // CHECK and DEL after the restart: the lease is known, and released (by a DEL without CNI_NETNS: the
    // daemon sends from the netns it saved).
    lan.run(&bin("dhcp"), "CHECK", &conf).expect_ok();
    lan.run_in(&bin("dhcp"), "DEL", &conf, None).expect_ok();
    assert!(lan.released(ip), "dnsmasq still lists {ip}: {:?}", lan.dnsmasq.leases());
}

/// A daemon down for longer than the lease (the saved lease is aged past its two minutes before the
/// restart): the new daemon asks for the address again (INIT-REBOOT: a broadcast REQUEST with option 50, no
/// `ciaddr`, no server identifier) and keeps it, instead of bringing the pod's interface down at once.
#[test]
fn ours_lease_back_after_a_restart_past_its_expiry() {
    if !have_dnsmasq() {
        return;
    }
    let lan = Lan::new();
    let state = lan.node.dir().join("state");
    let mut first = DhcpDaemon::ours(&lan.node, &["-timeout", "3s"]);
    let conf = lan.conf(&first.socket);
    let ip = lan.expect_lease(lan.run(&bin("dhcp"), "ADD", &conf).expect_ok());
    first.daemon.stop(nix::sys::signal::Signal::SIGKILL);
    let file = fs::read_dir(&state).unwrap().next().expect("a saved lease").unwrap().path();
    let mut saved: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    saved["bound_at_ms"] = json!(now_ms - 200_000);
    fs::write(&file, saved.to_string()).unwrap();

    let second = DhcpDaemon::ours(&lan.node, &["-timeout", "3s"]);
    assert!(
        wait_for(Duration::from_secs(30), || second.log().contains("INIT-REBOOT after the expiry done")).is_some(),
        "no INIT-REBOOT; log:\n{}",
        second.log()
    );
    let reboot = lan
        .capture
        .requests(lan.mac)
        .into_iter()
        .find(|s| s.kind == 3 && s.ciaddr.is_unspecified() && s.options.contains(&50) && !s.options.contains(&54))
        .expect("an INIT-REBOOT REQUEST");
    assert_eq!(reboot.ip_dst, Ipv4Addr::BROADCAST, "{reboot:?}");
    let eth0 = lan.pod.netlink().require_link("eth0").unwrap();
    assert!(eth0.up, "the pod's interface stays up");
    lan.run(&bin("dhcp"), "DEL", &conf).expect_ok();
    assert!(lan.released(ip), "dnsmasq still lists {ip}");
}

/// T1 = 4 s, T2 = 8 s, and the server's netns drops unicast DHCP (nftables there): the renewal gets no
/// answer, and at T2 the daemon rebinds, broadcast with `ciaddr` and without options 50/54, and dnsmasq's
/// ACK extends the lease.
#[test]
fn ours_rebinds_at_t2_when_renewals_go_unanswered() {
    if !have_dnsmasq() || !require("nft", on_path("nft"), "scripts/setup.sh installs nftables") {
        return;
    }
    let lan = Lan::with_times(4, 8);
    let drop_unicast = "table inet dhcptest {\n chain input {\n type filter hook input priority 0;\n \
                        ip daddr 10.77.0.1 udp dport 67 drop\n }\n}\n";
    let nft = lan._server.exec("nft", &["-f", "-"], &[], drop_unicast.as_bytes());
    assert!(nft.status.success(), "nft: {}", String::from_utf8_lossy(&nft.stderr));
    let daemon = DhcpDaemon::ours(&lan.node, &["-timeout", "2s"]);
    let conf = lan.conf(&daemon.socket);
    let ip = lan.expect_lease(lan.run(&bin("dhcp"), "ADD", &conf).expect_ok());
    assert!(
        wait_for(Duration::from_secs(40), || daemon.log().contains("rebinding done")).is_some(),
        "no rebinding; daemon log:\n{}",
        daemon.log()
    );
    let renewals = lan.renewals(ip);
    let unicast = renewals.iter().find(|s| s.ip_dst == SERVER).expect("a renewal unicast to the server first");
    let rebind = renewals.iter().find(|s| s.ip_dst == Ipv4Addr::BROADCAST).expect("a broadcast rebinding");
    for r in [unicast, rebind] {
        assert!(!r.options.contains(&50) && !r.options.contains(&54), "{r:?}");
    }
    assert!(daemon.log().contains("renewing failed"), "{}", daemon.log());
    lan.run(&bin("dhcp"), "DEL", &conf).expect_ok();
}

/// `-broadcast`: DISCOVER and REQUEST ask for broadcast answers (the BOOTP flag), and the lease comes.
#[test]
fn ours_broadcast_flag() {
    if !have_dnsmasq() {
        return;
    }
    let lan = Lan::new();
    let daemon = DhcpDaemon::ours(&lan.node, &["-broadcast"]);
    let conf = lan.conf(&daemon.socket);
    lan.expect_lease(lan.run(&bin("dhcp"), "ADD", &conf).expect_ok());
    let sent = lan.capture.requests(lan.mac);
    assert!(sent.iter().any(|s| s.kind == 1) && sent.iter().any(|s| s.kind == 3), "{sent:?}");
    assert!(sent.iter().filter(|s| s.kind == 1 || s.kind == 3).all(|s| s.flags == 0x8000), "{sent:?}");
    lan.run(&bin("dhcp"), "DEL", &conf).expect_ok();
}

#[test]
fn ours_del_without_a_daemon_succeeds_and_add_fails_clearly() {
    let node = Node::new();
    let pod = node.pod_netns();
    let socket = node.dir().join("none.sock");
    let conf = json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "macvlan",
                      "ipam": {"type": "dhcp", "daemonSocketPath": socket}});
    let env = [("CNI_CONTAINERID", "ctr1"), ("CNI_NETNS", pod.path.to_str().unwrap()), ("CNI_IFNAME", "eth0")];
    let add = node.run_plugin("dhcp", "ADD", &env, &conf);
    let err = add.expect_err();
    assert_eq!(err["code"], 11, "{err}");
    assert!(err["msg"].as_str().unwrap().contains("DHCP daemon"), "{err}");
    node.run_plugin("dhcp", "DEL", &env, &conf).expect_ok();
}

/// The reference plugin and daemon (1.1.1) on the same server: a lease from dnsmasq, released on DEL (1.1.1
/// broadcasts its RELEASE with the right ciaddr; #1278 is the later nclient4-based client's).
#[test]
fn reference_lease_from_dnsmasq() {
    if !have_dnsmasq() {
        return;
    }
    let lan = Lan::new();
    let daemon = DhcpDaemon::start(&lan.node, &reference("dhcp"), &["-timeout", "3s"], "ref");
    let conf = lan.conf(&daemon.socket);
    let out = lan.run(&reference("dhcp"), "ADD", &conf);
    let ip = lan.expect_lease(out.expect_ok());
    lan.run(&reference("dhcp"), "DEL", &conf).expect_ok();
    let release = wait_for(Duration::from_secs(5), || lan.capture.requests(lan.mac).iter().any(|s| s.kind == 7));
    assert!(release.is_some(), "no DHCPRELEASE: {:?}", lan.capture.requests(lan.mac));
    assert!(lan.released(ip), "dnsmasq still lists {ip}: {:?}", lan.dnsmasq.leases());
}

/// podman (CNI backend) `network create -d macvlan` without `--subnet`: podman writes a macvlan network with
/// dhcp IPAM. The dhcp daemon runs on its default socket (`/run/cni/dhcp.sock`) and state directory inside
/// podman's private mount namespace (a tmpfs on `/run`, the test's directory on `/var/lib/cni`), in the node
/// netns; the macvlan's parent `up0` is the node's link to the server with dnsmasq. A container gets a lease
/// (its address = dnsmasq's entry, reachable from the server), and `podman rm` releases it.
fn podman_macvlan_dhcp(plugins: netns_tests::runtimes::Plugins) {
    use netns_tests::images::INDEX_HTML;
    use netns_tests::podman::{self, Podman};
    if !podman::available() || !have_dnsmasq() {
        return;
    }
    let node = Node::new();
    let server = TestNetns::new("srv");
    veth_between(&server, &node, "s0", "up0", &["10.77.0.1/24".parse().unwrap()], &[]);
    let dnsmasq = Dnsmasq::start(&server, node.dir());
    let podman = Podman::new(&node, &plugins.dir());

    let log = node.dir().join("dhcp-daemon.log");
    let mut command = podman.command_beside(plugins.dir().join("dhcp"));
    command.arg("daemon").stdout(Stdio::null()).stderr(fs::File::create(&log).expect("daemon log"));
    let _daemon = Daemon::spawn(&mut command);
    let daemon_log = || fs::read_to_string(&log).unwrap_or_default();
    let socket = podman.path_in_daemon("/run/cni/dhcp.sock");
    assert!(wait_for(Duration::from_secs(10), || socket.exists()).is_some(), "no daemon socket: {}", daemon_log());

    podman.ok(&["network", "create", "-d", "macvlan", "-o", "parent=up0", NETWORK]);
    let conf: Value =
        serde_json::from_slice(&fs::read(podman.net_dir.join(format!("{NETWORK}.conflist"))).expect("conflist"))
            .expect("json");
    let macvlan = conf["plugins"].as_array().expect("plugins").iter().find(|p| p["type"] == "macvlan").cloned();
    assert_eq!(macvlan.as_ref().map(|m| &m["ipam"]["type"]), Some(&json!("dhcp")), "podman wrote {conf}");

    podman.run_httpd("web", &["--network", NETWORK], || format!("daemon log:\n{}", daemon_log()));
    let inspect = podman.inspect("web");
    let ip: Ipv4Addr = inspect["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no IP: {}", inspect["NetworkSettings"]));
    let leases = dnsmasq.leases();
    assert!(leases.iter().any(|(_, l, _)| *l == ip), "{ip} is not in dnsmasq's table {leases:?}");
    let url = std::net::SocketAddr::new(ip.into(), 80);
    let body =
        netns_tests::runtimes::eventually(Duration::from_secs(10), || netns_tests::daemon::http_get(&server, url, "/"))
            .expect("httpd in the container from the server's side");
    assert_eq!(body, INDEX_HTML);
    eprintln!("{plugins:?}: the container got {ip} from dnsmasq; the daemon said:\n{}", daemon_log());

    podman.ok(&["rm", "-f", "-t", "0", "web"]);
    assert!(
        wait_for(Duration::from_secs(5), || !dnsmasq.leases().iter().any(|(_, l, _)| *l == ip)).is_some(),
        "dnsmasq still lists {ip} after podman rm: {:?}\ndaemon log:\n{}",
        dnsmasq.leases(),
        daemon_log()
    );
    assert_eq!(podman.netns_names(), Vec::<String>::new(), "container netns removed");
}

#[test]
fn podman_macvlan_dhcp_ours() {
    podman_macvlan_dhcp(netns_tests::runtimes::Plugins::Ours);
}

#[test]
fn podman_macvlan_dhcp_reference() {
    podman_macvlan_dhcp(netns_tests::runtimes::Plugins::Reference);
}

/// The wire protocol both ways: the reference plugin (1.1.1) with our daemon, and our plugin with the
/// reference daemon (Go's net/rpc with gob, spoken by ours). Each gets the lease dnsmasq lists, CHECK passes,
/// and DEL frees it.
fn mixed(plugin: &Path, our_daemon: bool) {
    if !have_dnsmasq() {
        return;
    }
    let lan = Lan::new();
    let daemon = match our_daemon {
        true => DhcpDaemon::ours(&lan.node, &["-timeout", "3s"]),
        false => DhcpDaemon::start(&lan.node, &reference("dhcp"), &["-timeout", "3s"], "ref"),
    };
    let conf = lan.conf(&daemon.socket);
    let out = lan.run(plugin, "ADD", &conf);
    assert!(out.success(), "ADD: {} {}\ndaemon log:\n{}", out.stdout_text, out.stderr, daemon.log());
    let ip = lan.expect_lease(&out.stdout);
    assert_eq!(out.stdout["cniVersion"], "1.0.0", "{}", out.stdout_text);
    let check = lan.run(plugin, "CHECK", &conf);
    assert!(check.success(), "CHECK: {} {}\ndaemon log:\n{}", check.stdout_text, check.stderr, daemon.log());
    lan.run(plugin, "DEL", &conf).expect_ok();
    assert!(lan.released(ip), "dnsmasq still lists {ip}: {:?}\ndaemon log:\n{}", lan.dnsmasq.leases(), daemon.log());
}

#[test]
fn reference_plugin_with_our_daemon() {
    mixed(&reference("dhcp"), true);
}

#[test]
fn our_plugin_with_the_reference_daemon() {
    mixed(&bin("dhcp"), false);
}

/// `-hostprefix` (a daemon in a container with the host's root at a prefix): the netns paths the plugin sends
/// and the socket path are read under it. STATUS tells whether a daemon listens.
#[test]
fn ours_host_prefix_and_status() {
    if !have_dnsmasq() {
        return;
    }
    let lan = Lan::new();
    let prefix = lan.node.dir().join("host");
    let netns_dir = prefix.join("run/netns");
    fs::create_dir_all(&netns_dir).unwrap();
    std::os::unix::fs::symlink(&lan.pod.path, netns_dir.join(&lan.pod.name)).unwrap();
    let state = lan.node.dir().join("state");
    let mut command = clean_command(&lan.node, bin("dhcp"));
    command
        .args(["daemon", "-hostprefix", prefix.to_str().unwrap(), "-socketpath", "/dhcp.sock"])
        .args(["-statedir", state.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let socket = prefix.join("dhcp.sock");
    let conf = lan.conf(&socket);
    let status = |expect_ok: bool| {
        let out = lan.run(&bin("dhcp"), "STATUS", &with_version(&conf, "1.1.0"));
        assert_eq!(out.success(), expect_ok, "STATUS: {}", out.stdout_text);
        if !expect_ok {
            assert_eq!(out.stdout["code"], 50, "{}", out.stdout_text);
        }
    };
    status(false);
    let _daemon = Daemon::spawn(&mut command);
    assert!(wait_for(Duration::from_secs(10), || socket.exists()).is_some(), "no socket under the prefix");
    status(true);
    let ip = lan.expect_lease(lan.run(&bin("dhcp"), "ADD", &conf).expect_ok());
    lan.run(&bin("dhcp"), "DEL", &conf).expect_ok();
    assert!(lan.released(ip), "dnsmasq still lists {ip}");
}

fn with_version(conf: &Value, version: &str) -> Value {
    let mut c = conf.clone();
    c["cniVersion"] = json!(version);
    c
}

/// `n` pods on one server: a bridge `s0` (10.77.0.1/24) in its netns with a veth to each pod's eth0, and
/// dnsmasq on it without its ping before each offer (it waits up to 3 s for an answer, one address at a time).
fn bridged_pods(n: usize) -> (Node, TestNetns, Vec<TestNetns>, Dnsmasq) {
    let node = Node::new();
    let server = TestNetns::new("srv");
    server.ip(&["link", "add", "s0", "type", "bridge"]);
    server.ip(&["addr", "add", "10.77.0.1/24", "dev", "s0"]);
    server.ip(&["link", "set", "s0", "up"]);
    let pods: Vec<TestNetns> = (0..n).map(|_| node.pod_netns()).collect();
    for (i, pod) in pods.iter().enumerate() {
        let port = format!("p{i}");
        veth_between(&server, pod, &port, "eth0", &[], &[]);
        server.ip(&["link", "set", &port, "master", "s0"]);
    }
    let dnsmasq = Dnsmasq::start_with(&server, node.dir(), 4, 100, &["--no-ping"]);
    (node, server, pods, dnsmasq)
}

/// The plugin for pod `i` (container `ctr<i>`, eth0).
fn run_pod(node: &Node, pod: &TestNetns, i: usize, verb: &str, conf: &Value) -> PluginOutput {
    let mut c = clean_command(node, bin("dhcp"));
    c.env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", format!("ctr{i}"))
        .env("CNI_NETNS", &pod.path)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/nonexistent");
    output(&mut c, conf.to_string().as_bytes())
}

/// GC (spec 1.1) with pod 0 the only valid attachment: pod 1's lease is released, pod 0's kept; a GC without
/// a list releases nothing.
#[test]
fn ours_gc_releases_leases_of_attachments_gone() {
    if !have_dnsmasq() {
        return;
    }
    let (node, _server, pods, dnsmasq) = bridged_pods(2);
    let daemon = DhcpDaemon::ours(&node, &[]);
    let conf = json!({"cniVersion": "1.1.0", "name": NETWORK, "type": "macvlan",
                      "ipam": {"type": "dhcp", "daemonSocketPath": daemon.socket}});
    let ip = |out: &PluginOutput| -> Ipv4Addr {
        out.expect_ok()["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().parse().unwrap()
    };
    let ip0 = ip(&run_pod(&node, &pods[0], 0, "ADD", &conf));
    let ip1 = ip(&run_pod(&node, &pods[1], 1, "ADD", &conf));
    let gc = |conf: &Value| {
        let mut c = clean_command(&node, bin("dhcp"));
        c.env("CNI_COMMAND", "GC").env("CNI_PATH", "/nonexistent");
        output(&mut c, conf.to_string().as_bytes()).expect_ok();
    };
    gc(&conf);
    assert_eq!(dnsmasq.leases().len(), 2, "a GC without a list keeps everything");
    let mut with_valid = conf.clone();
    with_valid["cni.dev/valid-attachments"] = json!([{"containerID": "ctr0", "ifname": "eth0"}]);
    gc(&with_valid);
    let leased = |ip: Ipv4Addr| dnsmasq.leases().iter().any(|(_, l, _)| *l == ip);
    assert!(wait_for(Duration::from_secs(10), || !leased(ip1)).is_some(), "{ip1} kept:\n{}", daemon.log());
    assert!(leased(ip0), "{ip0} released: {:?}\n{}", dnsmasq.leases(), daemon.log());
    assert!(daemon.log().contains("released by GC"), "{}", daemon.log());
    run_pod(&node, &pods[1], 1, "DEL", &conf).expect_ok();
    run_pod(&node, &pods[0], 0, "DEL", &conf).expect_ok();
    assert!(wait_for(Duration::from_secs(10), || dnsmasq.leases().is_empty()).is_some());
}

/// Eight pods on one server (a bridge in its netns), added at once through one daemon and deleted at once:
/// eight distinct leases, each dnsmasq's entry for that pod's MAC, and an empty lease table after.
#[test]
fn ours_concurrent_pods() {
    if !have_dnsmasq() {
        return;
    }
    const PODS: usize = 8;
    let (node, _server, pods, dnsmasq) = bridged_pods(PODS);
    let state = node.dir().join("state");
    let daemon = DhcpDaemon::ours(&node, &[]);
    let started = std::time::Instant::now();
    let conf = json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "macvlan",
                      "ipam": {"type": "dhcp", "daemonSocketPath": daemon.socket}});
    let run = |i: usize, verb: &str| run_pod(&node, &pods[i], i, verb, &conf);
    let run = &run;
    let added: Vec<PluginOutput> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..PODS).map(|i| s.spawn(move || run(i, "ADD"))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ips = Vec::new();
    for (i, out) in added.iter().enumerate() {
        let result = out.expect_ok();
        let ip: Ipv4Addr = result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().parse().unwrap();
        let mac = pods[i].netlink().require_link("eth0").unwrap().mac.unwrap();
        let mac = mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        assert!(dnsmasq.leases().contains(&(mac, ip, client_id_hex(&format!("ctr{i}"), "eth0"))), "{ip}");
        ips.push(ip);
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), PODS, "distinct addresses: {ips:?}");
    eprintln!("{PODS} concurrent ADDs through one daemon: {:?}", started.elapsed());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..PODS).map(|i| s.spawn(move || run(i, "DEL"))).collect();
        for h in handles {
            h.join().unwrap().expect_ok();
        }
    });
    assert!(
        wait_for(Duration::from_secs(5), || dnsmasq.leases().is_empty()).is_some(),
        "dnsmasq still lists {:?}\n{}",
        dnsmasq.leases(),
        daemon.log()
    );
    assert_eq!(fs::read_dir(&state).unwrap().count(), 0);
}

/// Every spec version: ADD answers in the config's version (0.1.0/0.2.0 in the legacy `ip4` shape), CHECK
/// where the version has it, DEL frees the lease each time.
#[test]
fn ours_every_spec_version() {
    if !have_dnsmasq() {
        return;
    }
    let lan = Lan::new();
    let daemon = DhcpDaemon::ours(&lan.node, &[]);
    for version in ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let conf = with_version(&lan.conf(&daemon.socket), version);
        let out = lan.run(&bin("dhcp"), "ADD", &conf);
        let result = out.expect_ok();
        assert_eq!(result["cniVersion"], version, "{}", out.stdout_text);
        let address = if version < "0.3.0" { &result["ip4"]["ip"] } else { &result["ips"][0]["address"] };
        let ip: Ipv4Addr = address.as_str().and_then(|a| a.split('/').next()?.parse().ok()).unwrap_or_else(|| {
            panic!("{version}: no address in {}", out.stdout_text);
        });
        assert!(lan.dnsmasq.leases().iter().any(|(_, l, _)| *l == ip), "{version}: {ip} not leased");
        if version >= "0.4.0" {
            lan.run(&bin("dhcp"), "CHECK", &conf).expect_ok();
        }
        lan.run(&bin("dhcp"), "DEL", &conf).expect_ok();
        assert!(lan.released(ip), "{version}: {ip} still leased");
    }
}

/// `-pidfile` holds the daemon's PID; SIGTERM removes it and the socket, and leaves the leases saved (the
/// next daemon resumes them).
#[test]
fn ours_pidfile_and_sigterm() {
    if !have_dnsmasq() {
        return;
    }
    let lan = Lan::new();
    let pidfile = lan.node.dir().join("dhcp.pid");
    let mut daemon = DhcpDaemon::ours(&lan.node, &["-pidfile", pidfile.to_str().unwrap()]);
    assert_eq!(fs::read_to_string(&pidfile).unwrap(), daemon.daemon.id().to_string());
    let conf = lan.conf(&daemon.socket);
    let ip = lan.expect_lease(lan.run(&bin("dhcp"), "ADD", &conf).expect_ok());
    daemon.daemon.stop(nix::sys::signal::Signal::SIGTERM);
    assert!(!pidfile.exists() && !daemon.socket.exists(), "pidfile or socket left after SIGTERM");
    let state = lan.node.dir().join("state");
    assert_eq!(fs::read_dir(&state).unwrap().count(), 1, "the lease stays saved");
    let next = DhcpDaemon::ours(&lan.node, &[]);
    lan.run(&bin("dhcp"), "DEL", &conf).expect_ok();
    assert!(lan.released(ip), "dnsmasq still lists {ip}:\n{}", next.log());
}
