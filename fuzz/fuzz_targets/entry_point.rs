//! The plugin entry point (`cnicore::spec::run`) with arbitrary stdin, for every verb: config parsing, version
//! and verb checks, network name validation, `prevResult` parsing and conversion, `runtimeConfig`/`args`
//! lookups, `cni.dev/valid-attachments`, and the rendering of the answer in the config's version.
//!
//! Input: the first byte picks the verb and a `CNI_ARGS` variant, the rest is stdin.
#![no_main]

use cni_fuzz::{check_error, check_rendered_result};
use cnicore::spec::{
    gojson, parse_cni_args, run, validate_network_name, CniResult, Command, Context, Env, Interface,
    IpConfig, NetConf, Plugin, Result, RuntimeConfig, Version, MAX_STDIN,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const COMMANDS: [Command; 6] = [
    Command::Add,
    Command::Del,
    Command::Check,
    Command::Gc,
    Command::Status,
    Command::Version,
];
const ARGS: [&str; 4] = [
    "",
    "IgnoreUnknown=1;IP=10.0.0.5",
    "K8S_POD_NAME=p;MAC=02:00:00:00:00:01",
    "IP=fd00::5,10.1.0.9",
];

/// A plugin that touches nothing outside the process but uses every config accessor a real plugin uses.
struct Dummy;

impl Plugin for Dummy {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let prev = ctx.prev_result()?;
        let _: Value = ctx.parse_conf()?;
        let _: NetConf = ctx.parse_conf()?;
        if ctx.conf.ipam.is_some() {
            ctx.conf.ipam_type()?;
        }
        let runtime: Option<RuntimeConfig> = ctx
            .conf
            .runtime_config
            .clone()
            .and_then(|r| serde_json::from_value(r).ok());
        let _ = (
            runtime,
            ctx.conf.runtime("portMappings"),
            ctx.conf.args_cni("ips"),
            ctx.env.args.check_known(&["IP", "MAC"]),
        );
        let mut result = prev.unwrap_or_default();
        result.interfaces.push(Interface {
            name: ctx.env.ifname.clone(),
            sandbox: "/run/netns/fuzz".into(),
            ..Default::default()
        });
        let interface = Some(result.interfaces.len() - 1);
        result.ips.push(IpConfig {
            address: "10.0.0.2/24".parse().expect("constant"),
            gateway: None,
            interface,
        });
        Ok(result)
    }
    fn del(&self, ctx: &Context) -> Result<()> {
        ctx.prev_result()?;
        Ok(())
    }
    fn check(&self, ctx: &Context) -> Result<()> {
        let prev = ctx.require_prev_result()?;
        let _ = prev.sandbox_interface(&ctx.env.ifname);
        Ok(())
    }
    fn gc(&self, ctx: &Context) -> Result<()> {
        for (id, ifname) in ctx.valid_attachments()? {
            let _ = (id.len(), ifname.len());
        }
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, stdin)) = data.split_first() else {
        return;
    };
    if stdin.len() as u64 > MAX_STDIN {
        return;
    }
    let command = COMMANDS[usize::from(selector) % COMMANDS.len()];
    let args_raw = ARGS[usize::from(selector / 8) % ARGS.len()].to_string();
    let env = Env {
        command,
        container_id: "fuzz-container".into(),
        netns: Some("/run/netns/fuzz".into()),
        ifname: "eth0".into(),
        args: parse_cni_args(&args_raw).expect("constant CNI_ARGS"),
        args_raw,
        path: vec![],
    };
    let (version, outcome) = run(env, stdin.to_vec(), &Dummy);
    let accepted = outcome.is_ok();
    match outcome {
        Err(e) => {
            check_error(&e, version);
            assert_ne!(command, Command::Version, "VERSION never fails");
        }
        Ok(Some(answer)) if command == Command::Version => {
            assert!(answer["supportedVersions"].is_array(), "{answer}");
        }
        Ok(Some(answer)) => {
            assert_eq!(command, Command::Add, "only ADD and VERSION answer");
            check_rendered_result(&answer, version);
        }
        Ok(None) => assert!(
            !matches!(command, Command::Add | Command::Version),
            "{command:?} printed nothing"
        ),
    }
    // Whatever a verb accepted had a supported version and a valid network name.
    if accepted && command != Command::Version {
        let conf: NetConf = gojson::from_slice(stdin).expect("accepted config parses");
        assert_eq!(
            Version::parse_supported(&conf.cni_version).ok(),
            Some(version)
        );
        validate_network_name(&conf.name).expect("accepted network name is valid");
    }
});
