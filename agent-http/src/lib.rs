//! The HTTP endpoints of the node agents (fabricd, cni-netpol): `/metrics` in Prometheus' text format
//! (prometheus-client's encoder), `/healthz` and `/readyz`, served by hyper's HTTP/1 server.
//!
//! The listener is bound at start ([`bind`]), so an address in use stops the agent with a clear error
//! instead of leaving it running without its endpoints. Each agent says what a path answers ([`Endpoints`]);
//! any method is answered by path, the query string ignored.

use std::convert::Infallible;
use std::fmt;
use std::io;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{header, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};

use prometheus_client::encoding::prometheus_text;
use prometheus_client::registry::Registry;

/// A request head not complete in this time is dropped (a client that connects and sends nothing).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// The answer to a request: a status, a content type and a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Answer {
    /// A plain-text answer.
    pub fn text(status: u16, body: impl Into<String>) -> Answer {
        Answer { status, content_type: "text/plain; charset=utf-8", body: body.into() }
    }

    /// 200 with every metric of `registry` in the Prometheus text format (version 0.0.4).
    pub fn metrics(registry: &Registry) -> Answer {
        let mut body = String::new();
        // Writing into a String cannot fail; a metric's own encoder failing leaves the text cut short.
        let _ = prometheus_text::encode(&mut body, registry);
        Answer { status: 200, content_type: prometheus_text::CONTENT_TYPE, body }
    }

    /// 404, naming the paths there are.
    pub fn not_found(paths: &[&str]) -> Answer {
        Answer::text(404, format!("not found: {}\n", paths.join(", ")))
    }
}

/// What a server answers, by path (without its query string).
pub trait Endpoints: Send + Sync + 'static {
    fn answer(&self, path: &str) -> Answer;
}

/// An address that could not be listened on.
#[derive(Debug)]
pub struct BindError {
    pub address: String,
    pub error: io::Error,
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot listen on {}: {}", self.address, self.error)
    }
}

impl std::error::Error for BindError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// A listener on `address` (`host:port`), ready for [`serve`].
pub fn bind(address: &str) -> Result<TcpListener, BindError> {
    let failed = |error| BindError { address: address.to_string(), error };
    let listener = TcpListener::bind(address).map_err(failed)?;
    listener.set_nonblocking(true).map_err(failed)?;
    Ok(listener)
}

/// Answers on `listener` until the runtime ends; run it as a task of a tokio runtime with I/O and time.
pub async fn serve(listener: TcpListener, endpoints: Arc<dyn Endpoints>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => return eprintln!("HTTP endpoints: {e}"),
    };
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let answer = endpoints.answer(request.uri().path());
                async move { Ok::<_, Infallible>(response(answer)) }
            });
            let mut builder = http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
            // A connection that fails (reset, timed out) concerns only that client.
            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// [`serve`] on a thread of its own (a single-threaded runtime): the endpoints answer while the agent's own
/// thread is busy, and an agent without a runtime (cni-netpol's `run --static`) has them too.
pub fn serve_in_thread(listener: TcpListener, endpoints: Arc<dyn Endpoints>) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name("http".into()).spawn(move || runtime.block_on(serve(listener, endpoints)))?;
    Ok(())
}

fn response(answer: Answer) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(answer.body)));
    *response.status_mut() =
        hyper::StatusCode::from_u16(answer.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(answer.content_type));
    response
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    struct Fixed;

    impl Endpoints for Fixed {
        fn answer(&self, path: &str) -> Answer {
            match path {
                "/healthz" => Answer::text(200, "ok\n"),
                _ => Answer::not_found(&["/healthz"]),
            }
        }
    }

    fn get(address: std::net::SocketAddr, request: &str) -> String {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    #[test]
    fn answers_by_path_and_an_address_in_use_is_an_error() {
        let listener = bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        serve_in_thread(listener, Arc::new(Fixed)).unwrap();
        let ok = get(address, "GET /healthz?verbose HTTP/1.0\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n") && ok.ends_with("\r\n\r\nok\n"), "{ok:?}");
        // HTTP/1.1 with the connection closed by the client's request; a request in several segments.
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.write_all(b"GET /other HTTP/1.1\r\nHost: x\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        stream.write_all(b"Connection: close\r\n\r\n").unwrap();
        let mut missing = String::new();
        stream.read_to_string(&mut missing).unwrap();
        assert!(missing.starts_with("HTTP/1.1 404 Not Found\r\n"), "{missing:?}");
        assert!(missing.ends_with("not found: /healthz\n"), "{missing:?}");

        let taken = bind(&address.to_string()).unwrap_err();
        assert_eq!(taken.error.kind(), io::ErrorKind::AddrInUse);
        assert_eq!(taken.to_string(), format!("cannot listen on {address}: {}", taken.error));
    }

    #[test]
    fn metrics_in_the_prometheus_text_format() {
        let mut registry = Registry::with_prefix("agent");
        let counter = prometheus_client::metrics::counter::Counter::<u64>::default();
        registry.register("passes", "Passes made", counter.clone());
        counter.inc();
        let answer = Answer::metrics(&registry);
        assert_eq!(answer.content_type, "text/plain; version=0.0.4; charset=utf-8");
        assert_eq!(
            answer.body,
            "# HELP agent_passes_total Passes made.\n# TYPE agent_passes_total counter\nagent_passes_total 1\n"
        );
    }
}
