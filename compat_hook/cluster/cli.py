"""``compat-hook cluster agent|status``: the command lines (parsed here, so the main CLI stays small).

Exit statuses:

* ``cluster agent --once``: 0 published, 1 the API server failed or denied the pass
  (without ``--once`` the agent never exits on an API error: it retries with backoff);
* ``cluster status``: 0 every GPU node passes, 2 some node changes outcome or has no
  verdict, 3 some node would break, 1 an error (no cluster, denied, a bad config).

Every error is one line on stderr.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def _parser():
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            sys.stderr.write(f"{self.prog}: {message} (see --help)\n")
            raise SystemExit(EXIT_USAGE)

    p = Parser(prog="compat-hook cluster", description="The upgrade preflight, published on the cluster.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    a = sub.add_parser("agent", help="the node agent: publish this node's preflight, hold its upgrade when gated")
    a.add_argument("--node", required=True, metavar="NAME", help="this node's name (the downward API's spec.nodeName)")
    a.add_argument("--once", action="store_true", help="one pass, then exit (0 published, 1 an API error)")
    a.add_argument("--interval", type=float, default=300.0, metavar="SECONDS",
                   help="seconds between passes (default 300; a ClusterPolicy/NVIDIADriver change starts one at once)")
    a.add_argument("--no-watch", action="store_true", help="poll only; do not watch ClusterPolicy/NVIDIADriver")
    a.add_argument("--kubeconfig", metavar="PATH", help="default: the pod's service account, else $KUBECONFIG")
    a.add_argument("--store", action="append", metavar="SOURCE", default=[],
                   help="where the node's images are: any plan source (default containerd:, every image); repeatable")
    a.add_argument("--address", metavar="SOCKET", help="containerd's socket for containerd: sources")
    a.add_argument("--namespace", metavar="NS", default="k8s.io", help="containerd namespace (default k8s.io)")
    a.add_argument("--driver", metavar="VERSION", help="the target driver (default: the NVIDIADriver or ClusterPolicy)")
    a.add_argument("--host-root", metavar="DIR", help="read host facts under DIR (default: the config's host_root)")
    a.add_argument("--state-dir", metavar="DIR", default=None,
                   help="where the last result is kept (default /var/lib/compat-hook)")
    a.add_argument("--config", metavar="FILE", help="compat-hook's config (its cluster: settings: gate, prefix ...)")
    sub.add_parser("validate", add_help=False, help="after a driver change, prove this node's workloads (docs/validation.md)")
    s = sub.add_parser("status", help="every GPU node: driver, target, upgrade state, preflight, held")
    s.add_argument("--kubeconfig", metavar="PATH")
    s.add_argument("--config", metavar="FILE", help="for cluster.label_prefix")
    s.add_argument("--json", action="store_true", help="print one JSON object")
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

    if argv[:1] == ["validate"]:  # its own arguments: compat_hook/cluster/validate.py
        from .validate import main as validate
        return validate(argv[1:], load_config=_config, node_name_ok=_dns_subdomain)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    if args.command is None:
        _parser().print_help()
        return EXIT_USAGE
    try:
        if args.command == "agent":
            return _agent(args)
        return _status(args)
    except CompatHookError as e:
        sys.stderr.write(f"compat-hook cluster {args.command}: {e}\n")
        return EXIT_USAGE if e.code == "usage" else EXIT_ERROR


def _agent(args) -> int:
    from ..core.config import DEFAULT_STATE_DIR
    from ..core.errors import UsageError
    from . import agent, kube

    if args.interval < 1:
        raise UsageError("--interval: at least 1 second")
    if not _dns_subdomain(args.node):
        raise UsageError(f"--node: not a node name (a DNS subdomain), got {args.node[:80]!r}")
    cfg = _config(args.config, args.host_root)
    opts = agent.AgentOptions(args.node, stores=args.store or ["containerd:"], address=args.address,
                              namespace=args.namespace, driver=args.driver,
                              state_dir=args.state_dir or DEFAULT_STATE_DIR, interval=args.interval,
                              once=args.once, watch=not args.no_watch)
    if args.driver is not None:
        from ..policy.outcome import check_driver

        opts.driver = check_driver(args.driver, "--driver")
    return agent.run(lambda: kube.connect(args.kubeconfig), cfg, opts)


def _dns_subdomain(name: str) -> bool:
    """
    >>> _dns_subdomain("gpu-a.example"), _dns_subdomain("../x"), _dns_subdomain("A")
    (True, False, False)
    """
    return 0 < len(name) <= 253 and name.isascii() and all(
        p and p[0].isalnum() and p[-1].isalnum() and all(c.islower() or c.isdigit() or c == "-" for c in p)
        for p in name.split("."))


def _status(args) -> int:
    import json
    from . import agent, kube, status

    cfg = _config(args.config)
    prefix = agent.settings(cfg)["label_prefix"]
    k = kube.connect(args.kubeconfig)
    rep = status.status(k, prefix)
    if args.json:
        out = {"nodes": [{key: r[key] for key in ("name", "driver", "target", "upgrade_state", "preflight",
                                                   "broken", "held")} for r in rep["nodes"]],
               "summary": rep["summary"]}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        sys.stdout.write(status.render_text(rep))
    return status.exit_status(rep["nodes"])
