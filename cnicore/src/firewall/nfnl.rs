//! Set and map elements added and deleted as one nf_tables netlink batch (NETLINK_NETFILTER), in the calling
//! thread's namespace: the usual ADD and DEL of the nftables backends without an `nft` process (its exec and
//! libnftables' cache fetch cost milliseconds; the batch costs one `sendmsg`).
//!
//! A [`Batch`] is `NFNL_MSG_BATCH_BEGIN`, one `NFT_MSG_NEWSETELEM` or `NFT_MSG_DELSETELEM` per element and
//! `NFNL_MSG_BATCH_END`, sent as one datagram: the messages `nft` sends for the same `add element` and
//! `delete element` commands, byte for byte (pinned in the tests against nft 1.0.6's own), except that nft
//! also names each set by the ID of its cache (`NFTA_SET_ELEM_LIST_SET_ID`), which the kernel only reads for
//! a set created in the same batch, and we never create one here. Keys and values are encoded from the typed
//! [`Element`]: concatenations with each part padded to the 4 bytes of an nf_tables register, verdicts as
//! `NFTA_DATA_VERDICT`, and the owner tag as the comment of libnftnl's element userdata (a TLV: type 0, length,
//! the string with its NUL), which is where `nft` keeps it, so `nft list` shows it and the read-back by comment
//! finds it.
//!
//! [`tables`] lists the namespace's tables with one `NFT_MSG_GETTABLE` dump: what DEL asks before running
//! `nft` at all, so that a node that never had a table of ours or the reference's nftables backends runs no
//! `nft` process on DEL.
//!
//! [`delete_tagged`] is the read-back by owner tag (DEL without prevResult, GC): the table's sets listed with
//! an `NFT_MSG_GETSET` dump, each set's elements with an `NFT_MSG_GETSETELEM` dump (keys as bytes, comments
//! from the userdata), and the tagged ones deleted in one batch with the key bytes the kernel listed.
//!
//! [`commit_messages`] sends nf_tables messages of any kind (tables, chains, sets, rules) as one batch: the
//! NetworkPolicy agent's and the node masquerade's transactions. Their rules' expressions are written by the
//! one builder, [`expr::Expressions`], and every number of the kernel's uapi is in [`uapi`].
//!
//! The kernel handles the whole batch inside `sendmsg`, atomically: a refused message aborts it, and the
//! errors (one per refused message, naming it by its sequence number) are queued before `sendmsg` returns.
//! No message asks for an acknowledgement, so a batch that succeeds answers nothing; `nft` reads the answer
//! the same way.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

use netlink_packet_core::NLM_F_DUMP;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::element::{Datum, Element, MapValue};
use crate::netlink::wire::{self, Received, Request, NLA_F_NESTED};

pub mod expr;
pub mod uapi;

pub use expr::{Expressions, Field};
use uapi::*;

/// An nf_tables register is 4 bytes: each part of a concatenation starts on one.
const REGISTER: usize = 4;
/// `IFNAMSIZ`: an `ifname` is this many bytes, zero-padded.
const IFNAMSIZ: usize = 16;
/// The longest chain name nf_tables accepts (`NFT_CHAIN_MAXNAMELEN` without the NUL).
const CHAIN_MAX: usize = 255;

/// A NETLINK_NETFILTER socket of the calling thread's namespace.
pub(super) fn open_socket() -> io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    Ok(socket)
}

/// Every table of the namespace as (family as `nft` names it, name).
pub fn tables() -> io::Result<Vec<(String, String)>> {
    let socket = open_socket()?;
    let mut found = Vec::new();
    wire::exchange(&socket, &mut tables_request(), NLM_F_DUMP, 1, |message_type, payload| {
        if let Some(table) = parse_table(message_type, payload) {
            found.push(table);
        }
    })?;
    Ok(found)
}

/// True when `family name` exists. An error (no nf_tables in this kernel, say) is the caller's to judge.
pub fn table_exists(family: &str, name: &str) -> io::Result<bool> {
    Ok(tables()?.iter().any(|(f, n)| f == family && n == name))
}

/// `NFT_MSG_GETTABLE` of every family: nfgenmsg (AF_UNSPEC, NFNETLINK_V0, resource id 0), no attributes.
fn tables_request() -> Request {
    Request::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE, &[0, 0, 0, 0])
}

/// A table of the dump: (family, name).
fn parse_table(message_type: u16, payload: &[u8]) -> Option<(String, String)> {
    if message_type != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE {
        return None;
    }
    let family = family_name(*payload.first()?)?;
    let name = wire::attributes(payload.get(4..)?).find(|(kind, _)| *kind == NFTA_TABLE_NAME)?.1;
    Some((family.to_string(), wire::as_string(name)))
}

/// The `NFPROTO_*` families as `nft` spells them.
fn family_name(family: u8) -> Option<&'static str> {
    Some(match family {
        1 => "inet",
        2 => "ip",
        3 => "arp",
        5 => "netdev",
        7 => "bridge",
        10 => "ip6",
        _ => return None,
    })
}

/// The sockets of [`Batch::commit_closing_at_exit`].
static KEPT_OPEN: Mutex<Vec<Socket>> = Mutex::new(Vec::new());

/// Why a batch did not apply. It changed nothing either way.
#[derive(Debug)]
pub enum BatchError {
    /// The kernel refused the element at `index` (in the order added to the batch; `None` when the errors
    /// did not all fit in the socket's receive buffer): a set or chain missing (ENOENT), a key holding
    /// another value (EEXIST), ...
    Refused { index: Option<usize>, error: io::Error },
    /// The batch could not be built or sent, or the kernel refused it as a whole (no nf_tables, EPERM).
    Unavailable(io::Error),
}

impl BatchError {
    /// True when `nft` would be refused the same way: the state of the table, not the transport, is the
    /// reason (a set, map or chain missing; a map key holding another value).
    pub fn is_state(&self) -> bool {
        match self {
            BatchError::Refused { error, .. } => {
                matches!(error.raw_os_error(), Some(libc::ENOENT) | Some(libc::EEXIST))
            }
            BatchError::Unavailable(_) => false,
        }
    }
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchError::Refused { index: Some(i), error } => write!(f, "element {i} refused: {error}"),
            BatchError::Refused { index: None, error } => write!(f, "elements refused: {error}"),
            BatchError::Unavailable(error) => write!(f, "nf_tables batch not applied: {error}"),
        }
    }
}

/// What nf_tables cannot carry in an element (the batch is not sent; the same element as `nft` text is then
/// refused or applied by `nft`, as it would have been without netlink).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unencodable {
    /// A jump target that is empty, longer than nf_tables' 255 bytes or holds a NUL.
    ChainName(String),
    /// A comment longer than the 254 bytes of libnftnl's userdata, or holding a NUL.
    Comment(String),
    /// An interface name longer than IFNAMSIZ or holding a NUL.
    Ifname(String),
}

impl std::fmt::Display for Unencodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unencodable::ChainName(chain) => write!(f, "chain name {chain:?} cannot be sent"),
            Unencodable::Comment(comment) => write!(f, "comment {comment:?} cannot be sent (too long or with a NUL)"),
            Unencodable::Ifname(name) => write!(f, "interface name {name:?} cannot be a set key"),
        }
    }
}

impl std::error::Error for Unencodable {}

/// One transaction of element additions and deletions in one `inet` table.
#[derive(Debug, Clone)]
pub struct Batch {
    table: String,
    /// Each message with its netlink flags.
    messages: Vec<(Request, u16)>,
    /// Why an element could not be encoded (the batch is then not sent: the caller's `nft` text applies it).
    unencodable: Option<Unencodable>,
}

impl Batch {
    /// An empty batch for `inet <table>`.
    pub fn inet(table: &str) -> Batch {
        Batch { table: table.to_string(), messages: Vec::new(), unencodable: None }
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// `add element inet <table> <set> { <key> [comment "<comment>"] [: <value>] }`: the element's comment
    /// is sent when `with_comment`. Adding an element that is there with the same value changes nothing; with
    /// another value the kernel refuses it (EEXIST).
    pub fn add(&mut self, element: &Element, with_comment: bool) -> &mut Batch {
        let comment = element.comment.as_deref().filter(|_| with_comment);
        self.push(NFT_MSG_NEWSETELEM, element, true, comment)
    }

    /// `delete element inet <table> <set> { <key> }`: refused (ENOENT) when the key is not there.
    pub fn delete(&mut self, element: &Element) -> &mut Batch {
        self.push(NFT_MSG_DELSETELEM, element, false, None)
    }

    /// `add` then `delete` of the element: removes it, and succeeds when it is already gone; refused
    /// (EEXIST) when its key holds another value (another owner's).
    pub fn remove_if_present(&mut self, element: &Element) -> &mut Batch {
        self.add(element, false).delete(element)
    }

    /// `delete element` of a key as the kernel listed it ([`table_elements`]).
    pub fn delete_listed(&mut self, element: &ListedElement) -> &mut Batch {
        match encode_message(&self.table, NFT_MSG_DELSETELEM, &element.set, &element.key, None, None) {
            Ok(request) => self.messages.push((request, NLM_F_REQUEST)),
            Err(why) => {
                self.unencodable.get_or_insert(why);
            }
        }
        self
    }

    fn push(&mut self, command: u16, element: &Element, with_value: bool, comment: Option<&str>) -> &mut Batch {
        // As nft: NLM_F_CREATE on additions (without NLM_F_EXCL: an identical element is fine).
        let flags = if command == NFT_MSG_NEWSETELEM { NLM_F_REQUEST | NLM_F_CREATE } else { NLM_F_REQUEST };
        match encode_element(&self.table, command, element, with_value, comment) {
            Ok(request) => self.messages.push((request, flags)),
            Err(why) => {
                self.unencodable.get_or_insert(why);
            }
        }
        self
    }

    /// The datagram: BATCH_BEGIN (sequence 0), the messages (1..=n), BATCH_END (n + 1), as nft numbers them.
    #[cfg(test)]
    fn datagram(&mut self) -> Vec<u8> {
        datagram(&mut self.messages)
    }

    /// Sends the batch on a new NETLINK_NETFILTER socket of the calling thread's namespace and reads the
    /// kernel's answer. An empty batch is not sent.
    pub fn commit(&mut self) -> Result<(), BatchError> {
        self.send().map(drop)
    }

    /// [`Batch::commit`] for a batch that deletes, in a process about to exit: its socket stays open until
    /// the process exits. The kernel frees deleted elements after an RCU grace period, and the last close of
    /// any NETLINK_NETFILTER socket waits for that (10-20 ms here). Closed at once, the wait falls on this
    /// thread, or on a process another thread spawned meanwhile (the bridge's DEL runs `iptables-save` beside
    /// it), which holds the descriptor until its `execve`: measured, closing at once made the bridge's DEL
    /// 5-8 ms slower. At exit, the grace period has mostly passed while the rest of the DEL ran.
    pub fn commit_closing_at_exit(&mut self) -> Result<(), BatchError> {
        let socket = self.send()?;
        if let Some(socket) = socket {
            KEPT_OPEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(socket);
        }
        Ok(())
    }

    /// Sends the batch; the socket it used, if any.
    fn send(&mut self) -> Result<Option<Socket>, BatchError> {
        if let Some(why) = &self.unencodable {
            return Err(BatchError::Unavailable(io::Error::new(io::ErrorKind::InvalidInput, why.clone())));
        }
        if self.messages.is_empty() {
            return Ok(None);
        }
        send_messages(&mut self.messages).map(Some)
    }
}

/// The datagram of a batch of nf_tables messages (each with its netlink flags): BATCH_BEGIN (sequence 0), the
/// messages (1..=n), BATCH_END (n + 1), as nft numbers them.
fn datagram(messages: &mut [(Request, u16)]) -> Vec<u8> {
    let mut out = batch_without_end(messages);
    out.extend_from_slice(batch_marker(NFNL_MSG_BATCH_END).finish(NLM_F_REQUEST, messages.len() as u32 + 1));
    out
}

/// BATCH_BEGIN and the messages: with no BATCH_END the kernel handles every message, answers those it
/// refuses, and then aborts the transaction (`NFNL_ABORT_VALIDATE`), as for `nft --check`.
fn batch_without_end(messages: &mut [(Request, u16)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + messages.len() * 128);
    out.extend_from_slice(batch_marker(NFNL_MSG_BATCH_BEGIN).finish(NLM_F_REQUEST, 0));
    for (i, (message, flags)) in messages.iter_mut().enumerate() {
        out.extend_from_slice(message.finish(*flags, i as u32 + 1));
    }
    out
}

/// Sends nf_tables messages of any kind (tables, chains, sets, rules, elements; each with its netlink flags)
/// as one batch, one transaction, on a new socket of the calling thread's namespace, and reads the kernel's
/// answer: all of them applied, or none ([`BatchError::Refused`] names the first refused, by index).
pub fn commit_messages(messages: &mut [(Request, u16)]) -> Result<(), BatchError> {
    if messages.is_empty() {
        return Ok(());
    }
    send_messages(messages).map(drop)
}

/// What [`commit_messages`] would answer, without changing anything: the batch sent without its end, so that
/// the kernel checks every message against the table as it is and then aborts (`nft --check`). Costs what the
/// transaction would, without the commit.
pub fn validate_messages(messages: &mut [(Request, u16)]) -> Result<(), BatchError> {
    if messages.is_empty() {
        return Ok(());
    }
    send_datagram(&batch_without_end(messages), messages.len()).map(drop)
}

fn send_messages(messages: &mut [(Request, u16)]) -> Result<Socket, BatchError> {
    send_datagram(&datagram(messages), messages.len())
}

/// Sends a batch's datagram of `count` messages on a new socket and reads the kernel's answer.
fn send_datagram(datagram: &[u8], count: usize) -> Result<Socket, BatchError> {
    let unavailable = BatchError::Unavailable;
    let socket = open_socket().map_err(unavailable)?;
    grow_send_buffer(&socket, datagram.len());
    socket.send_to(datagram, &SocketAddr::new(0, 0), 0).map_err(unavailable)?;
    read_errors(&socket, count)?;
    Ok(socket)
}

/// The kernel refuses a datagram larger than the socket's send buffer (EMSGSIZE); a batch of thousands of
/// elements needs more than the default. Raised only when needed; when that fails, the send fails and the
/// caller's `nft` text applies the batch.
fn grow_send_buffer(socket: &Socket, len: usize) {
    const DEFAULT: usize = 200 * 1024;
    if len < DEFAULT {
        return;
    }
    let size = (len + 4096).min(i32::MAX as usize) as libc::c_int;
    for option in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
        // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a valid c_int.
        let done = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if done == 0 {
            return;
        }
    }
}

/// The errors the kernel queued while it handled the batch (nothing when it applied). An error answering
/// BATCH_BEGIN or BATCH_END refuses the batch as a whole; one answering message `i` refuses that element.
fn read_errors(socket: &Socket, count: usize) -> Result<(), BatchError> {
    socket.set_non_blocking(true).map_err(BatchError::Unavailable)?;
    let mut first: Option<(usize, io::Error)> = None;
    loop {
        let datagram = match socket.recv_from_full() {
            Ok((datagram, _)) => datagram,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            // ENOBUFS: more errors than the receive buffer holds. A batch that applies answers nothing, so
            // this one was refused.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                return Err(match first {
                    Some((index, error)) => BatchError::Refused { index: Some(index), error },
                    None => BatchError::Refused { index: None, error: e },
                })
            }
            Err(e) => return Err(BatchError::Unavailable(e)),
        };
        for message in wire::split_datagram(&datagram).map_err(BatchError::Unavailable)? {
            let Received::Failed(error) = message.received else { continue };
            let sequence = message.sequence as usize;
            if sequence == 0 || sequence > count {
                return Err(BatchError::Unavailable(error));
            }
            if first.is_none() {
                first = Some((sequence - 1, error));
            }
        }
    }
    match first {
        None => Ok(()),
        Some((index, error)) => Err(BatchError::Refused { index: Some(index), error }),
    }
}

/// An element of a set or map as the kernel lists it: its key's bytes (what a deletion sends back) and its
/// comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedElement {
    pub set: String,
    pub key: Vec<u8>,
    pub comment: Option<String>,
}

/// Every element of the named sets and maps of `inet <table>` (anonymous sets, which rules hold, left out):
/// one `NFT_MSG_GETSET` dump, then one `NFT_MSG_GETSETELEM` dump per set, on one socket. `None` when the
/// table does not exist. An interrupted dump (the table changed meanwhile) is an error ([`io::ErrorKind::Interrupted`]).
pub fn table_elements(table: &str) -> io::Result<Option<Vec<ListedElement>>> {
    let socket = open_socket()?;
    let mut sets = Vec::new();
    let listed = wire::exchange(&socket, &mut sets_request(table), NLM_F_DUMP, 1, |message_type, payload| {
        sets.extend(parse_set(message_type, payload, table));
    });
    match listed {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
        Ok(true) => return Err(io::Error::new(io::ErrorKind::Interrupted, "the table changed during the dump")),
        Ok(false) => {}
    }
    let mut out = Vec::new();
    for (sequence, set) in (2..).zip(&sets) {
        let mut request = elements_request(table, set);
        let interrupted = wire::exchange(&socket, &mut request, NLM_F_DUMP, sequence, |message_type, payload| {
            out.extend(parse_elements(message_type, payload, set));
        })?;
        if interrupted {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "the set changed during the dump"));
        }
    }
    Ok(Some(out))
}

/// `NFT_MSG_GETSET` of `inet <table>`, as `nft list table` asks it.
fn sets_request(table: &str) -> Request {
    let mut request = Request::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETSET, &[NFPROTO_INET, 0, 0, 0]);
    request.attr_str(NFTA_SET_TABLE, table);
    request
}

/// `NFT_MSG_GETSETELEM` of one set, as `nft list set` asks it (the set's name first).
fn elements_request(table: &str, set: &str) -> Request {
    let mut request = Request::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETSETELEM, &[NFPROTO_INET, 0, 0, 0]);
    request.attr_str(NFTA_SET_ELEM_LIST_SET, set).attr_str(NFTA_SET_ELEM_LIST_TABLE, table);
    request
}

/// The name of a named set of `table` in a NEWSET message of the dump.
fn parse_set(message_type: u16, payload: &[u8], table: &str) -> Option<String> {
    if message_type != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSET {
        return None;
    }
    let (mut name, mut in_table, mut anonymous) = (None, false, false);
    for (kind, value) in wire::attributes(payload.get(4..)?) {
        match kind {
            NFTA_SET_TABLE => in_table = wire::as_string(value) == table,
            NFTA_SET_NAME => name = Some(wire::as_string(value)),
            NFTA_SET_FLAGS => {
                anonymous = value.len() == 4 && u32::from_be_bytes(value.try_into().ok()?) & NFT_SET_ANONYMOUS != 0
            }
            _ => {}
        }
    }
    name.filter(|_| in_table && !anonymous)
}

/// The elements of a NEWSETELEM message of the dump: key bytes and comment (libnftnl's userdata TLV).
fn parse_elements(message_type: u16, payload: &[u8], set: &str) -> Vec<ListedElement> {
    let mut out = Vec::new();
    if message_type != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM {
        return out;
    }
    let attributes = payload.get(4..).unwrap_or_default();
    for (kind, list) in wire::attributes(attributes) {
        if kind != NFTA_SET_ELEM_LIST_ELEMENTS {
            continue;
        }
        for (kind, item) in wire::attributes(list) {
            if kind != NFTA_LIST_ELEM {
                continue;
            }
            let (mut key, mut comment) = (None, None);
            for (kind, value) in wire::attributes(item) {
                match kind {
                    NFTA_SET_ELEM_KEY => {
                        key = wire::attributes(value).find(|(k, _)| *k == NFTA_DATA_VALUE).map(|(_, v)| v.to_vec())
                    }
                    NFTA_SET_ELEM_USERDATA => comment = userdata_comment(value),
                    _ => {}
                }
            }
            if let Some(key) = key {
                out.push(ListedElement { set: set.to_string(), key, comment });
            }
        }
    }
    out
}

/// The comment of libnftnl's userdata TLVs (type, length, value), without its NUL.
fn userdata_comment(mut data: &[u8]) -> Option<String> {
    while let [kind, len, rest @ ..] = data {
        let value = rest.get(..usize::from(*len))?;
        if *kind == UDATA_COMMENT {
            return Some(wire::as_string(value));
        }
        data = &rest[usize::from(*len)..];
    }
    None
}

/// Deletes every element of `inet <table>` whose comment satisfies `owned`, in one batch after one read
/// ([`table_elements`]); a batch refused because of a concurrent change is recomputed, up to
/// `firewall::ATTEMPTS` times.
/// Nothing to delete (or no table) is success. The socket is closed at exit
/// ([`Batch::commit_closing_at_exit`]).
pub fn delete_tagged(table: &str, owned: &dyn Fn(&str) -> bool) -> Result<(), BatchError> {
    let mut last = None;
    for _ in 0..super::ATTEMPTS {
        let Some(listed) = table_elements(table).map_err(BatchError::Unavailable)? else { return Ok(()) };
        let mut batch = Batch::inet(table);
        for element in listed.iter().filter(|e| e.comment.as_deref().is_some_and(owned)) {
            batch.delete_listed(element);
        }
        match batch.commit_closing_at_exit() {
            Ok(()) => return Ok(()),
            Err(e @ BatchError::Refused { .. }) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("at least one attempt"))
}

/// BATCH_BEGIN or BATCH_END of the nf_tables subsystem: nfgenmsg (AF_UNSPEC, NFNETLINK_V0, resource id
/// NFNL_SUBSYS_NFTABLES in network order).
fn batch_marker(kind: u16) -> Request {
    let resource = NFNL_SUBSYS_NFTABLES.to_be_bytes();
    Request::new(kind, &[0, 0, resource[0], resource[1]])
}

/// One NEWSETELEM or DELSETELEM message with one element (the key; the value and comment for additions).
fn encode_element(
    table: &str,
    command: u16,
    element: &Element,
    with_value: bool,
    comment: Option<&str>,
) -> Result<Request, Unencodable> {
    let key = encode_data(&element.key)?;
    let value = element.value.as_ref().filter(|_| with_value);
    encode_message(table, command, &element.set, &key, value, comment)
}

/// One NEWSETELEM or DELSETELEM message with one element, its key already encoded.
fn encode_message(
    table: &str,
    command: u16,
    set: &str,
    key: &[u8],
    value: Option<&MapValue>,
    comment: Option<&str>,
) -> Result<Request, Unencodable> {
    let mut request = Request::new((NFNL_SUBSYS_NFTABLES << 8) | command, &[NFPROTO_INET, 0, 0, 0]);
    request.attr_str(NFTA_SET_ELEM_LIST_TABLE, table).attr_str(NFTA_SET_ELEM_LIST_SET, set);
    let elements = request.begin_nested(NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED);
    let item = request.begin_nested(NFTA_LIST_ELEM | NLA_F_NESTED);
    let nest = request.begin_nested(NFTA_SET_ELEM_KEY | NLA_F_NESTED);
    request.attr(NFTA_DATA_VALUE, key);
    request.end_nested(nest);
    if let Some(value) = value {
        let data = request.begin_nested(NFTA_SET_ELEM_DATA | NLA_F_NESTED);
        match value {
            MapValue::Data(parts) => {
                request.attr(NFTA_DATA_VALUE, &encode_data(parts)?);
            }
            MapValue::Continue | MapValue::Jump(_) => {
                let verdict = request.begin_nested(NFTA_DATA_VERDICT | NLA_F_NESTED);
                let code = if matches!(value, MapValue::Continue) { NFT_CONTINUE } else { NFT_JUMP };
                request.attr(NFTA_VERDICT_CODE, &code.to_be_bytes());
                if let MapValue::Jump(chain) = value {
                    if chain.is_empty() || chain.len() > CHAIN_MAX || chain.contains('\0') {
                        return Err(Unencodable::ChainName(chain.clone()));
                    }
                    request.attr_str(NFTA_VERDICT_CHAIN, chain);
                }
                request.end_nested(verdict);
            }
        }
        request.end_nested(data);
    }
    if let Some(comment) = comment {
        request.attr(NFTA_SET_ELEM_USERDATA, &comment_userdata(comment)?);
    }
    request.end_nested(item);
    request.end_nested(elements);
    Ok(request)
}

/// libnftnl's userdata holding one comment: type, length (with the NUL), the string, NUL.
fn comment_userdata(comment: &str) -> Result<Vec<u8>, Unencodable> {
    let unencodable = || Unencodable::Comment(comment.to_string());
    let len = u8::try_from(comment.len() + 1).map_err(|_| unencodable())?;
    if comment.contains('\0') {
        return Err(unencodable());
    }
    let mut out = vec![UDATA_COMMENT, len];
    out.extend_from_slice(comment.as_bytes());
    out.push(0);
    Ok(out)
}

/// A key or data value: one datum as its type's bytes, or a concatenation with each part padded to a
/// register.
fn encode_data(parts: &[Datum]) -> Result<Vec<u8>, Unencodable> {
    let mut out = Vec::new();
    for part in parts {
        out.extend_from_slice(&encode_datum(part)?);
        if parts.len() > 1 {
            out.resize(out.len().next_multiple_of(REGISTER), 0);
        }
    }
    Ok(out)
}

/// One datum in nf_tables' byte order: addresses and ports in network order, the protocol as its byte,
/// interface names zero-padded to IFNAMSIZ.
fn encode_datum(datum: &Datum) -> Result<Vec<u8>, Unencodable> {
    Ok(match datum {
        Datum::Addr(std::net::IpAddr::V4(ip)) => ip.octets().to_vec(),
        Datum::Addr(std::net::IpAddr::V6(ip)) => ip.octets().to_vec(),
        Datum::Proto { number, .. } => vec![*number],
        Datum::Port(port) => port.to_be_bytes().to_vec(),
        Datum::Ifname(name) => {
            let name = name.as_str();
            if name.len() > IFNAMSIZ || name.contains('\0') {
                return Err(Unencodable::Ifname(name.to_string()));
            }
            let mut bytes = name.as_bytes().to_vec();
            bytes.resize(IFNAMSIZ, 0);
            bytes
        }
    })
}

#[cfg(test)]
mod tests;
