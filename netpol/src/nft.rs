//! The plan as nf_tables netlink messages: the table, its chains, sets, elements and rules, encoded as `nft`
//! would send them for the same text (expressions `meta`, `ct`, `bitwise`, `payload`, `cmp`, `lookup`,
//! `counter`, `limit`, `log`, `immediate`, written by cnicore's one expression writer), and sent with cnicore's batch ([`nfnl::commit_messages`]): one transaction.
//!
//! Sets and chains created in a transaction are found by name by the later messages of the same
//! transaction (the kernel looks names up in the generation being built).

use std::net::IpAddr;

use cnicore::firewall::nfnl::uapi::*;
use cnicore::firewall::nfnl::{self, BatchError, Expressions};
use cnicore::netlink::wire::{Request, NLA_F_NESTED};

use crate::plan::{Chain, Family, Field, Key, Match, Rule, Set, SetKind, Verdict, PROTO_ICMPV6};

/// Elements per NEWSETELEM message: an attribute's length is 16 bits, so a message holds at most 64 KiB of
/// elements.
const ELEMENTS_PER_MESSAGE: usize = 256;

/// One nf_tables transaction under construction, in one `inet` table.
pub struct Transaction {
    table: String,
    messages: Vec<(Request, u16)>,
    next_set_id: u32,
}

fn message(command: u16) -> Request {
    Request::new((NFNL_SUBSYS_NFTABLES << 8) | command, &[NFPROTO_INET, 0, 0, 0])
}

impl Transaction {
    pub fn new(table: &str) -> Transaction {
        Transaction { table: table.to_string(), messages: Vec::new(), next_set_id: 1 }
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Sends everything as one batch: all applied, or nothing.
    pub fn commit(mut self) -> Result<(), BatchError> {
        nfnl::commit_messages(&mut self.messages)
    }

    /// What [`Transaction::commit`] would answer, nothing applied (`nft --check`).
    pub fn validate(mut self) -> Result<(), BatchError> {
        nfnl::validate_messages(&mut self.messages)
    }

    /// `add table inet <table>`: creates it, or leaves it as it is.
    pub fn add_table(&mut self) -> &mut Self {
        let mut m = message(NFT_MSG_NEWTABLE);
        m.attr_str(NFTA_TABLE_NAME, &self.table);
        self.messages.push((m, NLM_F_REQUEST | NLM_F_CREATE));
        self
    }

    /// `delete table inet <table>`, with everything in it.
    pub fn delete_table(&mut self) -> &mut Self {
        let mut m = message(NFT_MSG_DELTABLE);
        m.attr_str(NFTA_TABLE_NAME, &self.table);
        self.messages.push((m, NLM_F_REQUEST));
        self
    }

    /// A chain: `forward` is the base chain (hook forward, priority filter, policy accept).
    pub fn add_chain(&mut self, chain: Chain) -> &mut Self {
        let mut m = message(NFT_MSG_NEWCHAIN);
        m.attr_str(NFTA_CHAIN_TABLE, &self.table).attr_str(NFTA_CHAIN_NAME, chain.name());
        if chain == Chain::Forward {
            let hook = m.begin_nested(NFTA_CHAIN_HOOK | NLA_F_NESTED);
            m.attr(NFTA_HOOK_HOOKNUM, &NF_INET_FORWARD.to_be_bytes()).attr(NFTA_HOOK_PRIORITY, &0i32.to_be_bytes());
            m.end_nested(hook);
            m.attr(NFTA_CHAIN_POLICY, &(NF_ACCEPT as u32).to_be_bytes()).attr_str(NFTA_CHAIN_TYPE, "filter");
        }
        self.messages.push((m, NLM_F_REQUEST | NLM_F_CREATE));
        self
    }

    /// A named set (empty: [`Transaction::add_elements`] fills it).
    pub fn add_set(&mut self, name: &str, set: &Set) -> &mut Self {
        let (key_type, key_len) = key_shape(set);
        let mut m = message(NFT_MSG_NEWSET);
        m.attr_str(NFTA_SET_TABLE, &self.table).attr_str(NFTA_SET_NAME, name);
        if set.kind == SetKind::Ranges {
            m.attr(NFTA_SET_FLAGS, &NFT_SET_INTERVAL.to_be_bytes());
        }
        m.attr(NFTA_SET_KEY_TYPE, &key_type.to_be_bytes()).attr(NFTA_SET_KEY_LEN, &key_len.to_be_bytes());
        m.attr(NFTA_SET_ID, &self.next_set_id.to_be_bytes());
        self.next_set_id += 1;
        self.messages.push((m, NLM_F_REQUEST | NLM_F_CREATE));
        self
    }

    /// `delete set`: refused unless no rule of the new generation refers to it.
    pub fn delete_set(&mut self, name: &str) -> &mut Self {
        let mut m = message(NFT_MSG_DELSET);
        m.attr_str(NFTA_SET_TABLE, &self.table).attr_str(NFTA_SET_NAME, name);
        self.messages.push((m, NLM_F_REQUEST));
        self
    }

    /// `flush chain`: every rule of the chain deleted (a DELRULE naming no rule).
    pub fn flush_chain(&mut self, chain: Chain) -> &mut Self {
        let mut m = message(NFT_MSG_DELRULE);
        m.attr_str(NFTA_RULE_TABLE, &self.table).attr_str(NFTA_RULE_CHAIN, chain.name());
        self.messages.push((m, NLM_F_REQUEST));
        self
    }

    /// Adds elements to a set (a range is its start and, unless it ends the address space, its end).
    pub fn add_elements<'k>(&mut self, set: &str, keys: impl IntoIterator<Item = &'k Key>) -> &mut Self {
        self.elements(NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE, set, keys)
    }

    /// Deletes elements (each must be there, or the transaction is refused).
    pub fn delete_elements<'k>(&mut self, set: &str, keys: impl IntoIterator<Item = &'k Key>) -> &mut Self {
        self.elements(NFT_MSG_DELSETELEM, NLM_F_REQUEST, set, keys)
    }

    fn elements<'k>(
        &mut self,
        command: u16,
        flags: u16,
        set: &str,
        keys: impl IntoIterator<Item = &'k Key>,
    ) -> &mut Self {
        let encoded: Vec<(Vec<u8>, bool)> = keys.into_iter().flat_map(encode_key).collect();
        for chunk in encoded.chunks(ELEMENTS_PER_MESSAGE) {
            let mut m = message(command);
            m.attr_str(NFTA_SET_ELEM_LIST_TABLE, &self.table).attr_str(NFTA_SET_ELEM_LIST_SET, set);
            let list = m.begin_nested(NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED);
            for (key, interval_end) in chunk {
                let item = m.begin_nested(NFTA_LIST_ELEM | NLA_F_NESTED);
                let nest = m.begin_nested(NFTA_SET_ELEM_KEY | NLA_F_NESTED);
                m.attr(NFTA_DATA_VALUE, key);
                m.end_nested(nest);
                if *interval_end {
                    m.attr(NFTA_SET_ELEM_FLAGS, &NFT_SET_ELEM_INTERVAL_END.to_be_bytes());
                }
                m.end_nested(item);
            }
            m.end_nested(list);
            self.messages.push((m, flags));
        }
        self
    }

    /// Appends a rule to a chain.
    pub fn add_rule(&mut self, chain: Chain, rule: &Rule) -> &mut Self {
        let mut m = message(NFT_MSG_NEWRULE);
        m.attr_str(NFTA_RULE_TABLE, &self.table).attr_str(NFTA_RULE_CHAIN, chain.name());
        let list = m.begin_nested(NFTA_RULE_EXPRESSIONS | NLA_F_NESTED);
        let mut e = Expressions(&mut m);
        if let Some(family) = rule.family {
            let proto = match family {
                Family::V4 => NFPROTO_IPV4,
                Family::V6 => NFPROTO_IPV6,
            };
            e.meta(NFT_META_NFPROTO, NFT_REG_1).cmp(NFT_CMP_EQ, &[proto]);
        }
        for matched in &rule.matches {
            write_match(&mut e, matched, rule.family);
        }
        write_verdict(&mut e, &rule.verdict);
        m.end_nested(list);
        self.messages.push((m, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND));
        self
    }
}

/// nft's key type and the key's length in bytes.
fn key_shape(set: &Set) -> (u32, u32) {
    let (addr_type, addr_len) = match set.family {
        Family::V4 => (TYPE_IPV4_ADDR, 4),
        Family::V6 => (TYPE_IPV6_ADDR, 16),
    };
    match set.kind {
        SetKind::Addr | SetKind::Ranges => (addr_type, addr_len),
        SetKind::AddrProtoPort => {
            let concat = (((addr_type << TYPE_BITS) | TYPE_INET_PROTO) << TYPE_BITS) | TYPE_INET_SERVICE;
            (concat, addr_len + 4 + 4)
        }
    }
}

fn addr_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(ip) => ip.octets().to_vec(),
        IpAddr::V6(ip) => ip.octets().to_vec(),
    }
}

/// A key as the kernel stores it, with whether it is an interval's end. A range is two elements (its start,
/// and the address after its end flagged as an end) or one when it reaches the last address.
fn encode_key(key: &Key) -> Vec<(Vec<u8>, bool)> {
    match key {
        Key::Addr(ip) => vec![(addr_bytes(ip), false)],
        Key::Range(first, last) => {
            let mut out = vec![(addr_bytes(first), false)];
            let max = match last {
                IpAddr::V4(_) => u128::from(u32::MAX),
                IpAddr::V6(_) => u128::MAX,
            };
            let end = crate::ranges::to_number(*last);
            if end != max {
                out.push((addr_bytes(&crate::ranges::from_number(*last, end + 1)), true));
            }
            out
        }
        Key::AddrProtoPort(ip, proto, port) => {
            let mut bytes = addr_bytes(ip);
            bytes.extend_from_slice(&[*proto, 0, 0, 0]);
            bytes.extend_from_slice(&port.to_be_bytes());
            bytes.extend_from_slice(&[0, 0]);
            vec![(bytes, false)]
        }
    }
}

/// One match of a rule, as `nft` encodes it.
fn write_match(e: &mut Expressions, matched: &Match, family: Option<Family>) {
    // The compiler puts address matches only in rules of one family.
    let family = family.unwrap_or(Family::V4);
    match matched {
        Match::Established => {
            e.ct_established();
        }
        Match::Lookup { field, set, negated } => {
            e.address(family, *field, None, NFT_REG_1).lookup(set, NFT_REG_1, *negated);
        }
        Match::Proto(proto) => {
            e.meta(NFT_META_L4PROTO, NFT_REG_1).cmp(NFT_CMP_EQ, &[*proto]);
        }
        Match::Ports { proto, first, last } => {
            e.meta(NFT_META_L4PROTO, NFT_REG_1).cmp(NFT_CMP_EQ, &[*proto]);
            e.payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, NFT_REG_1);
            if first == last {
                e.cmp(NFT_CMP_EQ, &first.to_be_bytes());
            } else {
                e.cmp(NFT_CMP_GTE, &first.to_be_bytes()).cmp(NFT_CMP_LTE, &last.to_be_bytes());
            }
        }
        Match::NamedPorts { set } => {
            let words = match family {
                Family::V4 => 1,
                Family::V6 => 4,
            };
            e.address(family, Field::Daddr, None, NFT_REG32_00);
            e.meta(NFT_META_L4PROTO, NFT_REG32_00 + words);
            e.payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, NFT_REG32_00 + words + 1);
            e.lookup(set, NFT_REG32_00, false);
        }
        Match::Ndisc => {
            e.meta(NFT_META_L4PROTO, NFT_REG_1).cmp(NFT_CMP_EQ, &[PROTO_ICMPV6]);
            e.payload(NFT_PAYLOAD_TRANSPORT_HEADER, 0, 1, NFT_REG_1);
            e.cmp(NFT_CMP_GTE, &[133]).cmp(NFT_CMP_LTE, &[137]);
        }
    }
}

/// The rule's counter and verdict (`counter accept`), or for a log rule its limit, counter and log (`limit
/// rate R/second burst B packets counter log prefix "..." group N`): every rule counts what it judges.
fn write_verdict(e: &mut Expressions, verdict: &Verdict) {
    let (code, chain) = match verdict {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(chain) => (NFT_JUMP, Some(chain.name())),
        Verdict::Log { isolation, log } => {
            e.limit(u64::from(log.rate), log.burst).counter().log(isolation.prefix(), log.group);
            return;
        }
    };
    e.counter().verdict(code, chain);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn keys_as_the_kernel_stores_them() {
        assert_eq!(encode_key(&Key::Addr(ip("10.0.0.1"))), vec![(vec![10, 0, 0, 1], false)]);
        // A range: its start, and the address after its end flagged as an interval end.
        assert_eq!(
            encode_key(&Key::Range(ip("10.0.0.0"), ip("10.0.255.255"))),
            vec![(vec![10, 0, 0, 0], false), (vec![10, 1, 0, 0], true)]
        );
        // A range to the last address has no end element.
        assert_eq!(encode_key(&Key::Range(ip("0.0.0.0"), ip("255.255.255.255"))), vec![(vec![0, 0, 0, 0], false)]);
        assert_eq!(encode_key(&Key::Range(ip("ff00::"), ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))).len(), 1);
        // address . protocol . port: each part padded to a 4-byte register, the port in network order.
        assert_eq!(
            encode_key(&Key::AddrProtoPort(ip("10.0.0.1"), 6, 8080)),
            vec![(vec![10, 0, 0, 1, 6, 0, 0, 0, 0x1f, 0x90, 0, 0], false)]
        );
        assert_eq!(encode_key(&Key::AddrProtoPort(ip("fd00::1"), 17, 53))[0].0.len(), 24);
    }

    #[test]
    fn set_shapes() {
        let set = |family, kind| Set::new(family, kind);
        assert_eq!(key_shape(&set(Family::V4, SetKind::Addr)), (TYPE_IPV4_ADDR, 4));
        assert_eq!(key_shape(&set(Family::V6, SetKind::Ranges)), (TYPE_IPV6_ADDR, 16));
        // nft's concatenated type: ipv4_addr . inet_proto . inet_service, 6 bits each.
        assert_eq!(key_shape(&set(Family::V4, SetKind::AddrProtoPort)), ((7 << 12) | (12 << 6) | 13, 12));
        assert_eq!(key_shape(&set(Family::V6, SetKind::AddrProtoPort)).1, 24);
    }

    #[test]
    fn a_transaction_splits_long_element_lists() {
        let keys: Vec<Key> =
            (0..600u32).map(|i| Key::Addr(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)))).collect();
        let mut tx = Transaction::new("t");
        tx.add_elements("s", &keys);
        assert_eq!(tx.len(), 600usize.div_ceil(ELEMENTS_PER_MESSAGE));
    }
}
