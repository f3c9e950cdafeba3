#!/bin/sh
# compat-hook-k8s: the DaemonSet's installer (packaging/kubernetes/compat-hook.yaml).
#
#   compat-hook-k8s run        install, then wait (the container's command)
#   compat-hook-k8s watch      the re-registration loop of `run` alone (after an install)
#   compat-hook-k8s install    install once and exit
#   compat-hook-k8s uninstall  remove the containerd registration (the preStop hook)
#   compat-hook-k8s plan       `compat-hook plan containerd: --driver $TARGET_DRIVER --json` on the
#                              node (upgrade/plan-daemonset.yaml), then wait; plan-once: then exit
#   compat-hook-k8s help
#
# The node's root filesystem is mounted at $HOST_ROOT (hostPath "/"). compat-hook
# itself runs on the node, not in this container: the hook and the runtime
# wrapper are started by the node's containerd, so they must use the node's
# Python and files. This script
#   1. copies the payload of the image ($PAYLOAD: compat_hook plus pure-Python
#      PyYAML, pyelftools and tomlkit) to $HOST_ROOT$HOST_PREFIX/<version-hash>,
#      a new directory per build that is never modified afterwards, so
#      containers starting during an upgrade never see half a copy; the
#      previous copy is kept, older ones are removed;
#   2. puts /etc/compat-hook/config.yaml on the node if it has none (or copies
#      $CONFIG_SOURCE over it, e.g. a mounted ConfigMap);
#   3. runs `compat-hook install containerd` chrooted into the node root with
#      the node's python3 (>= 3.9 required), so every path it registers is a
#      node path. REGISTRATION_PATH picks how: nri (the NRI plugin the payload
#      carries at libexec/compat-hook-nri, `--via nri`: every container that
#      asks for a GPU, whatever runtime it names), runtimeclass (the runtime the
#      RuntimeClass names, below), or auto (nri where the node's containerd runs
#      NRI: 2.x unless disabled, 1.7 when enabled; else runtimeclass, with one
#      line saying why). The runtime is registered on nri nodes too, for pods
#      that name the RuntimeClass. The path taken is written to $PATH_FILE (the agent
#      publishes it as a Node label); taking runtimeclass removes a plugin an
#      earlier nri install left. The runtime wrapper goes to the fixed path
#      $HOST_PREFIX/bin/compat-hook-runtime (rewritten atomically), so an
#      upgrade of the DaemonSet changes no containerd setting and needs no
#      containerd restart: the next container start runs the new copy.
#      $HOST_PREFIX/bin/compat-hook runs the current copy for the node's admin
#      (`/opt/compat-hook/bin/compat-hook explain --bundle ...`);
#   4. where the node has the NVIDIA Container Toolkit's config.toml (the GPU
#      Operator's /usr/local/nvidia/toolkit/.config/nvidia-container-runtime/
#      config.toml, or /etc/nvidia-container-runtime/config.toml), runs
#      `compat-hook install nvidia-toolkit` on it, so containers started
#      through the NVIDIA runtime go through the same wrapper. The operator's
#      toolkit container rewrites that file from scratch whenever it starts
#      (nvidia-ctk-installer deletes /usr/local/nvidia/toolkit first), so
#      `run` registers again when it changed. The watcher on the node
#      (python3 -m compat_hook.install.watch: inotify, its imports done at
#      start) does it itself the moment the file is whole again, with the
#      install's own code in its running process, then says "change"; this
#      script then checks each config and runs `compat-hook install
#      nvidia-toolkit` where the file is not what it registered last (the
#      fallback should the watcher's attempt fail), and every $TOOLKIT_RECHECK
#      seconds as well (the fallback for a missed event, and all there is
#      where the watcher cannot run). The durable setting is the operator's own: ClusterPolicy
#      spec.toolkit.env NVIDIA_CONTAINER_RUNTIME_RUNTIMES=
#      "$HOST_PREFIX/bin/compat-hook-runtime,runc,crun" (docs/engines.md). With it set,
#      TOOLKIT_CONFIGS="" (the chart's gpuOperator.toolkitEnv=true) leaves the toolkit's files
#      alone: no watcher, and the files in TOOLKIT_EXPECT are only checked for the wrapper,
#      with one line whenever their content changes;
#   5. `run` also re-runs `compat-hook install containerd` whenever containerd's
#      configuration files change (checked every $TOOLKIT_RECHECK seconds): on
#      containerd 1.x the runtime lives in config.toml itself, so a tool that
#      rewrites the file (nvidia-ctk, the GPU Operator's toolkit) keeps it, and
#      this puts it back should one drop it; on the drop-in route (a drop-in
#      carrying the whole CRI section hides config.toml's) it renders the drop-in
#      anew from the changed files;
#   6. restarts containerd only when RESTART_CONTAINERD=true and the
#      registration changed (default off: restart it yourself with
#      `systemctl restart containerd` in a maintenance window). The restart runs
#      $RESTART_COMMAND, by default `nsenter --target 1 --mount --uts --ipc --net
#      --pid -- systemctl restart containerd`, which needs `hostPID: true` and
#      `privileged: true` in the pod spec. Running containers keep running
#      (their shims do not restart).
#
# Environment (defaults in brackets):
#   HOST_ROOT [/host]  PAYLOAD [/opt/compat-hook]  HOST_PREFIX [/opt/compat-hook]
#   HOST_PYTHON [/usr/bin/python3]  CONTAINERD_CONFIG [/etc/containerd/config.toml]
#   RUNTIME_NAME [cuda-compat]  INSTALL_ARGS [] (e.g. "--set-as-default")
#   REGISTRATION_PATH [runtimeclass] (auto, nri, runtimeclass)  PATH_FILE [/run/compat-hook/registration]
#   NRI_REQUIRE [off] (off, per-pod, all: --nri-require of the NRI install, containerd >= 2.2)
#   CONFIG_SOURCE []  RESTART_CONTAINERD [false]  RESTART_COMMAND [see above]
#   UNINSTALL_ON_STOP [true]  READY_FILE [/tmp/compat-hook-ready]
#   TOOLKIT_CONFIGS [the two paths in 4.; "" none]  TOOLKIT_EXPECT []  TOOLKIT_RECHECK [30]
#   LOG_FILE [/var/log/compat-hook.log]  LOG_MAX_BYTES [52428800]  LOG_KEEP [8]: the node's
#   decision log (the config's log_file) is rotated like the Debian package's logrotate file does:
#   checked at every TOOLKIT_RECHECK, renamed to .1 past LOG_MAX_BYTES, older copies gzipped
# Only POSIX sh and busybox applets are used.
set -eu

HOST_ROOT=${HOST_ROOT:-/host}
PAYLOAD=${PAYLOAD:-/opt/compat-hook}
HOST_PREFIX=${HOST_PREFIX:-/opt/compat-hook}
HOST_PYTHON=${HOST_PYTHON:-/usr/bin/python3}
CONTAINERD_CONFIG=${CONTAINERD_CONFIG:-/etc/containerd/config.toml}
RUNTIME_NAME=${RUNTIME_NAME:-cuda-compat}
INSTALL_ARGS=${INSTALL_ARGS:-}
NRI_REQUIRE=${NRI_REQUIRE:-off}
CONFIG_SOURCE=${CONFIG_SOURCE:-}
RESTART_CONTAINERD=${RESTART_CONTAINERD:-false}
RESTART_COMMAND=${RESTART_COMMAND:-nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd}
UNINSTALL_ON_STOP=${UNINSTALL_ON_STOP:-true}
REGISTRATION_PATH=${REGISTRATION_PATH:-runtimeclass}
PATH_FILE=${PATH_FILE:-/run/compat-hook/registration}
READY_FILE=${READY_FILE:-/tmp/compat-hook-ready}
# (set but empty: no toolkit config is registered or watched)
TOOLKIT_CONFIGS=${TOOLKIT_CONFIGS-/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml /etc/nvidia-container-runtime/config.toml}
TOOLKIT_EXPECT=${TOOLKIT_EXPECT:-}
TOOLKIT_RECHECK=${TOOLKIT_RECHECK:-30}
TOOLKIT_STATE=${TOOLKIT_STATE:-/tmp/compat-hook-toolkit}
LOG_FILE=${LOG_FILE:-/var/log/compat-hook.log}
LOG_MAX_BYTES=${LOG_MAX_BYTES:-52428800}
LOG_KEEP=${LOG_KEEP:-8}

log() { echo "compat-hook-k8s: $*" >&2; }
die() { log "error: $*"; exit 1; }

is_true() {
    case $1 in true|True|TRUE|1|yes|Yes|YES|on|On|ON) return 0 ;; *) return 1 ;; esac
}

check() {
    [ -d "$HOST_ROOT" ] || die "HOST_ROOT=$HOST_ROOT is not a directory (mount the node's / there)"
    [ -f "$PAYLOAD/STAMP" ] || die "PAYLOAD=$PAYLOAD has no STAMP file (not a compat-hook image payload)"
    [ -x "$HOST_ROOT$HOST_PYTHON" ] || [ -L "$HOST_ROOT$HOST_PYTHON" ] ||
        die "the node has no $HOST_PYTHON; compat-hook needs python3 >= 3.9 on the node (set HOST_PYTHON)"
    host_env "$HOST_PYTHON" -I -S -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' ||
        die "$HOST_PYTHON on the node is older than 3.9"
}

# A command run chrooted into the node root with a fixed environment.
host_env() {
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C \
        chroot "$HOST_ROOT" "$@"
}

stamp() { cat "$PAYLOAD/STAMP"; }

# compat-hook on the node, from the installed copy $1 (a node path).
compat_hook() {
    dir=$1; shift
    host_env "$HOST_PYTHON" -I -c \
        'import sys; sys.path.insert(0, sys.argv.pop(1)); from compat_hook.cli import entry; entry()' \
        "$dir/lib" "$@"
}

copy_payload() {
    dest="$HOST_PREFIX/$(stamp)"
    if [ -f "$HOST_ROOT$dest/STAMP" ] && [ "$(cat "$HOST_ROOT$dest/STAMP")" = "$(stamp)" ]; then
        log "payload already on the node at $dest"
    else
        tmp="$HOST_ROOT$dest.tmp.$$"
        rm -rf "$tmp"
        mkdir -p "$HOST_ROOT$HOST_PREFIX"
        mkdir -p "$tmp"
        cp -a "$PAYLOAD/." "$tmp/"
        rm -rf "$HOST_ROOT$dest"
        mv "$tmp" "$HOST_ROOT$dest"
        log "copied the payload to $dest"
    fi
    echo "$dest"
}

put_config() {
    cfg="$HOST_ROOT/etc/compat-hook/config.yaml"
    mkdir -p "$HOST_ROOT/etc/compat-hook"
    if [ -n "$CONFIG_SOURCE" ]; then
        [ -f "$CONFIG_SOURCE" ] || die "CONFIG_SOURCE=$CONFIG_SOURCE does not exist"
        cp "$CONFIG_SOURCE" "$cfg.tmp.$$" && mv "$cfg.tmp.$$" "$cfg"
        log "copied $CONFIG_SOURCE to /etc/compat-hook/config.yaml"
    elif [ ! -e "$cfg" ]; then
        cp "$PAYLOAD/share/config.yaml" "$cfg.tmp.$$" && mv "$cfg.tmp.$$" "$cfg"
        log "wrote the default /etc/compat-hook/config.yaml"
    fi
}

# A checksum of containerd's configuration files, to tell whether a restart is needed.
containerd_sum() {
    d="$HOST_ROOT$(dirname "$CONTAINERD_CONFIG")"
    if [ -d "$d" ]; then
        find "$d" -type f ! -name '*.bak' | sort | while read -r f; do md5sum "$f"; done
    fi
}

restart_containerd() {
    if ! is_true "$RESTART_CONTAINERD"; then
        log "containerd not restarted (RESTART_CONTAINERD=$RESTART_CONTAINERD): run" \
            "'systemctl restart containerd' on the node to load the change"
        return 1
    fi
    log "restarting containerd: $RESTART_COMMAND"
    sh -c "$RESTART_COMMAND" || die "the restart failed (RESTART_COMMAND needs hostPID: true and privileged: true)"
    return 0
}

# $HOST_PREFIX/bin/compat-hook: the admin's entry to the current copy $1.
launcher() {
    b="$HOST_ROOT$HOST_PREFIX/bin"
    mkdir -p "$b"
    printf '#!/bin/sh\n# compat-hook (installed by the compat-hook DaemonSet): the current copy\nexec %s "$@"\n' \
        "$1/bin/compat-hook" > "$b/.compat-hook.$$"
    chmod 0755 "$b/.compat-hook.$$"
    mv "$b/.compat-hook.$$" "$b/compat-hook"
}

# Remove copies other than $1 and the newest other one ($1 empty: remove all), and
# the backups compat-hook leaves when it rewrites the wrapper (it is regenerated).
prune() {
    keep=$1
    kept=
    rm -f "$HOST_ROOT$HOST_PREFIX"/bin/*.bak
    for d in $(ls -1dt "$HOST_ROOT$HOST_PREFIX"/*/ 2>/dev/null); do
        d=${d%/}
        [ -f "$d/STAMP" ] || continue
        [ "$d" = "$HOST_ROOT$keep" ] && continue
        if [ -n "$keep" ] && [ -z "$kept" ]; then kept=$d; continue; fi
        rm -rf "$d"
        log "removed the old copy ${d#"$HOST_ROOT"}"
    done
}

do_install() {
    check
    dest=$(copy_payload)
    put_config
    before=$(containerd_sum)
    path=$(choose_path "$dest")
    nri_changed=false
    # The runtime the RuntimeClass names, on every node: pods that name it keep working where the NRI
    # plugin reaches every GPU container too (the wrapper adds no second hook to a spec that has one).
    # shellcheck disable=SC2086 # INSTALL_ARGS is a list of words on purpose
    compat_hook "$dest" install containerd --engine-config "$CONTAINERD_CONFIG" \
        --runtime-name "$RUNTIME_NAME" --wrapper-path "$HOST_PREFIX/bin/compat-hook-runtime" \
        $INSTALL_ARGS >&2 || die "compat-hook install containerd failed"
    if [ "$path" = nri ]; then
        out=$(install_nri "$dest" 2>&1) || { echo "$out" >&2; die "compat-hook install containerd --via nri failed"; }
        echo "$out" >&2
        case $out in *"nothing changed"*) ;; *) nri_changed=true ;; esac
    else
        drop_nri "$dest" && nri_changed=true
    fi
    echo "$path" > "$TOOLKIT_STATE.path"
    publish_path "$path"
    launcher "$dest"
    sync_toolkit "$dest"
    check_toolkit_env
    after=$(containerd_sum)
    if [ "$before" != "$after" ] || [ "$nri_changed" = true ]; then
        restart_containerd || true
    else
        log "containerd's configuration is unchanged"
    fi
    prune "$dest"
    echo "$dest" > "$READY_FILE"
    if [ "$path" = nri ]; then
        log "ready: NRI plugin $NRI_BASENAME and runtime '$RUNTIME_NAME' -> compat-hook $dest"
    else
        log "ready: runtime '$RUNTIME_NAME' -> compat-hook $dest"
    fi
}

NRI_BASENAME=90-compat-hook

# Whether the node's containerd runs NRI (compat_hook.install.nri.detect): 0, with where the plugin's
# binary goes in $NRI_BINARY_FILE; or 1 and the reason on stdout.
NRI_BINARY_FILE=$TOOLKIT_STATE.nri-binary
nri_detect() {
    if why=$(host_env "$HOST_PYTHON" -I -c \
            'import sys; sys.path.insert(0, sys.argv.pop(1)); from compat_hook.install.nri import detect_main; sys.exit(detect_main())' \
            "$1/lib" "$CONTAINERD_CONFIG"); then
        echo "${why#nri }" > "$NRI_BINARY_FILE"
        return 0
    fi
    echo "${why:-the NRI check failed}"
    return 1
}

# Whether containerd holds the pre-registered NRI plugin $1 (a node path) connected: 0 when a process
# of the node runs with $1 as its argv[0] (containerd starts it so, and it exits as soon as containerd's
# connection to it closes), 1 when none does, 2 when the node's processes cannot be seen (no procfs at
# $HOST_ROOT/proc). $HOST_ROOT/proc is the node's own procfs, whatever the pod's PID namespace.
nri_running() {
    [ -r "$HOST_ROOT/proc/1/comm" ] || return 2
    comm=$(basename "$1" | cut -c1-15)  # the kernel keeps 15 bytes of the name
    for f in $(grep -lxF -- "$comm" "$HOST_ROOT"/proc/[0-9]*/comm 2>/dev/null); do
        [ "$(tr '\000' '\n' < "${f%/comm}/cmdline" 2>/dev/null | head -n 1)" = "$1" ] && return 0
    done
    return 1
}

# What the agent publishes (<prefix>/registration): the path taken, and for nri, whether containerd
# holds the plugin connected: nri-not-connected when its binary is gone from where containerd starts it
# (removed by hand, or NRI's plugin_path moved without a new install), or when no process of it runs
# (containerd has not started it since the install, or it died: containerd starts it again only at its
# own restart). Checked at the install and every $TOOLKIT_RECHECK s.
publish_path() {
    p=$1
    [ -n "$p" ] || return 0  # no install of this pod's yet
    why=
    if [ "$p" = nri ]; then
        b=$(cat "$NRI_BINARY_FILE" 2>/dev/null || true)
        running=0
        if [ -z "$b" ] || [ ! -f "$HOST_ROOT$b" ]; then
            p=nri-not-connected why="the NRI plugin ${b:-?} is gone"
        elif nri_running "$b" || running=$?; [ "$running" = 1 ]; then
            p=nri-not-connected why="no process of the NRI plugin $b runs (containerd starts it at its own start)"
        fi
    fi
    mkdir -p "$(dirname "$PATH_FILE")"
    was=$(cat "$PATH_FILE" 2>/dev/null || true)
    [ "$was" = "$p" ] && return 0
    echo "$p" > "$PATH_FILE.tmp" && mv "$PATH_FILE.tmp" "$PATH_FILE"
    if [ "$p" = nri-not-connected ]; then
        log "warning: $why: GPU containers start without compat-hook"
    elif [ "$p" = nri ] && [ "$was" = nri-not-connected ]; then
        log "the NRI plugin $b runs: connected again"
    fi
    return 0
}

# The path this node gets (REGISTRATION_PATH), on stdout; the reason for a fallback on stderr.
# registration.path=nri where it cannot be had is an error (the pod does not become ready).
choose_path() {
    case $REGISTRATION_PATH in
        runtimeclass) echo runtimeclass; return 0 ;;
        nri|auto) ;;
        *) die "REGISTRATION_PATH=$REGISTRATION_PATH: use auto, nri or runtimeclass" ;;
    esac
    if [ ! -f "$HOST_ROOT$1/libexec/compat-hook-nri" ]; then
        why="this image carries no NRI plugin (built without it: build the image with make image)"
    elif why=$(nri_detect "$1"); then
        echo nri
        return 0
    fi
    [ "$REGISTRATION_PATH" = nri ] && die "REGISTRATION_PATH=nri: $why"
    log "registration: the RuntimeClass path (auto: $why)"
    echo runtimeclass
}

install_nri() {
    compat_hook "$1" install containerd --via nri --engine-config "$CONTAINERD_CONFIG" \
        --nri-plugin "$1/libexec/compat-hook-nri" --nri-require "$NRI_REQUIRE"
}

# The runtimeclass path: a plugin an earlier nri install left goes (0 when one went, 1 when none was there).
drop_nri() {
    out=$(compat_hook "$1" uninstall containerd --via nri --engine-config "$CONTAINERD_CONFIG" 2>&1) ||
        { echo "$out" >&2; log "warning: the NRI plugin of an earlier install could not be removed"; return 1; }
    case $out in *"nothing changed"*) return 1 ;; esac
    echo "$out" >&2
    return 0
}

# Register (again) under every NVIDIA toolkit config on the node whose content
# changed since we last did; quiet when nothing changed.
sync_toolkit() {
    dest=$1
    mkdir -p "$TOOLKIT_STATE"
    for cfg in $TOOLKIT_CONFIGS; do
        [ -f "$HOST_ROOT$cfg" ] || continue
        key=$(echo "$cfg" | tr '/' '_')
        sum=$(md5sum < "$HOST_ROOT$cfg")
        [ "$sum" = "$(cat "$TOOLKIT_STATE/$key" 2>/dev/null)" ] && continue
        if compat_hook "$dest" install nvidia-toolkit --engine-config "$cfg" \
                --wrapper-path "$HOST_PREFIX/bin/compat-hook-runtime" >&2; then
            md5sum < "$HOST_ROOT$cfg" > "$TOOLKIT_STATE/$key"
            log "registered under the NVIDIA toolkit's $cfg"
        else
            log "warning: compat-hook install nvidia-toolkit --engine-config $cfg failed"
        fi
    done
}

# The toolkit configs someone else registers compat-hook in (the GPU Operator's, from the
# ClusterPolicy's toolkit.env): only read, one line each time one's content changes.
check_toolkit_env() {
    mkdir -p "$TOOLKIT_STATE"
    for cfg in $TOOLKIT_EXPECT; do
        [ -f "$HOST_ROOT$cfg" ] || continue
        key=expect$(echo "$cfg" | tr '/' '_')
        sum=$(md5sum < "$HOST_ROOT$cfg")
        [ "$sum" = "$(cat "$TOOLKIT_STATE/$key" 2>/dev/null)" ] && continue
        echo "$sum" > "$TOOLKIT_STATE/$key"
        if grep -Eq "^[[:space:]]*runtimes[[:space:]]*=[[:space:]]*\\[[[:space:]]*\"$HOST_PREFIX/bin/compat-hook-runtime\"" \
                "$HOST_ROOT$cfg"; then
            log "$cfg runs $HOST_PREFIX/bin/compat-hook-runtime first (the ClusterPolicy's toolkit.env)"
        else
            log "warning: $cfg does not run $HOST_PREFIX/bin/compat-hook-runtime first: pods of the NVIDIA" \
                "runtime miss compat-hook; set the ClusterPolicy's spec.toolkit.env" \
                "NVIDIA_CONTAINER_RUNTIME_RUNTIMES=$HOST_PREFIX/bin/compat-hook-runtime,runc,crun (docs/engines.md)"
        fi
    done
}

# Re-register when containerd's files changed since the last install (ours included in the sum).
sync_containerd() {
    dest=$1
    sum=$(containerd_sum | md5sum)
    [ "$sum" = "$(cat "$TOOLKIT_STATE.containerd" 2>/dev/null)" ] && return 0
    if [ -f "$TOOLKIT_STATE.containerd" ] && [ "$(cat "$TOOLKIT_STATE.path" 2>/dev/null)" = nri ]; then
        # containerd's NRI settings may have moved its plugin dirs: the plugin goes where they say now
        if out=$(install_nri "$dest" 2>&1); then
            case $out in
                *"nothing changed"*) ;;
                *) echo "$out" >&2
                   log "containerd's configuration changed: compat-hook's NRI plugin registered again"
                   restart_containerd || true ;;
            esac
        else
            echo "$out" >&2
            log "warning: compat-hook install containerd --via nri failed after containerd's configuration changed"
        fi
    fi
    if [ -f "$TOOLKIT_STATE.containerd" ]; then
        # shellcheck disable=SC2086 # INSTALL_ARGS is a list of words on purpose
        if out=$(compat_hook "$dest" install containerd --engine-config "$CONTAINERD_CONFIG" \
                --runtime-name "$RUNTIME_NAME" --wrapper-path "$HOST_PREFIX/bin/compat-hook-runtime" \
                $INSTALL_ARGS 2>&1); then
            case $out in
                "no changes"*) ;;
                *) echo "$out" >&2
                   log "containerd's configuration changed: compat-hook's runtime registered again"
                   restart_containerd || true ;;
            esac
        else
            echo "$out" >&2
            log "warning: compat-hook install containerd failed after containerd's configuration changed"
        fi
    fi
    containerd_sum | md5sum > "$TOOLKIT_STATE.containerd"
}

# sync_toolkit on every line of the watcher (compat_hook/install/watch.py: "ready" once armed,
# "change" at a change, "poll" every $TOOLKIT_RECHECK s), and at "ready" and "poll" the
# containerd check and the log's rotation too; returns when the watcher stops. With
# --wrapper-path the watcher has registered again under a changed config before it says
# "change" (same install code, in its process): sync_toolkit then finds the content it
# registered last time and has nothing to do, or registers (again) where it differs.
watch_toolkit() {
    dest=$1
    # shellcheck disable=SC2086 # TOOLKIT_CONFIGS is a list of paths on purpose
    host_env "$HOST_PYTHON" -I -c \
        'import sys; sys.path.insert(0, sys.argv.pop(1)); from compat_hook.install.watch import main; sys.exit(main())' \
        "$dest/lib" --every "$TOOLKIT_RECHECK" --wrapper-path "$HOST_PREFIX/bin/compat-hook-runtime" \
        $TOOLKIT_CONFIGS |
        while read -r what; do
            sync_toolkit "$dest"
            # a change of a toolkit config: nothing else to do then, the next one may follow at once
            [ "$what" = change ] || { sync_containerd "$dest"; rotate_log; publish_path "$(cat "$TOOLKIT_STATE.path" 2>/dev/null || true)"; }
        done
}

# The node's decision log, bounded: past LOG_MAX_BYTES it is renamed to .1 (the hook and the
# wrapper open it anew at every start with O_APPEND, so no line is lost: benchmarks/soak.py),
# older copies move up and are gzipped one generation late (a start that opened the file just
# before the rename finishes its line in .1), LOG_KEEP copies kept.
rotate_log() {
    f=$HOST_ROOT$LOG_FILE
    [ -f "$f" ] && [ "$(wc -c < "$f")" -gt "$LOG_MAX_BYTES" ] || return 0
    n=$LOG_KEEP
    rm -f "$f.$n.gz"
    while [ "$n" -gt 2 ]; do
        n=$((n - 1))
        if [ -f "$f.$n.gz" ]; then mv "$f.$n.gz" "$f.$((n + 1)).gz" || true; fi
    done
    if [ -f "$f.1" ]; then mv "$f.1" "$f.2" && gzip -f "$f.2" || true; fi
    mv "$f" "$f.1" && log "rotated $LOG_FILE ($LOG_MAX_BYTES bytes)" || true
}

# The re-registration loop: the watcher, and plain polling whenever it is not running (or
# there is no toolkit config to watch: TOOLKIT_CONFIGS="").
toolkit_loop() {
    trap 'kill "$wpid" 2>/dev/null; exit 0' TERM INT
    sync_containerd "$(cat "$READY_FILE")"
    while :; do
        if [ -n "$TOOLKIT_CONFIGS" ]; then
            watch_toolkit "$(cat "$READY_FILE")" & wpid=$!
            wait "$wpid" || true
            log "warning: the toolkit config watcher stopped; checking every ${TOOLKIT_RECHECK}s"
        fi
        sleep "$TOOLKIT_RECHECK" & wpid=$!
        wait "$wpid" || true
        sync_toolkit "$(cat "$READY_FILE")"
        check_toolkit_env
        sync_containerd "$(cat "$READY_FILE")"
        rotate_log
        publish_path "$(cat "$TOOLKIT_STATE.path" 2>/dev/null || true)"
    done
}

do_uninstall() {
    if ! is_true "$UNINSTALL_ON_STOP"; then
        log "UNINSTALL_ON_STOP=$UNINSTALL_ON_STOP: leaving the registration in place"
        return 0
    fi
    check
    dest="$HOST_PREFIX/$(stamp)"
    [ -d "$HOST_ROOT$dest/lib" ] || dest=$(copy_payload)
    before=$(containerd_sum)

    for cfg in $TOOLKIT_CONFIGS; do
        [ -f "$HOST_ROOT$cfg" ] || continue
        compat_hook "$dest" uninstall nvidia-toolkit --engine-config "$cfg" >&2 ||
            log "warning: compat-hook uninstall nvidia-toolkit --engine-config $cfg failed"
    done
    rm -rf "$TOOLKIT_STATE"
    rm -f "$TOOLKIT_STATE.containerd" "$TOOLKIT_STATE.path" "$NRI_BINARY_FILE"
    # Pods of the runtime still running keep a pass-through at the wrapper's path (it execs
    # runc, nothing of compat-hook), so they can still be stopped and drained.
    compat_hook "$dest" uninstall containerd --engine-config "$CONTAINERD_CONFIG" \
        --runtime-name "$RUNTIME_NAME" --wrapper-path "$HOST_PREFIX/bin/compat-hook-runtime" >&2 ||
        die "compat-hook uninstall containerd failed"
    # the NRI plugin too, whichever path this node got (a running plugin stops at containerd's restart)
    nri_changed=false
    drop_nri "$dest" && nri_changed=true
    after=$(containerd_sum)
    rm -f "$READY_FILE" "$PATH_FILE"
    if { [ "$before" != "$after" ] || [ "$nri_changed" = true ]; } && restart_containerd; then
        # The uninstall left a pass-through for the containerd that had the runtime in memory; this
        # one has restarted without it: the pass-through goes now unless pods created through it live.
        compat_hook "$dest" uninstall containerd --engine-config "$CONTAINERD_CONFIG" \
            --runtime-name "$RUNTIME_NAME" --wrapper-path "$HOST_PREFIX/bin/compat-hook-runtime" >&2 || true
        prune ""
        rm -f "$HOST_ROOT$HOST_PREFIX/bin/compat-hook"
        if rmdir "$HOST_ROOT$HOST_PREFIX/bin" 2>/dev/null; then
            rmdir "$HOST_ROOT$HOST_PREFIX" 2>/dev/null || true
        else
            log "kept $HOST_PREFIX/bin/compat-hook-runtime (a pass-through to runc) for the pods still using it;" \
                "'$HOST_PREFIX/bin/compat-hook-runtime' goes with the next uninstall once they are gone"
        fi
    fi
}

# The driver-upgrade preflight on this node (docs/upgrade.md): every image in the node's
# containerd against $TARGET_DRIVER, one JSON object on stdout (the pod's log).
do_plan() {
    [ -n "${TARGET_DRIVER:-}" ] || die "TARGET_DRIVER is not set (the target driver version, e.g. 580.65.06)"
    dest="$HOST_PREFIX/$(stamp)"
    [ -d "$HOST_ROOT$dest/lib" ] || die "compat-hook is not on this node: apply compat-hook.yaml first"
    # shellcheck disable=SC2086 # PLAN_ARGS is a list of words on purpose
    if compat_hook "$dest" plan containerd: --driver "$TARGET_DRIVER" --json ${PLAN_ARGS:-}; then
        log "plan done"
    else
        log "plan exited $? (one line above says why)"
    fi
}

case ${1:-run} in
    run)
        do_install
        toolkit_loop ;;
    watch)
        [ -s "$READY_FILE" ] || die "no $READY_FILE: run install first"
        toolkit_loop ;;
    install) do_install ;;
    plan)
        do_plan
        trap 'exit 0' TERM INT
        while :; do sleep 3600 & wait $! || true; done ;;
    plan-once) do_plan ;;
    uninstall) do_uninstall ;;
    help|-h|--help) sed -n '2,31p' "$0" ;;
    *) die "unknown command '$1' (run, watch, install, uninstall, plan, plan-once, help)" ;;
esac
