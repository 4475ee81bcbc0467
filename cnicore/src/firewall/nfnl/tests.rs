//! Each case is one description of elements: rendered as nft text it gives the commands of the fixture,
//! encoded it gives the bytes nft 1.0.6 sent for those commands (`nft-1.0.6-batches.txt`).

use super::*;
use crate::firewall::nftables::{add_script, remove_script};

const FIXTURES: &str = include_str!("nft-1.0.6-batches.txt");

struct Fixture {
    commands: String,
    bytes: Vec<u8>,
}

fn fixture(name: &str) -> Fixture {
    let mut lines = FIXTURES.lines().skip_while(|l| *l != format!("case {name}")).skip(1);
    let mut commands = String::new();
    let mut hex = String::new();
    for line in lines.by_ref().take_while(|l| !l.is_empty()) {
        match line.strip_prefix("> ") {
            Some(command) => {
                commands.push_str(command);
                commands.push('\n');
            }
            None => hex.push_str(line),
        }
    }
    assert!(!hex.is_empty(), "no fixture {name}");
    let bytes = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    Fixture { commands, bytes }
}

/// nft's datagram without the `NFTA_SET_ELEM_LIST_SET_ID` attributes (the ID of the set in nft's cache,
/// which the kernel reads only for a set created in the same batch; we do not send it).
fn without_set_ids(datagram: &[u8]) -> Vec<u8> {
    let new_set_element = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM;
    let mut out = Vec::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        let len = u32::from_ne_bytes(rest[..4].try_into().unwrap()) as usize;
        let (message, next) = rest.split_at(wire::align(len));
        let mut kept = message[..20].to_vec(); // nlmsghdr + nfgenmsg
        let mut at = 20;
        while at < len {
            let attr_len = usize::from(u16::from_ne_bytes([message[at], message[at + 1]]));
            let kind = u16::from_ne_bytes([message[at + 2], message[at + 3]]);
            let end = (at + wire::align(attr_len)).min(message.len());
            let message_type = u16::from_ne_bytes([message[4], message[5]]);
            if !(message_type == new_set_element && kind == 4) {
                kept.extend_from_slice(&message[at..end]);
            }
            at = end;
        }
        let new_len = kept.len() as u32;
        kept[..4].copy_from_slice(&new_len.to_ne_bytes());
        out.extend_from_slice(&kept);
        rest = next;
    }
    out
}

fn ip(text: &str) -> Datum {
    Datum::Addr(text.parse().unwrap())
}

fn proto(name: &'static str) -> Datum {
    let number = match name {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        _ => unreachable!(),
    };
    Datum::Proto { number, name }
}

fn element(set: &str, key: Vec<Datum>, value: Option<MapValue>, tag: Option<&str>) -> Element {
    let element = Element::new(set, key, value);
    match tag {
        Some(tag) => element.tagged(tag),
        None => element,
    }
}

fn jump(chain: &str) -> Option<MapValue> {
    Some(MapValue::Jump(chain.to_string()))
}

/// The description renders to the fixture's commands and encodes to its bytes.
fn assert_case(name: &str, table: &str, elements: &[Element], remove: bool) {
    let fixture = fixture(name);
    let mut batch = Batch::inet(table);
    for e in elements {
        if remove {
            batch.remove_if_present(e);
        } else {
            batch.add(e, true);
        }
    }
    let script = if remove { remove_script(table, elements) } else { add_script(table, elements) };
    assert_eq!(script.render(), fixture.commands, "{name}: nft text");
    assert_eq!(hex(&batch.datagram()), hex(&without_set_ids(&fixture.bytes)), "{name}: netlink bytes");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const MASQ: &str = "masq-0a1b2c3d-0123456789abcdef";
const PM: &str = "pm-0a1b2c3d-0123456789abcdef";
const FW: &str = "fw-0a1b2c3d-0123456789abcdef";

fn masq_v4(tag: Option<&str>) -> Vec<Element> {
    vec![
        element("local4_24", vec![ip("10.244.1.5"), ip("10.244.1.0")], None, tag),
        element("nomasq4", vec![ip("10.244.1.5")], jump("nomasq4-0123456789ab"), tag),
        element("pods4_24", vec![ip("10.244.1.5")], None, tag),
    ]
}

#[test]
fn masquerade_elements() {
    assert_case("masq_add_v4", "cni_ipmasq", &masq_v4(Some(MASQ)), false);
    let v6 = vec![
        element("local6_64", vec![ip("fd00:10:244:1::5"), ip("fd00:10:244:1::")], None, Some(MASQ)),
        element("nomasq6", vec![ip("fd00:10:244:1::5")], Some(MapValue::Continue), Some(MASQ)),
        element("pods6_64", vec![ip("fd00:10:244:1::5")], None, Some(MASQ)),
    ];
    assert_case("masq_add_v6", "cni_ipmasq", &v6, false);
    // DEL's pairs: the comment is not sent (the tagged elements are the same element either way).
    assert_case("masq_del_v4", "cni_ipmasq", &masq_v4(Some(MASQ)), true);
}

fn target(addr: &str, port: u16) -> Option<MapValue> {
    Some(MapValue::Data(vec![ip(addr), Datum::Port(port)]))
}

#[test]
fn portmap_elements() {
    let tcp8080 = vec![proto("tcp"), Datum::Port(8080)];
    let hostip53 = vec![ip("10.1.0.1"), proto("udp"), Datum::Port(53)];
    let hairpin = vec![ip("10.22.0.0"), ip("10.22.0.5"), proto("tcp"), Datum::Port(80)];
    let v4 = vec![
        element("hostports4", tcp8080.clone(), jump("dnat4-any"), Some(PM)),
        element("dnat4", tcp8080.clone(), target("10.22.0.5", 80), Some(PM)),
        element("masq_hairpin4_24", hairpin.clone(), None, Some(PM)),
        element("masq_local4", vec![ip("10.22.0.5"), proto("tcp"), Datum::Port(80)], None, Some(PM)),
        element("hostip_ports4", hostip53.clone(), jump("hostip-dnat4-any"), Some(PM)),
        element("hostip_dnat4", hostip53, target("10.22.0.5", 5353), Some(PM)),
    ];
    assert_case("portmap_add_v4", "cni_portmap", &v4, false);
    assert_case("portmap_del_v4", "cni_portmap", &v4[..3], true);
    let sctp9000 = vec![proto("sctp"), Datum::Port(9000)];
    let hostip = vec![ip("fd00::1"), proto("udp"), Datum::Port(65535)];
    let v6 = vec![
        element("hostports6", sctp9000.clone(), jump("dnat6-any"), Some(PM)),
        element("dnat6", sctp9000, target("fd22::5", 9001), Some(PM)),
        element(
            "masq_hairpin6_64",
            vec![ip("fd22::"), ip("fd22::5"), proto("sctp"), Datum::Port(9001)],
            None,
            Some(PM),
        ),
        element("hostip_ports6", hostip.clone(), jump("hostip-dnat6-any"), Some(PM)),
        element("hostip_dnat6", hostip, target("fd22::5", 1), Some(PM)),
    ];
    assert_case("portmap_add_v6", "cni_portmap", &v6, false);
}

#[test]
fn firewall_elements() {
    let bridge = Datum::ifname("cni-podman0").unwrap();
    let add = vec![
        element("containers4", vec![ip("10.88.0.2")], None, Some(FW)),
        element("containers6", vec![ip("fd00::2")], None, Some(FW)),
        element("isolated", vec![bridge.clone()], None, None),
        element("same_bridge", vec![bridge.clone(), bridge.clone()], None, None),
        element("within_bridge", vec![bridge.clone(), bridge], None, None),
    ];
    assert_case("firewall_add", "cni_firewall", &add, false);
    // A name of 15 characters fills the 16 bytes with its NUL.
    let long = Datum::ifname("br-0123456789ab").unwrap();
    let del = vec![
        element("containers4", vec![ip("10.88.0.2")], None, Some(FW)),
        element("within_bridge", vec![long.clone(), long], None, None),
    ];
    assert_case("firewall_del", "cni_firewall", &del, true);
    assert!(Datum::ifname("a\"b").is_err());
}

#[test]
fn what_cannot_be_encoded_is_not_sent() {
    let mut batch = Batch::inet("t");
    batch.add(&element("s", vec![Datum::ifname(&"x".repeat(17)).unwrap()], None, None), false);
    assert!(batch.is_empty());
    assert!(matches!(batch.commit(), Err(BatchError::Unavailable(_))));
    let mut batch = Batch::inet("t");
    batch.add(&element("s", vec![ip("10.0.0.1")], None, Some(&"c".repeat(255))), true);
    assert!(matches!(batch.commit(), Err(BatchError::Unavailable(_))));
}

#[test]
fn state_refusals_are_told_apart() {
    let refused = |errno| BatchError::Refused { index: Some(0), error: io::Error::from_raw_os_error(errno) };
    assert!(refused(libc::ENOENT).is_state());
    assert!(refused(libc::EEXIST).is_state());
    assert!(!refused(libc::EINVAL).is_state());
    assert!(!BatchError::Unavailable(io::Error::from_raw_os_error(libc::EPERM)).is_state());
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn dump_requests_are_those_of_nft() {
    // `nft list table inet cni_ipmasq` and `nft list set inet cni_ipmasq nomasq4` (nft 1.0.6, strace); we ask
    // for an ACK besides (NLM_F_ACK), the rest is the same.
    let flags = NLM_F_REQUEST | NLM_F_DUMP;
    let sets = concat!(
        "24000000",
        "0a0a",
        "0103",
        "00000000",
        "00000000",
        "01000000",
        "0f000100",
        "636e695f69706d6173710000",
    );
    assert_eq!(hex(sets_request("cni_ipmasq").finish(flags, 0)), sets);
    let elements = concat!(
        "30000000",
        "0d0a",
        "0103",
        "00000000",
        "00000000",
        "01000000",
        "0c000200",
        "6e6f6d6173713400",
        "0f000100",
        "636e695f69706d6173710000",
    );
    assert_eq!(hex(elements_request("cni_ipmasq", "nomasq4").finish(flags, 0)), elements);
}

/// What the kernel answered nft's GETSETELEM dumps of `nomasq6` and `local6_64` (the elements of
/// `masq_add_v6`): the first datagram of each.
const NOMASQ6_DUMP: &str = concat!(
    "880000000c0a02000000000020210000010000110f000100636e695f69706d61737100000c0002006e6f6d617371360058000300",
    "540001001800010014000100fd000010024400010000000000000005100002000c00020008000100ffffffff25000600001f6d61",
    "73712d30613162326333642d3031323334353637383961626364656600000000",
);
const LOCAL6_DUMP: &str = concat!(
    "8c0000000c0a02000000000026210000010000110f000100636e695f69706d61737100000e0002006c6f63616c365f3634000000",
    "58000300540001002800010024000100fd000010024400010000000000000005fd0000100244000100000000000000002500060000",
    "1f6d6173712d30613162326333642d3031323334353637383961626364656600000000",
);

fn parsed(datagram: &str, set: &str) -> Vec<ListedElement> {
    let bytes = unhex(datagram);
    let mut out = Vec::new();
    for message in wire::split_datagram(&bytes).unwrap() {
        if let Received::Message { message_type, payload } = message.received {
            out.extend(parse_elements(message_type, payload, set));
        }
    }
    out
}

#[test]
fn dumped_elements_give_their_key_bytes_and_comment() {
    let v6 = |text: &str| text.parse::<std::net::Ipv6Addr>().unwrap().octets().to_vec();
    let comment = Some("masq-0a1b2c3d-0123456789abcdef".to_string());
    let nomasq = parsed(NOMASQ6_DUMP, "nomasq6");
    assert_eq!(
        nomasq,
        vec![ListedElement { set: "nomasq6".into(), key: v6("fd00:10:244:1::5"), comment: comment.clone() }]
    );
    let local = parsed(LOCAL6_DUMP, "local6_64");
    let key = [v6("fd00:10:244:1::5"), v6("fd00:10:244:1::")].concat();
    assert_eq!(local, vec![ListedElement { set: "local6_64".into(), key: key.clone(), comment }]);
    // The key bytes are what a deletion sends back: the same as the typed element's.
    let typed = Element::new("local6_64", vec![ip("fd00:10:244:1::5"), ip("fd00:10:244:1::")], None);
    let (mut by_type, mut by_listing) = (Batch::inet("cni_ipmasq"), Batch::inet("cni_ipmasq"));
    by_type.delete(&typed);
    by_listing.delete_listed(&local[0]);
    assert_eq!(by_type.datagram(), by_listing.datagram());
    assert_eq!(key, encode_data(&typed.key).unwrap());
    // Userdata with another TLV before the comment, and a truncated one.
    assert_eq!(userdata_comment(&[1, 1, 0, 0, 3, b'a', b'b', 0]), Some("ab".to_string()));
    assert_eq!(userdata_comment(&[0, 9, b'a']), None);
}

#[test]
fn anonymous_sets_are_not_listed() {
    let set = |name: &str, flags: u32| {
        let mut request = Request::new(0, &[1, 0, 0, 0]);
        request.attr_str(NFTA_SET_TABLE, "t").attr_str(NFTA_SET_NAME, name).attr(NFTA_SET_FLAGS, &flags.to_be_bytes());
        request.finish(0, 0)[wire::NLMSG_HDRLEN..].to_vec()
    };
    let new_set = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSET;
    assert_eq!(parse_set(new_set, &set("pods4_24", 0), "t"), Some("pods4_24".to_string()));
    assert_eq!(parse_set(new_set, &set("__set0", NFT_SET_ANONYMOUS | 2), "t"), None);
    assert_eq!(parse_set(new_set, &set("pods4_24", 0), "other"), None);
}

#[test]
fn tables_request_bytes() {
    let mut request = tables_request();
    let flags = netlink_packet_core::NLM_F_REQUEST | netlink_packet_core::NLM_F_ACK | NLM_F_DUMP;
    let bytes = request.finish(flags, 7).to_vec();
    let mut expected = Vec::new();
    expected.extend_from_slice(&20u32.to_ne_bytes()); // length
    expected.extend_from_slice(&0x0a01u16.to_ne_bytes()); // NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETTABLE
    expected.extend_from_slice(&0x0305u16.to_ne_bytes()); // REQUEST | ACK | DUMP
    expected.extend_from_slice(&7u32.to_ne_bytes()); // sequence
    expected.extend_from_slice(&0u32.to_ne_bytes()); // port
    expected.extend_from_slice(&[0, 0, 0, 0]); // AF_UNSPEC, NFNETLINK_V0, resource id 0
    assert_eq!(bytes, expected);
}

#[test]
fn parses_tables_of_the_dump() {
    // nfgenmsg (inet), NFTA_TABLE_NAME "cni_ipmasq", NFTA_TABLE_FLAGS 0.
    let mut payload = vec![1, 0, 0, 0];
    payload.extend_from_slice(&15u16.to_ne_bytes());
    payload.extend_from_slice(&NFTA_TABLE_NAME.to_ne_bytes());
    payload.extend_from_slice(b"cni_ipmasq\0\0");
    payload.extend_from_slice(&8u16.to_ne_bytes());
    payload.extend_from_slice(&2u16.to_ne_bytes());
    payload.extend_from_slice(&0u32.to_ne_bytes());
    let table = parse_table(0x0a00, &payload);
    assert_eq!(table, Some(("inet".to_string(), "cni_ipmasq".to_string())));
    payload[0] = 10;
    assert_eq!(parse_table(0x0a00, &payload).map(|t| t.0), Some("ip6".to_string()));
    assert_eq!(parse_table(0x0a03, &payload), None, "a chain, not a table");
    payload[0] = 99;
    assert_eq!(parse_table(0x0a00, &payload), None, "an unknown family");
}

/// A NEWRULE of `inet <table> <chain>` with the expressions `write` writes, as the one message of a batch.
fn rule_datagram(table: &str, chain: &str, write: impl FnOnce(&mut Expressions)) -> Vec<u8> {
    let mut m = Request::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE, &[NFPROTO_INET, 0, 0, 0]);
    m.attr_str(NFTA_RULE_TABLE, table).attr_str(NFTA_RULE_CHAIN, chain);
    let list = m.begin_nested(NFTA_RULE_EXPRESSIONS | NLA_F_NESTED);
    write(&mut Expressions(&mut m));
    m.end_nested(list);
    datagram(&mut [(m, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND)])
}

#[test]
fn counter_log_and_limit_are_those_of_nft() {
    let logged = rule_datagram("cni-netpol", "ingress", |e| {
        e.limit(10, 20).counter().log("cni-netpol:ingress", 100);
    });
    assert_eq!(hex(&logged), hex(&fixture("netpol_log_rule").bytes));
    let dropped = rule_datagram("cni-netpol", "ingress", |e| {
        e.counter().verdict(NF_DROP, None);
    });
    assert_eq!(hex(&dropped), hex(&fixture("netpol_drop_rule").bytes));
    // The jump's rule ends as nft ends it: the counter, then the verdict (its lookup's attributes are in
    // another order and nft names the set by its cache's ID too, so only the end is compared).
    let jump = rule_datagram("cni-netpol", "forward", |e| {
        e.counter().verdict(NFT_JUMP, Some("ingress"));
    });
    let nft = fixture("netpol_counted_jump").bytes;
    let (ours, theirs) = (&jump[jump.len() - 20 - 80..], &nft[nft.len() - 20 - 80..]);
    assert_eq!(hex(ours), hex(theirs), "counter jump ingress, then BATCH_END");
}
