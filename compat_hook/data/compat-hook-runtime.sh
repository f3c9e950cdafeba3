#!/bin/sh
# compat-hook-runtime: a runc-compatible wrapper for containerd's BinaryName
# (or Docker's runtimes.path). Rendered by `compat-hook install`: edit the
# template compat_hook/data/compat-hook-runtime.sh, not this copy.
#
# Every verb but `create` and `run` execs the real runtime at once, without
# starting Python. `create`/`run` go to compat-hook's Python wrapper
# (compat_hook/commands/runtime.py), which edits <bundle>/config.json and then execs
# the real runtime with the same arguments.
#
# The real runtime is the config key `runtime:` (runc, crun,
# nvidia-container-runtime or an absolute path). It is read here with shell
# builtins from the YAML file: the config validator restricts the value to
# [A-Za-z0-9_./+-], and every line this reader cannot vouch for (flow or
# multi-line values it cannot see the end of, anchors, tags, complex keys,
# odd characters) hands the whole call to the Python wrapper, which reads the
# file with PyYAML. compat_hook/core/realruntime.py:read_runtime_line() is the same
# reader in Python; the tests check both against the YAML loader.
#
# compat-hook-installation: @INSTALLATION@

ch_python=@PYTHON@
ch_boot=@BOOT@
ch_config=@CONFIG@
ch_state=@STATE@
# Non-empty: on_error: fail at registration (a missing compat-hook stops the container).
ch_fail=@FAIL@
# The log file named at registration: a fail-open without Python is told there too.
ch_log=@LOG@
ch_default_config=/etc/compat-hook/config.yaml
ch_path='/usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin'

# -- the `runtime:` reader -------------------------------------------------
ch_rt=runc
ch_sure=1

# Blank-trimmed copy of $1 in ch_t.
ch_trim() {
    ch_t=${1#"${1%%[! 	]*}"}
    ch_t=${ch_t%"${ch_t##*[! 	]}"}
}

# Another top-level key's value ($1): unsure when it may continue on the
# next lines (an unclosed quote or flow collection) or uses YAML features
# that could hide a key.
ch_other() {
    ch_trim "$1"
    case $ch_t in
        '"'*)
            ch_r=${ch_t#?}
            case $ch_r in
                *\\*) ch_sure= ;;
                *\"*) ;;
                *) ch_sure= ;;
            esac ;;
        "'"*)
            ch_r=${ch_t#?}
            while :; do
                case $ch_r in *"''"*) ch_r=${ch_r%%"''"*}${ch_r#*"''"} ;; *) break ;; esac
            done
            case $ch_r in *"'"*) ;; *) ch_sure= ;; esac ;;
        '['*|'{'*)
            case $ch_t in *'#'*|*\"*|*"'"*) ch_sure= ;; *']'|*'}') ;; *) ch_sure= ;; esac ;;
        '&'*|'*'*|'!'*|'|'*|'>'*|'%'*|'@'*|'`'*) ch_sure= ;;
    esac
}

# The value of a `runtime:` line ($1 = the text after the colon).
ch_value() {
    case $1 in
        ''|' '*|'	'*) ;;
        *) ch_sure=; return ;;
    esac
    ch_v=$1
    case $ch_v in
        *'#'*)
            ch_pre=${ch_v%%'#'*}
            case $ch_pre in
                *' '|*'	') ch_v=$ch_pre ;;
                *) ch_sure=; return ;;
            esac ;;
    esac
    ch_trim "$ch_v"
    ch_v=$ch_t
    case $ch_v in
        \"*\") ch_v=${ch_v#?}; ch_v=${ch_v%?} ;;
        "'"*"'") ch_v=${ch_v#?}; ch_v=${ch_v%?} ;;
        [A-Za-z_/]*)
            case $ch_v in
                y|Y|n|N|yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF|null|Null|NULL)
                    ch_sure=; return ;;
            esac ;;
        *) ch_sure=; return ;;
    esac
    case $ch_v in
        ''|*[!A-Za-z0-9_./+-]*) ch_sure=; return ;;
        /*) ;;
        */*) ch_sure=; return ;;
    esac
    ch_rt=$ch_v
}

ch_read() {
    while IFS= read -r ch_l || [ -n "$ch_l" ]; do
        case $ch_l in
            runtime:*) ch_value "${ch_l#runtime:}" ;;
            ''|'#'*|' '*|'	'*|'---'|'...'|'- '*|'-') ;;
            [a-z_]*:*)
                ch_after=${ch_l#*:}
                case ${ch_l%%:*} in
                    *[!a-z_]*) ch_sure= ;;
                    *)
                        case $ch_after in
                            ''|' '*|'	'*) ch_other "$ch_after" ;;
                            *) ch_sure= ;;
                        esac ;;
                esac ;;
            *) ch_sure= ;;
        esac
        [ -n "$ch_sure" ] || return 0
    done < "$1"
}

ch_cfgarg=
if [ -n "${COMPAT_HOOK_CONFIG-}" ]; then
    ch_cfg=$COMPAT_HOOK_CONFIG
else
    ch_cfg=$ch_config
    [ "$ch_cfg" = "$ch_default_config" ] || ch_cfgarg=1
fi
if [ -r "$ch_cfg" ]; then
    ch_read "$ch_cfg"
elif [ -e "$ch_cfg" ]; then
    ch_sure=
fi

# -- the verb (the first argument that is not a global option) -------------
ch_verb=
ch_skip=
for ch_a do
    if [ -n "$ch_skip" ]; then ch_skip=; continue; fi
    case $ch_a in
        --root|--log|--log-format|--log-level|--criu|--rootless|--cgroup-manager|\
        -root|-log|-log-format|-log-level|-criu|-rootless|-cgroup-manager) ch_skip=1 ;;
        -*) ;;
        *) ch_verb=$ch_a; break ;;
    esac
done

ch_resolve() {
    case $ch_rt in
        /*) ch_bin=$ch_rt ;;
        *)
            ch_bin=
            for ch_d in $ch_path; do
                if [ -f "$ch_d/$ch_rt" ] && [ -x "$ch_d/$ch_rt" ]; then ch_bin=$ch_d/$ch_rt; break; fi
            done ;;
    esac
}

ch_to_python() {
    if [ -n "$ch_state" ] && [ -z "${COMPAT_HOOK_STATE_DIR-}" ]; then
        export COMPAT_HOOK_STATE_DIR="$ch_state"
    fi
    if [ -n "$ch_sure" ]; then
        ch_resolve
        [ -z "$ch_bin" ] || export COMPAT_HOOK_RUNTIME_FALLBACK="$ch_bin"
    fi
    # The boot code reads --fail-closed first, the Python wrapper then --compat-hook-config.
    if [ -n "$ch_cfgarg" ]; then set -- --compat-hook-config "$ch_cfg" "$@"; fi
    # Failing closed is for creates only: a delete or kill must always reach the runtime.
    if [ -n "$ch_fail" ] && [ -n "$ch_edit" ]; then set -- --fail-closed "$@"; fi
    exec "$ch_python" -I -S -c "$ch_boot" "$@"
}

if [ "${1-}" = --compat-hook-resolve ]; then
    # For the tests: what the reader made of the config.
    if [ -n "$ch_sure" ]; then echo "runtime=$ch_rt"; else echo "unsure"; fi
    exit 0
fi

# One JSON line in the log (runc drops a successful runtime's stderr; `compat-hook report`
# counts it as a failure). Only for creates, only when the log is writable.
ch_fail_open_log() {
    [ -n "$ch_edit" ] && [ -n "$ch_log" ] || return 0
    { [ -w "$ch_log" ] || { [ ! -e "$ch_log" ] && [ -w "${ch_log%/*}" ]; }; } || return 0
    for ch_id do :; done
    case $ch_python$ch_id in *'"'*|*\\*|*'
'*) return 0 ;; esac
    ch_now=$(date -u +%Y-%m-%dT%H:%M:%S.000Z 2>/dev/null) || ch_now=
    printf '{"time":"%s","event":"fail_open","decision":"error","reason":"installation_missing","component":"runtime","container_id":"%s","error":"%s is missing: the container runs without compat-hook"}\n' \
        "$ch_now" "$ch_id" "$ch_python" >> "$ch_log" 2>/dev/null || :
}

ch_edit=
if [ "$ch_verb" = create ] || [ "$ch_verb" = run ]; then ch_edit=1; fi
if [ -z "$ch_sure" ] || [ -n "$ch_edit" ]; then
    if [ -x "$ch_python" ]; then
        ch_to_python "$@"
    fi
    if [ -n "$ch_fail" ] && [ -n "$ch_edit" ]; then
        echo "compat-hook-runtime: $ch_python is missing: not running the real runtime (on_error: fail)" >&2
        exit 1
    fi
    echo "compat-hook-runtime: $ch_python is missing: running the real runtime without compat-hook" >&2
    ch_fail_open_log "$@"
    [ -n "$ch_sure" ] || ch_rt=runc
fi

if [ -n "${COMPAT_HOOK_RUNTIME_ACTIVE-}" ]; then
    echo "compat-hook-runtime: the real runtime '$ch_rt' leads back to compat-hook-runtime (a loop)" >&2
    exit 1
fi
ch_resolve
if [ -z "$ch_bin" ]; then
    echo "compat-hook-runtime: runtime '$ch_rt' not found in $ch_path" >&2
    exit 127
fi
if [ "$ch_bin" -ef "$0" ]; then
    echo "compat-hook-runtime: runtime '$ch_rt' is this wrapper itself (a loop)" >&2
    exit 1
fi
export COMPAT_HOOK_RUNTIME_ACTIVE=1
exec "$ch_bin" "$@"
