"""Hostile device profiles and recipes: refused fast with one line (exit 2), never a hang, never a
memory blow-up, never an error line that embeds the expanded input."""
from __future__ import annotations

import os
import threading
import time

import pytest

from clitools import assert_user_error
from edgetrain.devices import load_device
from edgetrain.errors import UsageError
from edgetrain.recipes import read_recipe
from hostile import gen

CASES = list(gen.hostile_yaml_cases())
READERS = {"device": load_device, "recipe": read_recipe}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_yaml_refused_fast(tmp_path, case, reader):
    _id, data = case
    f = tmp_path / "hostile.yaml"
    f.write_bytes(data)
    t0 = time.monotonic()
    with pytest.raises(UsageError) as info:
        READERS[reader](str(f))
    assert time.monotonic() - t0 < 10
    line = info.value.line()
    assert "\n" not in line and len(line) < 1000
    assert "lol" not in line  # the expansion never reaches the message


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "fifo", "folder.yaml"])
def test_device_file_that_never_ends_never_hangs(tmp_path, reader, special):
    if special == "fifo":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)  # nobody writes: a plain read would block forever
    elif special == "folder.yaml":
        path = tmp_path / "folder.yaml"
        path.mkdir()
    else:
        path = special
    result = {}

    def run():
        try:
            READERS[reader](str(path))
        except UsageError as exc:
            result["error"] = exc.line()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading hung"
    assert "error" in result


@pytest.mark.parametrize("command", [("devices", "show"), ("recipes", "validate")])
@pytest.mark.parametrize("case", ["billion-laughs", "deep-flow-100000", "latin1", "huge-scalar"])
def test_cli_one_line_exit_2(tmp_path, cli, command, case):
    data = dict(CASES)[case]
    f = tmp_path / "hostile.yaml"
    f.write_bytes(data)
    res = cli(*command, f, timeout=60)
    assert_user_error(res, 2)
    assert len(res.err) < 2000


@pytest.mark.parametrize("command", [("devices", "show"), ("recipes", "validate")])
def test_cli_dev_zero(cli, command):
    res = cli(*command, "/dev/zero", timeout=60)
    assert_user_error(res, 2, "not a regular file")


def test_modest_aliases_still_work(tmp_path):
    """The bound is on expansion, not on using anchors at all."""
    from edgetrain.fileio import parse_yaml

    text = "base: &b {a: 1, b: [1, 2, 3]}\nx: *b\ny: *b\nz: [*b, *b]\n"
    assert parse_yaml(text, "t")["z"][1]["b"] == [1, 2, 3]
