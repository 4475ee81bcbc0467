//! Generic netlink: a NETLINK_GENERIC socket and the controller (`nlctrl`) that names a family's id, for the
//! families that are not rtnetlink (wireguard).

use std::io;

use netlink_sys::{protocols::NETLINK_GENERIC, Socket};

use super::wire::{self, attributes, Reply, Request};
use crate::netns::NetNs;

/// The controller family's fixed id (`GENL_ID_CTRL`).
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// A generic netlink request: `struct genlmsghdr` {cmd, version, reserved} then attributes.
pub fn genl_request(family: u16, command: u8, version: u8) -> Request {
    Request::new(family, &[command, version, 0, 0])
}

/// The request that asks the controller for `name`'s family id.
fn get_family_request(name: &str) -> Request {
    let mut request = genl_request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1);
    request.attr_str(CTRL_ATTR_FAMILY_NAME, name);
    request
}

/// The family id in the controller's answer.
fn family_id_of(reply: &[u8]) -> Option<u16> {
    let attrs = reply.get(4..)?;
    attributes(attrs).find(|(kind, _)| *kind == CTRL_ATTR_FAMILY_ID).and_then(|(_, value)| wire::as_u16(value))
}

/// A NETLINK_GENERIC socket bound in the calling thread's network namespace.
pub struct Genl {
    socket: Socket,
    sequence: u32,
}

impl Genl {
    pub fn new() -> io::Result<Genl> {
        let mut socket = Socket::new(NETLINK_GENERIC)?;
        socket.bind_auto()?;
        Ok(Genl { socket, sequence: 0 })
    }

    /// A socket in `netns`.
    pub fn in_netns(netns: &NetNs) -> io::Result<Genl> {
        netns.run(Genl::new)?
    }

    /// The id of the family `name` (the kernel loads its module on this request when it can); ENOENT when
    /// the kernel has no such family.
    pub fn family_id(&mut self, name: &str) -> io::Result<u16> {
        let replies = self.request(&mut get_family_request(name), 0)?;
        replies.iter().find_map(|reply| family_id_of(&reply.data)).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("nlctrl named no id for the {name} family"))
        })
    }

    /// Sends `request` with `NLM_F_REQUEST | NLM_F_ACK | flags`; the messages of the answer (each payload
    /// starting with its `genlmsghdr`).
    pub fn request(&mut self, request: &mut Request, flags: u16) -> io::Result<Vec<Reply>> {
        self.sequence = self.sequence.wrapping_add(1);
        let mut replies = Vec::new();
        wire::exchange(&self.socket, request, flags, self.sequence, |message_type, payload| {
            replies.push(Reply { message_type, data: payload.to_vec() })
        })?;
        Ok(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_family_request_and_answer() {
        let request = get_family_request("wireguard");
        // genlmsghdr {CTRL_CMD_GETFAMILY, version 1}, then CTRL_ATTR_FAMILY_NAME "wireguard\0" padded to 16.
        let mut expected = vec![3, 1, 0, 0, 14, 0, 2, 0];
        expected.extend_from_slice(b"wireguard\0\0\0");
        assert_eq!(request.payload(), &expected[..]);
        // An answer: genlmsghdr {CTRL_CMD_NEWFAMILY}, CTRL_ATTR_FAMILY_NAME, CTRL_ATTR_FAMILY_ID 0x1c.
        let mut answer = vec![1, 2, 0, 0, 14, 0, 2, 0];
        answer.extend_from_slice(b"wireguard\0\0\0");
        answer.extend_from_slice(&[6, 0, 1, 0, 0x1c, 0, 0, 0]);
        assert_eq!(family_id_of(&answer), Some(0x1c));
        assert_eq!(family_id_of(&[1, 2, 0, 0]), None);
    }
}
