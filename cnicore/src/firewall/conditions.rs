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
//! - `-m mark --mark value[/mask]`.
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
    Source { net: IpNet, negated: bool },
    Destination { net: IpNet, negated: bool },
    InInterface { name: String, negated: bool },
    OutInterface { name: String, negated: bool },
    /// `-m addrtype`: (negated, type) for the source and/or destination address.
    AddrType { src: Option<(bool, &'static str)>, dst: Option<(bool, &'static str)> },
    Mark { value: u32, mask: u32, negated: bool },
}

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
                    other => Err(self.error(format!("unsupported match module {:?}", truncate_for_msg(other)))),
                }
            }
            other => Err(self.error(format!("unsupported condition {:?}", truncate_for_msg(other)))),
        }
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
        let c = parse(Family::V4, &["!", "-d", "192.0.2.0/24", "-i", "eth+", "-m", "addrtype", "!", "--src-type", "local", "-m", "mark", "--mark", "0x4000/0x4000"]).unwrap();
        let rule = c.apply_iptables(Rule::new().protocol("tcp").jump("X")).unwrap();
        assert_eq!(rule.render(), "! -d 192.0.2.0/24 -i eth+ -p tcp -m addrtype ! --src-type LOCAL -m mark --mark 0x4000/0x4000 -j X");
        assert_eq!(
            c.nft().unwrap(),
            " ip daddr != 192.0.2.0/24 iifname \"eth*\" fib saddr type != local meta mark & 0x4000 == 0x4000"
        );
        let c6 = parse(Family::V6, &["-s", "fc00::1"]).unwrap();
        assert_eq!(c6.nft().unwrap(), " ip6 saddr fc00::1/128");
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
            &["-m", "comment", "--comment", "x"],
            &["-m", "addrtype"],
            &["-m", "addrtype", "--src-type", "NAT"],
            &["-m", "mark", "--mark", "zz"],
            &["-p", "tcp"],
            &["--to-destination", "1.2.3.4"],
            &["-d", "1.2.3.4", "-d", "1.2.3.5"],
        ];
        for tokens in bad {
            let result = parse(Family::V4, tokens).and_then(|c| c.apply_iptables(Rule::new()).map(|_| ()));
            let e = result.expect_err(&format!("{tokens:?} accepted"));
            assert_eq!(e.code, crate::spec::codes::INVALID_CONFIG);
        }
    }
}
