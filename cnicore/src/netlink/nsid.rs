//! Namespace ids: the number one network namespace gives another (`RTM_GETNSID`). A link whose lower device is
//! in another namespace (an ipvlan moved into a pod) names that namespace by such an id (`IFLA_LINK_NETNSID`).

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use super::wire::{self, attributes, Request};
use super::Netlink;
use crate::netns::NetNs;

/// `NETNSA_NSID`, `NETNSA_FD`.
const NETNSA_NSID: u16 = 1;
const NETNSA_FD: u16 = 3;
/// `struct rtgenmsg` (family `AF_UNSPEC`), padded to 4 bytes.
const RTGENMSG: [u8; 4] = [0; 4];

/// The `RTM_GETNSID` request for the namespace of the open file `fd`.
fn nsid_request(fd: u32) -> Request {
    let mut request = Request::new(libc::RTM_GETNSID, &RTGENMSG);
    request.attr_u32(NETNSA_FD, fd);
    request
}

/// The id in an `RTM_NEWNSID` payload; None when the namespace has none here (`NETNSA_NSID_NOT_ASSIGNED`, -1).
fn nsid_of_reply(data: &[u8]) -> Option<i32> {
    let (_, value) = attributes(data.get(RTGENMSG.len()..)?).find(|(kind, _)| *kind == NETNSA_NSID)?;
    let id = wire::as_u32(value)? as i32;
    (id >= 0).then_some(id)
}

impl Netlink {
    /// The id this socket's namespace gives `other`, if it has given one (the kernel gives one when it first
    /// reports a link of this namespace whose lower device is in `other`).
    pub fn nsid_of(&mut self, other: &NetNs) -> io::Result<Option<i32>> {
        let mut request = nsid_request(other.as_fd().as_raw_fd() as u32);
        let replies = self.request_raw(&mut request, 0)?;
        Ok(replies.iter().filter(|r| r.message_type == libc::RTM_NEWNSID).find_map(|r| nsid_of_reply(&r.data)))
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::nsid::{NsidAttribute, NsidMessage};

    use super::*;
    use crate::netlink::wire::emitted;

    #[test]
    fn the_request_matches_netlink_packet_route() {
        let mut reference = NsidMessage::default();
        reference.attributes = vec![NsidAttribute::Fd(5)];
        assert_eq!(nsid_request(5).payload(), emitted(&reference));
    }

    #[test]
    fn the_reply_is_read_and_not_assigned_is_none() {
        for (id, want) in [(0, Some(0)), (3, Some(3)), (-1, None)] {
            let mut reply = NsidMessage::default();
            reply.attributes = vec![NsidAttribute::Id(id)];
            assert_eq!(nsid_of_reply(&emitted(&reply)), want, "{id}");
        }
        assert_eq!(nsid_of_reply(&emitted(&NsidMessage::default())), None);
    }
}
