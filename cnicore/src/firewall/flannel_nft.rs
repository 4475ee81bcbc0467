//! flanneld v0.28's nftables masquerade (its `pkg/trafficmngr/nftables`) as a plan and as nf_tables netlink
//! messages: tables `ip flannel-ipv4` / `ip6 flannel-ipv6` (comment `rules for <table>`), base chain `postrtg`
//! (nat, postrouting, priority srcnat, comment as flanneld's) and its six rules, each rule encoded as `nft`
//! encodes the same text (expressions `meta`, `payload`, `bitwise`, `cmp`, `immediate`, `masq`; a prefix of
//! whole bytes compared on those bytes only, as nft does), so `nft list ruleset` and `nft --debug=netlink list
//! ruleset` show what flanneld's rules show. The transaction is one batch ([`nfnl::commit_messages`]): every
//! table of the layout, and the previous release's `inet fabricd`, deleted and made again at once.

use std::io;

use ipnet::IpNet;

use super::nfnl::uapi::*;
pub use super::nfnl::Field;
use super::nfnl::{self, BatchError, Expressions};
use super::Family;
use crate::netlink::wire::{self, Request, NLA_F_NESTED};

/// flanneld's tables by family, its nat chain, and fabricd's previous release's table (`inet fabricd`).
pub const TABLES: [(Family, &str); 2] = [(Family::V4, "flannel-ipv4"), (Family::V6, "flannel-ipv6")];
pub const CHAIN: &str = "postrtg";
/// flanneld's forward chain (`--iptables-forward-rules`).
pub const FORWARD_CHAIN: &str = "forward";
const FORWARD_COMMENT: &str = "chain to accept flannel traffic";
pub const OLD_TABLE: &str = "fabricd";
const CHAIN_COMMENT: &str = "chain to manage traffic masquerading by flannel";
/// kube-proxy's masquerade mark: flanneld leaves those packets to kube-proxy's own rule.
pub const KUBE_PROXY_MARK: u32 = 0x4000;

/// One condition of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    /// `meta mark <mark>`.
    Mark(u32),
    /// `<ip|ip6> <field> [!=] <net>`.
    Addr { field: Field, net: IpNet, negated: bool },
}

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Return,
    Accept,
    MasqueradeFullyRandom,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasqRule {
    pub conds: Vec<Cond>,
    pub action: Action,
}

/// flanneld's `postrtg` rules for one family (`cluster`: the family's Network; `pods`: this node's subnet), in
/// its order.
pub fn rules(cluster: IpNet, pods: IpNet) -> Vec<MasqRule> {
    let multicast: IpNet = match Family::of_net(&cluster) {
        Family::V4 => "224.0.0.0/4".parse().expect("valid"),
        Family::V6 => "ff00::/8".parse().expect("valid"),
    };
    let addr = |field, net, negated| Cond::Addr { field, net, negated };
    let rule = |conds: Vec<Cond>, action| MasqRule { conds, action };
    use Field::{Daddr, Saddr};
    vec![
        rule(vec![Cond::Mark(KUBE_PROXY_MARK)], Action::Return),
        rule(vec![addr(Saddr, pods, false), addr(Daddr, cluster, false)], Action::Return),
        rule(vec![addr(Saddr, cluster, false), addr(Daddr, pods, false)], Action::Return),
        rule(vec![addr(Saddr, pods, true), addr(Daddr, cluster, false)], Action::Return),
        rule(vec![addr(Saddr, cluster, false), addr(Daddr, multicast, true)], Action::MasqueradeFullyRandom),
        rule(vec![addr(Saddr, cluster, true), addr(Daddr, cluster, false)], Action::MasqueradeFullyRandom),
    ]
}

/// flanneld's `forward` rules for one family's Network: accepted from it and to it.
pub fn forward_rules(cluster: IpNet) -> Vec<MasqRule> {
    let addr = |field| Cond::Addr { field, net: cluster, negated: false };
    vec![
        MasqRule { conds: vec![addr(Field::Saddr)], action: Action::Accept },
        MasqRule { conds: vec![addr(Field::Daddr)], action: Action::Accept },
    ]
}

#[cfg(test)]
impl MasqRule {
    /// The rule as `nft` writes it (`accept` for the forward chain's).
    pub fn render(&self) -> String {
        let mut words: Vec<String> = self
            .conds
            .iter()
            .map(|cond| match cond {
                Cond::Mark(mark) => format!("meta mark 0x{mark:08x}"),
                Cond::Addr { field, net, negated } => {
                    let kw = Family::of_net(net).nft_keyword();
                    let field = if *field == Field::Saddr { "saddr" } else { "daddr" };
                    format!("{kw} {field} {}{net}", if *negated { "!= " } else { "" })
                }
            })
            .collect();
        words.push(match self.action {
            Action::Return => "return".into(),
            Action::Accept => "accept".into(),
            Action::MasqueradeFullyRandom => "masquerade fully-random".into(),
        });
        words.join(" ")
    }
}

fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    }
}

fn message(command: u16, family: u8) -> Request {
    Request::new((NFNL_SUBSYS_NFTABLES << 8) | command, &[family, 0, 0, 0])
}

/// libnftnl's userdata holding one comment: type, length, the string with its NUL.
fn comment(text: &str) -> Vec<u8> {
    let mut udata = vec![UDATA_COMMENT, (text.len() + 1) as u8];
    udata.extend_from_slice(text.as_bytes());
    udata.push(0);
    udata
}

/// The messages of one transaction: each table of the layout (flanneld's two, the old `inet fabricd`) made if
/// missing and deleted, then per family flanneld's table with its `postrtg` chain and rules for the
/// (cluster, node subnet) of `pairs` of that family, and its `forward` chain and rules for the Network of
/// `forward` of that family (`--iptables-forward-rules`). Nothing asked: only the removal (cleanup).
pub fn transaction(pairs: &[(IpNet, IpNet)], forward: &[IpNet]) -> Vec<(Request, u16)> {
    let mut messages = Vec::new();
    let mut table_message = |command, family, name: &str, flags| {
        let mut m = message(command, family);
        m.attr_str(NFTA_TABLE_NAME, name);
        messages.push((m, flags));
    };
    for (family, name) in [(NFPROTO_INET, OLD_TABLE), (NFPROTO_IPV4, TABLES[0].1), (NFPROTO_IPV6, TABLES[1].1)] {
        table_message(NFT_MSG_NEWTABLE, family, name, NLM_F_REQUEST | NLM_F_CREATE);
        table_message(NFT_MSG_DELTABLE, family, name, NLM_F_REQUEST);
    }
    for (family, table) in TABLES {
        let masq = pairs.iter().find(|(cluster, _)| Family::of_net(cluster) == family);
        let accept = forward.iter().find(|cluster| Family::of_net(cluster) == family);
        if masq.is_none() && accept.is_none() {
            continue;
        }
        let proto = nfproto(family);
        let mut m = message(NFT_MSG_NEWTABLE, proto);
        m.attr_str(NFTA_TABLE_NAME, table).attr(NFTA_TABLE_USERDATA, &comment(&format!("rules for {table}")));
        messages.push((m, NLM_F_REQUEST | NLM_F_CREATE));
        let chains = [
            masq.map(|(cluster, pods)| (BaseChain::Postrouting, rules(*cluster, *pods))),
            accept.map(|cluster| (BaseChain::Forward, forward_rules(*cluster))),
        ];
        for (chain, rules) in chains.into_iter().flatten() {
            messages.push((chain_message(proto, table, chain), NLM_F_REQUEST | NLM_F_CREATE));
            for rule in rules {
                let m = rule_message(proto, table, chain.name(), &rule);
                messages.push((m, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND));
            }
        }
    }
    messages
}

/// flanneld's two base chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BaseChain {
    /// `postrtg`: nat, postrouting, priority srcnat.
    Postrouting,
    /// `forward`: filter, forward, priority filter.
    Forward,
}

impl BaseChain {
    fn name(self) -> &'static str {
        match self {
            BaseChain::Postrouting => CHAIN,
            BaseChain::Forward => FORWARD_CHAIN,
        }
    }
}

/// `add chain <table> postrtg { type nat hook postrouting priority srcnat; comment "…"; }`, or `forward { type
/// filter hook forward priority filter; comment "…"; }`.
fn chain_message(family: u8, table: &str, chain: BaseChain) -> Request {
    let (hooknum, priority, kind, text) = match chain {
        BaseChain::Postrouting => (NF_INET_POST_ROUTING, PRIORITY_SRCNAT, "nat", CHAIN_COMMENT),
        BaseChain::Forward => (NF_INET_FORWARD, 0, "filter", FORWARD_COMMENT),
    };
    let mut m = message(NFT_MSG_NEWCHAIN, family);
    m.attr_str(NFTA_CHAIN_TABLE, table).attr_str(NFTA_CHAIN_NAME, chain.name());
    let hook = m.begin_nested(NFTA_CHAIN_HOOK | NLA_F_NESTED);
    m.attr(NFTA_HOOK_HOOKNUM, &hooknum.to_be_bytes()).attr(NFTA_HOOK_PRIORITY, &priority.to_be_bytes());
    m.end_nested(hook);
    m.attr_str(NFTA_CHAIN_TYPE, kind).attr(NFTA_CHAIN_USERDATA, &comment(text));
    m
}

/// `add rule <table> <chain> <rule>`.
fn rule_message(family: u8, table: &str, chain: &str, rule: &MasqRule) -> Request {
    let mut m = message(NFT_MSG_NEWRULE, family);
    m.attr_str(NFTA_RULE_TABLE, table).attr_str(NFTA_RULE_CHAIN, chain);
    let list = m.begin_nested(NFTA_RULE_EXPRESSIONS | NLA_F_NESTED);
    let mut e = Expressions(&mut m);
    for cond in &rule.conds {
        match *cond {
            // The mark is a host-order integer to nft.
            Cond::Mark(mark) => e.meta(NFT_META_MARK, NFT_REG_1).cmp(NFT_CMP_EQ, &mark.to_ne_bytes()),
            Cond::Addr { field, net, negated } => prefix_match(&mut e, field, net, negated),
        };
    }
    match rule.action {
        Action::Return => e.verdict(NFT_RETURN, None),
        Action::Accept => e.verdict(NF_ACCEPT, None),
        Action::MasqueradeFullyRandom => e.masquerade(NF_NAT_RANGE_PROTO_RANDOM_FULLY),
    };
    m.end_nested(list);
    m
}

/// The packet's address `field` in `net`, as nft 1.0 encodes it: a prefix of whole bytes has those bytes
/// loaded and compared (`payload load 2b @ network header + 12` for a /16); any other has the whole address
/// loaded and masked first (`bitwise reg 1 = (reg 1 & 0x000000f0) ^ 0` for a /4).
fn prefix_match<'e, 'm>(
    e: &'e mut Expressions<'m>,
    field: Field,
    net: IpNet,
    negated: bool,
) -> &'e mut Expressions<'m> {
    let address: Vec<u8> = match net.network() {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    let bits = usize::from(net.prefix_len());
    let whole_bytes = bits % 8 == 0;
    let len = if whole_bytes { bits / 8 } else { address.len() };
    e.address(Family::of_net(&net), field, Some(len as u32), NFT_REG_1);
    if !whole_bytes {
        let mask: Vec<u8> = match net.netmask() {
            std::net::IpAddr::V4(mask) => mask.octets().to_vec(),
            std::net::IpAddr::V6(mask) => mask.octets().to_vec(),
        };
        e.bitwise(&mask, &vec![0; len]);
    }
    e.cmp(if negated { NFT_CMP_NEQ } else { NFT_CMP_EQ }, &address[..len])
}

/// Applies [`transaction`] as one batch.
pub fn apply(pairs: &[(IpNet, IpNet)], forward: &[IpNet]) -> Result<(), BatchError> {
    nfnl::commit_messages(&mut transaction(pairs, forward))
}

/// The number of rules in `chain` of `family`'s flanneld table (an `NFT_MSG_GETRULE` dump of that table and
/// chain; 0 when it does not exist).
pub fn rule_count(family: Family, chain: &str) -> io::Result<usize> {
    let table = TABLES.iter().find(|(f, _)| *f == family).expect("both families").1;
    let socket = nfnl::open_socket()?;
    let mut request = message(NFT_MSG_GETRULE, nfproto(family));
    request.attr_str(NFTA_RULE_TABLE, table).attr_str(NFTA_RULE_CHAIN, chain);
    let rule_type = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE;
    let mut count = 0;
    let answer = wire::exchange(&socket, &mut request, netlink_packet_core::NLM_F_DUMP, 1, |kind, _| {
        count += usize::from(kind == rule_type);
    });
    match answer {
        Ok(_) => Ok(count),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(0),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    #[test]
    fn flanneld_s_rules_in_its_order() {
        let rendered: Vec<String> =
            rules(net("10.244.0.0/16"), net("10.244.3.0/24")).iter().map(|r| r.render()).collect();
        assert_eq!(
            rendered,
            [
                "meta mark 0x00004000 return",
                "ip saddr 10.244.3.0/24 ip daddr 10.244.0.0/16 return",
                "ip saddr 10.244.0.0/16 ip daddr 10.244.3.0/24 return",
                "ip saddr != 10.244.3.0/24 ip daddr 10.244.0.0/16 return",
                "ip saddr 10.244.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random",
                "ip saddr != 10.244.0.0/16 ip daddr 10.244.0.0/16 masquerade fully-random",
            ]
        );
        let v6 = rules(net("fd00:10:244::/56"), net("fd00:10:244:3::/64"));
        assert_eq!(v6[4].render(), "ip6 saddr fd00:10:244::/56 ip6 daddr != ff00::/8 masquerade fully-random");
    }

    /// Attributes as (kind without flags, value).
    type Attrs = Vec<(u16, Vec<u8>)>;

    /// The attributes of a message after its 4-byte nfgenmsg, as (kind without flags, value).
    fn attrs(payload: &[u8]) -> Attrs {
        wire::attributes(payload).map(|(kind, value)| (kind & !NLA_F_NESTED, value.to_vec())).collect()
    }

    /// The expressions of a NEWRULE message: (name, data attributes).
    fn expressions(payload: &[u8]) -> Vec<(String, Attrs)> {
        let rule = attrs(&payload[4..]);
        let list = &rule.iter().find(|(k, _)| *k == NFTA_RULE_EXPRESSIONS).unwrap().1;
        attrs(list)
            .iter()
            .map(|(_, item)| {
                let item = attrs(item);
                let name = wire::as_string(&item[0].1);
                (name, attrs(&item[1].1))
            })
            .collect()
    }

    fn nested_value(value: &[u8]) -> Vec<u8> {
        attrs(value)[0].1.clone()
    }

    #[test]
    fn rules_are_encoded_as_nft_encodes_them() {
        let mut messages = transaction(&[(net("10.244.0.0/16"), net("10.244.3.0/24"))], &[]);
        // 3 tables made and deleted, then the table, the chain and six rules.
        assert_eq!(messages.len(), 6 + 2 + 6);
        let payloads: Vec<Vec<u8>> = messages.iter_mut().map(|(m, flags)| m.finish(*flags, 1)[16..].to_vec()).collect();
        assert_eq!(payloads[0][0], NFPROTO_INET, "inet fabricd first");
        assert_eq!(attrs(&payloads[7][4..]).iter().find(|(k, _)| *k == NFTA_CHAIN_TYPE).unwrap().1, b"nat\0");
        // ip saddr 10.244.3.0/24 ip daddr 10.244.0.0/16 return: 3 and 2 bytes loaded, no bitwise.
        let exprs = expressions(&payloads[9]);
        let names: Vec<&str> = exprs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["payload", "cmp", "payload", "cmp", "immediate"]);
        assert_eq!(exprs[0].1[2..], [(3, 12u32.to_be_bytes().to_vec()), (4, 3u32.to_be_bytes().to_vec())]);
        assert_eq!(nested_value(&exprs[1].1[2].1), [10, 244, 3]);
        assert_eq!(exprs[2].1[2..], [(3, 16u32.to_be_bytes().to_vec()), (4, 2u32.to_be_bytes().to_vec())]);
        assert_eq!(nested_value(&exprs[3].1[2].1), [10, 244]);
        // ip daddr != 224.0.0.0/4: the 4 bytes, masked with f0000000, compared not equal; masquerade fully-random.
        let exprs = expressions(&payloads[12]);
        let names: Vec<&str> = exprs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["payload", "cmp", "payload", "bitwise", "cmp", "masq"]);
        assert_eq!(exprs[2].1[3], (4, 4u32.to_be_bytes().to_vec()));
        assert_eq!(nested_value(&exprs[3].1[3].1), [0xf0, 0, 0, 0]);
        assert_eq!(nested_value(&exprs[3].1[4].1), [0, 0, 0, 0]);
        assert_eq!(exprs[4].1[1], (2, NFT_CMP_NEQ.to_be_bytes().to_vec()));
        assert_eq!(nested_value(&exprs[4].1[2].1), [224, 0, 0, 0]);
        assert_eq!(exprs[5].1, [(1, 0x10u32.to_be_bytes().to_vec())]);
        // meta mark 0x00004000 return.
        let exprs = expressions(&payloads[8]);
        assert_eq!(exprs[0].1, [(1, 1u32.to_be_bytes().to_vec()), (2, 3u32.to_be_bytes().to_vec())]);
        assert_eq!(nested_value(&exprs[1].1[2].1), 0x4000u32.to_ne_bytes());
        assert_eq!(comment("ab"), [0, 3, b'a', b'b', 0]);
        assert_eq!(transaction(&[], &[]).len(), 6, "cleanup: the removals only");
        // --iptables-forward-rules: the forward chain (filter, hook forward 2, priority 0) and two accepts.
        let mut messages = transaction(&[], &[net("fd00:10:244::/56")]);
        assert_eq!(messages.len(), 6 + 2 + 2, "only the IPv6 table, with only its forward chain");
        let payloads: Vec<Vec<u8>> = messages.iter_mut().map(|(m, flags)| m.finish(*flags, 1)[16..].to_vec()).collect();
        assert_eq!(payloads[6][0], NFPROTO_IPV6);
        let chain = attrs(&payloads[7][4..]);
        assert_eq!(chain.iter().find(|(k, _)| *k == NFTA_CHAIN_NAME).unwrap().1, b"forward\0");
        let hook = attrs(&chain.iter().find(|(k, _)| *k == NFTA_CHAIN_HOOK).unwrap().1);
        assert_eq!(hook, [(1, 2u32.to_be_bytes().to_vec()), (2, 0u32.to_be_bytes().to_vec())]);
        let exprs = expressions(&payloads[8]);
        assert_eq!(exprs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["payload", "cmp", "immediate"]);
        assert_eq!(exprs[0].1[2..], [(3, 8u32.to_be_bytes().to_vec()), (4, 7u32.to_be_bytes().to_vec())]);
        let verdict = attrs(&attrs(&exprs[2].1[1].1)[0].1);
        assert_eq!(verdict, [(NFTA_VERDICT_CODE, 1i32.to_be_bytes().to_vec())], "accept");
        let rendered: Vec<String> = forward_rules(net("10.244.0.0/16")).iter().map(|r| r.render()).collect();
        assert_eq!(rendered, ["ip saddr 10.244.0.0/16 accept", "ip daddr 10.244.0.0/16 accept"]);
    }
}
