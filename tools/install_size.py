"""What the device set and the host set cost to install: download MB, installed MB, install time (README,
"Supported platforms").

For each set (`pip install .` and `pip install ".[host]"`) in a fresh venv of this Python:
- download: the wheels pip fetches for it (`pip download` into an empty folder, edgetrain's own wheel left
  out), MB on the wire;
- installed: the venv's site-packages after the install minus a fresh venv's (pip itself), MB on disk;
- time: `pip install --no-cache-dir` wall-clock, from the package index as configured here (no wheel cache).

    python3.11 tools/install_size.py [--python python3.11] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETS = {"device": ".", "host": ".[host]"}


def tree_mb(path: Path) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = Path(root) / name
            if not p.is_symlink():
                total += p.stat().st_size
    return total / 1e6


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def measure(python: str, spec: str, work: Path) -> dict:
    venv = work / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "--quiet", "--upgrade", "pip"], check=True)
    before = tree_mb(site_packages(venv))
    t0 = time.monotonic()
    subprocess.run([*pip, "install", "--quiet", "--no-cache-dir", spec], check=True, cwd=REPO)
    seconds = time.monotonic() - t0
    installed = tree_mb(site_packages(venv)) - before
    dist = [line.split("==")[0] for line in subprocess.run([*pip, "freeze", "--exclude-editable"], check=True,
                                                            capture_output=True, text=True).stdout.splitlines()]
    has_mxnet = any(d.lower() == "mxnet" for d in dist)
    down = work / "download"
    subprocess.run([*pip, "download", "--quiet", "--no-cache-dir", "-d", str(down), spec], check=True, cwd=REPO)
    files = [p for p in down.iterdir() if not p.name.startswith("edgetrain")]
    biggest = sorted(files, key=lambda p: -p.stat().st_size)[:4]
    check = subprocess.run([*pip, "check"], capture_output=True, text=True)
    return {"spec": spec, "download_mb": round(sum(p.stat().st_size for p in files) / 1e6, 1),
            "installed_mb": round(installed, 1), "install_s": round(seconds, 1), "distributions": len(dist),
            "mxnet": has_mxnet, "largest_downloads": {p.name: round(p.stat().st_size / 1e6, 1) for p in biggest},
            "pip_check": check.stdout.strip() or check.stderr.strip()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    version = subprocess.run([args.python, "-c", "import platform; print(platform.python_version(), platform.machine())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    out = {"python": version, "sets": {}}
    for name, spec in SETS.items():
        work = Path(tempfile.mkdtemp(prefix=f"edgetrain-size-{name}-"))
        try:
            out["sets"][name] = r = measure(args.python, spec, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"{name:<7} pip install {spec!r:<10} download {r['download_mb']:7.1f} MB  installed {r['installed_mb']:7.1f} MB  "
              f"time {r['install_s']:6.1f} s  ({r['distributions']} distributions, mxnet {'yes' if r['mxnet'] else 'no'}; "
              f"pip check: {r['pip_check']})", flush=True)
        print(f"        largest downloads: {', '.join(f'{k} {v} MB' for k, v in r['largest_downloads'].items())}", flush=True)
    print(f"Python {version}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
