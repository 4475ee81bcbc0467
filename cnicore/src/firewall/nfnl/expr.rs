//! The one writer of nf_tables rule expressions: each expression with its attributes named as the kernel's
//! uapi names them, in the order `nft` writes them, so a rule encoded here is the rule `nft` sends for the
//! same text. Used by the NetworkPolicy agent (netpol) and the node masquerade (flannel_nft).

use super::uapi::*;
use crate::ip::IpFamily;
use crate::netlink::wire::{Request, NLA_F_NESTED};

/// Which address of the packet an expression reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    Saddr,
    Daddr,
}

impl Field {
    /// The address's offset in the network header of `family` and its length.
    pub fn offset(self, family: IpFamily) -> (u32, u32) {
        match (family, self) {
            (IpFamily::V4, Field::Saddr) => (12, 4),
            (IpFamily::V4, Field::Daddr) => (16, 4),
            (IpFamily::V6, Field::Saddr) => (8, 16),
            (IpFamily::V6, Field::Daddr) => (24, 16),
        }
    }
}

/// The expressions of one rule being written into its message's `NFTA_RULE_EXPRESSIONS`.
pub struct Expressions<'m>(pub &'m mut Request);

impl Expressions<'_> {
    /// One expression: its name, and its attributes written by `data`.
    pub fn expression(&mut self, name: &str, data: impl FnOnce(&mut Request)) -> &mut Self {
        let m = &mut *self.0;
        let item = m.begin_nested(NFTA_LIST_ELEM | NLA_F_NESTED);
        m.attr_str(NFTA_EXPR_NAME, name);
        let nest = m.begin_nested(NFTA_EXPR_DATA | NLA_F_NESTED);
        data(m);
        m.end_nested(nest);
        m.end_nested(item);
        self
    }

    /// `meta`: the packet's `key` into `dreg`.
    pub fn meta(&mut self, key: u32, dreg: u32) -> &mut Self {
        self.expression("meta", |m| {
            m.attr(NFTA_META_DREG, &dreg.to_be_bytes()).attr(NFTA_META_KEY, &key.to_be_bytes());
        })
    }

    /// `cmp`: register 1 `op` the value.
    pub fn cmp(&mut self, op: u32, value: &[u8]) -> &mut Self {
        self.expression("cmp", |m| {
            m.attr(NFTA_CMP_SREG, &NFT_REG_1.to_be_bytes()).attr(NFTA_CMP_OP, &op.to_be_bytes());
            data_value(m, NFTA_CMP_DATA, value);
        })
    }

    /// `payload`: `len` bytes at `offset` of the header `base` into `dreg`.
    pub fn payload(&mut self, base: u32, offset: u32, len: u32, dreg: u32) -> &mut Self {
        self.expression("payload", |m| {
            m.attr(NFTA_PAYLOAD_DREG, &dreg.to_be_bytes())
                .attr(NFTA_PAYLOAD_BASE, &base.to_be_bytes())
                .attr(NFTA_PAYLOAD_OFFSET, &offset.to_be_bytes())
                .attr(NFTA_PAYLOAD_LEN, &len.to_be_bytes());
        })
    }

    /// The first `len` bytes of the packet's address `field` of `family` into `dreg` (the whole address
    /// when `len` is `None`).
    pub fn address(&mut self, family: IpFamily, field: Field, len: Option<u32>, dreg: u32) -> &mut Self {
        let (offset, whole) = field.offset(family);
        self.payload(NFT_PAYLOAD_NETWORK_HEADER, offset, len.unwrap_or(whole), dreg)
    }

    /// `bitwise`: register 1 = (register 1 & `mask`) ^ `xor`, over the mask's length.
    pub fn bitwise(&mut self, mask: &[u8], xor: &[u8]) -> &mut Self {
        self.expression("bitwise", |m| {
            m.attr(NFTA_BITWISE_SREG, &NFT_REG_1.to_be_bytes())
                .attr(NFTA_BITWISE_DREG, &NFT_REG_1.to_be_bytes())
                .attr(NFTA_BITWISE_LEN, &(mask.len() as u32).to_be_bytes());
            data_value(m, NFTA_BITWISE_MASK, mask);
            data_value(m, NFTA_BITWISE_XOR, xor);
        })
    }

    /// `lookup`: `sreg` in the named set (or, `negated`, not in it).
    pub fn lookup(&mut self, set: &str, sreg: u32, negated: bool) -> &mut Self {
        self.expression("lookup", |m| {
            m.attr_str(NFTA_LOOKUP_SET, set).attr(NFTA_LOOKUP_SREG, &sreg.to_be_bytes());
            if negated {
                m.attr(NFTA_LOOKUP_FLAGS, &NFT_LOOKUP_F_INV.to_be_bytes());
            }
        })
    }

    /// `ct state established,related`: the state loaded, masked, compared with 0.
    pub fn ct_established(&mut self) -> &mut Self {
        self.expression("ct", |m| {
            m.attr(NFTA_CT_DREG, &NFT_REG_1.to_be_bytes()).attr(NFTA_CT_KEY, &NFT_CT_STATE.to_be_bytes());
        });
        // The state is a host-order integer to nft.
        self.bitwise(&CT_ESTABLISHED_RELATED.to_ne_bytes(), &0u32.to_ne_bytes()).cmp(NFT_CMP_NEQ, &0u32.to_ne_bytes())
    }

    /// `immediate` of a verdict (`code`, and the chain of a jump).
    pub fn verdict(&mut self, code: i32, chain: Option<&str>) -> &mut Self {
        self.expression("immediate", |m| {
            m.attr(NFTA_IMMEDIATE_DREG, &NFT_REG_VERDICT.to_be_bytes());
            let data = m.begin_nested(NFTA_IMMEDIATE_DATA | NLA_F_NESTED);
            let nest = m.begin_nested(NFTA_DATA_VERDICT | NLA_F_NESTED);
            m.attr(NFTA_VERDICT_CODE, &code.to_be_bytes());
            if let Some(chain) = chain {
                m.attr_str(NFTA_VERDICT_CHAIN, chain);
            }
            m.end_nested(nest);
            m.end_nested(data);
        })
    }

    /// `counter`: the rule's packets and bytes, kept by the kernel from zero (nft sends no start values).
    pub fn counter(&mut self) -> &mut Self {
        self.expression("counter", |_| {})
    }

    /// `log prefix "<prefix>" group <group>`: the packet to NFLOG group `group`, with the prefix.
    pub fn log(&mut self, prefix: &str, group: u16) -> &mut Self {
        self.expression("log", |m| {
            m.attr_str(NFTA_LOG_PREFIX, prefix).attr(NFTA_LOG_GROUP, &group.to_be_bytes());
        })
    }

    /// `limit rate <rate>/second burst <burst> packets`: matches while the kernel's token bucket holds.
    pub fn limit(&mut self, rate: u64, burst: u32) -> &mut Self {
        self.expression("limit", |m| {
            m.attr(NFTA_LIMIT_RATE, &rate.to_be_bytes())
                .attr(NFTA_LIMIT_UNIT, &1u64.to_be_bytes())
                .attr(NFTA_LIMIT_BURST, &burst.to_be_bytes())
                .attr(NFTA_LIMIT_TYPE, &NFT_LIMIT_PKTS.to_be_bytes())
                .attr(NFTA_LIMIT_FLAGS, &0u32.to_be_bytes());
        })
    }

    /// `masq` with its `NF_NAT_RANGE_*` flags.
    pub fn masquerade(&mut self, flags: u32) -> &mut Self {
        self.expression("masq", |m| {
            m.attr(NFTA_MASQ_FLAGS, &flags.to_be_bytes());
        })
    }
}

/// An `nft_data` value: attribute `kind` nesting `NFTA_DATA_VALUE`.
fn data_value(m: &mut Request, kind: u16, value: &[u8]) {
    let nest = m.begin_nested(kind | NLA_F_NESTED);
    m.attr(NFTA_DATA_VALUE, value);
    m.end_nested(nest);
}
