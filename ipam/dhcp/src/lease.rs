//! One lease: acquired in its own thread, then kept (renewed at T1, rebound at T2) until released, its
//! interface gone or the lease expired. What it holds is saved under the daemon's state directory, so that a
//! restarted daemon resumes renewing it and a DEL after the restart still releases it.

use crate::client::{self, PacketSocket, Path};
use crate::log::say;
use crate::packet::{ClientMessage, MessageType, ServerMessage};
use crate::timing::{self, Action, Times};
use cnicore::netlink::Netlink;
use cnicore::netns::NetNs;
use cnicore::spec::{CniResult, Error, ErrorContext, IpConfig, Result, Route};
use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path as FsPath, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How the daemon was started.
#[derive(Debug, Clone)]
pub struct Settings {
    pub broadcast: bool,
    /// One exchange's wait for an answer.
    pub timeout: Duration,
    pub resend_max: Duration,
    /// No more acquisition attempts after this long.
    pub resend_timeout: Duration,
    pub host_prefix: String,
    pub state_dir: PathBuf,
}

/// RFC 2131 §4.1's backoff as the reference does it: four quick retries, then 4 s doubling to `resend_max`.
const FAST_RETRIES: u32 = 4;
const FAST_DELAY: Duration = Duration::from_secs(2);
const FIRST_DELAY: Duration = Duration::from_secs(4);
/// How often a waiting lease looks whether its interface is still there.
const LINK_CHECK: Duration = Duration::from_secs(60);

/// What is saved of a lease: enough to renew and release it after a restart.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Held {
    pub client_id: Vec<u8>,
    /// The attachment, for GC (the client ID may be cut short).
    #[serde(default)]
    pub container_id: String,
    #[serde(default)]
    pub network: String,
    pub netns: String,
    pub ifname: String,
    pub mac: [u8; 6],
    pub options: Vec<(u8, Vec<u8>)>,
    pub priority: u32,
    pub ack: ServerMessage,
    /// Unix time, milliseconds, of the last ACK.
    pub bound_at_ms: u64,
}

/// A failure of the DHCP exchange or of the lease's data, as the daemon answers it (code 999, its text).
fn internal(e: impl std::fmt::Display) -> Error {
    Error::internal(e.to_string())
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Held {
    fn elapsed(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.bound_at_ms))
    }

    fn message<'a>(&'a self, kind: MessageType, ciaddr: Ipv4Addr, broadcast: bool) -> ClientMessage<'a> {
        ClientMessage {
            kind,
            xid: client::random_u32(),
            mac: self.mac,
            broadcast,
            ciaddr,
            requested_ip: None,
            server_id: None,
            client_id: &self.client_id,
            extra: &self.options,
        }
    }

    pub fn result(&self) -> Result<CniResult> {
        result_of(&self.ack, self.priority)
    }
}

fn prefix_of(mask: Ipv4Addr) -> Option<u8> {
    let m = u32::from(mask);
    let ones = m.leading_ones();
    (m.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
}

/// The CNI result of an ACK, as the reference makes it: the address with its mask, the first router as
/// gateway; routes from option 121 alone when present (RFC 3442; on-link ones with scope link), else option
/// 33 and a default route via the router; `priority` on every route. No DNS, as theirs.
pub fn result_of(ack: &ServerMessage, priority: u32) -> Result<CniResult> {
    let mask = ack.subnet_mask.ok_or_else(|| Error::internal("DHCP option Subnet Mask not found in DHCPACK"))?;
    let prefix =
        prefix_of(mask).ok_or_else(|| Error::internal(format!("DHCP subnet mask {mask} is not contiguous")))?;
    let address = IpNet::V4(Ipv4Net::new(ack.yiaddr, prefix).map_err(internal)?);
    let gateway = ack.routers.first().copied();
    let route = |dst: Ipv4Addr, prefix: u8, gw: Ipv4Addr| -> Result<Route> {
        let dst = Ipv4Net::new(dst, prefix).map_err(internal)?.trunc();
        let mut r = Route::new(IpNet::V4(dst), Some(IpAddr::V4(gw)));
        if gw.is_unspecified() {
            r.scope = Some(253);
        }
        Ok(r)
    };
    let mut routes = Vec::new();
    if !ack.classless_routes.is_empty() {
        for r in &ack.classless_routes {
            routes.push(route(r.dst, r.prefix, r.router)?);
        }
    } else {
        for r in &ack.static_routes {
            routes.push(route(r.dst, r.prefix, r.router)?);
        }
        if let Some(gw) = gateway {
            routes.push(Route::new("0.0.0.0/0".parse().expect("a prefix"), Some(IpAddr::V4(gw))));
        }
    }
    if priority != 0 {
        for r in &mut routes {
            r.priority = Some(priority);
        }
    }
    Ok(CniResult {
        interfaces: vec![],
        ips: vec![IpConfig { address, gateway: gateway.map(IpAddr::V4), interface: None }],
        routes,
        dns: Default::default(),
    })
}

/// The state file of a client ID (a hash: client IDs hold slashes and may be 254 bytes long).
pub fn state_file(dir: &FsPath, client_id: &[u8]) -> PathBuf {
    let digest = Sha256::digest(client_id);
    let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{name}.json"))
}

fn save(settings: &Settings, held: &Held) {
    let path = state_file(&settings.state_dir, &held.client_id);
    let data = serde_json::to_vec(held).expect("a lease serializes");
    if let Err(e) = cnicore::state::write_atomic(&path, &data, 0o600) {
        log(held, format_args!("failed to save the lease to {}: {e}", path.display()));
    }
}

fn forget(settings: &Settings, held: &Held) {
    let path = state_file(&settings.state_dir, &held.client_id);
    if let Err(e) = std::fs::remove_file(&path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            log(held, format_args!("failed to remove {}: {e}", path.display()));
        }
    }
}

/// The leases saved by an earlier run of the daemon.
pub fn load_saved(dir: &FsPath) -> Vec<Held> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut held = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        match std::fs::read(&path).map_err(internal).and_then(|b| serde_json::from_slice::<Held>(&b).map_err(internal))
        {
            Ok(h) if state_file(dir, &h.client_id) == path => held.push(h),
            Ok(_) => say(format_args!("ignoring {}: not named after its client ID", path.display())),
            Err(e) => say(format_args!("ignoring {}: {e}", path.display())),
        }
    }
    held
}

fn log(held: &Held, msg: std::fmt::Arguments) {
    say(format_args!("{}: {msg}", String::from_utf8_lossy(&held.client_id)));
}

/// Tells a lease thread to release its lease; it answers on the channel once the RELEASE is sent.
type Stop = SyncSender<()>;

/// How long a DEL waits for the RELEASE to be sent.
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// A lease being kept by its thread.
pub struct Lease {
    pub held: Arc<Mutex<Held>>,
    stop: Mutex<Option<Sender<Stop>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Lease {
    pub fn is_alive(&self) -> bool {
        self.thread.lock().unwrap().as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops keeping the lease and releases it: returns once the thread has removed the state file and sent
    /// the RELEASE (it closes its sockets afterwards, off the caller's path).
    pub fn release(&self) {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let sent = self.stop.lock().unwrap().take().is_some_and(|stop| stop.send(done_tx).is_ok());
        if sent {
            let _ = done_rx.recv_timeout(RELEASE_WAIT);
        }
        self.thread.lock().unwrap().take();
    }
}

/// What an Allocate gives the lease thread.
pub struct Wanted {
    pub client_id: Vec<u8>,
    pub container_id: String,
    pub network: String,
    pub netns: String,
    pub ifname: String,
    pub options: Vec<(u8, Vec<u8>)>,
    pub priority: u32,
}

fn open_netns(settings: &Settings, netns: &str) -> std::io::Result<NetNs> {
    NetNs::open(format!("{}{netns}", settings.host_prefix))
}

/// Acquires a lease (DISCOVER, OFFER, REQUEST, ACK, with the reference's retries) and keeps it in a thread
/// of its own; returns once it is bound or has failed.
pub fn acquire(settings: Arc<Settings>, wanted: Wanted) -> Result<Lease> {
    let (reply_tx, reply_rx) = mpsc::sync_channel::<Result<Arc<Mutex<Held>>>>(1);
    let (stop_tx, stop_rx) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        let (held, socket) = match bind(&settings, wanted) {
            Ok(bound) => bound,
            Err(e) => {
                let _ = reply_tx.send(Err(e));
                return;
            }
        };
        save(&settings, &held);
        let held = Arc::new(Mutex::new(held));
        let _ = reply_tx.send(Ok(held.clone()));
        drop(socket);
        {
            let held = held.lock().unwrap();
            log(&held, format_args!("lease acquired: {}", held.ack.yiaddr));
        }
        keep(&settings, &held, &stop_rx);
    });
    match reply_rx.recv() {
        Ok(Ok(held)) => Ok(Lease { held, stop: Mutex::new(Some(stop_tx)), thread: Mutex::new(Some(thread)) }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(Error::internal("the lease thread ended without an answer")),
    }
}

/// Resumes keeping a lease saved by an earlier run.
pub fn resume(settings: Arc<Settings>, held: Held) -> Lease {
    let (stop_tx, stop_rx) = mpsc::channel();
    let held = Arc::new(Mutex::new(held));
    let shared = held.clone();
    let thread = std::thread::spawn(move || {
        log(&shared.lock().unwrap(), format_args!("resuming the lease saved by an earlier run"));
        keep(&settings, &shared, &stop_rx)
    });
    Lease { held, stop: Mutex::new(Some(stop_tx)), thread: Mutex::new(Some(thread)) }
}

fn jittered(d: Duration) -> Duration {
    // ±1 s, as the reference.
    let j = Duration::from_millis(u64::from(client::random_u32() % 2000));
    (d + j).saturating_sub(Duration::from_secs(1))
}

fn bind(settings: &Settings, wanted: Wanted) -> Result<(Held, PacketSocket)> {
    let netns =
        open_netns(settings, &wanted.netns).with_context(|| format!("failed to open netns {}", wanted.netns))?;
    let mut nl = Netlink::in_netns(&netns).with_context(|| format!("netlink in {}", wanted.netns))?;
    let link = nl
        .link_by_name(&wanted.ifname)
        .with_context(|| format!("error looking up {:?}", wanted.ifname))?
        .ok_or_else(|| Error::internal(format!("error looking up {:?}: Link not found", wanted.ifname)))?;
    if !link.up {
        nl.set_up(link.index).with_context(|| format!("failed to set {} up", wanted.ifname))?;
    }
    let mac = link.mac.ok_or_else(|| Error::internal(format!("{} has no hardware address", wanted.ifname)))?;
    let socket =
        PacketSocket::open(&netns, link.index).with_context(|| format!("packet socket on {}", wanted.ifname))?;
    let mut held = Held {
        client_id: wanted.client_id,
        container_id: wanted.container_id,
        network: wanted.network,
        netns: wanted.netns,
        ifname: wanted.ifname,
        mac,
        options: wanted.options,
        priority: wanted.priority,
        ack: ServerMessage::empty_ack(),
        bound_at_ms: 0,
    };
    let give_up = Instant::now() + settings.resend_timeout;
    let (mut fast, mut delay) = (FAST_RETRIES, FIRST_DELAY);
    loop {
        let error = match select(settings, &socket, &held) {
            Ok(ack) => {
                held.ack = ack;
                held.bound_at_ms = now_ms();
                if let Err(e) = result_of(&held.ack, held.priority) {
                    // Granted but unusable (no subnet mask): given back rather than left to expire.
                    drop(release(settings, &held));
                    return Err(e);
                }
                return Ok((held, socket));
            }
            Err(e) => e,
        };
        log(&held, format_args!("{error}"));
        let wait = if fast > 0 {
            fast -= 1;
            jittered(FAST_DELAY)
        } else {
            let wait = jittered(delay);
            if delay < settings.resend_max {
                delay *= 2;
            }
            wait
        };
        if Instant::now() + wait > give_up {
            return Err(error.within("no more tries"));
        }
        std::thread::sleep(wait);
    }
}

/// SELECTING: one DISCOVER and one REQUEST for what was offered.
fn select(settings: &Settings, socket: &PacketSocket, held: &Held) -> Result<ServerMessage> {
    let path = Path::Broadcast(socket);
    let discover = held.message(MessageType::Discover, Ipv4Addr::UNSPECIFIED, settings.broadcast);
    let offer = client::exchange(&path, &discover, &[MessageType::Offer], settings.timeout).map_err(internal)?;
    if offer.kind == MessageType::Nak {
        return Err(Error::internal(format!("DHCPNAK to DHCPDISCOVER: {}", offer.message.unwrap_or_default())));
    }
    let server = offer.server_id.ok_or_else(|| Error::internal("DHCPOFFER without a server identifier"))?;
    let mut request = held.message(MessageType::Request, Ipv4Addr::UNSPECIFIED, settings.broadcast);
    request.xid = discover.xid;
    request.requested_ip = Some(offer.yiaddr);
    request.server_id = Some(server);
    let ack = client::exchange(&path, &request, &[MessageType::Ack], settings.timeout).map_err(internal)?;
    if ack.kind == MessageType::Nak {
        return Err(Error::internal(format!("DHCPNAK: {}", ack.message.unwrap_or_default())));
    }
    Ok(ack)
}

enum Outcome {
    Bound(ServerMessage),
    Nak(String),
    Failed(String),
}

/// RENEWING (unicast to the server, from the leased address) or REBINDING (broadcast): a REQUEST with
/// `ciaddr` and neither a requested address nor a server identifier (RFC 2131 §4.3.6). After the expiry (a
/// daemon that was down longer than the lease): INIT-REBOOT, a broadcast REQUEST for the address it had
/// (option 50, no `ciaddr`, no server identifier; RFC 2131 §4.3.2).
fn extend(settings: &Settings, netns: &NetNs, held: &Held, action: Action) -> Outcome {
    let addr = held.ack.yiaddr;
    let answer = match action {
        Action::Expired => {
            let mut msg = held.message(MessageType::Request, Ipv4Addr::UNSPECIFIED, settings.broadcast);
            msg.requested_ip = Some(addr);
            let index = Netlink::in_netns(netns).and_then(|mut nl| nl.require_link(&held.ifname)).map(|l| l.index);
            index
                .and_then(|i| PacketSocket::open(netns, i))
                .and_then(|s| client::exchange(&Path::Broadcast(&s), &msg, &[MessageType::Ack], settings.timeout))
        }
        Action::Renew => {
            let Some(server) = held.ack.server_id else { return Outcome::Failed("no server identifier".into()) };
            let msg = held.message(MessageType::Request, addr, false);
            client::unicast_socket(netns, &held.ifname, addr)
                .and_then(|s| client::exchange(&Path::Unicast(&s, server), &msg, &[MessageType::Ack], settings.timeout))
        }
        _ => {
            let msg = held.message(MessageType::Request, addr, settings.broadcast);
            let index = Netlink::in_netns(netns).and_then(|mut nl| nl.require_link(&held.ifname)).map(|l| l.index);
            index
                .and_then(|i| PacketSocket::open(netns, i))
                .and_then(|s| client::exchange(&Path::Broadcast(&s), &msg, &[MessageType::Ack], settings.timeout))
        }
    };
    match answer {
        Ok(ack) if ack.kind == MessageType::Nak => Outcome::Nak(ack.message.unwrap_or_default()),
        Ok(ack) => Outcome::Bound(ack),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// Is the pod's interface still there? `None` when it cannot be told (try again later).
fn interface_present(settings: &Settings, held: &Held) -> Option<(bool, Option<NetNs>)> {
    match open_netns(settings, &held.netns) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some((false, None)),
        Err(_) => None,
        Ok(ns) => {
            let present = Netlink::in_netns(&ns).and_then(|mut nl| nl.link_by_name(&held.ifname)).ok()?;
            Some((present.is_some(), Some(ns)))
        }
    }
}

fn keep(settings: &Settings, shared: &Arc<Mutex<Held>>, stop: &Receiver<Stop>) {
    let mut keeper = Keeper { settings, shared, retry_at: None };
    loop {
        let held = shared.lock().unwrap().clone();
        let netns = match interface_present(settings, &held) {
            Some((false, _)) => {
                log(&held, format_args!("interface {} is gone: no longer kept", held.ifname));
                forget(settings, &held);
                return;
            }
            Some((true, ns)) => ns,
            None => None,
        };
        let wait = match keeper.step(&held, netns.as_ref()) {
            Next::Again => continue,
            Next::Wait(wait) => wait,
            Next::Stop => return,
        };
        let done = match stop.recv_timeout(wait.min(LINK_CHECK)) {
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(done) => Some(done),
            Err(RecvTimeoutError::Disconnected) => None,
        };
        release_on_stop(settings, shared, done);
        return;
    }
}

/// What the lease thread does after a step.
enum Next {
    /// Look at the lease again now (it was just bound again).
    Again,
    /// Wait this long for a DEL (looking at the interface at least every [`LINK_CHECK`]).
    Wait(Duration),
    /// The lease is lost and given up: the thread ends.
    Stop,
}

/// The lease thread between its steps.
struct Keeper<'a> {
    settings: &'a Settings,
    shared: &'a Arc<Mutex<Held>>,
    /// When a failed renewal or rebinding is tried again (elapsed since the ACK).
    retry_at: Option<Duration>,
}

impl Keeper<'_> {
    /// One look at the lease: what its times ask for now (wait, renew, rebind, or try once more after the expiry),
    /// done.
    fn step(&mut self, held: &Held, netns: Option<&NetNs>) -> Next {
        let settings = self.settings;
        let times = Times::of(&held.ack);
        let elapsed = held.elapsed();
        let action = match (timing::next_action(elapsed, &times), self.retry_at) {
            (Action::Expired, _) => Action::Expired,
            (_, Some(at)) if elapsed < at => Action::Wait(at - elapsed),
            (a, _) => a,
        };
        match (action, netns) {
            (Action::Wait(d), _) => Next::Wait(d),
            (Action::Expired, _) => self.after_expiry(held, netns),
            (_, None) => Next::Wait(Duration::from_secs(1)),
            (_, Some(ns)) => {
                let what = if action == Action::Renew { "renewing" } else { "rebinding" };
                match extend(settings, ns, held, action) {
                    Outcome::Bound(ack) => self.bound_again(ack, what),
                    Outcome::Nak(msg) => {
                        log(held, format_args!("DHCPNAK while {what} ({msg}): the lease is gone"));
                        give_up(settings, held, Some(ns));
                        Next::Stop
                    }
                    Outcome::Failed(e) => {
                        let wait = timing::retry_after(elapsed, timing::deadline_of(action, &times));
                        log(held, format_args!("{what} failed: {e}; again in {wait:?}"));
                        self.retry_at = Some(elapsed + wait);
                        Next::Wait(wait)
                    }
                }
            }
        }
    }

    /// The lease expired: the address may still be ours to have, asked for once (INIT-REBOOT) before the
    /// interface goes down.
    fn after_expiry(&mut self, held: &Held, netns: Option<&NetNs>) -> Next {
        let outcome = match netns {
            Some(ns) => extend(self.settings, ns, held, Action::Expired),
            None => Outcome::Failed("the netns cannot be read".into()),
        };
        match outcome {
            Outcome::Bound(ack) if ack.yiaddr == held.ack.yiaddr => {
                return self.bound_again(ack, "INIT-REBOOT after the expiry")
            }
            Outcome::Bound(ack) => log(held, format_args!("INIT-REBOOT offered {} instead", ack.yiaddr)),
            Outcome::Nak(msg) => log(held, format_args!("INIT-REBOOT refused: {msg}")),
            Outcome::Failed(e) => log(held, format_args!("INIT-REBOOT failed: {e}")),
        }
        log(held, format_args!("lease expired, bringing {} down", held.ifname));
        give_up(self.settings, held, netns);
        Next::Stop
    }

    /// A new ACK for the lease: kept, saved, logged (`what` done); looked at again at once.
    fn bound_again(&mut self, ack: ServerMessage, what: &str) -> Next {
        let mut h = self.shared.lock().unwrap();
        h.ack = ack;
        h.bound_at_ms = now_ms();
        save(self.settings, &h);
        log(&h, format_args!("lease {what} done: {} for {:?}", h.ack.yiaddr, Times::of(&h.ack).expire));
        self.retry_at = None;
        Next::Again
    }
}

/// A lease lost (expired, or refused by the server): its interface set down, as the reference does (the
/// address is not the pod's to use any more), and its file removed.
fn give_up(settings: &Settings, held: &Held, netns: Option<&NetNs>) {
    if let Some(ns) = netns {
        if let Ok(mut nl) = Netlink::in_netns(ns) {
            if let Ok(link) = nl.require_link(&held.ifname) {
                let _ = nl.set_down(link.index);
            }
        }
    }
    forget(settings, held);
}

/// A DEL (answered on `done` once the RELEASE is sent) or the daemon's end: the lease given back.
fn release_on_stop(settings: &Settings, shared: &Arc<Mutex<Held>>, done: Option<Stop>) {
    // Forgotten first: a daemon that dies now must not resume a lease the server has freed.
    let held = shared.lock().unwrap().clone();
    forget(settings, &held);
    let socket = release(settings, &held);
    if let Some(done) = done {
        let _ = done.send(());
    }
    drop(socket);
}

/// A socket a RELEASE went out on, to be closed after the caller is answered.
#[allow(dead_code)] // held only to be dropped late
enum Sent {
    Unicast(std::net::UdpSocket),
    Broadcast(PacketSocket),
}

/// RELEASE, unicast to the server from the leased address with `ciaddr` = that address (reference #1278 sent
/// another one, and servers kept the lease); broadcast when the address is no longer on the interface.
fn release(settings: &Settings, held: &Held) -> Option<Sent> {
    let addr = held.ack.yiaddr;
    let server = held.ack.server_id?;
    let netns = match open_netns(settings, &held.netns) {
        Ok(ns) => ns,
        Err(e) => {
            log(held, format_args!("no DHCPRELEASE sent: netns {}: {e}", held.netns));
            return None;
        }
    };
    let mut msg = held.message(MessageType::Release, addr, false);
    msg.server_id = Some(server);
    let sent = match client::unicast_socket(&netns, &held.ifname, addr) {
        Ok(s) => client::release(&Path::Unicast(&s, server), &msg).map(|()| Sent::Unicast(s)),
        Err(_) => Netlink::in_netns(&netns)
            .and_then(|mut nl| nl.require_link(&held.ifname))
            .and_then(|l| PacketSocket::open(&netns, l.index))
            .and_then(|s| client::release(&Path::Broadcast(&s), &msg).map(|()| Sent::Broadcast(s))),
    };
    match sent {
        Ok(socket) => {
            log(held, format_args!("released {addr} to {server}"));
            Some(socket)
        }
        Err(e) => {
            log(held, format_args!("failed to send DHCPRELEASE: {e}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::StaticRoute;

    fn ack() -> ServerMessage {
        ServerMessage {
            yiaddr: Ipv4Addr::new(10, 0, 0, 20),
            subnet_mask: Some(Ipv4Addr::new(255, 255, 255, 0)),
            routers: vec![Ipv4Addr::new(10, 0, 0, 1)],
            ..ServerMessage::empty_ack()
        }
    }

    #[test]
    fn result_with_router() {
        let r = result_of(&ack(), 0).unwrap();
        let v = r.to_json(cnicore::spec::Version::V100).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"1.0.0","ips":[{"address":"10.0.0.20/24","gateway":"10.0.0.1"}],
                "routes":[{"dst":"0.0.0.0/0","gw":"10.0.0.1"}],"dns":{}})
        );
    }

    #[test]
    fn result_with_classless_routes_and_priority() {
        let mut a = ack();
        a.static_routes =
            vec![StaticRoute { dst: Ipv4Addr::new(10, 0, 0, 0), prefix: 8, router: Ipv4Addr::new(10, 0, 0, 9) }];
        a.classless_routes = vec![
            StaticRoute { dst: Ipv4Addr::new(192, 168, 0, 0), prefix: 16, router: Ipv4Addr::new(10, 0, 0, 1) },
            StaticRoute { dst: Ipv4Addr::new(10, 9, 8, 0), prefix: 24, router: Ipv4Addr::UNSPECIFIED },
        ];
        let r = result_of(&a, 5).unwrap();
        assert_eq!(r.routes.len(), 2, "121 replaces 33 and the router's default route");
        assert_eq!(r.routes[0].dst.to_string(), "192.168.0.0/16");
        assert_eq!(r.routes[1].scope, Some(253));
        assert!(r.routes.iter().all(|r| r.priority == Some(5)));
    }

    #[test]
    fn result_needs_a_contiguous_mask() {
        let mut a = ack();
        a.subnet_mask = None;
        assert!(result_of(&a, 0).unwrap_err().msg.contains("Subnet Mask"));
        a.subnet_mask = Some(Ipv4Addr::new(255, 0, 255, 0));
        assert!(result_of(&a, 0).is_err());
        assert_eq!(prefix_of(Ipv4Addr::new(0, 0, 0, 0)), Some(0));
        assert_eq!(prefix_of(Ipv4Addr::new(255, 255, 255, 255)), Some(32));
    }

    #[test]
    fn state_round_trip() {
        let dir = std::env::temp_dir().join(format!("dhcp-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let held = Held {
            client_id: b"c/net/eth0".to_vec(),
            container_id: "c".into(),
            network: "net".into(),
            netns: "/run/netns/x".into(),
            ifname: "eth0".into(),
            mac: [2, 0, 0, 0, 0, 1],
            options: vec![(55, vec![3, 1])],
            priority: 0,
            ack: ack(),
            bound_at_ms: 1,
        };
        let settings = Settings {
            broadcast: false,
            timeout: Duration::from_secs(1),
            resend_max: Duration::from_secs(1),
            resend_timeout: Duration::from_secs(1),
            host_prefix: String::new(),
            state_dir: dir.clone(),
        };
        save(&settings, &held);
        std::fs::write(dir.join("junk.json"), b"{").unwrap();
        assert_eq!(load_saved(&dir), vec![held.clone()]);
        forget(&settings, &held);
        assert!(load_saved(&dir).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
