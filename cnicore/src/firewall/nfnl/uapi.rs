//! The kernel's nf_tables and nfnetlink uapi numbers (`linux/netfilter/nf_tables.h`, `nfnetlink.h`,
//! `linux/netfilter.h`), and nft's data types, in one place for every writer: the element batches, the
//! NetworkPolicy agent (netpol) and the node masquerade (flannel_nft). Attributes are named as the header
//! names them; an expression's attributes are written through [`super::expr`].

// nfnetlink.
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub const NFNL_MSG_BATCH_END: u16 = 0x11;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;

// Families (`NFPROTO_*`).
pub const NFPROTO_INET: u8 = 1;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

// Messages (`enum nf_tables_msg_types`).
pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_GETTABLE: u16 = 1;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_GETRULE: u16 = 7;
pub const NFT_MSG_DELRULE: u16 = 8;
pub const NFT_MSG_NEWSET: u16 = 9;
pub const NFT_MSG_GETSET: u16 = 10;
pub const NFT_MSG_DELSET: u16 = 11;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_GETSETELEM: u16 = 13;
pub const NFT_MSG_DELSETELEM: u16 = 14;

// Tables.
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_TABLE_USERDATA: u16 = 6;

// Chains and their hooks.
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_HOOK: u16 = 4;
pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_CHAIN_TYPE: u16 = 7;
pub const NFTA_CHAIN_USERDATA: u16 = 12;
pub const NFTA_HOOK_HOOKNUM: u16 = 1;
pub const NFTA_HOOK_PRIORITY: u16 = 2;
pub const NF_INET_FORWARD: u32 = 2;
pub const NF_INET_POST_ROUTING: u32 = 4;
/// `srcnat`: `NF_IP_PRI_NAT_SRC`.
pub const PRIORITY_SRCNAT: i32 = 100;

// Rules.
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;

// Sets and their elements.
pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_ID: u16 = 10;
pub const NFT_SET_ANONYMOUS: u32 = 0x1;
pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFTA_SET_ELEM_USERDATA: u16 = 6;
pub const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;
pub const NFTA_LIST_ELEM: u16 = 1;

// Data and verdicts.
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_CONTINUE: i32 = -1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_RETURN: i32 = -5;

// Registers: the verdict register, the first 16-byte one, the first 4-byte one (concatenations are loaded
// one part per 4-byte register from there).
pub const NFT_REG_VERDICT: u32 = 0;
pub const NFT_REG_1: u32 = 1;
pub const NFT_REG32_00: u32 = 8;

// Expressions: each one's name (`NFTA_EXPR_*`) and attributes.
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;
pub const NFTA_META_DREG: u16 = 1;
pub const NFTA_META_KEY: u16 = 2;
pub const NFT_META_MARK: u32 = 3;
pub const NFT_META_NFPROTO: u32 = 15;
pub const NFT_META_L4PROTO: u32 = 16;
pub const NFTA_CMP_SREG: u16 = 1;
pub const NFTA_CMP_OP: u16 = 2;
pub const NFTA_CMP_DATA: u16 = 3;
pub const NFT_CMP_EQ: u32 = 0;
pub const NFT_CMP_NEQ: u32 = 1;
pub const NFT_CMP_LTE: u32 = 3;
pub const NFT_CMP_GTE: u32 = 5;
pub const NFTA_PAYLOAD_DREG: u16 = 1;
pub const NFTA_PAYLOAD_BASE: u16 = 2;
pub const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub const NFTA_PAYLOAD_LEN: u16 = 4;
pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
pub const NFTA_BITWISE_SREG: u16 = 1;
pub const NFTA_BITWISE_DREG: u16 = 2;
pub const NFTA_BITWISE_LEN: u16 = 3;
pub const NFTA_BITWISE_MASK: u16 = 4;
pub const NFTA_BITWISE_XOR: u16 = 5;
pub const NFTA_LOOKUP_SET: u16 = 1;
pub const NFTA_LOOKUP_SREG: u16 = 2;
pub const NFTA_LOOKUP_FLAGS: u16 = 5;
pub const NFT_LOOKUP_F_INV: u32 = 1;
pub const NFTA_IMMEDIATE_DREG: u16 = 1;
pub const NFTA_IMMEDIATE_DATA: u16 = 2;
pub const NFTA_CT_DREG: u16 = 1;
pub const NFTA_CT_KEY: u16 = 2;
pub const NFT_CT_STATE: u32 = 0;
/// `NF_CT_STATE_BIT(IP_CT_ESTABLISHED) | NF_CT_STATE_BIT(IP_CT_RELATED)`.
pub const CT_ESTABLISHED_RELATED: u32 = 0x2 | 0x4;
pub const NFTA_LOG_GROUP: u16 = 1;
pub const NFTA_LOG_PREFIX: u16 = 2;
pub const NFTA_LIMIT_RATE: u16 = 1;
/// The limit's time unit in seconds.
pub const NFTA_LIMIT_UNIT: u16 = 2;
pub const NFTA_LIMIT_BURST: u16 = 3;
pub const NFTA_LIMIT_TYPE: u16 = 4;
pub const NFTA_LIMIT_FLAGS: u16 = 5;
pub const NFT_LIMIT_PKTS: u32 = 0;
pub const NFTA_MASQ_FLAGS: u16 = 1;
/// `NF_NAT_RANGE_PROTO_RANDOM_FULLY`: `masquerade fully-random`.
pub const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;

// nft's data types, for `nft list` (the kernel only keeps them), and its concatenated types: each part's
// type shifted by this many bits.
pub const TYPE_IPV4_ADDR: u32 = 7;
pub const TYPE_IPV6_ADDR: u32 = 8;
pub const TYPE_INET_PROTO: u32 = 12;
pub const TYPE_INET_SERVICE: u32 = 13;
pub const TYPE_BITS: u32 = 6;

/// libnftnl's comment in a table's, chain's or element's userdata (`NFTNL_UDATA_*_COMMENT`).
pub const UDATA_COMMENT: u8 = 0;
