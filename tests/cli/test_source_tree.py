"""Run from a clone's top folder, `python -m edgetrain` imports the source tree, not the installed
package: the bundled profiles, recipes and data must be found there too."""
from __future__ import annotations

from pathlib import Path

from clitools import run_edgetrain

REPO = Path(__file__).resolve().parents[2]


def test_bundled_files_found_from_the_source_tree():
    res = run_edgetrain("devices", "show", "rpi4b-4gb", "--json", "-", cwd=REPO)
    assert res.code == 0, res.err
    assert res.json()["name"] == "rpi4b-4gb"
    res = run_edgetrain("recipes", "validate", "quickstart", cwd=REPO)
    assert res.code == 0, res.err


def test_the_quickstarts_run_folder_is_ignored_by_git_in_a_clone(tmp_path, monkeypatch):
    """The README's quickstart, run in a clone's top folder, leaves edgetrain-run-quickstart (then -2, -3...):
    git ignores each folder `edgetrain run` would name there (issue 37), and still sees the project's files."""
    import shutil
    import subprocess

    import pytest

    from edgetrain.ops import run

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git clone")
    monkeypatch.chdir(tmp_path)
    first = run._new_rundir("quickstart")
    first.mkdir()
    names = [str(first), str(run._new_rundir("quickstart")), "edgetrain/api.py", "recipes/quickstart.yaml"]
    paths = [f"{n}/result.json" if n.startswith("edgetrain-run") else n for n in names]
    proc = subprocess.run(["git", "check-ignore", "--no-index", "-v", *paths], cwd=REPO, capture_output=True, text=True)
    ignored = [line.rsplit("\t", 1)[-1] for line in proc.stdout.splitlines()]
    assert ignored == paths[:2], proc.stdout + proc.stderr
