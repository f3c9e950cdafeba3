"""A minimal CRI client for the tests (grpcio + our own ``cri.proto``).

containerd has no gRPC reflection and Debian ships no CRI proto or crictl
(docs/background.md "Test machines"), so the tests generate Python code
from ``tests/cri/cri.proto`` with ``grpc_tools.protoc`` into a temp dir at
test time (nothing generated is committed) and talk to containerd's socket.
Needs the Debian packages python3-grpcio and python3-grpc-tools.
"""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys
import time

PROTO = pathlib.Path(__file__).with_name("cri.proto")


def generate(out_dir: pathlib.Path, proto: pathlib.Path = PROTO):
    """Run protoc on ``proto`` (cri.proto) into ``out_dir``; returns ``(pb2, pb2_grpc)`` modules."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}",
                        f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", proto.name],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"grpc_tools.protoc failed: {p.stderr.strip()}")
    sys.path.insert(0, str(out_dir))
    try:
        names = (f"{proto.stem}_pb2", f"{proto.stem}_pb2_grpc")
        for name in names:
            sys.modules.pop(name, None)
        return tuple(importlib.import_module(name) for name in names)
    finally:
        sys.path.remove(str(out_dir))


class Client:
    """RuntimeService/ImageService stubs on ``unix://<socket>``."""

    def __init__(self, socket: str, out_dir: pathlib.Path, timeout: float = 60) -> None:
        import grpc

        self.pb, grpc_mod = generate(out_dir)
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.runtime = grpc_mod.RuntimeServiceStub(self.channel)
        self.images = grpc_mod.ImageServiceStub(self.channel)
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def version(self):
        return self.runtime.Version(self.pb.VersionRequest(version="v1"), timeout=self.timeout)

    def sandbox_config(self, name: str, log_dir: str):
        pb = self.pb
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="compat-hook-tests", attempt=0),
            log_directory=log_dir,
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE))))  # host network: no CNI needed

    def run_pod(self, config, handler: str) -> str:
        r = self.runtime.RunPodSandbox(self.pb.RunPodSandboxRequest(config=config, runtime_handler=handler),
                                       timeout=self.timeout)
        return r.pod_sandbox_id

    def remove_pod(self, pod_id: str) -> None:
        self.runtime.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout)
        self.runtime.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout)

    def container_config(self, name: str, image: str, command=(), envs=None, annotations=None,
                         log_path: str | None = None, cdi_devices=()):
        """A ContainerConfig; ``cdi_devices``: CDI names (``nvidia.com/gpu=0``), as the kubelet passes
        a device plugin's or a DRA claim's."""
        pb = self.pb
        return pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name), image=pb.ImageSpec(image=image),
                                  command=list(command), log_path=log_path or f"{name}.log",
                                  envs=[pb.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
                                  annotations=annotations or {},
                                  CDI_devices=[pb.CDIDevice(name=n) for n in cdi_devices])

    def create_container(self, pod_id: str, sandbox_config, cfg) -> str:
        return self.runtime.CreateContainer(self.pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=cfg, sandbox_config=sandbox_config), timeout=self.timeout).container_id

    def run_container(self, pod_id: str, sandbox_config, name: str, image: str, command=(), envs=None,
                      annotations=None, log_path: str | None = None, wait: float = 60, cdi_devices=()):
        """Create, start and wait for a container to exit; returns ``(status, container_id)``."""
        pb = self.pb
        cfg = self.container_config(name, image, command, envs, annotations, log_path, cdi_devices)
        cid = self.create_container(pod_id, sandbox_config, cfg)
        self.runtime.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=self.timeout)
        deadline = time.monotonic() + wait
        while True:
            st = self.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                              timeout=self.timeout).status
            if st.state == pb.CONTAINER_EXITED or time.monotonic() > deadline:
                return st, cid
            time.sleep(0.05)

    def remove_container(self, cid: str) -> None:
        self.runtime.RemoveContainer(self.pb.RemoveContainerRequest(container_id=cid), timeout=self.timeout)


def read_log(path) -> str:
    """The stdout/stderr text of a CRI container log (``<time> <stream> <P|F> <text>`` lines)."""
    out = []
    for line in pathlib.Path(path).read_text().splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4:
            out.append(parts[3] + ("\n" if parts[2] == "F" else ""))
    return "".join(out)
