//! Extra match conditions given in a config as iptables arguments (portmap's `conditionsV4` / `conditionsV6`,
//! e.g. `["!", "-d", "192.0.2.0/24"]`).
//!
//! The reference pastes them into `iptables` command lines; here they are parsed into a small typed language
//! and rendered for either backend, so a condition can never add a rule, a target or another table. Supported
//! (each optionally negated with a leading `!`):
//!
//! - `-s` / `--source`, `-d` / `--destination` with one address or CIDR of the rule's family;
//! - `-i` / `--in-interface`, `-o` / `--out-interface` with an interface name (a trailing `+` is a wildcard);
//! - `-m addrtype` with `--src-type` and/or `--dst-type` (UNSPEC, UNICAST, LOCAL, BROADCAST, ANYCAST,
//!   MULTICAST, BLACKHOLE, UNREACHABLE, PROHIBIT);
//! - `-m mark --mark value[/mask]`;
//! - with the iptables backend, any other match the reference passes through to iptables (`-p udp`, `-m
//!   conntrack --ctstate NEW`, `-m set --match-set s src`, ...): kept as words, each quoted for
//!   `iptables-restore`, so it stays one match of the rule. Targets and commands (`-j`, `-g`, `-A`, `-t`, ...)
//!   are refused; iptables refuses what it does not know. Written as `iptables-save` prints it, CHECK finds it.
//!
//! The nft-syntax form of reference v1.6+ (the first word neither starts with `-` nor is `!`, e.g.
//! `["ip", "saddr", "!=", "192.0.2.0/24"]`) is kept as text for the nftables backend, after checking that it
//! is matches only: no `;`, `#`, newline, `@`, `$` or backslash, balanced quotes, and no statement or verdict
//! word (`accept`, `drop`, `jump`, `set`, `counter`, `dnat`, ...), so it can neither end the rule nor add one.
//!
//! Anything else is an invalid config (code 7) naming the token.

use ipnet::IpNet;

use super::iptables::Rule;
use super::{nftables, Family};
use crate::spec::{truncate_for_msg, Error, Result};

const ADDRESS_TYPES: &[&str] =
    &["UNSPEC", "UNICAST", "LOCAL", "BROADCAST", "ANYCAST", "MULTICAST", "BLACKHOLE", "UNREACHABLE", "PROHIBIT"];

/// One parsed condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    Source {
        net: IpNet,
        negated: bool,
    },
    Destination {
        net: IpNet,
        negated: bool,
    },
    InInterface {
        name: String,
        negated: bool,
    },
    OutInterface {
        name: String,
        negated: bool,
    },
    /// `-m addrtype`: (negated, type) for the source and/or destination address.
    AddrType {
        src: Option<(bool, &'static str)>,
        dst: Option<(bool, &'static str)>,
    },
    Mark {
        value: u32,
        mask: u32,
        negated: bool,
    },
    /// Another iptables match, passed through (iptables backend only): option and value words.
    Passthrough {
        words: Vec<String>,
    },
    /// Conditions in nft syntax (reference v1.6+), checked to be matches only (nftables backend only).
    Nft {
        text: String,
    },
}

/// True when conditions are in nft syntax, as the reference decides (`detectBackendOfConditions`): the first
/// word does not start with `-` or `!`.
pub fn is_nft_syntax(tokens: &[String]) -> bool {
    tokens.first().is_some_and(|t| !t.is_empty() && !t.starts_with('-') && !t.starts_with('!'))
}

/// iptables options that are not matches: targets, commands and table selection.
const IPTABLES_NOT_MATCHES: &[&str] = &[
    "-j",
    "--jump",
    "-g",
    "--goto",
    "-t",
    "--table",
    "-A",
    "--append",
    "-I",
    "--insert",
    "-D",
    "--delete",
    "-R",
    "--replace",
    "-N",
    "--new-chain",
    "-X",
    "--delete-chain",
    "-F",
    "--flush",
    "-P",
    "--policy",
    "-E",
    "--rename-chain",
    "-Z",
    "--zero",
    "-L",
    "--list",
    "-S",
    "--list-rules",
    "-C",
    "--check",
];

/// nft words that make a rule do something (statements, verdicts) rather than match.
const NFT_STATEMENTS: &[&str] = &[
    "accept",
    "drop",
    "reject",
    "queue",
    "continue",
    "return",
    "jump",
    "goto",
    "masquerade",
    "snat",
    "dnat",
    "redirect",
    "counter",
    "log",
    "limit",
    "quota",
    "notrack",
    "dup",
    "fwd",
    "tproxy",
    "synproxy",
    "set",
    "add",
    "update",
    "delete",
    "flow",
    "meter",
    "comment",
    "map",
    "vmap",
    "include",
    "define",
    "flush",
    "reset",
    "destroy",
    "insert",
    "replace",
    "create",
    "rule",
    "chain",
    "table",
];

/// The conditions of one address family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conditions {
    family: Family,
    items: Vec<Condition>,
}

impl Conditions {
    /// No conditions.
    pub fn none(family: Family) -> Conditions {
        Conditions { family, items: Vec::new() }
    }

    /// Parses conditions in either form: nft syntax ([`is_nft_syntax`]) or iptables arguments.
    pub fn parse_any(what: &str, family: Family, tokens: &[String]) -> Result<Conditions> {
        if is_nft_syntax(tokens) {
            Conditions::parse_nft(what, family, tokens)
        } else {
            Conditions::parse(what, family, tokens)
        }
    }

    /// Checks conditions in nft syntax: matches only (see the module docs).
    pub fn parse_nft(what: &str, family: Family, tokens: &[String]) -> Result<Conditions> {
        let text = tokens.join(" ");
        let error = |msg: String| Error::config(format!("invalid {what}: {msg}"));
        if let Some(c) = text.chars().find(|c| c.is_control() || matches!(c, ';' | '#' | '@' | '$' | '\\')) {
            return Err(error(format!("{c:?} cannot appear in nft conditions")));
        }
        if !text.matches('"').count().is_multiple_of(2) {
            return Err(error("unbalanced quote".into()));
        }
        let words = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        if let Some(word) = words.map(str::to_ascii_lowercase).find(|w| NFT_STATEMENTS.contains(&w.as_str())) {
            return Err(error(format!(
                "{word:?} is a statement or verdict, not a match: conditions only match packets"
            )));
        }
        let items = if text.trim().is_empty() { Vec::new() } else { vec![Condition::Nft { text }] };
        Ok(Conditions { family, items })
    }

    /// True when the conditions are in nft syntax (usable with the nftables backend only).
    pub fn is_nft(&self) -> bool {
        self.items.iter().any(|c| matches!(c, Condition::Nft { .. }))
    }

    /// True when some condition is an iptables match passed through (usable with the iptables backend only).
    pub fn has_passthrough(&self) -> bool {
        self.items.iter().any(|c| matches!(c, Condition::Passthrough { .. }))
    }

    /// Parses iptables-style arguments. `what` names the config field in errors.
    pub fn parse(what: &str, family: Family, tokens: &[String]) -> Result<Conditions> {
        let mut parser = Parser { what, family, tokens, position: 0 };
        let mut items = Vec::new();
        while parser.position < tokens.len() {
            items.push(parser.condition()?);
        }
        Ok(Conditions { family, items })
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn items(&self) -> &[Condition] {
        &self.items
    }

    /// Adds the conditions to an iptables rule (addresses and interfaces as rule options, the rest as matches
    /// after the ones already there, where the reference puts them).
    pub fn apply_iptables(&self, mut rule: Rule) -> Result<Rule> {
        for item in &self.items {
            rule = match item {
                Condition::Source { net, negated } => rule.source(*net, *negated)?,
                Condition::Destination { net, negated } => rule.destination(*net, *negated)?,
                Condition::InInterface { name, negated } => rule.in_interface(name, *negated)?,
                Condition::OutInterface { name, negated } => rule.out_interface(name, *negated)?,
                Condition::AddrType { src, dst } => {
                    let mut text = String::from("-m addrtype");
                    for (option, part) in [("--src-type", src), ("--dst-type", dst)] {
                        if let Some((negated, kind)) = part {
                            text.push_str(&format!(" {}{option} {kind}", if *negated { "! " } else { "" }));
                        }
                    }
                    rule.raw_match(text)
                }
                Condition::Mark { value, mask, negated } => {
                    let not = if *negated { "! " } else { "" };
                    let mark = if *mask == u32::MAX { format!("{value:#x}") } else { format!("{value:#x}/{mask:#x}") };
                    rule.raw_match(format!("-m mark {not}--mark {mark}"))
                }
                Condition::Passthrough { words } => {
                    rule.raw_match(words.iter().map(|w| super::iptables::save_string(w)).collect::<Vec<_>>().join(" "))
                }
                Condition::Nft { .. } => {
                    return Err(Error::config(
                        "conditions in nft syntax need the nftables backend (set \"backend\": \"nftables\")",
                    ))
                }
            };
        }
        Ok(rule)
    }

    /// The conditions as nftables match expressions, each preceded by a space (empty when there are none).
    pub fn nft(&self) -> Result<String> {
        let mut out = String::new();
        let ip = self.family.nft_keyword();
        let op = |negated: bool| if negated { "!= " } else { "" };
        for item in &self.items {
            let part = match item {
                Condition::Source { net, negated } => format!("{ip} saddr {}{}", op(*negated), net.trunc()),
                Condition::Destination { net, negated } => format!("{ip} daddr {}{}", op(*negated), net.trunc()),
                Condition::InInterface { name, negated } => format!("iifname {}{}", op(*negated), nft_ifname(name)?),
                Condition::OutInterface { name, negated } => format!("oifname {}{}", op(*negated), nft_ifname(name)?),
                Condition::AddrType { src, dst } => {
                    let mut parts = Vec::new();
                    for (which, part) in [("saddr", src), ("daddr", dst)] {
                        if let Some((negated, kind)) = part {
                            parts.push(format!("fib {which} type {}{}", op(*negated), kind.to_ascii_lowercase()));
                        }
                    }
                    parts.join(" ")
                }
                Condition::Mark { value, mask, negated } => {
                    if *mask == u32::MAX {
                        format!("meta mark {}{value:#x}", op(*negated))
                    } else {
                        format!("meta mark & {mask:#x} {} {value:#x}", if *negated { "!=" } else { "==" })
                    }
                }
                Condition::Passthrough { words } => {
                    return Err(Error::config(format!(
                        "the iptables match {:?} has no nftables translation here: write the conditions in nft syntax or use the iptables backend",
                        truncate_for_msg(&words.join(" "))
                    )))
                }
                Condition::Nft { text } => text.clone(),
            };
            out.push(' ');
            out.push_str(&part);
        }
        Ok(out)
    }
}

/// An interface name in nft syntax: iptables' trailing `+` wildcard becomes `*`.
fn nft_ifname(name: &str) -> Result<String> {
    match name.strip_suffix('+') {
        Some(prefix) => nftables::string(&format!("{prefix}*")),
        None => nftables::string(name),
    }
}

struct Parser<'a> {
    what: &'a str,
    family: Family,
    tokens: &'a [String],
    position: usize,
}

impl Parser<'_> {
    fn error(&self, msg: impl std::fmt::Display) -> Error {
        Error::config(format!("invalid {}: {msg}", self.what))
    }

    fn next(&mut self) -> Option<&str> {
        let token = self.tokens.get(self.position)?;
        self.position += 1;
        Some(token.as_str())
    }

    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.position).map(String::as_str)
    }

    fn value(&mut self, option: &str) -> Result<String> {
        match self.next() {
            Some(v) if v != "!" && !v.starts_with('-') => Ok(v.to_string()),
            _ => Err(self.error(format!("{option} needs a value"))),
        }
    }

    /// Consumes a leading `!`.
    fn negation(&mut self) -> bool {
        if self.peek() == Some("!") {
            self.position += 1;
            true
        } else {
            false
        }
    }

    fn condition(&mut self) -> Result<Condition> {
        let negated = self.negation();
        let Some(option) = self.next().map(str::to_string) else {
            return Err(self.error("'!' at the end"));
        };
        match option.as_str() {
            "-s" | "--source" | "--src" => Ok(Condition::Source { net: self.net(&option)?, negated }),
            "-d" | "--destination" | "--dst" => Ok(Condition::Destination { net: self.net(&option)?, negated }),
            "-i" | "--in-interface" => Ok(Condition::InInterface { name: self.interface(&option)?, negated }),
            "-o" | "--out-interface" => Ok(Condition::OutInterface { name: self.interface(&option)?, negated }),
            "-m" | "--match" if !negated => {
                let module = self.value("-m")?;
                match module.as_str() {
                    "addrtype" => self.addrtype(),
                    "mark" => self.mark(),
                    _ => self.passthrough(vec![option, module]),
                }
            }
            other if IPTABLES_NOT_MATCHES.contains(&other) => {
                Err(self.error(format!("{other:?} is not a match: conditions only select packets")))
            }
            other if other.starts_with('-') => {
                let mut words = if negated { vec!["!".to_string()] } else { Vec::new() };
                words.push(option.clone());
                self.passthrough(words)
            }
            other => Err(self.error(format!("unsupported condition {:?}", truncate_for_msg(other)))),
        }
    }

    /// An iptables match passed through: `words` so far, then its options and values up to the next match
    /// (`-m`) or a rule option that is not one of this match's. Every word is checked to be printable.
    fn passthrough(&mut self, mut words: Vec<String>) -> Result<Condition> {
        while let Some(next) = self.peek() {
            if matches!(next, "-m" | "--match") || (words.len() > 1 && matches!(next, "-s" | "-d" | "-i" | "-o" | "-p"))
            {
                break;
            }
            if IPTABLES_NOT_MATCHES.contains(&next) {
                return Err(self.error(format!("{next:?} is not a match: conditions only select packets")));
            }
            words.push(next.to_string());
            self.position += 1;
        }
        if let Some(bad) = words.iter().find(|w| w.is_empty() || w.chars().any(|c| c.is_control())) {
            return Err(self.error(format!("{:?} is not a printable word", truncate_for_msg(bad))));
        }
        Ok(Condition::Passthrough { words })
    }

    fn net(&mut self, option: &str) -> Result<IpNet> {
        let text = self.value(option)?;
        let net = text
            .parse::<IpNet>()
            .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
            .map_err(|_| self.error(format!("{option} {:?} is not an address or CIDR", truncate_for_msg(&text))))?;
        if Family::of_net(&net) != self.family {
            return Err(self.error(format!("{option} {text} is not an {} address", self.family.name())));
        }
        Ok(net)
    }

    fn interface(&mut self, option: &str) -> Result<String> {
        let name = self.value(option)?;
        let base = name.strip_suffix('+').unwrap_or(&name);
        let ok = !base.is_empty()
            && name.len() <= 15
            && base.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return Err(self.error(format!("{option} {:?} is not an interface name", truncate_for_msg(&name))));
        }
        Ok(name)
    }

    fn addrtype(&mut self) -> Result<Condition> {
        let (mut src, mut dst) = (None, None);
        loop {
            let start = self.position;
            let negated = self.negation();
            let slot = match self.peek() {
                Some("--src-type") => &mut src,
                Some("--dst-type") => &mut dst,
                _ => {
                    self.position = start;
                    break;
                }
            };
            let option = self.next().unwrap_or_default().to_string();
            if slot.is_some() {
                return Err(self.error(format!("{option} given twice")));
            }
            let kind = self.value(&option)?;
            let known = ADDRESS_TYPES
                .iter()
                .find(|t| t.eq_ignore_ascii_case(&kind))
                .ok_or_else(|| self.error(format!("unknown address type {:?}", truncate_for_msg(&kind))))?;
            *slot = Some((negated, *known));
        }
        if src.is_none() && dst.is_none() {
            return Err(self.error("-m addrtype needs --src-type or --dst-type"));
        }
        Ok(Condition::AddrType { src, dst })
    }

    fn mark(&mut self) -> Result<Condition> {
        let negated = self.negation();
        if self.next() != Some("--mark") {
            return Err(self.error("-m mark needs --mark value[/mask]"));
        }
        let text = self.value("--mark")?;
        let (value, mask) = match text.split_once('/') {
            Some((v, m)) => (parse_u32(v), parse_u32(m)),
            None => (parse_u32(&text), Some(u32::MAX)),
        };
        match (value, mask) {
            (Some(value), Some(mask)) => Ok(Condition::Mark { value, mask, negated }),
            _ => Err(self.error(format!("--mark {:?} is not value[/mask]", truncate_for_msg(&text)))),
        }
    }
}

fn parse_u32(text: &str) -> Option<u32> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(family: Family, tokens: &[&str]) -> Result<Conditions> {
        let tokens: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
        Conditions::parse("conditionsV4", family, &tokens)
    }

    #[test]
    fn renders_both_backends() {
        let c = parse(
            Family::V4,
            &[
                "!",
                "-d",
                "192.0.2.0/24",
                "-i",
                "eth+",
                "-m",
                "addrtype",
                "!",
                "--src-type",
                "local",
                "-m",
                "mark",
                "--mark",
                "0x4000/0x4000",
            ],
        )
        .unwrap();
        let rule = c.apply_iptables(Rule::new().protocol("tcp").jump("X")).unwrap();
        assert_eq!(
            rule.render(),
            "! -d 192.0.2.0/24 -i eth+ -p tcp -m addrtype ! --src-type LOCAL -m mark --mark 0x4000/0x4000 -j X"
        );
        assert_eq!(
            c.nft().unwrap(),
            " ip daddr != 192.0.2.0/24 iifname \"eth*\" fib saddr type != local meta mark & 0x4000 == 0x4000"
        );
        let c6 = parse(Family::V6, &["-s", "fc00::1"]).unwrap();
        assert_eq!(c6.nft().unwrap(), " ip6 saddr fc00::1/128");
    }

    #[test]
    fn passes_other_iptables_matches_through_quoted() {
        let c = parse(
            Family::V4,
            &[
                "-p",
                "udp",
                "-m",
                "conntrack",
                "--ctstate",
                "NEW,ESTABLISHED",
                "-m",
                "comment",
                "--comment",
                "two words",
                "-s",
                "10.0.0.0/8",
            ],
        )
        .unwrap();
        assert!(c.has_passthrough() && !c.is_nft());
        let rule = c.apply_iptables(Rule::new().jump("X")).unwrap();
        assert_eq!(
            rule.render(),
            r#"-s 10.0.0.0/8 -p udp -m conntrack --ctstate "NEW,ESTABLISHED" -m comment --comment "two words" -j X"#
        );
        assert!(c.nft().unwrap_err().msg.contains("nft syntax"));
        let negated = parse(Family::V4, &["!", "--syn"]).unwrap();
        assert_eq!(negated.items(), &[Condition::Passthrough { words: vec!["!".into(), "--syn".into()] }]);
    }

    #[test]
    fn nft_syntax_of_reference_v1_6() {
        let tokens = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        assert!(is_nft_syntax(&tokens(&["ip", "saddr", "10.0.0.0/8"])));
        assert!(!is_nft_syntax(&tokens(&["!", "-d", "10.0.0.0/8"])));
        assert!(!is_nft_syntax(&tokens(&["-d", "10.0.0.0/8"])));
        assert!(!is_nft_syntax(&[]));
        let c = Conditions::parse_any(
            "conditionsV4",
            Family::V4,
            &tokens(&["ip saddr != { 10.0.0.0/8, 192.168.0.0/16 }", "iifname", "\"eth0\""]),
        )
        .unwrap();
        assert!(c.is_nft());
        assert_eq!(c.nft().unwrap(), " ip saddr != { 10.0.0.0/8, 192.168.0.0/16 } iifname \"eth0\"");
        assert!(c.apply_iptables(Rule::new()).unwrap_err().msg.contains("nftables backend"));
        for bad in [
            &["ip", "saddr", "1.2.3.4", "accept"][..],
            &["ip saddr 1.2.3.4; add rule ip t c drop"],
            &["ip", "saddr", "1.2.3.4\nflush ruleset"],
            &["meta", "mark", "set", "1"],
            &["ip", "saddr", "1.2.3.4", "#"],
            &["ip", "saddr", "@x"],
            &["ip", "daddr", "{1.2.3.4:jump}"],
            &["iifname", "\"eth0"],
            &["tcp", "dport", "80", "counter"],
        ] {
            let e = Conditions::parse_any("conditionsV4", Family::V4, &tokens(bad))
                .expect_err(&format!("{bad:?} accepted"));
            assert_eq!(e.code, crate::spec::codes::INVALID_CONFIG, "{bad:?}");
        }
    }

    #[test]
    fn refuses_anything_else() {
        let bad: &[&[&str]] = &[
            &["-j", "ACCEPT"],
            &["-d", "1.2.3.4", "-j", "DROP"],
            &["-d", "1.2.3.4\n-A INPUT -j DROP"],
            &["-s"],
            &["!"],
            &["-d", "fc00::/7"],
            &["-i", "eth0\"; drop"],
            &["-m", "addrtype"],
            &["-m", "addrtype", "--src-type", "NAT"],
            &["-m", "mark", "--mark", "zz"],
            &["-d", "1.2.3.4", "-d", "1.2.3.5"],
            &["-m", "conntrack", "--ctstate", "NEW", "-j", "DNAT"],
            &["-m", "comment", "--comment", "a\nCOMMIT"],
            &["-t", "filter"],
            &["-p", "tcp", "-g", "X"],
            &["-A", "INPUT"],
        ];
        for tokens in bad {
            let result = parse(Family::V4, tokens).and_then(|c| c.apply_iptables(Rule::new()).map(|_| ()));
            let e = result.expect_err(&format!("{tokens:?} accepted"));
            assert_eq!(e.code, crate::spec::codes::INVALID_CONFIG);
        }
    }
}
