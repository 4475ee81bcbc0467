//! Plugin to daemon: one JSON request and one JSON answer per connection on the daemon's unix socket.
//!
//! The reference speaks Go's `net/rpc` (gob encoding behind an HTTP CONNECT); ours does not (see the README):
//! a request names the method as theirs do (`DHCP.Allocate`, `DHCP.Release`) and carries the plugin's
//! arguments; the answer is a 1.1.0 result or a CNI error object.

use cnicore::spec::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;

/// Requests are a config and a few names; this bounds a hostile client.
pub const MAX_REQUEST: u64 = 2 << 20;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub method: String,
    pub container_id: String,
    /// Absolute: the daemon may run in another directory.
    pub netns: String,
    pub ifname: String,
    /// `CNI_ARGS` as the runtime sent it.
    pub args: String,
    /// The network config as the plugin read it.
    pub stdin: String,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub struct Response {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

impl Response {
    pub fn from_outcome(outcome: Result<Option<Value>>) -> Response {
        match outcome {
            Ok(result) => Response { result, error: None },
            Err(e) => Response { result: None, error: Some(e.to_json("1.1.0")) },
        }
    }
}

/// Why a call did not reach a daemon: DEL tolerates this one.
pub struct Unreachable(pub Error);

pub fn call(socket_path: &str, request: &Request) -> std::result::Result<Option<Value>, std::result::Result<Error, Unreachable>> {
    let mut stream = UnixStream::connect(socket_path).map_err(|e| {
        Err(Unreachable(Error::new(
            cnicore::spec::codes::TRY_AGAIN,
            format!("error dialing DHCP daemon at {socket_path}: {e}"),
        )))
    })?;
    let io = |e: std::io::Error| Ok(Error::io(format!("error calling {} on {socket_path}: {e}", request.method)));
    let mut line = serde_json::to_vec(request).map_err(|e| Ok(Error::internal(e.to_string())))?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io)?;
    stream.shutdown(std::net::Shutdown::Write).map_err(io)?;
    let mut answer = Vec::new();
    stream.take(MAX_REQUEST).read_to_end(&mut answer).map_err(io)?;
    let response: Response = serde_json::from_slice(&answer).map_err(|e| {
        Ok(Error::decode(format!("error calling {}: the daemon's answer is not valid: {e}", request.method)))
    })?;
    match response.error {
        Some(e) => Err(Ok(Error::from_json(&e).unwrap_or_else(|| Error::internal(format!("daemon error: {e}"))))),
        None => Ok(response.result),
    }
}

/// The daemon's side: one request from `stream`.
pub fn read_request(stream: &UnixStream) -> std::io::Result<Request> {
    let mut line = Vec::new();
    BufReader::new(stream.take(MAX_REQUEST)).read_until(b'\n', &mut line)?;
    serde_json::from_slice(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

pub fn write_response(mut stream: &UnixStream, response: &Response) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(response).map_err(std::io::Error::other)?;
    out.push(b'\n');
    stream.write_all(&out)
}
