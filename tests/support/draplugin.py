"""A minimal DRA kubelet plugin that prepares claims with CDI device names in NVIDIA's form.

What NVIDIA's DRA driver for GPUs does on a node, cut to the bone: it publishes the node's GPUs as
a ``ResourceSlice`` (``resource.k8s.io/v1``: driver ``--driver``, pool = the node's name, devices
``gpu-0`` ... ``--gpus``), registers with the kubelet as a DRA plugin, and when the kubelet prepares a
claim that the scheduler allocated from that slice it writes a per-claim CDI spec to
``/var/run/cdi`` (kind ``k8s.gpu.nvidia.com/claim``, device ``<claim uid>-gpu-<i>``) and answers
with that one CDI name. The kubelet passes it to the engine in the CRI's ``CDI_devices``, and
the engine applies the spec itself, as for the device plugin's names (tests/support/
deviceplugin.py). Unprepare removes the claim's spec.

Two gRPC services (grpcio, code generated at start as tests/cri does):

* plugin registration (tests/support/draregistration.proto, pluginregistration v1) on
  ``/var/lib/kubelet/plugins_registry/<driver>-reg.sock``, which the kubelet's plugin watcher
  finds: ``GetInfo`` says type ``DRAPlugin``, the driver's name, the DRA socket and the service
  ``v1.DRAPlugin`` (what kubelet v1.34 speaks besides ``v1beta1.DRAPlugin``);
* the DRA service (tests/support/dra.proto, dra v1) on
  ``/var/lib/kubelet/plugins/<driver>/dra.sock``: ``NodePrepareResources`` reads each claim
  from the API server (as a real driver does: which request, pool and device it was allocated)
  and answers per claim UID.

The edits file is read at each prepare (a real driver reads its driver root then), so a test can
change it after a driver change (:meth:`Plugin.set_edits`).

The CDI device's edits are the test's (``--edits``, a JSON file: what the toolkit's spec carries
for the GPU on this node). Every prepare is one line on stdout (``prepare <ns>/<name> <cdi
name>``), every unprepare one too (``unprepare <ns>/<name>``), so a test can tell that the
kubelet really asked it. SIGTERM: it stops serving, deletes its ResourceSlice and exits 0.

In a test: :class:`Plugin` runs it in a node's mount namespace (``python3 -m
tests.support.draplugin``), where the kubelet's plugin dirs and the node's ``/run`` are.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

HERE = pathlib.Path(__file__).parent
REPO = HERE.resolve().parents[1]
#: NVIDIA's driver (k8s-dra-driver-gpu) names its GPUs' claim devices with this CDI kind.
CDI_KIND = "k8s.gpu.nvidia.com/claim"
CDI_DIR = "/var/run/cdi"
#: The DRA gRPC services kubelet v1.34 knows (pkg/apis/dra/v1 and v1beta1 ``DRAPluginService``); this plugin serves v1.
SERVICE = "v1.DRAPlugin"
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR = "/var/lib/kubelet/plugins"
RESOURCE_API = "/apis/resource.k8s.io/v1"


def cdi_name(claim_uid: str, device: str) -> str:
    """The CDI device NVIDIA's driver gives a claim's GPU ``device`` (``gpu-<index>``, as in its ResourceSlice).

    >>> cdi_name("0c7d2b4e-1111-2222-3333-444455556666", "gpu-0")
    'k8s.gpu.nvidia.com/claim=0c7d2b4e-1111-2222-3333-444455556666-gpu-0'
    """
    return f"{CDI_KIND}={claim_uid}-{device}"


def spec_path(claim_uid: str) -> str:
    """Where the claim's CDI spec goes (one file per claim, as NVIDIA's driver writes them).

    >>> spec_path("u1")
    '/var/run/cdi/k8s.gpu.nvidia.com-claim_u1.json'
    """
    return f"{CDI_DIR}/{CDI_KIND.replace('/', '-')}_{claim_uid}.json"


def claim_spec(claim_uid: str, device: str, edits: dict) -> dict:
    """The claim's CDI spec: one device, ``<uid>-<device>``, with the GPU's edits (``/dev/nvidia<index>``).

    >>> s = claim_spec("u1", "gpu-1", {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]})
    >>> s["devices"][0]["name"], s["devices"][0]["containerEdits"]["deviceNodes"][0]["path"]
    ('u1-gpu-1', '/dev/nvidia1')
    """
    index = device.rsplit("-", 1)[1]
    nodes = [dict(n, path=f"/dev/nvidia{index}") if n.get("path") == "/dev/nvidia0" else n
             for n in edits.get("deviceNodes") or []]
    return {"cdiVersion": "0.5.0", "kind": CDI_KIND,
            "devices": [{"name": f"{claim_uid}-{device}", "containerEdits": dict(edits, deviceNodes=nodes)}]}


def resource_slice(driver: str, node: str, gpus: int) -> dict:
    """The node's GPUs (``gpu-0`` ...) as the driver publishes them (pool = the node's name)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "index": {"int": i}}}
                                 for i in range(gpus)]}}


def _write(path: str, data: dict) -> None:
    """Atomically: the engine's CDI cache refreshes on the dir's events and must never read half a spec."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.rename(tmp, path)


def serve(args: argparse.Namespace) -> int:
    import grpc

    from tests.cri import generate
    from tests.support.kube import Api, ApiError

    gen = pathlib.Path(args.gen)
    dra, dra_rpc = generate(gen, HERE / "dra.proto")
    reg, reg_rpc = generate(gen, HERE / "draregistration.proto")
    api = Api(args.server, pathlib.Path(args.token_file).read_text().strip())
    stop = threading.Event()

    def allocated(claim) -> tuple:
        """The claim's request names, pool and device this driver was allocated for it (from the API server)."""
        obj = api.get(f"{RESOURCE_API}/namespaces/{claim.namespace}/resourceclaims/{claim.name}")
        if obj["metadata"]["uid"] != claim.uid:
            raise ValueError(f"claim {claim.namespace}/{claim.name} is not {claim.uid}")
        results = [r for r in (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results") or [] if r.get("driver") == args.driver]
        if len(results) != 1:
            raise ValueError(f"claim {claim.namespace}/{claim.name}: {len(results)} devices of {args.driver}")
        return [results[0]["request"]], results[0]["pool"], results[0]["device"]

    class Dra(dra_rpc.DRAPluginServicer):
        def NodePrepareResources(self, request, context):
            out = {}
            for c in request.claims:
                try:
                    names, pool, device = allocated(c)
                    # read at each prepare, as a real driver reads its driver root: a driver change shows
                    edits = json.loads(pathlib.Path(args.edits).read_text())
                    _write(spec_path(c.uid), claim_spec(c.uid, device, edits))
                    out[c.uid] = dra.NodePrepareResourceResponse(devices=[dra.Device(
                        request_names=names, pool_name=pool, device_name=device,
                        cdi_device_ids=[cdi_name(c.uid, device)])])
                    print(f"prepare {c.namespace}/{c.name} {cdi_name(c.uid, device)}", flush=True)
                except (ValueError, KeyError, ApiError, OSError) as e:
                    print(f"prepare-error {c.namespace}/{c.name}: {e}", flush=True)
                    out[c.uid] = dra.NodePrepareResourceResponse(error=str(e))
            return dra.NodePrepareResourcesResponse(claims=out)

        def NodeUnprepareResources(self, request, context):
            out = {}
            for c in request.claims:
                try:
                    os.unlink(spec_path(c.uid))
                except FileNotFoundError:
                    pass
                print(f"unprepare {c.namespace}/{c.name}", flush=True)
                out[c.uid] = dra.NodeUnprepareResourceResponse()
            return dra.NodeUnprepareResourcesResponse(claims=out)

    dra_sock = f"{PLUGINS_DIR}/{args.driver}/dra.sock"
    reg_sock = f"{REGISTRY_DIR}/{args.driver}-reg.sock"

    class Registration(reg_rpc.RegistrationServicer):
        def GetInfo(self, request, context):
            return reg.PluginInfo(type="DRAPlugin", name=args.driver, endpoint=dra_sock, supported_versions=[SERVICE])

        def NotifyRegistrationStatus(self, request, context):
            print(f"registration {'ok' if request.plugin_registered else 'failed: ' + request.error}", flush=True)
            return reg.RegistrationStatusResponse()

    # the slice first: the scheduler can allocate as soon as the kubelet may prepare
    sl = resource_slice(args.driver, args.node, args.gpus)
    try:
        api.create(f"{RESOURCE_API}/resourceslices", sl)
    except ApiError as e:
        if e.status != 409:
            raise
    print(f"published ResourceSlice {sl['metadata']['name']}", flush=True)
    servers = []
    for sock, add, servicer in ((dra_sock, dra_rpc.add_DRAPluginServicer_to_server, Dra()),
                                (reg_sock, reg_rpc.add_RegistrationServicer_to_server, Registration())):
        os.makedirs(os.path.dirname(sock), exist_ok=True)
        if os.path.exists(sock):
            os.unlink(sock)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add(servicer, server)
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        servers.append(server)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"serving {args.driver} at {reg_sock}", flush=True)
    stop.wait()
    for server in servers:
        server.stop(grace=1).wait()
    for sock in (reg_sock, dra_sock):
        if os.path.exists(sock):
            os.unlink(sock)
    try:
        api.delete(f"{RESOURCE_API}/resourceslices/{sl['metadata']['name']}")
    except ApiError as e:
        if e.status != 404:
            raise
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tests.support.draplugin")
    ap.add_argument("--driver", default="gpu.nvidia.com")
    ap.add_argument("--node", required=True)
    ap.add_argument("--gpus", type=int, default=1, help="how many GPUs the slice has")
    ap.add_argument("--server", required=True, help="the API server's URL")
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--edits", required=True, help="a JSON file: the CDI containerEdits of the GPU")
    ap.add_argument("--gen", required=True, help="where the gRPC code is generated")
    return serve(ap.parse_args(argv))


class Plugin:
    """The plugin as a process in ``node``'s mount namespace (tests/support/node.py), registered with its kubelet."""

    def __init__(self, node, work: pathlib.Path, edits: dict, driver: str = "gpu.nvidia.com",
                 gpus: int = 1) -> None:
        from tests.support.kube import ADMIN_TOKEN

        work = pathlib.Path(work)
        work.mkdir(parents=True, exist_ok=True)
        self.log, self.edits = work / "draplugin.log", work / "edits.json"
        self.set_edits(edits)
        token = work / "token"
        token.write_text(ADMIN_TOKEN)
        token.chmod(0o600)
        argv = ["nsenter", "-t", str(node.holder.pid), "-m", f"--wd={REPO}", "--", "/usr/bin/python3", "-m",
                "tests.support.draplugin", "--driver", driver, "--gpus", str(gpus), "--node", node.name,
                "--server", node.cluster.url, "--token-file", str(token), "--edits", str(work / "edits.json"), "--gen", str(work / "gen")]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"},
                                         start_new_session=True)
        deadline = time.monotonic() + 90
        while "registration ok" not in self.text():  # the kubelet's plugin watcher found it and took it
            assert self.proc.poll() is None, f"the DRA plugin exited: {self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"the kubelet did not register the DRA plugin: {self.text()[-3000:]}"
            time.sleep(0.1)

    def set_edits(self, edits: dict) -> None:
        """The GPU's CDI edits for the claims prepared from now on (after a driver change: the new driver's)."""
        tmp = self.edits.with_name(".edits.json.tmp")
        tmp.write_text(json.dumps(edits, indent=2))
        os.replace(tmp, self.edits)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def prepared(self) -> list:
        """``(claim, CDI name)`` of every prepare the kubelet asked for."""
        return [tuple(ln.split()[1:3]) for ln in self.text().splitlines() if ln.startswith("prepare ")]

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
