//! Policy routing rules (`ip rule`): "from <prefix> lookup <table>", IPv4 and IPv6, listed, added and deleted.

use std::io;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};

use super::wire::{self, attributes, Request};
use super::{IpFamily, Netlink};

/// Size of `struct fib_rule_hdr`.
const FIB_RULE_HDR_LEN: usize = 12;
const FRA_DST: u16 = 1;
const FRA_SRC: u16 = 2;
const FRA_IIFNAME: u16 = 3;
const FRA_PRIORITY: u16 = 6;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;
const FRA_OIFNAME: u16 = 17;
const FRA_L3MDEV: u16 = 19;
/// `FR_ACT_TO_TBL`: look the packet up in the rule's table.
const FR_ACT_TO_TBL: u8 = 1;
/// `RT_TABLE_UNSPEC`: the header's table when the id does not fit in a byte (`FRA_TABLE` carries it).
const RT_TABLE_UNSPEC: u8 = 0;

/// A rule. Rules read back carry every field; a rule to add sets `src`, `table` and perhaps `priority`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    /// Source prefix (`from`); `None` is "from all" (then `family` says which family).
    pub src: Option<IpNet>,
    /// Destination prefix (`to`).
    pub dst: Option<IpNet>,
    pub table: u32,
    /// `pref`; the kernel picks one (just above the main table's rule) when adding without.
    pub priority: Option<u32>,
    /// Address family of a rule without prefixes (`true` for IPv6).
    pub v6: bool,
    /// Whether the rule matches on more than its prefixes (iif, oif, fwmark, l3mdev): such rules are never ours.
    pub other_selectors: bool,
    /// `FR_ACT_*`.
    pub action: u8,
}

impl Rule {
    /// "from `src` lookup `table`", with `priority` if given.
    pub fn from_source(src: IpNet, table: u32, priority: Option<u32>) -> Rule {
        Rule { src: Some(src), table, priority, v6: src.addr().is_ipv6(), action: FR_ACT_TO_TBL, ..Rule::default() }
    }

    fn family(&self) -> u8 {
        let v6 = self.src.or(self.dst).map(|p| p.addr().is_ipv6()).unwrap_or(self.v6);
        (if v6 { libc::AF_INET6 } else { libc::AF_INET }) as u8
    }

    /// `RTM_NEWRULE` / `RTM_DELRULE` as `ip rule add|del from <src> [to <dst>] table <t> [pref <p>]` sends it.
    fn to_request(&self, message_type: u16) -> Request {
        let header_table = u8::try_from(self.table).unwrap_or(RT_TABLE_UNSPEC);
        let prefix_len = |p: Option<IpNet>| p.map(|p| p.prefix_len()).unwrap_or(0);
        let header = [
            self.family(),
            prefix_len(self.dst),
            prefix_len(self.src),
            0,
            header_table,
            0,
            0,
            FR_ACT_TO_TBL,
            0,
            0,
            0,
            0,
        ];
        let mut request = Request::new(message_type, &header);
        if let Some(dst) = self.dst {
            request.attr_ip(FRA_DST, dst.network());
        }
        if let Some(src) = self.src {
            request.attr_ip(FRA_SRC, src.network());
        }
        if let Some(priority) = self.priority {
            request.attr_u32(FRA_PRIORITY, priority);
        }
        request.attr_u32(FRA_TABLE, self.table);
        request
    }

    fn parse(data: &[u8]) -> Option<Rule> {
        let header = data.get(..FIB_RULE_HDR_LEN)?;
        let v6 = match i32::from(header[0]) {
            libc::AF_INET => false,
            libc::AF_INET6 => true,
            _ => return None,
        };
        let mut rule = Rule { table: u32::from(header[4]), v6, action: header[7], ..Rule::default() };
        for (kind, value) in attributes(&data[FIB_RULE_HDR_LEN..]) {
            match kind {
                FRA_SRC => rule.src = IpNet::new(wire::as_ip(value, v6)?, header[2]).ok(),
                FRA_DST => rule.dst = IpNet::new(wire::as_ip(value, v6)?, header[1]).ok(),
                FRA_PRIORITY => rule.priority = wire::as_u32(value),
                FRA_TABLE => rule.table = wire::as_u32(value).unwrap_or(rule.table),
                FRA_IIFNAME | FRA_OIFNAME | FRA_FWMARK | FRA_L3MDEV => rule.other_selectors = true,
                _ => {}
            }
        }
        Some(rule)
    }
}

impl Netlink {
    /// The rules of `family`, in priority order as the kernel lists them.
    pub fn rules(&mut self, family: IpFamily) -> io::Result<Vec<Rule>> {
        let family = match family {
            IpFamily::V4 => libc::AF_INET,
            IpFamily::V6 => libc::AF_INET6,
        } as u8;
        let mut request = Request::new(libc::RTM_GETRULE, &[family, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        self.dump(&mut request, libc::RTM_NEWRULE, Rule::parse)
    }

    /// Adds a rule; EEXIST if an identical one exists.
    pub fn add_rule(&mut self, rule: &Rule) -> io::Result<()> {
        self.request_raw(&mut rule.to_request(libc::RTM_NEWRULE), NLM_F_CREATE | NLM_F_EXCL)?;
        Ok(())
    }

    /// Deletes the first rule matching `rule` (ENOENT if none, see [`super::is_not_found`]).
    pub fn del_rule(&mut self, rule: &Rule) -> io::Result<()> {
        self.request_raw(&mut rule.to_request(libc::RTM_DELRULE), 0)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Requests compared byte for byte with netlink-packet-route's, and the parser fed its messages.
    use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
    use netlink_packet_route::AddressFamily;

    use super::*;
    use crate::netlink::wire::emitted;

    fn reference(family: AddressFamily, src_len: u8, table: u8, attributes: Vec<RuleAttribute>) -> RuleMessage {
        let mut message = RuleMessage::default();
        message.header.family = family;
        message.header.src_len = src_len;
        message.header.table = table;
        message.header.action = RuleAction::ToTable;
        message.attributes = attributes;
        message
    }

    #[test]
    fn rule_requests() {
        let rule = Rule::from_source("10.1.0.5/32".parse().unwrap(), 100, None);
        let expected = reference(
            AddressFamily::Inet,
            32,
            100,
            vec![RuleAttribute::Source("10.1.0.5".parse().unwrap()), RuleAttribute::Table(100)],
        );
        assert_eq!(rule.to_request(libc::RTM_NEWRULE).payload(), emitted(&expected));

        // A table id above 255 goes in FRA_TABLE only; a priority comes before it, as `ip rule` orders them.
        let rule = Rule::from_source("fd00::5/128".parse().unwrap(), 1000, Some(32000));
        let expected = reference(
            AddressFamily::Inet6,
            128,
            0,
            vec![
                RuleAttribute::Source("fd00::5".parse().unwrap()),
                RuleAttribute::Priority(32000),
                RuleAttribute::Table(1000),
            ],
        );
        assert_eq!(rule.to_request(libc::RTM_DELRULE).payload(), emitted(&expected));
    }

    #[test]
    fn parses_rules() {
        let mut reported = reference(
            AddressFamily::Inet,
            32,
            0,
            vec![
                RuleAttribute::Table(1000),
                RuleAttribute::Priority(32765),
                RuleAttribute::Source("10.1.0.5".parse().unwrap()),
            ],
        );
        let rule = Rule::parse(&emitted(&reported)).unwrap();
        assert_eq!(
            rule,
            Rule { priority: Some(32765), ..Rule::from_source("10.1.0.5/32".parse().unwrap(), 1000, None) }
        );

        reported.attributes = vec![RuleAttribute::Table(254), RuleAttribute::Iifname("eth0".into())];
        reported.header.src_len = 0;
        reported.header.table = 254;
        let rule = Rule::parse(&emitted(&reported)).unwrap();
        assert_eq!((rule.src, rule.table, rule.other_selectors), (None, 254, true));
        assert!(Rule::parse(&[0; 4]).is_none());
    }
}
