"""A minimal kubelet device plugin that answers ``Allocate`` with CDI device names.

What the NVIDIA device plugin does in the GPU Operator's CDI mode (``cdi-cri``): it advertises
``nvidia.com/gpu`` to the kubelet and, for a container that gets a GPU, answers ``Allocate`` with
CDI device names only (``ContainerAllocateResponse.cdi_devices``: no env, no mounts, no device
specs). The kubelet passes them to the engine in the CRI's ``CDI_devices``, and the engine
applies the CDI spec itself (tests/support/node.py's containerd 2.x node).

Device-plugin API v1beta1 over gRPC (grpcio, tests/support/deviceplugin.proto, generated at
start as tests/cri does). The plugin serves ``<dir>/<endpoint>`` and registers with the kubelet
at ``<dir>/kubelet.sock`` once; every ``Allocate`` is one line on stdout
(``allocate nvidia.com/gpu=0``), so a test can tell that the kubelet really asked it. It does not
register again after a kubelet restart (the tests never restart the kubelet). SIGTERM: it stops
serving and exits 0.

In a test: :class:`Plugin` runs it in a node's mount namespace (``python3 -m
tests.support.deviceplugin``), where the kubelet's ``/var/lib/kubelet/device-plugins`` is.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

PROTO = pathlib.Path(__file__).with_name("deviceplugin.proto")
REPO = pathlib.Path(__file__).resolve().parents[2]
API_VERSION = "v1beta1"
KUBELET_DIR = "/var/lib/kubelet/device-plugins"


def serve(args: argparse.Namespace) -> int:
    import grpc

    from tests.cri import generate

    pb, rpc = generate(pathlib.Path(args.gen), PROTO)
    stop = threading.Event()

    class Servicer(rpc.DevicePluginServicer):
        def GetDevicePluginOptions(self, request, context):
            return pb.DevicePluginOptions()

        def ListAndWatch(self, request, context):
            yield pb.ListAndWatchResponse(devices=[pb.Device(ID=d, health="Healthy") for d in args.device])
            while not stop.is_set() and context.is_active():  # the list never changes
                stop.wait(1)

        def Allocate(self, request, context):
            out = []
            for c in request.container_requests:
                names = [f"{args.cdi_kind}={d}" for d in c.devices_ids]
                print("allocate " + " ".join(names), flush=True)
                out.append(pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name=n) for n in names]))
            return pb.AllocateResponse(container_responses=out)

        def PreStartContainer(self, request, context):
            return pb.PreStartContainerResponse()

    sock = os.path.join(args.dir, args.endpoint)
    if os.path.exists(sock):
        os.unlink(sock)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rpc.add_DevicePluginServicer_to_server(Servicer(), server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with grpc.insecure_channel(f"unix://{os.path.join(args.dir, 'kubelet.sock')}") as ch:
        rpc.RegistrationStub(ch).Register(pb.RegisterRequest(
            version=API_VERSION, endpoint=args.endpoint, resource_name=args.resource,
            options=pb.DevicePluginOptions()), timeout=30)
    print(f"registered {args.resource} ({', '.join(args.device)}) at {sock}", flush=True)
    stop.wait()
    server.stop(grace=1).wait()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tests.support.deviceplugin")
    ap.add_argument("--dir", default=KUBELET_DIR)
    ap.add_argument("--endpoint", default="compat-hook-tests.sock")
    ap.add_argument("--resource", default="nvidia.com/gpu")
    ap.add_argument("--cdi-kind", default="nvidia.com/gpu")
    ap.add_argument("--device", action="append", required=True, help="a device ID (repeat)")
    ap.add_argument("--gen", required=True, help="where the gRPC code is generated")
    return serve(ap.parse_args(argv))


class Plugin:
    """The plugin as a process in ``node``'s mount namespace (tests/support/node.py)."""

    def __init__(self, node, work: pathlib.Path, devices=("0",)) -> None:
        self.log = pathlib.Path(work) / "deviceplugin.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        argv = ["nsenter", "-t", str(node.holder.pid), "-m", f"--wd={REPO}", "--", "/usr/bin/python3", "-m",
                "tests.support.deviceplugin", "--gen", str(pathlib.Path(work) / "deviceplugin-gen")]
        for d in devices:
            argv += ["--device", d]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"},
                                         start_new_session=True)
        deadline = time.monotonic() + 60
        while "registered " not in self.text():
            assert self.proc.poll() is None, f"the device plugin exited: {self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"the device plugin did not register: {self.text()[-3000:]}"
            time.sleep(0.1)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def allocations(self) -> list:
        return [ln.split()[1:] for ln in self.text().splitlines() if ln.startswith("allocate ")]

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


if __name__ == "__main__":
    sys.exit(main())
