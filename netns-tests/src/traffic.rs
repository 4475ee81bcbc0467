//! Real traffic between test namespaces: a TCP server that tells each client something (e.g. the address
//! it sees the client come from), and the client that asks.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::TestNetns;

/// A TCP server in a namespace (on every address, IPv4 and IPv6) writing `reply(client address)` to each
/// client and closing; stopped on drop.
pub struct TcpServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    pub fn start(ns: &TestNetns, port: u16, reply: impl Fn(IpAddr) -> String + Send + 'static) -> TcpServer {
        // Bound inside the namespace; the socket stays there whatever thread uses it later.
        let listener = ns.run(|| TcpListener::bind(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)));
        let listener = listener.unwrap_or_else(|e| panic!("listen on port {port} in {}: {e}", ns.name));
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut stream, peer)) => {
                        let _ = stream.write_all(reply(client_ip(peer)).as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        TcpServer { stop, thread: Some(thread) }
    }

    /// A server answering each client with the address it comes from.
    pub fn echo_source(ns: &TestNetns, port: u16) -> TcpServer {
        TcpServer::start(ns, port, |client| client.to_string())
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The client's address, IPv4 when it is an IPv4-mapped IPv6 address.
pub fn client_ip(peer: SocketAddr) -> IpAddr {
    match peer.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// What a TCP server at `to` answers to a client in `ns`, if anything (a few attempts: a fresh mapping or
/// neighbour entry can cost the first SYN).
pub fn tcp_ask(ns: &TestNetns, to: SocketAddr) -> Option<String> {
    for attempt in 0..3 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(answer) = tcp_ask_once(ns, to, Duration::from_millis(1500)).filter(|a| !a.is_empty()) {
            return Some(answer);
        }
    }
    None
}

/// What a TCP server at `to` answers to one connection from `ns` (connecting for up to `connect`, reading for
/// up to 2 s), if it connects: for a test that a path is closed, where retries would only cost time.
pub fn tcp_ask_once(ns: &TestNetns, to: SocketAddr, connect: Duration) -> Option<String> {
    let mut stream = ns.run(|| TcpStream::connect_timeout(&to, connect)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}
