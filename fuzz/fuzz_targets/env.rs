//! Validation of the `CNI_*` environment (`Env::from_getter`) and of the names that become paths, chain names
//! and comments: container IDs, interface names, network names, plugin types, spec versions.
#![no_main]

use arbitrary::Arbitrary;
use cni_fuzz::check_error;
use cnicore::spec::{
    validate_container_id, validate_ifname, validate_network_name, validate_plugin_type, Command,
    Env, Version,
};
use cnicore::state::validate_path_component;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Vars {
    command: Option<String>,
    command_pick: u8,
    container_id: Option<String>,
    netns: Option<String>,
    ifname: Option<String>,
    args: Option<String>,
    path: Option<String>,
}

const COMMANDS: [&str; 6] = ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"];

/// The characters the spec allows in container IDs and network names.
fn spec_name_chars(s: &str) -> bool {
    s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fuzz_target!(|vars: Vars| {
    // Mostly a valid verb, so that the other variables get checked.
    let command = match &vars.command {
        Some(c) if vars.command_pick % 4 == 0 => Some(c.clone()),
        _ => Some(COMMANDS[usize::from(vars.command_pick) % COMMANDS.len()].to_string()),
    };
    let get = |name: &str| match name {
        "CNI_COMMAND" => command.clone(),
        "CNI_CONTAINERID" => vars.container_id.clone(),
        "CNI_NETNS" => vars.netns.clone(),
        "CNI_IFNAME" => vars.ifname.clone(),
        "CNI_ARGS" => vars.args.clone(),
        "CNI_PATH" => vars.path.clone(),
        _ => None,
    };
    match Env::from_getter(get) {
        Err(e) => check_error(&e, Version::LATEST),
        Ok(env) => {
            if env.command.is_attachment_verb() {
                assert!(
                    spec_name_chars(&env.container_id),
                    "container ID {:?} accepted",
                    env.container_id
                );
                assert!(
                    !env.ifname.is_empty() && env.ifname.len() <= 15,
                    "ifname {:?} accepted",
                    env.ifname
                );
                assert!(
                    !env.ifname.contains(['/', ':']) && env.ifname != "." && env.ifname != ".."
                );
                assert!(!env.ifname.chars().any(char::is_whitespace));
            }
            if let Some(netns) = &env.netns {
                assert!(netns.is_absolute(), "relative netns {netns:?} accepted");
            }
            if matches!(env.command, Command::Add | Command::Check) {
                assert!(env.netns.is_some(), "{:?} without a netns", env.command);
            }
        }
    }
    // The single validators, on every string of the input.
    for s in [
        &vars.container_id,
        &vars.ifname,
        &vars.netns,
        &vars.args,
        &vars.command,
    ]
    .into_iter()
    .flatten()
    {
        match validate_container_id(s) {
            Ok(()) => assert!(spec_name_chars(s) && s.len() <= 256, "container ID {s:?}"),
            Err(e) => check_error(&e, Version::LATEST),
        }
        match validate_network_name(s) {
            Ok(()) => assert!(spec_name_chars(s) && s.len() <= 128, "network name {s:?}"),
            Err(e) => check_error(&e, Version::LATEST),
        }
        match validate_ifname(s) {
            Ok(()) => assert!(
                !s.contains('/') && s != ".." && s.len() <= 15,
                "ifname {s:?}"
            ),
            Err(e) => check_error(&e, Version::LATEST),
        }
        match validate_plugin_type(s) {
            Ok(()) => assert!(!s.contains('/') && !s.contains('\0') && s != ".." && s != "."),
            Err(e) => check_error(&e, Version::LATEST),
        }
        match validate_path_component("name", s) {
            Ok(()) => assert!(
                !s.is_empty() && !s.contains('/') && !s.contains('\0') && s != ".." && s != "."
            ),
            Err(e) => check_error(&e, Version::LATEST),
        }
        match Version::parse(s) {
            Ok(v) => assert_eq!(
                Version::parse(&v.to_string()).ok(),
                Some(v),
                "version {s:?}"
            ),
            Err(e) => check_error(&e, Version::LATEST),
        }
        if let Err(e) = Version::parse_supported(s) {
            check_error(&e, Version::LATEST);
        }
    }
});
