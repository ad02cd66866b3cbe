"""`edgetrain devices` end to end: a real child process started from an unrelated folder."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
import yaml

from edgetrain.devices import load_device


def run(*args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    proc = subprocess.run([sys.executable, "-m", "edgetrain", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def assert_user_error(code, out, err, *fragments):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_list_json(tmp_path):
    code, out, err = run("devices", "list", "--json", "-", cwd=tmp_path)
    assert code == 0, err
    profiles = {p["name"]: p for p in json.loads(out)["profiles"]}
    assert {"rpi3bplus", "rpi4b-4gb", "rpi5-8gb", "rpi-zero2w", "jetson-nano-5w", "jetson-nano-10w",
            "x86-64-generic"} <= set(profiles)
    assert profiles["rpi5-8gb"]["isa"]["dotprod"] is True
    assert profiles["rpi4b-4gb"]["power"]["idle_w"]["value"] > 0
    assert "NAME" in err and "rpi5-8gb" in err  # the table goes to stderr when stdout carries JSON


def test_list_human(tmp_path):
    code, out, err = run("devices", "list", cwd=tmp_path)
    assert code == 0, err
    assert "jetson-nano-5w" in out and "neon,dotprod" in out


def test_show_json_and_human(tmp_path):
    code, out, err = run("devices", "show", "rpi-zero2w", "--json", "-", cwd=tmp_path)
    assert code == 0, err
    data = json.loads(out)
    assert data["name"] == "rpi-zero2w" and data["ram_mb"] == 512
    assert data["power"]["load_w"]["kind"] == "estimate" and data["power"]["idle_w"]["source"]
    code, out, err = run("devices", "show", "rpi4b-4gb", cwd=tmp_path)
    assert code == 0 and "pidramble" in out and "source:" in out


def test_show_writes_json_file(tmp_path):
    target = tmp_path / "out" / "rpi5.json"
    target.parent.mkdir()
    code, out, err = run("devices", "show", "rpi5-8gb", "--json", target, cwd=tmp_path)
    assert code == 0, err
    assert json.loads(target.read_text())["cpu"].startswith("Cortex-A76")


def test_show_user_profile(tmp_path):
    data = load_device("rpi4b-4gb").to_dict()
    data["name"] = "my-pi"
    (tmp_path / "my-pi.yaml").write_text(yaml.safe_dump(data))
    code, out, err = run("devices", "show", "my-pi.yaml", "--json", "-", cwd=tmp_path)
    assert code == 0, err
    assert json.loads(out)["name"] == "my-pi"


def test_host_json(tmp_path):
    code, out, err = run("devices", "host", "--json", "-", cwd=tmp_path)
    assert code == 0, err
    data = json.loads(out)
    assert data["arch"] == platform.machine()
    assert data["cores_usable"] == len(os.sched_getaffinity(0))
    assert data["ram_mb"] > 0 and isinstance(data["emulated"], bool)
    assert "matched_profile" in data


def _mutate(path_parts, value):
    def change(d):
        *parents, last = path_parts
        for p in parents:
            d = d[p]
        if value is _DELETE:
            del d[last]
        else:
            d[last] = value
    return change


_DELETE = object()


@pytest.mark.parametrize("change,fragments", [
    (_mutate(["colour"], "blue"), ["unknown key 'colour'"]),
    (_mutate(["power", "idle_w", "watts"], 2.0), ["unknown key 'power.idle_w.watts'"]),
    (_mutate(["cores"], _DELETE), ["missing field 'cores'"]),
    (_mutate(["cores"], "four"), ["'cores'"]),
    (_mutate(["power", "load_w", "value"], 1.0), ["'power.load_w'", "below idle_w"]),
    (_mutate(["power", "idle_w", "value"], -1.0), ["'power.idle_w.value'"]),
    (_mutate(["default_threads"], 64), ["'default_threads'", "more than cores"]),
])
def test_bad_user_profile_is_exit_2_naming_file_and_field(tmp_path, change, fragments):
    data = load_device("rpi4b-4gb").to_dict()
    change(data)
    bad = tmp_path / "bad-board.yaml"
    bad.write_text(yaml.safe_dump(data))
    assert_user_error(*run("devices", "show", str(bad), cwd=tmp_path), "bad-board.yaml", *fragments)


def test_unknown_name_and_missing_file(tmp_path):
    assert_user_error(*run("devices", "show", "rpi9", cwd=tmp_path), "unknown device 'rpi9'", "rpi4b-4gb")
    assert_user_error(*run("devices", "show", "nowhere/x.yaml", cwd=tmp_path), "file not found", "x.yaml")


def test_invalid_yaml(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    assert_user_error(*run("devices", "show", str(bad), cwd=tmp_path), "not valid YAML", "broken.yaml")
