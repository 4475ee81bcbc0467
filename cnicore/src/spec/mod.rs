//! The CNI specification (0.1.0 – 1.1.0) as types and functions.

mod config;
mod env;
mod error;
pub mod gojson;
pub mod ipam;
mod result;
mod skel;
mod version;

pub use config::{json_error, validate_network_name, validate_plugin_type, NetConf, NetConfList, RuntimeConfig};
pub use config::{json_error_in, ConventionArgs, IpsArg};
pub use env::{
    parse_cni_args, truncate as truncate_for_msg, validate_container_id, validate_ifname, CniArgs, Command, Env,
};
pub use error::{codes, io_error, program_name, report_rollback, warn, Error, ErrorContext, Errors, Result};
pub use gojson::shorten_json_error;
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use skel::{plugin_main, Context, Plugin, Verbs};
/// The entry point without the process around it (stdin already read, nothing printed): for fuzzing and tests.
pub use skel::{run, MAX_STDIN};
pub use version::{Version, SUPPORTED_VERSIONS};
