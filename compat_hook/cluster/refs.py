"""Image references: the images of this node's GPU pods, and which of them are in the node's store.

Pod specs come from the API server and are untrusted input: pods, images and
reference lengths are bounded, and a dropped entry is counted, never silently lost.

>>> normalize_ref("cuda-app"), normalize_ref("nvcr.io/nvidia/cuda:12.4.1-base")
('docker.io/library/cuda-app:latest', 'nvcr.io/nvidia/cuda:12.4.1-base')
>>> normalize_ref("localhost:5000/x@sha256:" + "a" * 64)[:30]
'localhost:5000/x@sha256:aaaaaa'
"""

from __future__ import annotations

import os

__all__ = ["normalize_ref", "gpu_pod", "pod_images", "store_index", "MAX_IMAGES", "MAX_REF"]

MAX_IMAGES = 256
MAX_REF = 512
MAX_PODS = 1000
_GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")


def normalize_ref(ref: str) -> str:
    """The fully qualified form containerd and the kubelet use (``docker.io/library/...:latest``)."""
    r = ref.strip()
    name, _, digest = r.partition("@")
    first, _, rest = name.partition("/")
    if not rest:
        name = "docker.io/library/" + name
    elif "." not in first and ":" not in first and first != "localhost":
        name = "docker.io/" + name
    if ":" not in name.rsplit("/", 1)[-1] and not digest:
        name += ":latest"
    return name + ("@" + digest if digest else "")


def _containers(pod: dict) -> list:
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    out = []
    for key in ("initContainers", "containers"):
        cs = spec.get(key)
        if isinstance(cs, list):
            out.extend(c for c in cs if isinstance(c, dict))
    return out


def gpu_pod(pod: dict) -> bool:
    """A pod that asks for an NVIDIA GPU: a ``nvidia.com/gpu*`` or ``nvidia.com/mig-*`` resource, or
    ``NVIDIA_VISIBLE_DEVICES`` in a container's env (what compat-hook's hook acts on)."""
    for c in _containers(pod):
        res = c.get("resources") if isinstance(c.get("resources"), dict) else {}
        for part in ("limits", "requests"):
            m = res.get(part)
            if isinstance(m, dict) and any(isinstance(k, str) and k.startswith(_GPU_RESOURCES) for k in m):
                return True
        env = c.get("env")
        if isinstance(env, list) and any(isinstance(e, dict) and e.get("name") == "NVIDIA_VISIBLE_DEVICES"
                                         and e.get("value") not in (None, "", "void", "none") for e in env):
            return True
    return False


def pod_images(pods: list) -> tuple:
    """``({normalized image: [pod names]}, dropped)`` for the running or pending GPU pods in ``pods``."""
    images: dict = {}
    dropped = 0
    for pod in pods[:MAX_PODS]:
        if not isinstance(pod, dict) or not gpu_pod(pod):
            continue
        st = pod.get("status") if isinstance(pod.get("status"), dict) else {}
        if st.get("phase") in ("Succeeded", "Failed"):
            continue
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
        who = f"{str(meta.get('namespace'))[:63]}/{str(meta.get('name'))[:253]}"
        for c in _containers(pod):
            img = c.get("image")
            if not isinstance(img, str) or not img or len(img) > MAX_REF or not img.isprintable() or " " in img:
                dropped += 1
                continue
            key = normalize_ref(img)
            if key not in images and len(images) >= MAX_IMAGES:
                dropped += 1
                continue
            names = images.setdefault(key, [])
            if len(names) < 5 and who not in names:
                names.append(who)
    dropped += max(0, len(pods) - MAX_PODS)
    return images, dropped


def _oci_names(path: str) -> list:
    """The ``org.opencontainers.image.ref.name`` of each image in an OCI layout's index.json."""
    import json

    try:
        fd = os.open(os.path.join(path, "index.json"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            data = f.read(1 << 20)
        doc = json.loads(data.decode())
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    ms = doc.get("manifests") if isinstance(doc, dict) and isinstance(doc.get("manifests"), list) else []
    names = []
    for m in ms:
        a = m.get("annotations") if isinstance(m, dict) and isinstance(m.get("annotations"), dict) else {}
        n = a.get("org.opencontainers.image.ref.name")
        if isinstance(n, str):
            names.append(n)
    return names


def _names(store: str, source: str) -> list:
    """The references ``source`` (one image, from expanding ``store``) is known by."""
    if source.startswith("containerd:"):
        return [source[len("containerd:"):]]
    if source != store and source.startswith(store + ":"):
        return [source[len(store) + 1:]]
    if source.startswith("oci:"):
        return _oci_names(source[len("oci:"):])
    return []


def store_index(stores: list, expander) -> tuple:
    """``({normalized reference: plan source}, [problems])`` for every image in ``stores``."""
    from ..core.errors import describe

    index: dict = {}
    problems = []
    for store in stores:
        try:
            sources = expander(store)
        except Exception as e:  # a store that cannot be listed: said, and the pass goes on
            problems.append(f"{store}: {describe(e)[1]}")
            continue
        for src in sources:
            for n in _names(store, src):
                key = normalize_ref(n)
                index.setdefault(key, src)
                digest = key.partition("@")[2]
                if digest:
                    index.setdefault("@" + digest, src)
    return index, problems


def match(images: dict, index: dict) -> tuple:
    """``({plan source: [image refs]}, [images not in the store])``."""
    found: dict = {}
    missing = []
    for img in sorted(images):
        src = index.get(img)
        if src is None and "@" in img:
            src = index.get("@" + img.partition("@")[2])
        if src is None:
            missing.append(img)
        else:
            found.setdefault(src, []).append(img)
    return found, missing
