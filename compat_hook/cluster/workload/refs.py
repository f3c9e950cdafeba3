"""Image references: the images of this node's GPU pods, and which of them are in the node's store.

:func:`store_index` maps every name an image in the node's stores is known by
to the ``plan`` source that reads it: containerd's every tag and digest of an
image, an OCI layout's or archive's ``io.containerd.image.name`` and
``org.opencontainers.image.ref.name``, a docker-archive's ``RepoTags``, the
engines' names. A store that names no image by a reference a pod could use (a
directory; an archive whose images carry a bare tag) is refused in one line, and
one that cannot be listed makes the index incomplete (``reachable`` False).

Pod specs come from the API server and are untrusted input: pods, images and
reference lengths are bounded, and a dropped entry is counted, never silently lost.

>>> normalize_ref("cuda-app"), normalize_ref("nvcr.io/nvidia/cuda:12.4.1-base")
('docker.io/library/cuda-app:latest', 'nvcr.io/nvidia/cuda:12.4.1-base')
>>> normalize_ref("localhost:5000/x@sha256:" + "a" * 64)[:30]
'localhost:5000/x@sha256:aaaaaa'
"""

from __future__ import annotations

__all__ = ["normalize_ref", "gpu_pod", "pod_images", "store_index", "match", "MAX_IMAGES", "MAX_REF"]

MAX_IMAGES = 256
MAX_REF = 512
MAX_PODS = 1000


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


def gpu_pod(pod: dict, claims=None) -> bool:
    """A pod with a container (init containers too) that asks for an NVIDIA GPU, by the one model
    (:func:`.runs.gpu_reason`: a ``nvidia.com/gpu*`` or ``nvidia.com/mig-*`` resource, a resource claim
    (DRA), NVIDIA's pod annotation naming the container, a CDI annotation (``cdi.k8s.io/*``) naming an
    NVIDIA device, or ``NVIDIA_VISIBLE_DEVICES`` in its env).

    >>> claim = {"spec": {"containers": [{"resources": {"claims": [{"name": "gpu"}]}}]}}
    >>> cdi = {"metadata": {"annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}}, "spec": {"containers": [{}]}}
    >>> gpu_pod(claim), gpu_pod(cdi), gpu_pod({"spec": {"containers": [{"resources": {"claims": []}}]}})
    (True, True, False)
    >>> gpu_pod({"metadata": {"annotations": {"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=all"}},
    ...          "spec": {"containers": [{"name": "app"}]}})
    True
    """
    from .runs import gpu_reason

    return any(gpu_reason(pod, c, claims=claims) is not None for c in _containers(pod))


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


#: Images of one layout, archive or store read for their names at most.
MAX_INDEX = 10000
_REF_NAME = "org.opencontainers.image.ref.name"
_CTR_IMAGE_NAME = "io.containerd.image.name"


def _matchable(name) -> str | None:
    """A reference a pod can name (normalized), or None for a bare tag (``1.0``, ``latest``): an OCI
    ``ref.name`` is often only the tag, which names no repository.

    >>> _matchable("registry.test/apps/a:1"), _matchable("latest"), _matchable("busybox:1.36")
    ('registry.test/apps/a:1', None, 'docker.io/library/busybox:1.36')
    """
    if not isinstance(name, str) or not name or len(name) > MAX_REF or not name.isprintable() or " " in name:
        return None
    if "/" not in name and ":" not in name and "@" not in name:
        return None
    return normalize_ref(name)


def _oci_entries(index: dict) -> list:
    """Per image of an index.json: its names (containerd's full name first, then ref.name)."""
    ms = index.get("manifests") if isinstance(index, dict) and isinstance(index.get("manifests"), list) else []
    out = []
    for m in ms[:MAX_INDEX]:
        a = m.get("annotations") if isinstance(m, dict) and isinstance(m.get("annotations"), dict) else {}
        out.append([str(a[k]) for k in (_CTR_IMAGE_NAME, _REF_NAME) if isinstance(a.get(k), str)])
    return out


def _archive_entries(kind: str, path: str) -> list:
    """The names of each image of an ``oci:`` layout or an ``oci-archive:``/``docker-archive:`` file."""
    from ...images import stores as st
    from ...images.reader import Limits

    lim = Limits()
    if kind == "oci":
        store = st.OciDir(path, lim)
    elif kind == "oci-archive":
        store = st.OciArchive(path, lim)
    else:
        store = st.DockerArchive(path, lim)
    try:
        if kind == "docker-archive":
            return [[t for t in (e.get("RepoTags") if isinstance(e.get("RepoTags"), list) else [])
                     if isinstance(t, str)] for e in store.manifest()[:MAX_INDEX]]
        return _oci_entries(store.index())
    finally:
        store.close()


def _pick(entries: list, sel: str) -> list:
    """The names of the entry selector ``sel`` (``@N``, a tag or a name) picks."""
    if sel.startswith("@") and sel[1:].isdigit():
        i = int(sel[1:])
        return entries[i] if i < len(entries) else []
    for names in entries:
        if any(n == sel or n.endswith(":" + sel) for n in names):
            return names
    return [sel]


def _containerd(store: str, address, namespace: str, host_root: str) -> tuple:
    """``({normalized reference: source}, listed)`` of every name of every image in containerd: a pod
    may name any tag or digest of an image (``expand`` keeps one per image)."""
    from ...images import stores as st
    from ...images.reader import Limits

    sel = store[len("containerd:"):]
    if sel:
        return {normalize_ref(sel): store}, 1
    addr, _ = st.find_socket(address, host_root or "/")
    c = st.Containerd(addr, namespace, Limits())
    best: dict = {}
    pairs = c.images()[:MAX_INDEX * 4]
    for ref, digest in pairs:
        rank = 2 if ref.startswith("sha256:") else 1 if "@" in ref else 0
        if digest not in best or rank < best[digest][0]:
            best[digest] = (rank, ref)
    out: dict = {}
    for ref, digest in pairs:
        if ref.startswith("sha256:") or digest not in best:
            continue
        out.setdefault(normalize_ref(ref), f"containerd:{best[digest][1]}")
    return out, len(best)


def _names_of(store: str, expander) -> tuple:
    """``([(source, [names])], problem or None)`` for a store that is not containerd's."""
    kind = store.split(":", 1)[0] if ":" in store else ""
    if kind in ("oci", "oci-archive", "docker-archive"):
        from ...images.reader import split_source

        path, sel = split_source(kind, store[len(kind) + 1:])
        entries = _archive_entries(kind, path)
        if sel is not None:
            return [(store, _pick(entries, sel))], None
        sources = expander(store)
        if len(sources) == len(entries):
            return list(zip(sources, entries)), None
        return [(sources[0], [n for names in entries for n in names])] if sources else [], None
    if kind in ("docker", "containers-storage"):
        out = []
        for src in expander(store):
            ref = src.split("]", 1)[1] if src.startswith("containers-storage:[") else src.split(":", 1)[1]
            out.append((src, [ref]))
        return out, None
    return [], (f"{store}: a directory names no image reference, so the pods' images cannot be matched "
                f"to it (use an image store: containerd:, oci:, oci-archive:, docker-archive:)")


def store_index(stores: list, expander, *, address=None, namespace: str = "k8s.io", host_root: str = "/") -> tuple:
    """``({normalized reference: plan source}, [problems], reachable)`` for every image in ``stores``.

    ``reachable`` is False when a store could not be listed (containerd down, a missing archive): the
    pass then cannot know what is in the node's store. A store that can be read but names no image a
    pod can name (a directory, an archive tagged by tag alone) is refused with one line.
    """
    from ...core.errors import describe

    index: dict = {}
    problems = []
    reachable = True
    for store in stores:
        try:
            if store.startswith("containerd:"):
                found, _ = _containerd(store, address, namespace, host_root)
                for k, v in found.items():
                    index.setdefault(k, v)
                continue
            pairs, problem = _names_of(store, expander)
        except Exception as e:  # a store that cannot be listed: said, and the pass knows it is incomplete
            problems.append(f"{store}: {describe(e)[1]}")
            reachable = False
            continue
        if problem:
            problems.append(problem)
            continue
        named = 0
        for src, names in pairs:
            for n in names:
                key = _matchable(n)
                if key is None:
                    continue
                named += 1
                index.setdefault(key, src)
                digest = key.partition("@")[2]
                if digest:
                    index.setdefault("@" + digest, src)
        if pairs and not named:
            problems.append(f"{store}: no image in it is named by a full reference (registry/repository:tag), "
                            f"only by tags, so the pods' images cannot be matched to it")
    return index, problems, reachable


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
