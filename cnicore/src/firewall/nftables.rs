//! The nftables backend: one transaction per call; state read with `nft -j list ...`. Set and map elements
//! are typed ([`Element`]): the usual ADD and DEL ([`add_elements`], [`remove_elements`]) and the deletion by
//! owner tag ([`delete_tagged`]) go over netlink as one nf_tables batch ([`super::nfnl`]), everything else
//! (tables, chains, rules, CHECK's listing) is `nft -f -` text, and so are those when netlink cannot be used.
//!
//! A [`Script`] is applied atomically by the kernel: when any command fails, nothing changes. Identifiers and
//! comments (owner tags, [`super::nft_tag`]) in scripts are generated; strings from configs (interface names)
//! go through [`string`], which refuses anything that could end the string or the command. Addresses and
//! ports are rendered from parsed values.
//!
//! Design rule for callers: the usual ADD should only add (deleting anything makes the kernel wait for an RCU
//! grace period, ~10–20 ms here) and should not create per-container chains (nft lists every chain of the
//! table before each transaction), so that its cost does not grow with the number of containers. Owners are
//! recorded as element comments, read back with [`table_elements`].

use std::collections::BTreeSet;

use serde_json::Value;

pub use super::element::{string, Datum, Element, IfName, MapValue};
use super::exec::{self, Failure};
use super::nfnl;
use crate::spec::Result;

/// One nft transaction.
#[derive(Debug, Clone, Default)]
pub struct Script {
    lines: Vec<String>,
}

impl Script {
    pub fn new() -> Script {
        Script::default()
    }

    /// Adds one command (`add rule inet t c ...`), built from generated names and [`string`]-checked text.
    pub fn push(&mut self, command: impl Into<String>) -> &mut Self {
        self.lines.push(command.into());
        self
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    pub fn render(&self) -> String {
        let mut text = self.lines.join("\n");
        text.push('\n');
        text
    }

    /// Runs the transaction with one `nft -f -`.
    pub fn apply(&self) -> Result<(), Failure> {
        if self.is_empty() {
            return Ok(());
        }
        exec::run("nft", &["-f", "-"], self.render().as_bytes()).map(|_| ())
    }
}

/// One transaction written as nft's JSON commands (`nft -j -f -`): for rules whose every value comes from the
/// input, nothing of which must ever be read as nft syntax (bridge's MAC spoof check).
pub fn apply_json(commands: &[Value]) -> Result<(), Failure> {
    let input = serde_json::json!({ "nftables": commands }).to_string();
    exec::run("nft", &["-j", "-f", "-"], input.as_bytes()).map(|_| ())
}

/// `nft -j list <args>`, parsed; `None` when the object listed does not exist.
pub fn list(args: &[&str]) -> Result<Option<Value>, Failure> {
    let mut all = vec!["-j", "list"];
    all.extend_from_slice(args);
    match exec::run("nft", &all, b"") {
        Ok(text) => Ok(Some(serde_json::from_str(&text).map_err(|e| Failure {
            command: format!("nft {}", all.join(" ")),
            missing: false,
            stderr: format!("unparseable JSON output: {e}"),
        })?)),
        Err(failure) if failure.is_not_found() && !failure.missing => Ok(None),
        Err(failure) => Err(failure),
    }
}

/// The objects of a `nft -j list` answer (`{"nftables": [{"map": {...}}, ...]}`) of one kind (`"map"`,
/// `"chain"`, `"rule"`, ...) in `family`/`table`.
pub fn objects<'a>(
    listing: &'a Value,
    kind: &'a str,
    family: &'a str,
    table: &'a str,
) -> impl Iterator<Item = &'a Value> + 'a {
    listing
        .get("nftables")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(move |item| item.get(kind))
        .filter(move |object| {
            object.get("family").and_then(Value::as_str) == Some(family)
                && object.get("table").and_then(Value::as_str) == Some(table)
        })
}

/// `add element` of each element with its comment, as `nft` text.
pub fn add_script(table: &str, elements: &[Element]) -> Script {
    let mut script = Script::new();
    for element in elements {
        script.push(format!("add element inet {table} {} {{ {} }}", element.set, element.render(true)));
    }
    script
}

/// `add element` then `delete element` of each element, as `nft` text: removes them, and succeeds for those
/// already gone.
pub fn remove_script(table: &str, elements: &[Element]) -> Script {
    let mut script = Script::new();
    for element in elements {
        script.push(format!("add element inet {table} {} {{ {} }}", element.set, element.render(false)));
        script.push(format!("delete element inet {table} {} {{ {} }}", element.set, element.key_text()));
    }
    script
}

/// The usual ADD of a backend: the elements added with their comments in one transaction, as one netlink
/// batch, or as [`add_script`] run by `nft` when netlink cannot be used (no NETLINK_NETFILTER, EPERM, a
/// name that cannot be encoded). False when the kernel refused it (a set or chain missing, a key holding
/// another value; `nft` would be refused the same way): the caller's slower path follows.
pub fn add_elements(table: &str, elements: &[Element]) -> bool {
    usual(
        || {
            let mut batch = nfnl::Batch::inet(table);
            for element in elements {
                batch.add(element, true);
            }
            batch.commit()
        },
        || add_script(table, elements).apply().is_ok(),
    )
}

/// The usual DEL of a backend: the elements removed ([`nfnl::Batch::remove_if_present`]) in one
/// transaction, over netlink or else as [`remove_script`]. False when the kernel refused it (the table
/// missing, a key holding another owner's value): the caller's slower path follows. For a process about to
/// exit (a plugin's DEL): the socket is closed at exit ([`nfnl::Batch::commit_closing_at_exit`]).
pub fn remove_elements(table: &str, elements: &[Element]) -> bool {
    usual(
        || {
            let mut batch = nfnl::Batch::inet(table);
            for element in elements {
                batch.remove_if_present(element);
            }
            batch.commit_closing_at_exit()
        },
        || remove_script(table, elements).apply().is_ok(),
    )
}

/// The usual transaction: over netlink, else as text. Without the `nft` binary, the text path runs (and
/// fails as `nft` missing, code 50 in the callers' errors), so that a node without nftables' tools behaves
/// as before netlink was used.
fn usual(netlink: impl FnOnce() -> Result<(), nfnl::BatchError>, text: impl FnOnce() -> bool) -> bool {
    if exec::find_binary("nft").is_none() {
        return text();
    }
    decide(netlink(), text)
}

/// What the netlink outcome means: applied; refused for the table's state (nft would be too: the slower
/// path, no `nft` run); or netlink unusable (the same transaction as text).
fn decide(committed: Result<(), nfnl::BatchError>, text: impl FnOnce() -> bool) -> bool {
    match committed {
        Ok(()) => true,
        Err(refusal) if refusal.is_state() => false,
        Err(_) => text(),
    }
}

/// One element of a set or map of a table, read back from `nft -j list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The set or map holding it.
    pub set: String,
    /// The key in nft syntax (`tcp . 8080`, `10.22.0.0/24 . 10.22.0.5`), usable in `delete element`.
    pub key: String,
    /// The value of a map element in nft syntax (`10.22.0.5 . 80`, `jump dnat4-any`).
    pub value: Option<String>,
    /// The element's comment (our owner tag).
    pub comment: Option<String>,
}

impl Listed {
    /// True when this is `element`'s key in `element`'s set.
    pub fn is_key_of(&self, element: &Element) -> bool {
        self.set == element.set && self.key == element.key_text().replace('"', "")
    }
}

/// Every element of the sets and maps of `inet <table>`, from one `nft -j list table`; `None` when the table
/// does not exist. Elements whose key cannot be rendered back safely are skipped.
pub fn table_elements(table: &str) -> Result<Option<Vec<Listed>>> {
    let Some(listing) =
        list(&["table", "inet", table]).map_err(|f| f.to_error(&format!("listing table inet {table}")))?
    else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for kind in ["map", "set"] {
        for object in objects(&listing, kind, "inet", table) {
            let Some(name) = object.get("name").and_then(Value::as_str) else { continue };
            let items = object.get("elem").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
            out.extend(items.iter().filter_map(|item| element(name, item)));
        }
    }
    Ok(Some(out))
}

/// One `elem` entry: `key`, `{"elem": {"val": key, "comment": c}}`, or `[key-or-elem, value]` for maps.
fn element(set: &str, item: &Value) -> Option<Listed> {
    let (keyed, value) = match item.as_array() {
        Some(pair) => (pair.first()?, Some(render_value(pair.get(1)?)?)),
        None => (item, None),
    };
    let (key, comment) = match keyed.get("elem") {
        Some(inner) => (inner.get("val")?, inner.get("comment").and_then(Value::as_str).map(str::to_string)),
        None => (keyed, None),
    };
    Some(Listed { set: set.to_string(), key: render_key(key)?, value, comment })
}

/// A map value: a verdict (`jump X`, `continue`) or data written like a key.
fn render_value(value: &Value) -> Option<String> {
    for verdict in ["accept", "drop", "continue", "return"] {
        if value.get(verdict).is_some() {
            return Some(verdict.to_string());
        }
    }
    for verdict in ["jump", "goto"] {
        if let Some(target) = value.get(verdict).and_then(|j| j.get("target")).and_then(Value::as_str) {
            let safe = target.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            return safe.then(|| format!("{verdict} {target}"));
        }
    }
    render_key(value)
}

/// A key from JSON (`"10.0.0.1"`, `8080`, `{"concat": [...]}`, `{"prefix": {"addr", "len"}}`,
/// `{"range": [a, b]}`) back in nft syntax.
fn render_key(key: &Value) -> Option<String> {
    match key {
        Value::String(s) => {
            let safe =
                !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b':' | b'-' | b'_'));
            safe.then(|| s.clone())
        }
        Value::Number(n) => n.as_u64().map(|n| n.to_string()),
        Value::Object(o) => {
            if let Some(parts) = o.get("concat").and_then(Value::as_array) {
                let rendered: Option<Vec<String>> = parts.iter().map(render_key).collect();
                return Some(rendered?.join(" . "));
            }
            if let Some(prefix) = o.get("prefix") {
                let addr = render_key(prefix.get("addr")?)?;
                return Some(format!("{addr}/{}", prefix.get("len")?.as_u64()?));
            }
            let range = o.get("range")?.as_array()?;
            Some(format!("{}-{}", render_key(range.first()?)?, render_key(range.get(1)?)?))
        }
        _ => None,
    }
}

/// Deletes, in one transaction, every element of `inet <table>` whose comment satisfies `owned`. Elements
/// already gone are fine; a transaction that fails because of a concurrent change is recomputed. Read and
/// deleted over netlink ([`nfnl::delete_tagged`]: dumps of the table's sets, one batch); with `nft -j list`
/// and `nft -f` when netlink cannot be used, and without the `nft` binary (as before netlink was used).
pub fn delete_tagged(table: &str, owned: impl Fn(&str) -> bool) -> Result<()> {
    if exec::find_binary("nft").is_some() && nfnl::delete_tagged(table, &owned).is_ok() {
        return Ok(());
    }
    delete_tagged_text(table, owned)
}

/// [`delete_tagged`] with `nft`: one listing, one transaction.
fn delete_tagged_text(table: &str, owned: impl Fn(&str) -> bool) -> Result<()> {
    let mut last = None;
    for _ in 0..super::ATTEMPTS {
        let Some(elements) = table_elements(table)? else { return Ok(()) };
        let mut script = Script::new();
        for element in elements {
            if element.comment.as_deref().is_some_and(&owned) {
                script.push(format!("delete element inet {table} {} {{ {} }}", element.set, element.key));
            }
        }
        match script.apply() {
            Ok(()) => return Ok(()),
            Err(failure) => last = Some(failure),
        }
    }
    let failure = last.expect("at least one attempt");
    Err(failure.to_error(&format!("deleting elements from table inet {table}")))
}

/// Deletes the elements tagged ([`super::nft_tag`]) for attachments of `network` whose container is not in
/// `valid`.
pub fn gc_tagged(table: &str, kind: &str, network: &str, valid: &BTreeSet<&str>) -> Result<()> {
    let prefix = super::nft_tag_prefix(kind, network);
    let keep: BTreeSet<String> = valid.iter().map(|id| super::nft_tag(kind, network, id)).collect();
    delete_tagged(table, |tag| tag.starts_with(&prefix) && !keep.contains(tag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn netlink_outcomes() {
        use std::io;
        let refused = |errno| nfnl::BatchError::Refused { index: Some(0), error: io::Error::from_raw_os_error(errno) };
        let unavailable = || nfnl::BatchError::Unavailable(io::Error::from_raw_os_error(libc::EPERM));
        let text_ran = std::cell::Cell::new(0);
        let text = |ok| {
            text_ran.set(text_ran.get() + 1);
            ok
        };
        assert!(decide(Ok(()), || text(false)));
        assert!(!decide(Err(refused(libc::ENOENT)), || text(true)), "nft would be refused the same way");
        assert!(!decide(Err(refused(libc::EEXIST)), || text(true)));
        assert_eq!(text_ran.get(), 0);
        assert!(decide(Err(unavailable()), || text(true)), "netlink unusable: the text applies");
        assert!(!decide(Err(refused(libc::EINVAL)), || text(false)), "an unforeseen refusal: the text decides");
        assert_eq!(text_ran.get(), 2);
    }

    #[test]
    fn strings_cannot_escape() {
        assert_eq!(string("eth0").unwrap(), "\"eth0\"");
        for bad in ["a\"b", "a\\b", "a\nb", "a;\0"] {
            assert!(string(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reads_elements() {
        let listing = json!({"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"map": {"family": "inet", "name": "dnat4", "table": "t", "map": "ipv4_addr . inet_service",
                "elem": [[{"elem": {"val": {"concat": ["tcp", 8080]}, "comment": "pm-1"}}, {"concat": ["10.22.0.5", 80]}],
                         [{"concat": ["udp", 53]}, {"jump": {"target": "c2"}}],
                         [{"concat": ["udp", 54]}, {"continue": null}],
                         [{"concat": ["bad\"", 1]}, {"jump": {"target": "c3"}}]]}},
            {"set": {"family": "inet", "name": "hairpin4", "table": "t",
                "elem": [{"elem": {"val": {"concat": [{"prefix": {"addr": "10.22.0.0", "len": 24}}, "10.22.0.5"]}, "comment": "pm-1"}},
                         {"concat": [{"range": ["10.0.0.1", "10.0.0.9"]}, "10.22.0.6"]}]}},
            {"map": {"family": "inet", "name": "other", "table": "else"}}
        ]});
        let maps: Vec<_> = objects(&listing, "map", "inet", "t").collect();
        assert_eq!(maps.len(), 1);
        let elements: Vec<Listed> =
            maps[0]["elem"].as_array().unwrap().iter().filter_map(|e| element("dnat4", e)).collect();
        assert_eq!(elements.len(), 3);
        assert_eq!(elements[2].value.as_deref(), Some("continue"));
        assert_eq!(elements[0].key, "tcp . 8080");
        assert_eq!(elements[0].value.as_deref(), Some("10.22.0.5 . 80"));
        assert_eq!(elements[0].comment.as_deref(), Some("pm-1"));
        assert_eq!(elements[1].value.as_deref(), Some("jump c2"));
        let sets: Vec<_> = objects(&listing, "set", "inet", "t").collect();
        let elements: Vec<Listed> =
            sets[0]["elem"].as_array().unwrap().iter().filter_map(|e| element("hairpin4", e)).collect();
        assert_eq!(elements[0].key, "10.22.0.0/24 . 10.22.0.5");
        assert_eq!(elements[1].key, "10.0.0.1-10.0.0.9 . 10.22.0.6");
        assert_eq!(elements[1].comment, None);
    }
}
