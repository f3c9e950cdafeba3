"""compat_hook.core.config: defaults, validation with key paths, file lookup, parse cache."""

from __future__ import annotations

import glob
import json
import os

import pytest
import yaml

from compat_hook.core import config as config_mod
from compat_hook.core.config import (DEFAULT_PATH, SCHEMA, config_path, defaults, from_mapping, load,
                                     load_for_start, render_default_yaml)
from compat_hook.core.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_defaults():
    c = defaults()
    assert c.mode == "ldconfig" and c.on_error == "continue" and c.device_check == "enforce"
    assert c.compat_dirs == ["/usr/local/cuda/compat", "/usr/local/cuda/compat_orin"]
    assert c.host_root == "/" and c.dry_run is False and c.cache is True
    assert c.host_driver_version is None and c.host_cuda_version is None
    assert c.require_gpu_request is True and c.store_inject is True
    assert c.source is None
    assert set(c.to_dict()) == set(SCHEMA)


def test_defaults_are_not_shared():
    a, b = defaults(), defaults()
    a.compat_dirs.append("/x")
    assert b.compat_dirs == ["/usr/local/cuda/compat", "/usr/local/cuda/compat_orin"]
    assert SCHEMA["compat_dirs"][0] == ["/usr/local/cuda/compat", "/usr/local/cuda/compat_orin"]


# key -> bad values. Each must be rejected with a message starting with the key path.
BAD = {
    "host_root": ["relative", "", 1, None, "/a\0b", ["/"]],
    "driver_lib_dirs": [[], "/usr/lib", ["/ok", "rel"], [1], None],
    "host_driver_version": [550.54, 12, "abc", "1.2.3.4", "", True],
    "host_cuda_version": [12.4, "12.x", ""],
    "compat_dirs": [[], ["rel"], "/usr/local/cuda/compat", [None], ["/ok", "/a\nb"]],
    "mode": ["off", "LDCONFIG", "", None, 1],
    "dry_run": ["true", 1, None, "yes"],
    "on_error": ["stop", True, None],
    "log_file": ["relative.log", 1, ""],
    "device_check": ["on", True, None],
    "nvml": ["on", True, None],
    "store_dir": ["store", None],
    "store_inject": ["false", 0],
    "store_target": ["usr/local/cuda/compat", None],
    "runtime": ["", "bin/runc", "runc; rm -rf /", "run c", 5, None, "runc\n"],
    "ldconfig": ["ldconfig", None],
    "ldconfig_timeout": [0, -1, 3601, "10", True, None, float("nan")],
    "require_gpu_request": ["no", None],
    "cache": ["on", 1],
    "wrapper_add_hook": ["no", None],
    "wrapper_drop_oom_score_adj": [0],
    "annotations": ["a=b", ["a"], {"a": 1}, {1: "a"}],
    "cluster": ["yes", ["a"], {"gate": True}, {"gate_upgrade": "yes"}, {"label_prefix": "Bad_Prefix"},
                {"label_prefix": "a..b"}, {"label_prefix": "x" * 254}, {"textfile": "rel/x.prom"}],
}


def test_every_key_has_bad_values():
    assert set(BAD) == set(SCHEMA)


@pytest.mark.parametrize("key, value", [(k, v) for k, vs in BAD.items() for v in vs])
def test_bad_value_names_the_key(key, value):
    with pytest.raises(ConfigError) as e:
        from_mapping({key: value})
    assert str(e.value).startswith(f"{key}") and str(e.value)[len(key)] in ":[.", str(e.value)


def test_list_index_in_key_path():
    with pytest.raises(ConfigError, match=r"^compat_dirs\[1\]: must be an absolute path, got 'rel'$"):
        from_mapping({"compat_dirs": ["/usr/local/cuda/compat", "rel"]})
    with pytest.raises(ConfigError, match=r"^driver_lib_dirs\[2\]: "):
        from_mapping({"driver_lib_dirs": ["/a", "/b", 3]})


@pytest.mark.parametrize("key, value, expected", [
    ("compat_dirs", ["/opt/compat/", "/opt//compat", "/opt/compat"], ["/opt/compat"]),
    ("host_root", "/srv/host/", "/srv/host"),
    ("host_driver_version", "575.57.08", "575.57.08"),
    ("host_cuda_version", "12.10", "12.10"),
    ("ldconfig_timeout", 0.5, 0.5),
    ("ldconfig_timeout", 3600, 3600),
    ("log_file", None, None),
    ("runtime", "/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime"),
    ("runtime", "crun", "crun"),
    ("annotations", {"compat-hook/dry-run": "true"}, {"compat-hook/dry-run": "true"}),
    ("annotations", None, {}),
])
def test_good_values(key, value, expected):
    assert getattr(from_mapping({key: value}), key) == expected


def test_unknown_key():
    with pytest.raises(ConfigError, match=r"^modee: unknown key \(did you mean mode\?\)$"):
        from_mapping({"modee": "env"})
    with pytest.raises(ConfigError, match=r"^zzzz: unknown key$"):
        from_mapping({"zzzz": 1})


def test_every_error_is_reported_with_its_key_path():
    """Not only the first: each unknown key and bad value (and each bad list item), in file order."""
    data = {"mode": "nope", "modee": "env", "compat_dirs": ["/ok", "rel", 3],
            "ldconfig_timeout": 0, "on_error": "continue", "zzzz": 1}
    with pytest.raises(ConfigError) as e:
        from_mapping(data)
    assert e.value.errors == [
        "mode: must be one of ldconfig, env, both, got 'nope'",
        "modee: unknown key (did you mean mode?)",
        "compat_dirs[1]: must be an absolute path, got 'rel'",
        "compat_dirs[2]: must be an absolute path, got 3",
        "ldconfig_timeout: must be a number of seconds in (0, 3600], got 0",
        "zzzz: unknown key",
    ]
    # the exception's text stays one line (the hook's log line, `explain`'s error)
    assert str(e.value) == "; ".join(e.value.errors) and "\n" not in str(e.value)


def test_one_error_reads_as_before():
    with pytest.raises(ConfigError) as e:
        from_mapping({"mode": "nope"})
    assert e.value.errors == [str(e.value)] == ["mode: must be one of ldconfig, env, both, got 'nope'"]


@pytest.mark.parametrize("data", [[1, 2], "mode: env", 3])
def test_top_level_must_be_a_mapping(data):
    with pytest.raises(ConfigError, match=r"^\(top level\)"):
        from_mapping(data)


def test_replace_revalidates():
    c = defaults().replace(mode="env")
    assert c.mode == "env"
    with pytest.raises(ConfigError, match="^mode:"):
        defaults().replace(mode="nope")


# -- files ------------------------------------------------------------------------

def write(tmp_path, text, name="config.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_load_file(tmp_path):
    p = write(tmp_path, "mode: env\ncompat_dirs:\n  - /opt/compat\nhost_driver_version: '550.54.15'\n")
    c = load(p)
    assert (c.mode, c.compat_dirs, c.host_driver_version, c.source) == ("env", ["/opt/compat"], "550.54.15", p)


def test_empty_file_is_defaults(tmp_path):
    c = load(write(tmp_path, "# nothing\n"))
    assert c.to_dict() == defaults().to_dict()


def test_yaml_syntax_error_has_line(tmp_path):
    p = write(tmp_path, "mode: env\ncompat_dirs: [/a\ndry_run: true\n")
    with pytest.raises(ConfigError) as e:
        load(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: not valid YAML at line ") and "\n" not in msg
    line = int(msg.split("at line ")[1].split(":")[0])
    assert 2 <= line <= 4


def test_yaml_tab_indent_error_line(tmp_path):
    p = write(tmp_path, "mode: env\n\tdry_run: true\n")
    with pytest.raises(ConfigError, match=r"at line 2"):
        load(p)


def test_unquoted_version_float_is_explained(tmp_path):
    # YAML reads 12.10 as the float 12.1: the message tells to quote it.
    with pytest.raises(ConfigError, match=r"^host_cuda_version: must be a quoted version string"):
        load(write(tmp_path, "host_cuda_version: 12.10\n"))


def test_unquoted_nvml_off_is_off(tmp_path):
    # YAML reads an unquoted off as false; the shipped config's comment writes `off: never` unquoted.
    assert yaml.safe_load("nvml: off\n") == {"nvml": False}
    assert load(write(tmp_path, "nvml: off\n")).nvml == "off"
    assert load(write(tmp_path, "nvml: 'off'\n")).nvml == "off"
    # `on` is true, which is no setting of nvml: refused, naming the key.
    with pytest.raises(ConfigError, match=r"^nvml: must be one of auto, off, got True"):
        load(write(tmp_path, "nvml: on\n"))
    # the same for device_check
    assert load(write(tmp_path, "device_check: off\n")).device_check == "off"
    with pytest.raises(ConfigError, match=r"^device_check: must be one of enforce, warn, off, got True"):
        load(write(tmp_path, "device_check: on\n"))


def test_bad_value_in_file_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^compat_dirs\[0\]"):
        load(write(tmp_path, "compat_dirs: [relative]\n"))


def test_yaml_is_safe_loaded(tmp_path):
    with pytest.raises(ConfigError):
        load(write(tmp_path, "mode: !!python/object/apply:os.system ['true']\n"))


def test_not_utf8(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"mode: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load(str(p))


def test_missing_explicit_file_is_an_error(tmp_path):
    p = str(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"missing.yaml: no such file$"):
        load(p)


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load(str(tmp_path))  # a directory


def test_missing_default_file_is_defaults(monkeypatch, tmp_path):
    monkeypatch.setattr(config_mod, "DEFAULT_PATH", str(tmp_path / "absent.yaml"))
    c = load(None, environ={})
    assert c.to_dict() == defaults().to_dict() and c.source is None


def test_config_path_order():
    assert config_path("/x.yaml", {"COMPAT_HOOK_CONFIG": "/env.yaml"}) == ("/x.yaml", True)
    assert config_path(None, {"COMPAT_HOOK_CONFIG": "/env.yaml"}) == ("/env.yaml", True)
    assert config_path(None, {"COMPAT_HOOK_CONFIG": ""}) == (DEFAULT_PATH, False)
    assert config_path(None, {}) == (DEFAULT_PATH, False)
    assert DEFAULT_PATH == "/etc/compat-hook/config.yaml"


def test_env_variable(tmp_path, monkeypatch):
    p = write(tmp_path, "mode: both\n")
    assert load(None, environ={"COMPAT_HOOK_CONFIG": p}).mode == "both"
    with pytest.raises(ConfigError, match="no such file"):
        load(None, environ={"COMPAT_HOOK_CONFIG": str(tmp_path / "nope.yaml")})
    monkeypatch.setenv("COMPAT_HOOK_CONFIG", p)
    assert load().mode == "both"


# -- the parse cache ----------------------------------------------------------------

def _count_parses(monkeypatch):
    calls = []
    real = config_mod._parse_yaml

    def counting(text, path):
        calls.append(text)
        return real(text, path)

    monkeypatch.setattr(config_mod, "_parse_yaml", counting)
    return calls


def test_cache_hit_only_for_identical_text(tmp_path, monkeypatch):
    calls = _count_parses(monkeypatch)
    state = str(tmp_path / "state")
    p = write(tmp_path, "mode: env\n")
    a = load(p, state_dir=state)
    b = load(p, state_dir=state)
    assert len(calls) == 1 and a.to_dict() == b.to_dict() and b.source == p
    assert len(glob.glob(os.path.join(state, "cache", "config-*.json"))) == 1
    write(tmp_path, "mode: env \n")  # one byte more, same meaning: still re-parsed
    load(p, state_dir=state)
    assert len(calls) == 2
    write(tmp_path, "mode: both\n")
    assert load(p, state_dir=state).mode == "both" and len(calls) == 3
    write(tmp_path, "mode: env\n")
    assert load(p, state_dir=state).mode == "env" and len(calls) == 4


def test_cache_is_per_path(tmp_path, monkeypatch):
    calls = _count_parses(monkeypatch)
    state = str(tmp_path / "state")
    a = write(tmp_path, "mode: env\n", "a.yaml")
    b = write(tmp_path, "mode: env\n", "b.yaml")
    load(a, state_dir=state), load(b, state_dir=state)
    assert len(calls) == 2
    assert load(b, state_dir=state).source == b and len(calls) == 2


def test_cached_bad_value_is_revalidated(tmp_path, monkeypatch):
    calls = _count_parses(monkeypatch)
    state = str(tmp_path / "state")
    p = write(tmp_path, "mode: env\n")
    load(p, state_dir=state)
    (entry,) = glob.glob(os.path.join(state, "cache", "config-*.json"))
    obj = json.load(open(entry))
    obj["data"] = {"mode": "nonsense"}
    json.dump(obj, open(entry, "w"))
    assert load(p, state_dir=state).mode == "env"
    assert len(calls) == 2


def test_cache_without_state_dir_writes_nothing(tmp_path):
    p = write(tmp_path, "mode: env\n")
    load(p)
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]


def test_invalid_file_is_not_cached(tmp_path):
    state = str(tmp_path / "state")
    p = write(tmp_path, "mode: nope\n")
    with pytest.raises(ConfigError):
        load(p, state_dir=state)
    assert glob.glob(os.path.join(state, "cache", "config-*.json")) == []


def test_load_for_start_falls_back_to_the_defaults_and_caches_only_valid_files(tmp_path):
    """What the hook and the wrapper read at a start: the file, else the defaults with what the
    registration fixed (asked for only then); the invalid text is never cached, the fixed one is used."""
    state = str(tmp_path / "state")
    p = write(tmp_path, "mode: env\n")
    asked = []

    def fixed():
        asked.append(1)
        return {"log_file": "/var/log/reg.log", "on_error": "fail", "runtime": "crun", "mode": "both"}

    def cached():
        return [json.load(open(e))["text"] for e in glob.glob(os.path.join(state, "cache", "config-*.json"))]

    cfg, err = load_for_start(p, state_dir=state, fixed=fixed)
    assert (cfg.mode, err, asked, cached()) == ("env", None, [], ["mode: env\n"])
    write(tmp_path, "mode: env\ndry_run: maybe\n")
    cfg, err = load_for_start(p, state_dir=state, fixed=fixed)
    assert isinstance(err, ConfigError) and str(err) == "dry_run: must be true or false, got 'maybe'"
    # Only the keys a registration fixes are taken from it; every other one is the default.
    assert cfg.to_dict() == dict(defaults().to_dict(), log_file="/var/log/reg.log", on_error="fail", runtime="crun")
    assert cfg.source == p and asked == [1] and cached() == ["mode: env\n"]
    write(tmp_path, "mode: both\n")
    cfg, err = load_for_start(p, state_dir=state, fixed=fixed)
    assert (cfg.mode, err, asked, cached()) == ("both", None, [1], ["mode: both\n"])
    # A missing named file is an error like any other; nothing fixed: the plain defaults.
    cfg, err = load_for_start(str(tmp_path / "gone.yaml"))
    assert cfg.to_dict() == defaults().to_dict() and str(err).endswith("gone.yaml: no such file")


# -- the rendered defaults ---------------------------------------------------------------

def test_render_default_yaml_parses_back_to_the_defaults():
    text = render_default_yaml()
    data = yaml.safe_load(text)
    assert set(data) == set(SCHEMA)
    assert from_mapping(data).to_dict() == defaults().to_dict()
    for key, (_, _, comment) in SCHEMA.items():
        assert f"# {comment}\n{key}:" in text


def test_shipped_config_file_matches_the_defaults():
    path = os.path.join(REPO, "config", "compat-hook.yaml")
    with open(path) as f:
        text = f.read()
    assert text == render_default_yaml()
    assert load(path).to_dict() == defaults().to_dict()
