//! Frames seen on one interface of a test's namespace, captured with a raw `AF_PACKET` socket (no tcpdump):
//! to show what crosses an underlay (an encrypted tunnel shows no pod address in clear).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::TestNetns;

const ETH_P_ALL: u16 = 0x0003;

/// A capture running on a thread of its own until [`Capture::stop`].
pub struct Capture {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Vec<u8>>>>,
}

impl Capture {
    /// Starts capturing every frame in and out of `iface` in `ns`.
    pub fn start(ns: &TestNetns, iface: &str) -> Capture {
        let name = CString::new(iface).unwrap();
        let (fd, index) = ns.run(|| {
            // SAFETY: plain socket calls; the descriptor is owned below.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(ETH_P_ALL.to_be())) };
            // SAFETY: a NUL-terminated name.
            let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
            (fd, index)
        });
        assert!(fd >= 0 && index > 0, "capture socket on {iface}: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor owned from here on.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a zeroed sockaddr_ll filled in, and a timeval, passed with their sizes.
        unsafe {
            let mut address: libc::sockaddr_ll = std::mem::zeroed();
            address.sll_family = libc::AF_PACKET as u16;
            address.sll_protocol = ETH_P_ALL.to_be();
            address.sll_ifindex = index as i32;
            let bound = libc::bind(
                socket.as_raw_fd(),
                &address as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(bound, 0, "bind the capture to {iface}: {}", std::io::Error::last_os_error());
            let timeout = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &timeout as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut frames = Vec::new();
            let mut buffer = vec![0u8; 65536];
            while !stopped.load(Ordering::Relaxed) {
                // SAFETY: reads into a buffer of its length.
                let n = unsafe { libc::recv(socket.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len(), 0) };
                if n > 0 {
                    frames.push(buffer[..n as usize].to_vec());
                }
            }
            frames
        });
        Capture { stop, thread: Some(thread) }
    }

    /// Ends the capture; the frames seen, in order.
    pub fn stop(mut self) -> Vec<Vec<u8>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// True when `needle` occurs anywhere in `frame` (headers or payload).
pub fn contains(frame: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && frame.windows(needle.len()).any(|window| window == needle)
}

/// The UDP source and destination ports of an Ethernet frame carrying IPv4 or IPv6 UDP (no extension headers).
pub fn udp_ports(frame: &[u8]) -> Option<(u16, u16)> {
    let ethertype = u16::from_be_bytes(frame.get(12..14)?.try_into().ok()?);
    let udp = match ethertype {
        0x0800 if *frame.get(23)? == 17 => 14 + usize::from(frame.get(14)? & 0x0f) * 4,
        0x86dd if *frame.get(20)? == 17 => 14 + 40,
        _ => return None,
    };
    let ports = frame.get(udp..udp + 4)?;
    Some((u16::from_be_bytes([ports[0], ports[1]]), u16::from_be_bytes([ports[2], ports[3]])))
}
