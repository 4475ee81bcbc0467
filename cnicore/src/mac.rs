//! Ethernet (EUI-48) addresses as configs write them and as results report them.

use crate::spec::{codes, Error, Result};

/// A unicast Ethernet address as Go's `net.ParseMAC` spells an EUI-48: `aa:bb:cc:dd:ee:ff`,
/// `aa-bb-cc-dd-ee-ff` or `aabb.ccdd.eeff`, in either case. Multicast and all-zero addresses are refused: the
/// kernel would refuse them as an interface's address.
pub fn parse(text: &str) -> Result<[u8; 6]> {
    let bad = |why: &str| {
        Error::new(
            codes::INVALID_CONFIG,
            format!("invalid MAC address {:?}: {why}", crate::spec::truncate_for_msg(text)),
        )
    };
    let shape = || bad("expected six hexadecimal octets such as 0a:58:0a:f4:00:05");
    let octets: Vec<&str> = if text.contains('.') {
        let groups: Vec<&str> = text.split('.').collect();
        if groups.len() != 3 || groups.iter().any(|g| g.len() != 4) {
            return Err(shape());
        }
        groups.iter().flat_map(|g| [&g[..2], &g[2..]]).collect()
    } else {
        text.split([':', '-']).collect()
    };
    let separators_mixed = text.contains(':') && text.contains('-');
    if octets.len() != 6 || separators_mixed || octets.iter().any(|p| p.len() != 2) {
        return Err(shape());
    }
    let mut mac = [0u8; 6];
    for (octet, part) in mac.iter_mut().zip(&octets) {
        if !part.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("not hexadecimal"));
        }
        *octet = u8::from_str_radix(part, 16).map_err(|_| bad("not hexadecimal"))?;
    }
    if mac[0] & 1 == 1 {
        return Err(bad("a multicast address cannot be an interface address"));
    }
    if mac == [0; 6] {
        return Err(bad("the all-zero address cannot be an interface address"));
    }
    Ok(mac)
}

/// `aa:bb:cc:dd:ee:ff`, lower case, as Go's `HardwareAddr.String()` writes it.
pub fn format(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_spellings() {
        let mac = [0xc2, 0x11, 0x22, 0x33, 0x44, 0x55];
        for text in ["c2:11:22:33:44:55", "C2-11-22-33-44-55", "c211.2233.4455"] {
            assert_eq!(parse(text).unwrap(), mac, "{text}");
        }
        assert_eq!(format(&mac), "c2:11:22:33:44:55");
        for bad in [
            "",
            "c2:11:22:33:44",
            "c2:11:22:33:44:55:66",
            "c2:11-22:33:44:55",
            "g2:11:22:33:44:55",
            "+2:11:22:33:44:55",
            "c21.12233.4455",
            "01:00:5e:00:00:01",
            "00:00:00:00:00:00",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
