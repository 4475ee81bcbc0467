//! A blocking client of the CRI v1 API (`runtime.v1.RuntimeService` and `ImageService`) over a runtime's unix
//! socket: what the kubelet sends, for the containerd tests (`netns-tests/tests/containerd.rs`) and the
//! containerd benchmark (`cri-bench`).
//!
//! The generated messages are the `k8s-cri` crate's (the CRI's own `api.proto`); this crate adds the
//! connection (tonic over a unix socket, on a single-threaded tokio runtime owned by the client, so no threads
//! run behind the caller's back) and builders for the pod and container configs a kubelet would send.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

pub use k8s_cri::v1;
pub use tonic::{Code, Status};

use v1::*;

/// The annotations the kubelet turns a pod's bandwidth limits into; containerd passes them to CNI as the
/// `bandwidth` capability.
pub const INGRESS_BANDWIDTH: &str = "kubernetes.io/ingress-bandwidth";
pub const EGRESS_BANDWIDTH: &str = "kubernetes.io/egress-bandwidth";

/// A connection to a CRI runtime.
pub struct Cri {
    runtime: tokio::runtime::Runtime,
    service: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl Cri {
    /// Connects to the runtime's socket, retrying until `timeout` (the daemon may still be starting).
    pub fn connect(socket: &Path, timeout: Duration) -> Result<Cri, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let deadline = Instant::now() + timeout;
        let channel = loop {
            match runtime.block_on(connect_unix(socket.to_path_buf())) {
                Ok(channel) => break channel,
                Err(e) if Instant::now() >= deadline => return Err(format!("connect to {}: {e}", socket.display())),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let mut cri = Cri {
            runtime,
            service: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        };
        // The socket accepts before the CRI service is registered: wait for an answer to Version.
        loop {
            match cri.version() {
                Ok(_) => return Ok(cri),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("CRI Version on {}: {e}", socket.display()))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// `Version`: the runtime's name and version.
    pub fn version(&mut self) -> Result<VersionResponse, Status> {
        let request = VersionRequest { version: "v1".into() };
        self.runtime.block_on(self.service.version(request)).map(|r| r.into_inner())
    }

    /// `RunPodSandbox`: the sandbox id.
    pub fn run_pod_sandbox(&mut self, config: PodSandboxConfig) -> Result<String, Status> {
        let request = RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
        self.runtime.block_on(self.service.run_pod_sandbox(request)).map(|r| r.into_inner().pod_sandbox_id)
    }

    /// `PodSandboxStatus` (verbose: with the runtime's `info`, e.g. containerd's netns path).
    pub fn pod_sandbox_status(&mut self, id: &str, verbose: bool) -> Result<PodSandboxStatusResponse, Status> {
        let request = PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose };
        self.runtime.block_on(self.service.pod_sandbox_status(request)).map(|r| r.into_inner())
    }

    /// `StopPodSandbox`.
    pub fn stop_pod_sandbox(&mut self, id: &str) -> Result<(), Status> {
        let request = StopPodSandboxRequest { pod_sandbox_id: id.into() };
        self.runtime.block_on(self.service.stop_pod_sandbox(request)).map(|_| ())
    }

    /// `RemovePodSandbox`.
    pub fn remove_pod_sandbox(&mut self, id: &str) -> Result<(), Status> {
        let request = RemovePodSandboxRequest { pod_sandbox_id: id.into() };
        self.runtime.block_on(self.service.remove_pod_sandbox(request)).map(|_| ())
    }

    /// `ListPodSandbox`, unfiltered.
    pub fn list_pod_sandbox(&mut self) -> Result<Vec<PodSandbox>, Status> {
        let request = ListPodSandboxRequest { filter: None };
        self.runtime.block_on(self.service.list_pod_sandbox(request)).map(|r| r.into_inner().items)
    }

    /// `CreateContainer` in a sandbox (`sandbox` is the config the sandbox was run with, as the kubelet
    /// sends it again): the container id.
    pub fn create_container(
        &mut self,
        pod_id: &str,
        config: ContainerConfig,
        sandbox: PodSandboxConfig,
    ) -> Result<String, Status> {
        let request = CreateContainerRequest {
            pod_sandbox_id: pod_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox),
        };
        self.runtime.block_on(self.service.create_container(request)).map(|r| r.into_inner().container_id)
    }

    /// `StartContainer`.
    pub fn start_container(&mut self, id: &str) -> Result<(), Status> {
        let request = StartContainerRequest { container_id: id.into() };
        self.runtime.block_on(self.service.start_container(request)).map(|_| ())
    }

    /// `ContainerStatus`.
    pub fn container_status(&mut self, id: &str) -> Result<ContainerStatus, Status> {
        let request = ContainerStatusRequest { container_id: id.into(), verbose: false };
        self.runtime.block_on(self.service.container_status(request)).map(|r| r.into_inner().status.unwrap_or_default())
    }

    /// `UpdateRuntimeConfig` with the node's pod CIDR (what the kubelet sends once it knows it).
    pub fn update_pod_cidr(&mut self, cidr: &str) -> Result<(), Status> {
        let request = UpdateRuntimeConfigRequest {
            runtime_config: Some(RuntimeConfig { network_config: Some(NetworkConfig { pod_cidr: cidr.into() }) }),
        };
        self.runtime.block_on(self.service.update_runtime_config(request)).map(|_| ())
    }

    /// `Status` (verbose): the runtime's conditions, e.g. `NetworkReady`.
    pub fn status(&mut self) -> Result<StatusResponse, Status> {
        let request = StatusRequest { verbose: true };
        self.runtime.block_on(self.service.status(request)).map(|r| r.into_inner())
    }

    /// `ListImages`: the references of the images the runtime has.
    pub fn image_tags(&mut self) -> Result<Vec<String>, Status> {
        let request = ListImagesRequest { filter: None };
        self.runtime
            .block_on(self.images.list_images(request))
            .map(|r| r.into_inner().images.into_iter().flat_map(|i| i.repo_tags).collect())
    }
}

async fn connect_unix(socket: PathBuf) -> Result<Channel, tonic::transport::Error> {
    // The URI is required by the API and ignored by the connector.
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
}

/// A hostPort mapping of a pod, as the kubelet sends it.
#[derive(Debug, Clone, Copy)]
pub struct HostPort {
    pub host_port: u16,
    pub container_port: u16,
    pub udp: bool,
}

/// The sandbox config the kubelet sends for a pod `namespace/name` with `uid`: metadata, hostname, the
/// port mappings, and annotations (e.g. [`INGRESS_BANDWIDTH`] = "10M").
pub fn pod_config(
    namespace: &str,
    name: &str,
    uid: &str,
    ports: &[HostPort],
    annotations: &[(&str, &str)],
    log_directory: &Path,
) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_directory.display().to_string(),
        port_mappings: ports
            .iter()
            .map(|p| PortMapping {
                protocol: if p.udp { Protocol::Udp } else { Protocol::Tcp } as i32,
                container_port: p.container_port.into(),
                host_port: p.host_port.into(),
                host_ip: String::new(),
            })
            .collect(),
        labels: HashMap::from([("app".to_string(), name.to_string())]),
        annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        linux: Some(LinuxPodSandboxConfig::default()),
        ..Default::default()
    }
}

/// A container config running `command` from `image` (already present in the runtime).
pub fn container_config(name: &str, image: &str, command: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(ImageSpec { image: image.into(), ..Default::default() }),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        linux: Some(LinuxContainerConfig::default()),
        ..Default::default()
    }
}

/// The pod's IPv4/IPv6 addresses from a `PodSandboxStatus` (primary first).
pub fn pod_ips(status: &PodSandboxStatusResponse) -> Vec<String> {
    let Some(network) = status.status.as_ref().and_then(|s| s.network.as_ref()) else {
        return Vec::new();
    };
    let mut ips = vec![network.ip.clone()];
    ips.extend(network.additional_ips.iter().map(|ip| ip.ip.clone()));
    ips.retain(|ip| !ip.is_empty());
    ips
}
