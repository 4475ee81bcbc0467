//! Text that reaches firewall rules or comes back from them: portmap's `conditionsV4`/`conditionsV6`
//! (parsed, never pasted: rendering must not be able to add a rule, a target or a statement), iptables-save
//! quoting and parsing, owner comments, and the tbf parameters computed from configured rates.
#![no_main]

use arbitrary::Arbitrary;
use cni_fuzz::check_error;
use cnicore::firewall::conditions::Conditions;
use cnicore::firewall::iptables::{save_string, saved_comment, targets_chain, Rule, Snapshot};
use cnicore::firewall::{parse_owner_comment, validate_chain_name, Family};
use cnicore::spec::Version;
use cnicore::tc::Tbf;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    v6: bool,
    tokens: Vec<String>,
    text: String,
    rate: u64,
    burst: u64,
}

/// The arguments `iptables-restore` makes of a rule line: split at blanks outside double quotes, a backslash
/// taking the next character literally.
fn restore_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut escaped, mut started) = (Vec::new(), String::new(), false, false, false);
    for c in line.chars() {
        if escaped {
            word.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
            started = true;
        } else if c == '"' {
            quoted = !quoted;
            started = true;
        } else if (c == ' ' || c == '\t') && !quoted {
            if started {
                words.push(std::mem::take(&mut word));
                started = false;
            }
        } else {
            word.push(c);
            started = true;
        }
    }
    if started {
        words.push(word);
    }
    words
}

fuzz_target!(|input: Input| {
    let family = if input.v6 { Family::V6 } else { Family::V4 };
    match Conditions::parse("conditionsV4", family, &input.tokens) {
        Err(e) => check_error(&e, Version::LATEST),
        Ok(conditions) => {
            match conditions.apply_iptables(Rule::new()) {
                Ok(rule) => {
                    let text = rule.render();
                    assert!(
                        !text.contains(['\n', '\r', '\0']),
                        "line break in rule {text:?}"
                    );
                    // Matches are passed through, each word quoted: what counts is the words
                    // iptables-restore reads, not the text between the spaces.
                    for word in restore_words(&text) {
                        assert!(
                            !matches!(
                                word.as_str(),
                                "-j" | "-g" | "-A" | "-I" | "-D" | "-N" | "-X" | "-F" | "-t"
                            ),
                            "{text:?}"
                        );
                    }
                }
                Err(e) => check_error(&e, Version::LATEST),
            }
            match conditions.nft() {
                Ok(text) => assert!(
                    !text.contains(['\n', '\r', ';', '{', '}', '#', '\0']),
                    "nft text {text:?}"
                ),
                Err(e) => check_error(&e, Version::LATEST),
            }
        }
    }

    // iptables-save quoting reads back to the same text, on one line.
    let quoted = save_string(&input.text);
    assert_eq!(
        saved_comment(&format!("-m comment --comment {quoted} -j X")).as_deref(),
        Some(input.text.as_str())
    );
    let snapshot = Snapshot::parse(&input.text, "nat");
    for (chain, spec) in snapshot.all_rules() {
        let _ = (targets_chain(spec, chain), saved_comment(spec));
        if let Some(comment) = saved_comment(spec) {
            let _ = parse_owner_comment(&comment, "dnat ");
        }
    }
    let _ = parse_owner_comment(&input.text, "");
    if validate_chain_name("externalSetMarkChain", &input.text).is_ok() {
        assert!(!input.text.contains([' ', '\n', '"']) && input.text.len() <= 28);
    }

    if let Ok(tbf) = Tbf::like_reference(input.rate, input.burst) {
        let _ = tbf.to_attributes();
    }
});
