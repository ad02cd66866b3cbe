"""Running the CLI as a real child process and checking its user-facing errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def run_edgetrain(*args, cwd=None, env=None, timeout=600) -> CliResult:
    """Run `python -m edgetrain ARGS` as a real child process, as a user would."""
    full_env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "edgetrain", *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def assert_user_error(res: CliResult, code: int, *fragments: str) -> None:
    """A user's error: the given exit code, one `Error:` line on stderr, no traceback."""
    assert res.code == code, f"exit {res.code}, expected {code}\nstdout:{res.out}\nstderr:{res.err}"
    lines = [ln for ln in res.err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in res.err, res.err
    error_lines = [ln for ln in lines if ln.startswith("Error:")]
    assert len(error_lines) == 1, res.err
    for frag in fragments:
        assert frag in error_lines[0], f"{frag!r} not in {error_lines[0]!r}"


# A user's factory module whose net uses an operator mxnet 1.9.1's ONNX exporter cannot translate.
GROUPNORM_NET = (
    "from mxnet.gluon import nn\n"
    "def make():\n"
    "    net = nn.HybridSequential(prefix='gn_')\n"
    "    with net.name_scope():\n"
    "        net.add(nn.Conv2D(4, 3), nn.GroupNorm(num_groups=2), nn.GlobalAvgPool2D(), nn.Dense(3))\n"
    "    net.edgetrain_preprocess = {'input_shape': [1, 8, 8], 'mean': [0.5], 'std': [0.25]}\n"
    "    return net\n"
)


def edited_copies(doc, skip=()):
    """A result as edgetrain wrote it, edited by hand: for every leaf of ``doc`` (an empty list or object counts
    as one; the key paths in ``skip`` left alone), a copy with it changed to a value of another kind (cycling
    through NaN, -1, a string, null, [], {}, true) and a copy with it deleted, as (path, copy) pairs, each copy as
    it reads back from a file."""
    import copy

    def leaves(node, path=()):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else None
        if not items:
            yield path
            return
        for k, v in items:
            yield from leaves(v, path + (k,))

    kinds = [float("nan"), -1, "x", None, [], {}, True]
    for i, path in enumerate(p for p in leaves(doc) if not any(s in p for s in skip)):
        for value in (kinds[i % len(kinds)], "DELETE"):
            edited = copy.deepcopy(doc)
            node = edited
            for k in path[:-1]:
                node = node[k]
            if value == "DELETE":
                del node[path[-1]]
            elif node[path[-1]] == value:
                continue
            else:
                node[path[-1]] = value
            yield path, json.loads(json.dumps(edited))


def cli_commands(group=None, path: tuple = ()):
    """(path, click command) for every command of the CLI, groups walked (``("fleet", "serve")``)."""
    import click

    from edgetrain.cli import cli

    group = cli if group is None else group
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            yield from cli_commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd
