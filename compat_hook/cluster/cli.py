"""``compat-hook cluster agent|status|release|fleet``: the command lines (parsed here, so the main CLI stays small).

Exit statuses:

* ``cluster agent --once``: 0 published, 1 the API server failed or denied the pass
  (without ``--once`` the agent never exits on an API error: it retries with backoff);
* ``cluster status``: 0 every GPU node passes, 2 some node changes outcome or has no
  valid verdict (none, unknown, stale), 3 some node would regress (each such node held),
  5 some node would regress and nothing holds it, 1 an error (no cluster, denied, a bad config);
* ``cluster status`` and ``cluster release --node NAME``: 4 nothing to report on (no GPU node
  matched, the selector's typo included; no node of that name);
* ``cluster release``: 0 done, 1 an API error;
* ``cluster fleet``: runs until SIGTERM or SIGINT (0, its Lease released); 1 no credentials.

Credentials: in a pod its service account, else the kubeconfig files merged by kubectl's rules
(:mod:`.kubeconfig`); ``--context`` picks a context. ``status`` and ``release`` name the API
server they talked to on stderr (``status --json``: also its ``server`` key).

Bad usage is 2 everywhere; every error is one line on stderr.

>>> _dns_subdomain("gpu-a.example"), _dns_subdomain("../x"), _dns_subdomain("A")
(True, False, False)
"""

from __future__ import annotations

import sys

__all__ = ["main"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOTHING = 0, 1, 2, 4
KUBECONFIG_HELP = "default: the pod's service account, else $KUBECONFIG (merged as kubectl does), else ~/.kube/config"
CONTEXT_HELP = "the kubeconfig context to use (default: its current-context)"


def _parser():
    from ..core.argparser import Parser

    p = Parser(prog="compat-hook cluster", description="The upgrade preflight, published on the cluster.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    a = sub.add_parser("agent", help="the node agent: publish this node's preflight, hold its upgrade when gated")
    a.add_argument("--node", required=True, metavar="NAME", help="this node's name (the downward API's spec.nodeName)")
    a.add_argument("--once", action="store_true", help="one pass, then exit (0 published, 1 an API error)")
    a.add_argument("--interval", type=float, default=300.0, metavar="SECONDS",
                   help="seconds between passes (default 300, jittered; a change that matters starts one sooner)")
    a.add_argument("--no-watch", action="store_true",
                   help="poll only (read everything at each pass); do not watch the Node, pods and GPU Operator objects")
    a.add_argument("--kubeconfig", metavar="PATH", help=KUBECONFIG_HELP)
    a.add_argument("--context", metavar="NAME", help=CONTEXT_HELP)
    a.add_argument("--store", action="append", metavar="SOURCE", default=[],
                   help="where the node's images are: containerd: (default, every image), oci:DIR, oci-archive:FILE, "
                        "docker-archive:FILE, docker:, containers-storage:; repeatable")
    a.add_argument("--address", metavar="SOCKET", help="containerd's socket for containerd: sources")
    a.add_argument("--namespace", metavar="NS", default="k8s.io", help="containerd namespace (default k8s.io)")
    a.add_argument("--driver", metavar="VERSION", help="the target driver (default: the NVIDIADriver or ClusterPolicy)")
    a.add_argument("--host-root", metavar="DIR", help="read host facts under DIR (default: the config's host_root)")
    a.add_argument("--state-dir", metavar="DIR", default=None,
                   help="where the last result and workloads.json are kept (default /var/lib/compat-hook)")
    a.add_argument("--config", metavar="FILE",
                   help="compat-hook's config (its cluster: settings: gate, prefix ...), read again at every pass")
    a.add_argument("--publish-namespace", metavar="NS",
                   help="the namespace of the agent's Lease, ConfigMap and Events (default: the pod's own, else "
                        "compat-hook)")
    a.add_argument("--registration-file", metavar="FILE",
                   help="the chart's installer's registration path (nri, nri-not-connected, runtimeclass), "
                        "published as the label <prefix>/registration")
    sub.add_parser("validate", add_help=False, help="after a driver change, prove this node's workloads (docs/validation.md)")
    s = sub.add_parser("status", help="every GPU node: driver, target, upgrade state, preflight, hold, validation")
    s.add_argument("--kubeconfig", metavar="PATH", help=KUBECONFIG_HELP)
    s.add_argument("--context", metavar="NAME", help=CONTEXT_HELP)
    s.add_argument("--config", metavar="FILE", help="for cluster.label_prefix")
    s.add_argument("--publish-namespace", metavar="NS", default="compat-hook",
                   help="the agents' namespace, where their Leases are (default compat-hook)")
    s.add_argument("-l", "--selector", metavar="SELECTOR",
                   help="only the nodes this label selector selects (a node pool: -l pool=a)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    f = sub.add_parser("fleet", help="the leader-elected controller that says which driver versions the fleet has "
                                     "judged (the driver-version admission policy's parameter)")
    f.add_argument("--namespace", metavar="NS", default="compat-hook",
                   help="the release namespace: the agents' Leases, and the fleet's Lease and ConfigMap "
                        "(compat-hook-fleet) (default compat-hook)")
    f.add_argument("--identity", metavar="ID",
                   help="this replica's name in the Lease (default: $POD_NAME, else the host name and pid)")
    f.add_argument("--lease-seconds", type=int, default=15, metavar="S",
                   help="the leader's Lease: a standby takes over after S seconds without a renewal (default 15)")
    f.add_argument("--resync", type=float, default=5.0, metavar="S",
                   help="seconds between reconciles without a change (Leases expire without one; default 5)")
    f.add_argument("--kubeconfig", metavar="PATH", help=KUBECONFIG_HELP)
    f.add_argument("--context", metavar="NAME", help=CONTEXT_HELP)
    f.add_argument("--config", metavar="FILE", help="for cluster.label_prefix")
    r = sub.add_parser("release", help="remove compat-hook's upgrade holds (skip label and holds-upgrade annotation)")
    who = r.add_mutually_exclusive_group(required=True)
    who.add_argument("--node", metavar="NAME", help="this node only")
    who.add_argument("--all", action="store_true", help="every node")
    r.add_argument("--kubeconfig", metavar="PATH", help=KUBECONFIG_HELP)
    r.add_argument("--context", metavar="NAME", help=CONTEXT_HELP)
    r.add_argument("--config", metavar="FILE", help="for cluster.label_prefix")
    r.add_argument("--prefix", action="append", default=[], metavar="P",
                   help="also release holds published under this label prefix (a former cluster.label_prefix); "
                        "repeatable")
    r.add_argument("--purge", action="store_true",
                   help="with --all: remove everything compat-hook wrote, not only the holds: every label and "
                        "annotation under the prefixes on every Node, and the agents' Leases and ConfigMaps in "
                        "--publish-namespace (what helm uninstall runs)")
    r.add_argument("--publish-namespace", metavar="NS", default="compat-hook",
                   help="the agents' namespace, for --purge (default compat-hook)")
    return p


def _config(path, host_root=None):
    import os

    from ..core import config as _config

    cfg = _config.load(path)
    if host_root is not None:
        if not os.path.isdir(host_root):
            from ..core.errors import UsageError

            raise UsageError(f"--host-root {host_root}: no such directory")
        cfg = cfg.replace(host_root=host_root)
    return cfg


def main(argv: list) -> int:
    from ..core.errors import CompatHookError

    if argv[:1] == ["validate"]:  # its own arguments: compat_hook/cluster/node/validate.py
        from .node.validate import main as validate
        return validate(argv[1:], load_config=_config, node_name_ok=_dns_subdomain)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    if args.command is None:
        _parser().print_help()
        return EXIT_USAGE
    try:
        return {"agent": _agent, "status": _status, "release": _release, "fleet": _fleet}[args.command](args)
    except CompatHookError as e:
        sys.stderr.write(f"compat-hook cluster {args.command}: {e}\n")
        return EXIT_USAGE if e.code in ("usage", "bad_config") else EXIT_ERROR


def _agent(args) -> int:
    from ..core.config import DEFAULT_STATE_DIR
    from ..core.errors import UsageError
    from .node import agent
    from .api import kube

    if args.interval < 1:
        raise UsageError("--interval: at least 1 second")
    if not _dns_subdomain(args.node):
        raise UsageError(f"--node: not a node name (a DNS subdomain), got {args.node[:80]!r}")
    if args.publish_namespace is not None and not _dns_label(args.publish_namespace):
        raise UsageError(f"--publish-namespace: not a namespace name, got {args.publish_namespace[:80]!r}")
    for src in args.store:
        _check_store(src)
    cfg = _config(args.config, args.host_root)
    opts = agent.AgentOptions(args.node, stores=args.store or ["containerd:"], address=args.address,
                              namespace=args.namespace, driver=args.driver,
                              state_dir=args.state_dir or DEFAULT_STATE_DIR, interval=args.interval,
                              once=args.once, watch=not args.no_watch, publish_namespace=args.publish_namespace,
                              registration_file=args.registration_file)
    if args.driver is not None:
        from ..policy.outcome import check_driver

        opts.driver = check_driver(args.driver, "--driver")
    first = [cfg]

    def load():  # the file again at every pass (a changed ConfigMap takes effect without a restart)
        if first:
            return first.pop()
        return _config(args.config, args.host_root)

    return agent.run(lambda: kube.connect(args.kubeconfig, args.context), load, opts)


def _check_store(src: str) -> None:
    """A ``--store`` the agent can use, checked at its start (a pod that cannot read its images fails to
    start, instead of publishing an incomplete pass, and so never a hold, every interval).

    >>> _check_store("containerd:"), _check_store("/")
    (None, None)
    >>> _check_store("bogus:x")
    Traceback (most recent call last):
    ...
    compat_hook.core.errors.UsageError: --store bogus:x: not an image source (containerd:, oci:DIR, oci-archive:FILE, docker-archive:FILE, docker:, containers-storage:, or a directory)
    """
    import os

    from ..core.errors import UsageError
    from ..images.reader import TRANSPORTS

    kinds = ", ".join(("containerd:", "oci:DIR", "oci-archive:FILE", "docker-archive:FILE", "docker:",
                       "containers-storage:"))
    if not src.startswith(TRANSPORTS):
        if os.path.isdir(src):
            return
        raise UsageError(f"--store {src[:200]}: not an image source ({kinds}, or a directory)")
    kind, _, rest = src.partition(":")
    if kind in ("oci", "oci-archive", "docker-archive"):
        # the path, maybe followed by :TAG
        if not rest or not (os.path.exists(rest) or os.path.exists(rest.rsplit(":", 1)[0])):
            raise UsageError(f"--store {src[:200]}: no such {'directory' if kind == 'oci' else 'file'}")


def _dns_subdomain(name: str) -> bool:
    return 0 < len(name) <= 253 and name.isascii() and all(
        p and p[0].isalnum() and p[-1].isalnum() and all(c.islower() or c.isdigit() or c == "-" for c in p)
        for p in name.split("."))


def _dns_label(name: str) -> bool:
    """
    >>> _dns_label("compat-hook"), _dns_label("a.b")
    (True, False)
    """
    return len(name) <= 63 and "." not in name and _dns_subdomain(name)


def _status(args) -> int:
    import json
    from .node import agent
    from .api import kube
    from .overview import status

    cfg = _config(args.config)
    prefix = agent.settings(cfg)["label_prefix"]
    k = kube.connect(args.kubeconfig, args.context)
    rep = status.status(k, prefix, args.publish_namespace, selector=args.selector)
    _said_server("status", k)
    if args.json:
        keys = ("name", "driver", "target", "upgrade_state", "preflight", "verdict", "broken", "held", "hold",
                "stale", "renewed", "since", "validated", "path", "taint_not_tolerated", "note")
        out = {"nodes": [{key: r[key] for key in keys} for r in rep["nodes"]], "summary": rep["summary"],
               "server": {"url": k.host, "credentials": k.source}}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        sys.stdout.write(status.render_text(rep))
    if not rep["nodes"]:  # a typo in a CI gate's selector must not pass
        what = f"the selector {args.selector!r} selects" if args.selector else "the cluster has"
        sys.stderr.write(f"compat-hook cluster status: no GPU node: {what} none (a node labelled "
                         f"{status.PRESENT_LABEL}=true or published on by an agent)\n")
        return EXIT_NOTHING
    return status.exit_status(rep["nodes"], rep["summary"])


def _fleet(args) -> int:
    import os
    import socket

    from ..core.errors import UsageError
    from .node import agent
    from .overview import fleet
    from .api import kube

    if not _dns_label(args.namespace):
        raise UsageError(f"--namespace: not a namespace name, got {args.namespace[:80]!r}")
    if not 3 <= args.lease_seconds <= 3600:
        raise UsageError("--lease-seconds: 3 to 3600")
    if not 0.5 <= args.resync <= 3600:
        raise UsageError("--resync: 0.5 to 3600 seconds")
    identity = args.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    if not 0 < len(identity) <= 128 or not identity.isprintable():
        raise UsageError(f"--identity: 1 to 128 printable characters, got {identity[:80]!r}")
    prefix = agent.settings(_config(args.config))["label_prefix"]
    opts = fleet.FleetOptions(namespace=args.namespace, identity=identity, prefix=prefix,
                              lease_seconds=args.lease_seconds, resync=args.resync)
    return fleet.run(lambda: kube.connect(args.kubeconfig, args.context), opts)


def _said_server(command: str, k) -> None:
    """One stderr line: which API server, and how its credentials were found (kubectl's merge of several
    files can surprise; this line settles which cluster was read or changed)."""
    sys.stderr.write(f"compat-hook cluster {command}: API server {k.host} ({k.source})\n")


def _release(args) -> int:
    from ..core.errors import UsageError
    from .node import agent, release
    from .api import kube

    cfg = _config(args.config)
    prefixes = [agent.settings(cfg)["label_prefix"]]
    for p in args.prefix:
        if not _dns_subdomain(p):
            raise UsageError(f"--prefix: not a label prefix (a DNS subdomain), got {p[:80]!r}")
        if p not in prefixes:
            prefixes.append(p)
    if args.node is not None and not _dns_subdomain(args.node):
        raise UsageError(f"--node: not a node name (a DNS subdomain), got {args.node[:80]!r}")
    if args.purge and not args.all:
        raise UsageError("--purge: only with --all (it is what an uninstall runs)")
    if not _dns_label(args.publish_namespace):
        raise UsageError(f"--publish-namespace: not a namespace name, got {args.publish_namespace[:80]!r}")
    k = kube.connect(args.kubeconfig, args.context)
    done = release.release(k, prefixes, node=args.node, out=sys.stdout)
    if args.purge:
        got = release.purge(k, prefixes, args.publish_namespace, out=sys.stdout)
        sys.stdout.write(f"removed what compat-hook wrote from {len(got['nodes'])} node(s) and "
                         f"{len(got['objects'])} Lease(s)/ConfigMap(s) of its agents in {args.publish_namespace}\n")
    _said_server("release", k)  # (an error is one line, and names the server where it matters)
    if args.all:
        sys.stdout.write(f"released {len(done)} hold(s) of compat-hook\n")
    elif done is None:  # --node NAME: no such node (a typo must not look like a release)
        return EXIT_NOTHING
    return EXIT_OK
