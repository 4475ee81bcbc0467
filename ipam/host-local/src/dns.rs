//! `resolvConf`: the nameservers, domain, search list and options of a resolv.conf file, for the result's
//! `dns`, parsed as the reference does.

use cnicore::spec::{Dns, Error, Result};
use std::path::Path;

pub fn parse_resolv_conf(path: &Path) -> Result<Dns> {
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::io(format!("reading resolvConf {}: {e}", path.display())))?;
    Ok(parse(&text))
}

fn parse(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 2 {
            continue;
        }
        let rest = fields[1..].iter().map(|s| s.to_string());
        match fields[0] {
            "nameserver" => dns.nameservers.push(fields[1].to_string()),
            "domain" => dns.domain = fields[1].to_string(),
            "search" => dns.search.extend(rest),
            "options" => dns.options.extend(rest),
            _ => {}
        }
    }
    dns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf() {
        let dns = parse("# c\n; c\nnameserver 10.0.0.10\nnameserver fd00::10 extra\ndomain example.com\nsearch a.b c.d\noptions ndots:5 edns0\nnameserver\nbogus x\n");
        assert_eq!(dns.nameservers, ["10.0.0.10", "fd00::10"]);
        assert_eq!(dns.domain, "example.com");
        assert_eq!(dns.search, ["a.b", "c.d"]);
        assert_eq!(dns.options, ["ndots:5", "edns0"]);
    }
}
