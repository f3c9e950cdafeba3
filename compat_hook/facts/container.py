"""Facts about the container request: the spec's env, annotations and devices.

The opt-outs, documented in the README:

* annotation ``compat-hook/disable: "true"`` or env ``COMPAT_HOOK_DISABLE=1``
  turns the hook off for one container (``explain`` still says what it
  would have done);
* annotation ``compat-hook/dry-run: "true"`` logs the decision and changes
  nothing for one container.

A container *requests a GPU* when ``NVIDIA_VISIBLE_DEVICES`` names devices
(not empty, ``void`` or ``none``), when the spec carries an NVIDIA device node
(``/dev/nvidia[0-9]*``, ``/dev/nvidiactl``, ``/dev/nvgpu``, ``/dev/dri`` does
not count), or when a CDI device annotation names an ``nvidia.com`` device.

>>> r = Request.from_spec({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VERSION=12.4.1"]}})
>>> r.gpu_requested, r.gpu_reason, r.env["CUDA_VERSION"]
(True, 'NVIDIA_VISIBLE_DEVICES=all', '12.4.1')
>>> Request.from_spec({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}}).gpu_requested
False

*Which* GPUs it gets (:meth:`Request.gpu_names`, for the brand and
architecture checks): the CDI devices its ``cdi.k8s.io/*`` annotations name
(``nvidia.com/gpu=0``, ``nvidia.com/gpu=GPU-<uuid>``), else those of
``NVIDIA_VISIBLE_DEVICES`` (indexes, ``GPU-`` UUIDs, MIG UUIDs and
``<gpu>:<mig>`` indexes, CDI names such as ``nvidia.com/gpu=0``), as NVIDIA's
runtime prefers the annotations; with both, the ``/dev/nvidiaN`` device
nodes of the spec, which the runtime creates whatever else is asked.

>>> r = Request.from_spec({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0,GPU-5a1c"]},
...                        "linux": {"devices": [{"path": "/dev/nvidia1"}]}})
>>> r.gpu_names()
[('index', '0', 'NVIDIA_VISIBLE_DEVICES'), ('uuid', 'GPU-5a1c', 'NVIDIA_VISIBLE_DEVICES'), ('minor', '1', 'device /dev/nvidia1')]
"""

from __future__ import annotations

__all__ = ["Request", "parse_gpu_name", "ANNOTATION_DISABLE", "ANNOTATION_DRY_RUN", "ANNOTATION_REQUIRE_CUDA",
           "ENV_DISABLE", "truthy"]

ANNOTATION_DISABLE = "compat-hook/disable"
ANNOTATION_DRY_RUN = "compat-hook/dry-run"
#: The CUDA version the container needs, for host-store injection (``12.8``).
ANNOTATION_REQUIRE_CUDA = "compat-hook/require-cuda"
ENV_DISABLE = "COMPAT_HOOK_DISABLE"

_TRUE = ("1", "true", "yes", "on", "y")

#: compat-hook's own annotations start with this; ``Request.annotations``
#: holds those only.
ANNOTATION_PREFIX = "compat-hook/"
#: A CDI device request (``cdi.k8s.io/<name>: nvidia.com/gpu=0``) makes a GPU request.
CDI_PREFIX = "cdi.k8s.io/"

#: Annotations naming the pod, namespace, container and image, per engine
#: (containerd's CRI, CRI-O): the log line carries them for the operator.
LABEL_ANNOTATIONS = {
    "pod": ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"),
    "namespace": ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"),
    "container_name": ("io.kubernetes.cri.container-name", "io.kubernetes.container.name"),
    "image": ("io.kubernetes.cri.image-name", "io.kubernetes.cri-o.ImageName"),
}
LABEL_PREFIX = "io.kubernetes."

#: The variables a decision reads (``LD_LIBRARY_PATH``: the compat dirs an image
#: points at; ``CONDA_PREFIX``, ``MAMBA_ROOT_PREFIX``: where conda's cuda-compat
#: may be; ``NVIDIA_DRIVER_CAPABILITIES``: whether the CUDA driver is given at
#: all); ``Request.env`` holds these only.
ENV_KEYS = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_REQUIRE_CUDA", "NVIDIA_DISABLE_REQUIRE", "CUDA_VERSION",
            "LD_LIBRARY_PATH", ENV_DISABLE, "CONDA_PREFIX", "MAMBA_ROOT_PREFIX", "NVIDIA_DRIVER_CAPABILITIES",
            "PATH", "PIXI_PROJECT_ROOT")
#: What the runtime wrapper took off ``LD_LIBRARY_PATH`` (its value before), so the hook it
#: adds sees the same candidate dirs (:mod:`compat_hook.policy.assess`).
ANNOTATION_LD_BEFORE = "compat-hook/ld-library-path-before-wrapper"


def _pick_env(items: list, may_hold_nul: bool = True) -> dict:
    """The :data:`ENV_KEYS` of a ``process.env`` list (the last entry wins, as in execve).

    Joined on NUL and searched with ``rfind``: no env string can hold a NUL
    (execve's are NUL-terminated), so a NUL always starts an entry. A
    4000-entry env (the 1 MB config.json benchmark) takes ~0.5 ms this way
    against ~2-3.5 ms for a Python loop over the entries; anything odd (a
    non-string, a NUL inside an entry) takes the loop. ``may_hold_nul=False``
    (the JSON text has no ``\\u0000``) spares counting the NULs (~0.5 ms).
    """
    try:
        blob = "\0".join(["", *items, ""])
    except TypeError:
        blob = None
    env: dict = {}
    if blob is not None and (not may_hold_nul or blob.count("\0") == len(items) + 1):
        for k in ENV_KEYS:
            i = blob.rfind("\0" + k + "=")
            if i >= 0:
                start = i + len(k) + 2
                env[k] = blob[start:blob.index("\0", start)]
        return env
    for item in items:
        if isinstance(item, str):
            k, sep, v = item.partition("=")
            if sep and k in ENV_KEYS:
                env[k] = v
    return env


def truthy(value) -> bool:
    return isinstance(value, str) and value.strip().lower() in _TRUE


def _nvidia_device(path: str) -> bool:
    if path in ("/dev/nvidiactl", "/dev/nvgpu", "/dev/nvidia-uvm"):
        return True
    tail = path[len("/dev/nvidia"):] if path.startswith("/dev/nvidia") else ""
    return bool(tail) and tail.isdigit()


def parse_gpu_name(name: str) -> tuple:
    """``(kind, value)`` of one device name as NVIDIA's runtime takes it.

    ``kind``: ``all``, ``index``, ``uuid`` (``GPU-...``), ``mig`` (a MIG
    device's ``MIG-<uuid>``) or ``unknown``. A MIG device named by its GPU
    (``0:1``, ``MIG-GPU-<uuid>/1/0``) is that GPU. A CDI name
    (``nvidia.com/gpu=0``) is its device name, if the vendor is NVIDIA's.

    >>> [parse_gpu_name(n) for n in ("all", "1", "0:2", "GPU-5a1c", "MIG-GPU-5a1c/1/0", "MIG-77ab")]
    [('all', 'all'), ('index', '1'), ('index', '0'), ('uuid', 'GPU-5a1c'), ('uuid', 'GPU-5a1c'), ('mig', 'MIG-77ab')]
    >>> parse_gpu_name("nvidia.com/gpu=GPU-5a1c"), parse_gpu_name("example.com/dev=0")
    (('uuid', 'GPU-5a1c'), ('unknown', 'example.com/dev=0'))
    """
    n = name.strip()
    kind_part, eq, dev = n.rpartition("=")
    if eq:
        if "nvidia.com/" not in kind_part:
            return "unknown", n
        n = dev.strip()
    low = n.lower()
    if low == "all":
        return "all", "all"
    if n.isdigit():
        return "index", n
    head, colon, tail = n.partition(":")
    if colon and head.isdigit() and tail.isdigit():
        return "index", head
    if low.startswith("mig-gpu-"):
        return "uuid", n[len("MIG-"):].split("/", 1)[0]
    if low.startswith("gpu-"):
        return "uuid", n
    if low.startswith("mig-"):
        return "mig", n
    return "unknown", n


class Request:
    """What the container asks for, from its config.json.

    ``env`` holds the variables of :data:`ENV_KEYS` only, ``annotations``
    those starting with :data:`ANNOTATION_PREFIX`.
    """

    __slots__ = ("env", "annotations", "gpu_requested", "gpu_reason", "disabled", "disabled_reason",
                 "dry_run", "labels", "_spec", "_annotation_sources", "_gpu_names")

    def __init__(self, env: dict, annotations: dict, gpu_requested: bool, gpu_reason: str,
                 disabled: bool = False, disabled_reason: str | None = None, dry_run: bool = False,
                 labels: dict | None = None, spec=None, annotation_sources=()):
        self.env = env
        self.annotations = annotations
        self.gpu_requested = gpu_requested
        self.gpu_reason = gpu_reason
        self.disabled = disabled
        self.disabled_reason = disabled_reason
        self.dry_run = dry_run
        #: ``pod``, ``namespace``, ``container_name``, ``image`` where the annotations name them.
        self.labels = labels or {}
        # Read again only by gpu_names / libcuda_mounts, which the decision asks
        # only once a compat driver could be enabled (a large spec stays unparsed).
        self._spec = spec
        self._annotation_sources = tuple(annotation_sources)
        self._gpu_names = False

    @classmethod
    def from_spec(cls, spec, extra_annotations: dict | None = None,
                  state_annotations: dict | None = None) -> "Request":
        """Build from a parsed config.json (malformed parts count as absent).

        ``spec`` is a dict or a :class:`~compat_hook.core.jsonfast.LazyObject`; of
        the latter, ``annotations``, ``linux`` and ``mounts`` are parsed only
        when their text may hold what is looked for: ``compat-hook/``; and
        when no ``NVIDIA_VISIBLE_DEVICES`` decides, ``/dev/nv`` and
        ``cdi.k8s.io/``.
        """
        from ..core.jsonfast import LazyObject

        lazy = isinstance(spec, LazyObject)
        if not (lazy or isinstance(spec, dict)):
            spec = {}
        process = spec.get("process")
        raw_env = process.get("env") if isinstance(process, dict) else None
        env = (_pick_env(raw_env, not lazy or spec.may_contain("process", "\0"))
               if isinstance(raw_env, list) else {})
        # A large spec's annotations member is parsed only if its text may
        # hold a name a decision reads (LazyObject.may_contain); the CDI
        # names only matter when nothing before them found a GPU request.
        sources = [extra_annotations, state_annotations, None]

        def annotations_with(prefix: str) -> dict:
            if sources[2] is None and (not lazy or spec.may_contain("annotations", prefix)):
                sources[2] = spec.get("annotations")
            out: dict = {}
            for source in sources:
                if isinstance(source, dict):
                    out.update({k: v for k, v in source.items()
                                if isinstance(k, str) and isinstance(v, str) and k.startswith(prefix)})
            return out

        annotations = annotations_with(ANNOTATION_PREFIX)

        gpu, why = False, "no NVIDIA_VISIBLE_DEVICES, NVIDIA device or CDI device"
        nvd = env.get("NVIDIA_VISIBLE_DEVICES")
        if nvd is not None and nvd.strip().lower() not in ("", "void", "none"):
            gpu, why = True, f"NVIDIA_VISIBLE_DEVICES={nvd}"
        # Every path _nvidia_device accepts starts with this; a member whose
        # text cannot hold it needs no parse (a 1 MB spec is mostly mounts).
        needle = "/dev/nv"
        if not gpu and (not lazy or spec.may_contain("linux", needle)):
            linux = spec.get("linux")
            devices = linux.get("devices") if isinstance(linux, dict) else None
            for d in devices if isinstance(devices, list) else ():
                p = d.get("path") if isinstance(d, dict) else None
                if isinstance(p, str) and _nvidia_device(p):
                    gpu, why = True, f"device {p}"
                    break
        if not gpu and (not lazy or spec.may_contain("mounts", needle)):
            mounts = spec.get("mounts")
            for m in mounts if isinstance(mounts, list) else ():
                p = m.get("destination") if isinstance(m, dict) else None
                if isinstance(p, str) and _nvidia_device(p):
                    gpu, why = True, f"device mount {p}"
                    break
        if not gpu:
            for k, v in annotations_with(CDI_PREFIX).items():
                if "nvidia.com/" in v:
                    gpu, why = True, f"CDI annotation {k}"
                    break

        disabled, dreason = False, None
        if truthy(annotations.get(ANNOTATION_DISABLE)):
            disabled, dreason = True, f"annotation {ANNOTATION_DISABLE}"
        elif truthy(env.get(ENV_DISABLE)):
            disabled, dreason = True, f"env {ENV_DISABLE}"
        dry = truthy(annotations.get(ANNOTATION_DRY_RUN))
        labels = {}
        # Parsed only when the text names one of them: a 1 MB spec's tail is
        # searched once for the prefix (most annotations are not these).
        k8s = None
        if not lazy or (spec.may_contain("annotations", LABEL_PREFIX) and any(
                spec.may_contain("annotations", n) for names in LABEL_ANNOTATIONS.values() for n in names)):
            k8s = annotations_with(LABEL_PREFIX)
        if k8s:
            for field, names in LABEL_ANNOTATIONS.items():
                for n in names:
                    if k8s.get(n):
                        labels[field] = k8s[n]
                        break
        return cls(env, annotations, gpu, why, disabled, dreason, dry, labels, spec,
                   (extra_annotations, state_annotations))

    def _member(self, key: str, needle: str):
        """A member of the spec, parsed only if its text may hold ``needle``."""
        from ..core.jsonfast import LazyObject

        spec = self._spec
        if isinstance(spec, LazyObject):
            if not spec.may_contain(key, needle):
                return None
        elif not isinstance(spec, dict):
            return None
        try:
            return spec.get(key)
        except ValueError:  # a member past the hook's early stop that is not JSON
            return None

    @property
    def cwd(self):
        """The process's working dir (``process.cwd``), or ``None``: where a pixi project lives."""
        p = self._spec.get("process") if self._spec is not None else None
        c = p.get("cwd") if isinstance(p, dict) else None
        return c if isinstance(c, str) and c.startswith("/") else None

    @property
    def exe(self):
        """The process's program as the spec names it (``process.args[0]``), or ``None``."""
        p = self._spec.get("process") if self._spec is not None else None
        a = p.get("args") if isinstance(p, dict) else None
        return a[0] if isinstance(a, list) and a and isinstance(a[0], str) and a[0] else None

    def ld_before_wrapper(self) -> list:
        """The ``LD_LIBRARY_PATH`` entries the runtime wrapper took off (its annotation), or ``[]``."""
        v = self.annotations.get(ANNOTATION_LD_BEFORE)
        return [e for e in v.split(":") if e.startswith("/")][:64] if isinstance(v, str) else []

    def gpu_names(self):
        """The GPUs the container is given, as ``[(kind, value, source)]``, or ``None`` (none named).

        ``kind`` as :func:`parse_gpu_name`, plus ``minor`` for a
        ``/dev/nvidiaN`` device node. See the module docstring for the order.
        """
        if self._gpu_names is not False:
            return self._gpu_names
        names: list = []
        cdi: list = []
        merged: dict = {}  # the runtime's state repeats the spec's annotations: one key, one value
        for source in (*self._annotation_sources, self._member("annotations", CDI_PREFIX)):
            if isinstance(source, dict):
                merged.update({k: v for k, v in source.items()
                               if isinstance(k, str) and isinstance(v, str) and k.startswith(CDI_PREFIX)})
        for k, v in merged.items():
            for item in v.split(","):
                if "nvidia.com/" in item:
                    cdi.append((*parse_gpu_name(item), f"CDI annotation {k}"))
        if cdi:
            names.extend(cdi)
        else:
            nvd = self.env.get("NVIDIA_VISIBLE_DEVICES")
            if nvd is not None and nvd.strip().lower() not in ("", "void", "none"):
                for item in nvd.split(","):
                    if item.strip():
                        names.append((*parse_gpu_name(item), "NVIDIA_VISIBLE_DEVICES"))
        linux = self._member("linux", "/dev/nvidia")
        devices = linux.get("devices") if isinstance(linux, dict) else None
        for d in devices if isinstance(devices, list) else ():
            p = d.get("path") if isinstance(d, dict) else None
            if isinstance(p, str) and p.startswith("/dev/nvidia") and p[len("/dev/nvidia"):].isdigit():
                names.append(("minor", str(int(p[len("/dev/nvidia"):])), f"device {p}"))
        self._gpu_names = names or None
        return self._gpu_names

    def _bind_mounts(self, needle: str) -> list:
        """``[(destination, source)]`` of the spec's bind mounts (``type: bind`` or a ``bind``/``rbind``
        option) to an absolute destination, the mounts member parsed only if it may hold ``needle``."""
        mounts = self._member("mounts", needle)
        out = []
        for m in mounts if isinstance(mounts, list) else ():
            if not isinstance(m, dict):
                continue
            dest, opts = m.get("destination"), m.get("options")
            bind = m.get("type") == "bind" or (isinstance(opts, list) and ("bind" in opts or "rbind" in opts))
            if bind and isinstance(dest, str) and dest.startswith("/"):
                out.append((dest, m.get("source")))
        return out

    def libcuda_mounts(self) -> list:
        """Container paths the spec bind-mounts a ``libcuda.so.*`` file at (a hand-written runtime
        config, a CDI spec, a device plugin): where the host driver's library is, whatever its name.

        >>> Request.from_spec({"mounts": [{"destination": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        ...     "source": "/usr/lib/x86_64-linux-gnu/libcuda.so.555.58.02", "type": "bind"}]}).libcuda_mounts()
        ['/usr/lib/x86_64-linux-gnu/libcuda.so.1']
        """
        return [d for d, _ in self._bind_mounts("libcuda.so.") if d.rsplit("/", 1)[-1].startswith("libcuda.so.")]

    def bind_destinations(self) -> list:
        """Container paths the spec bind-mounts something at (a device plugin's driver dir, GKE's
        ``/usr/local/nvidia``): what the runtime fills at the start, empty when the image is read.

        >>> Request.from_spec({"mounts": [{"destination": "/usr/local/nvidia", "source": "/home/kubernetes/bin/nvidia",
        ...     "type": "bind"}, {"destination": "/proc", "type": "proc", "source": "proc"}]}).bind_destinations()
        ['/usr/local/nvidia']
        """
        return [d for d, _ in self._bind_mounts("bind")]

    def file_binds(self, prefixes=("libcuda.so.", "libnvidia-")) -> dict:
        """``{destination: source}`` of the spec's bind mounts of a file named with one of ``prefixes``
        (a CDI spec's host library, the runtime wrapper's own host library over a compat file).

        >>> Request.from_spec({"mounts": [{"destination": "/usr/local/cuda/compat/libcuda.so.550.163.01",
        ...     "source": "/usr/lib/x86_64-linux-gnu/libcuda.so.555.58.02", "type": "bind"}]}).file_binds()
        {'/usr/local/cuda/compat/libcuda.so.550.163.01': '/usr/lib/x86_64-linux-gnu/libcuda.so.555.58.02'}
        """
        out: dict = {}
        for needle in prefixes:
            for dest, src in self._bind_mounts(needle):
                if isinstance(src, str) and dest.rsplit("/", 1)[-1].startswith(needle):
                    out[dest] = src
        return out

    def compute(self) -> tuple:
        """``(gets_the_cuda_driver, why)`` by ``NVIDIA_DRIVER_CAPABILITIES``, as NVIDIA's runtime reads it.

        Unset or empty means NVIDIA's default, ``utility,compute``; ``all`` or
        a list naming ``compute`` gives libcuda; any other list (``utility``,
        ``graphics,display``) does not: the runtime injects no libcuda then.
        A spec that bind-mounts a ``libcuda.so.*`` itself (a CDI spec, a
        device plugin) gives it whatever the variable says.

        >>> Request.from_spec({"process": {"env": ["NVIDIA_DRIVER_CAPABILITIES=utility"]}}).compute()
        (False, 'NVIDIA_DRIVER_CAPABILITIES=utility names neither compute nor all')
        >>> Request.from_spec({"process": {"env": ["NVIDIA_DRIVER_CAPABILITIES=compute,utility"]}}).compute()[0]
        True
        """
        caps = self.env.get("NVIDIA_DRIVER_CAPABILITIES")
        if caps is None or not caps.strip():
            return True, "NVIDIA_DRIVER_CAPABILITIES unset or empty: NVIDIA's default utility,compute"
        names = {c.strip().lower() for c in caps.split(",")}
        if names & {"compute", "all"}:
            return True, f"NVIDIA_DRIVER_CAPABILITIES={caps}"
        mounts = self.libcuda_mounts()
        if mounts:
            return True, f"the spec mounts {mounts[0]} whatever NVIDIA_DRIVER_CAPABILITIES={caps} says"
        return False, f"NVIDIA_DRIVER_CAPABILITIES={caps} names neither compute nor all"

    @classmethod
    def assume_gpu(cls) -> "Request":
        """The request ``explain --rootfs`` assumes: a GPU container, no env."""
        return cls({}, {}, True, "assumed (--rootfs)")

    def required_cuda(self):
        """``(version, source)`` the image says it needs, or ``(None, None)``.

        From the annotation, else ``NVIDIA_REQUIRE_CUDA``'s ``cuda>=X.Y``
        (ignored when ``NVIDIA_DISABLE_REQUIRE`` is set, as NVIDIA's runtime
        does), else ``CUDA_VERSION`` (major.minor).
        """
        from ..core.versions import try_parse_version

        a = self.annotations.get(ANNOTATION_REQUIRE_CUDA)
        if a:
            v = try_parse_version(a)
            if v is not None:
                return (v[0], v[1], 0), f"annotation {ANNOTATION_REQUIRE_CUDA}"
        req = self.env.get("NVIDIA_REQUIRE_CUDA")
        if req and not truthy(self.env.get("NVIDIA_DISABLE_REQUIRE")):
            for tok in req.replace(",", " ").split():
                if tok.startswith("cuda>="):
                    v = try_parse_version(tok[len("cuda>="):])
                    if v is not None:
                        return (v[0], v[1], 0), "NVIDIA_REQUIRE_CUDA"
        cv = self.env.get("CUDA_VERSION")
        if cv:
            v = try_parse_version(cv)
            if v is not None:
                return (v[0], v[1], 0), "CUDA_VERSION"
        return None, None

    def to_dict(self) -> dict:
        need, src = self.required_cuda()
        return {"gpu_requested": self.gpu_requested, "gpu_reason": self.gpu_reason,
                "disabled": self.disabled, "disabled_reason": self.disabled_reason,
                "dry_run": self.dry_run,
                "required_cuda": f"{need[0]}.{need[1]}" if need else None,
                "required_cuda_source": src,
                "gpus_named": ([f"{v} ({source})" for _, v, source in self.gpu_names() or ()]
                               if self.gpu_requested else []),
                "compute": self.compute()[1] if self.gpu_requested else None,
                "CUDA_VERSION": self.env.get("CUDA_VERSION"),
                "NVIDIA_REQUIRE_CUDA": self.env.get("NVIDIA_REQUIRE_CUDA")}
