"""Issue 26 item 5: the closing hostile campaign (2026-12), aimed at what changed since the last one.

Runs each case as a real child process (`python -m edgetrain ...`, or a short API script) and checks the
project's promise (DESIGN.md): a mistake is one `Error: <what> (<where>); <how to fix>` line on stderr, no
traceback, exit 2 / 1 / 3, 0 only when the result is right; nothing half-written; no input modified; no hang.

    python tests/hostile/campaign_2026_12.py [-k SUBSTRING] [-j JOBS]

prints one line per case (id, command, expected, got, PASS/FAIL) and the totals. Cases are small
(builtin:digits, the shipped 16x16 digits base exported to ONNX, 1 epoch, `timeout 120`).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
PY = os.environ.get("CAMPAIGN_PYTHON", "/work/main/.venv/bin/python")
TIMEOUT = 120
ROOT = Path(tempfile.mkdtemp(prefix="campaign-"))


def env(extra=None):
    e = dict(os.environ, PYTHONPATH=str(REPO), EDGETRAIN_CACHE_DIR=str(ROOT / "cache"), PYTHONUNBUFFERED="1")
    e.update(extra or {})
    return e


def sha(path) -> str:
    p = Path(path)
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "-"


class Case:
    def __init__(self, cid, args, expect, *, check=None, stdin=None, extra_env=None, cwd=None, preexec=None,
                 api=None, keep=(), shell=None, timeout=TIMEOUT):
        self.id, self.args, self.expect = cid, list(args), (expect if isinstance(expect, tuple) else (expect,))
        self.check, self.stdin, self.extra_env, self.cwd, self.preexec = check, stdin, extra_env, cwd, preexec
        self.api, self.keep, self.shell, self.timeout = api, keep, shell, timeout

    def command(self) -> str:
        if self.api:
            return "python -c " + shlex.quote(self.api.strip().replace("\n", "; ")[:90])
        if self.shell:
            return self.shell[:110]
        return "edgetrain " + " ".join(shlex.quote(str(a)) for a in self.args)[:110]

    def run(self):
        before = {str(p): sha(p) for p in self.keep}
        if self.api:
            argv = [PY, "-c", self.api]
        elif self.shell:
            argv = ["bash", "-c", self.shell]
        else:
            argv = [PY, "-m", "edgetrain", *map(str, self.args)]
        t0 = time.time()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if self.stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(self.extra_env),
                                    cwd=self.cwd or ROOT, preexec_fn=self.preexec, start_new_session=True)
            out, err = proc.communicate(self.stdin, timeout=self.timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            code = "hang"
        dt = time.time() - t0
        err_s = err.decode("utf-8", "replace")
        problems = []
        if code not in self.expect:
            problems.append(f"exit {code}")
        if "Traceback" in err_s:
            problems.append("traceback: " + err_s.strip().splitlines()[-1][:120])
        if code in (1, 2, 3) and code not in ("hang",):
            errs = [ln for ln in err_s.splitlines() if ln.startswith("Error:")]
            if code == 2 and len(errs) != 1 and not self.api:
                problems.append(f"{len(errs)} Error: lines")
        for p, h in before.items():
            if sha(p) != h:
                problems.append(f"input modified: {p}")
        if self.check and not problems:
            try:
                msg = self.check(out, err_s, code)
            except Exception as exc:  # a check that cannot run is a failure of the case
                msg = f"check raised {type(exc).__name__}: {exc}"
            if msg:
                problems.append(msg)
        last = (err_s.strip().splitlines() or [""])[-1][:150]
        return code, problems, last, dt


# --- fixtures -------------------------------------------------------------------------------------------

def fixtures():
    ROOT.joinpath("cache").mkdir(exist_ok=True)
    base = ROOT / "d5.onnx"
    shared = Path("/tmp/camp/d5.onnx")
    if shared.is_file():
        base.write_bytes(shared.read_bytes())
    else:
        subprocess.run([PY, "-m", "edgetrain", "export", "edgetrain.nets:pretrained_digits", "-o", base],
                       env=env(), check=True, capture_output=True, timeout=600)
    return base


def onnx_variant(base: Path, name: str, edit) -> Path:
    import onnx
    m = onnx.load(str(base))
    edit(m)
    out = ROOT / name
    onnx.save(m, str(out))
    return out


def set_meta(m, key, value):
    for p in m.metadata_props:
        if p.key == key:
            p.value = value
            return
    m.metadata_props.add(key=key, value=value)


def edit_pre(**changes):
    def edit(m):
        for p in m.metadata_props:
            if p.key == "edgetrain.preprocess":
                d = json.loads(p.value)
                d.update(changes)
                p.value = json.dumps(d)
    return edit


def nan_weights(m):
    from onnx import numpy_helper
    for i, t in enumerate(m.graph.initializer):
        if t.name == "digits_dense0_weight":
            a = numpy_helper.to_array(t).copy()
            a[0, 0] = np.nan
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(a, t.name))


def png(path: Path, mode: str, size=(16, 16), **kw):
    from PIL import Image
    arr = (np.arange(size[0] * size[1]) % 256).reshape(size).astype(np.uint8)
    img = Image.fromarray(arr, "L").convert(mode) if mode not in ("I;16", "I;16B") else Image.fromarray(
        arr.astype(np.uint16) * 257, "I;16")
    img.save(path, **kw)
    return path


def power_log(path: Path, header: str, rows, encoding="utf-8", newline="\n", bom=b""):
    text = newline.join([header, *rows]) + newline
    path.write_bytes(bom + text.encode(encoding))
    return path


def log_rows(fmt_t=lambda t: f"{t:.3f}", fmt_w=lambda w: f"{w:.3f}", span=(-120, 900), step=0.5, sep=","):
    now = time.time()
    t = now + span[0]
    rows = []
    while t < now + span[1]:
        rows.append(f"{fmt_t(t)}{sep}{fmt_w(2.5)}")
        t += step
    return rows


# --- checks ---------------------------------------------------------------------------------------------

def no_file(path):
    def check(out, err, code):
        return f"left {path}" if code != 0 and Path(path).exists() else ""
    return check


def all_of(*checks):
    def check(out, err, code):
        for c in checks:
            m = c(out, err, code)
            if m:
                return m
        return ""
    return check


def stdout_has(text):
    def check(out, err, code):
        return "" if text.encode() in out else f"stdout lacks {text!r}"
    return check


def finite_json(path):
    def check(out, err, code):
        if not Path(path).exists():
            return ""
        d = json.loads(Path(path).read_text())
        s = json.dumps(d)
        return "non-finite figure in JSON" if ("NaN" in s or "Infinity" in s) else ""
    return check


def energy_sane(path, max_w=100.0):
    def check(out, err, code):
        if code != 0:
            return ""
        d = json.loads(Path(path).read_text())

        def walk(x, key=""):
            if isinstance(x, dict):
                for k, v in x.items():
                    yield from walk(v, k)
            elif isinstance(x, list):
                for v in x:
                    yield from walk(v, key)
            elif isinstance(x, (int, float)) and not isinstance(x, bool):
                yield key, x
        bad = [(k, v) for k, v in walk(d) if ("watt" in k.lower() or k.lower().endswith("_w")) and abs(v) > max_w]
        return f"energy figure {bad[0]} accepted" if bad else ""
    return check


# --- cases ----------------------------------------------------------------------------------------------

def cases(base: Path):
    R = ROOT
    C = []
    ft = ["finetune", base, "--data", "builtin:digits", "--epochs", "1", "--train-layers", "bias"]

    # -- fine-tuning from ONNX: option values at their limits
    for i, tl in enumerate(["last:0", "last:-1", "last:99999", "last:", "last:1.5", "LITE", "head,bias", "",
                            "last:99999999999999999999"]):
        C.append(Case(f"ft-train-layers-{i}", ["finetune", base, "--data", "builtin:digits", "--epochs", "1",
                                              "--train-layers", tl, "-o", R / f"tl{i}"], (0, 2) if tl == "LITE" else (2,),
                      check=no_file(R / f"tl{i}" / "model.onnx"), keep=[base]))
    for i, mb in enumerate(["0", "-5", "0.0001", "nan", "inf", "1e400MB", "99999999999TB", "12QB", "1e-9GB"]):
        C.append(Case(f"ft-membudget-{i}", [*ft, "--memory-budget", mb, "-o", R / f"mb{i}"],
                      (0, 2, 3) if "TB" in mb else (2, 3), keep=[base]))
    for i, (opt, val) in enumerate([("--epochs", "0"), ("--epochs", "-1"), ("--batch-size", "0"),
                                    ("--lr", "nan"), ("--lr", "inf"), ("--lr", "-0.1"), ("--lr", "0"),
                                    ("--val-split", "1"), ("--val-split", "0"), ("--val-split", "nan"),
                                    ("--val-split", "0.999"), ("--seed", str(2 ** 32)), ("--seed", "-1"),
                                    ("--batch-size", "99999999999999999999"), ("--epochs", "1e3"),
                                    ("--lr", "1e308")]):
        # a learning rate that makes the loss NaN is a run that failed (exit 1, "training diverged")
        C.append(Case(f"ft-opt-{i}{opt}={val}", [*ft, opt, val, "-o", R / f"opt{i}"], (1, 2, 3) if val == "1e308" else (2, 3),
                      check=(finite_json(R / f"opt{i}" / "metrics.json") if val in ("1e308",) else None), keep=[base]))

    # -- hostile ONNX files, for finetune and predict
    raw = base.read_bytes()
    (R / "trunc.onnx").write_bytes(raw[: len(raw) // 2])
    (R / "trunc10.onnx").write_bytes(raw[:10])
    (R / "empty.onnx").write_bytes(b"")
    (R / "dir.onnx").mkdir()
    (R / "zip.onnx").write_bytes(b"PK\x03\x04" + bytes(100))
    nanw = onnx_variant(base, "nanw.onnx", nan_weights)
    variants = {
        "nanw": nanw,
        "meta-mean-nan": onnx_variant(base, "mnan.onnx", edit_pre(mean=[float("nan")])),
        "meta-std-0": onnx_variant(base, "std0.onnx", edit_pre(std=[0.0])),
        "meta-std-str": onnx_variant(base, "stds.onnx", edit_pre(std="x")),
        "meta-shape-0": onnx_variant(base, "sh0.onnx", edit_pre(input_shape=[1, 0, 16])),
        "meta-shape-neg": onnx_variant(base, "shn.onnx", edit_pre(input_shape=[1, -16, 16])),
        "meta-shape-3ch": onnx_variant(base, "sh3.onnx", edit_pre(input_shape=[3, 16, 16])),
        "meta-classes-short": onnx_variant(base, "cls2.onnx", edit_pre(class_names=["a", "b"])),
        "meta-classes-dup": onnx_variant(base, "clsd.onnx", edit_pre(class_names=["a", "a", "a", "a", "a"])),
        "meta-classes-int": onnx_variant(base, "clsi.onnx", edit_pre(class_names=[1, 2, 3, 4, 5])),
        "meta-notjson": onnx_variant(base, "nj.onnx", lambda m: set_meta(m, "edgetrain.preprocess", "{not json")),
        "meta-list": onnx_variant(base, "ml.onnx", lambda m: set_meta(m, "edgetrain.preprocess", "[1,2]")),
        "meta-numcls-str": onnx_variant(base, "ncs.onnx", lambda m: set_meta(m, "edgetrain.num_classes", "five")),
        "meta-layout-nhwc": onnx_variant(base, "nhwc.onnx", edit_pre(layout="NHWC")),
        "meta-range": onnx_variant(base, "rng.onnx", edit_pre(pixel_range="0..65535")),
        "meta-resize": onnx_variant(base, "rsz.onnx", edit_pre(resize="lanczos9")),
        "meta-precision": onnx_variant(base, "prec.onnx", lambda m: set_meta(m, "edgetrain.precision", "int8")),
        "meta-huge-shape": onnx_variant(base, "hs.onnx", edit_pre(input_shape=[1, 100000, 100000])),
    }
    for name, path in [("trunc", R / "trunc.onnx"), ("trunc10", R / "trunc10.onnx"), ("empty", R / "empty.onnx"),
                       ("dir", R / "dir.onnx"), ("zip", R / "zip.onnx")]:
        C.append(Case(f"ft-onnx-{name}", ["finetune", path, "--data", "builtin:digits", "--epochs", "1",
                                          "--train-layers", "bias", "-o", R / f"fto-{name}"], (2,),
                      check=no_file(R / f"fto-{name}"), keep=[path]))
        C.append(Case(f"predict-onnx-{name}", ["predict", path, "builtin:digits"], (2,), keep=[path]))
    for name, path in variants.items():
        # recorded fields edgetrain does not use (layout, resize, pixel_range, precision, num_classes) and class
        # names of another type are no wrong answer: an answer or a refusal
        exp_ok = name in ("meta-classes-dup", "meta-classes-int", "meta-numcls-str", "meta-layout-nhwc", "meta-range",
                          "meta-resize", "meta-precision", "meta-classes-short")
        C.append(Case(f"predict-{name}", ["predict", path, "builtin:digits", "--top-k", "1", "--format", "csv"],
                      (0, 2) if exp_ok else (2, 3), keep=[path],
                      check=lambda o, e, c: "nan scores written" if b"nan" in o.lower() else ""))
        for tl in ("bias", "lite"):
            C.append(Case(f"ft-{tl}-{name}", ["finetune", path, "--data", "builtin:digits", "--epochs", "1",
                                              "--train-layers", tl, "-o", R / f"ftv-{tl}-{name}"],
                          (0, 2, 3) if exp_ok else (2, 3), keep=[path]))

    # -- outputs that alias inputs by other spellings
    (R / "alias").mkdir()
    (R / "alias" / "sub").mkdir()
    (R / "alias" / "model.onnx").write_bytes(raw)
    (R / "alias" / "sub").joinpath("x").write_text("")
    os.symlink(R / "alias", R / "alias-link")
    os.link(R / "alias" / "model.onnx", R / "hard.onnx")
    am = R / "alias" / "model.onnx"
    C.append(Case("ft-out-is-model-folder", ["finetune", am, "--data", "builtin:digits", "--epochs", "1",
                                             "--train-layers", "bias", "-o", R / "alias"], (2,), keep=[am]))
    C.append(Case("ft-out-via-symlink-folder", ["finetune", am, "--data", "builtin:digits", "--epochs", "1",
                                                "--train-layers", "bias", "-o", R / "alias-link"], (2,), keep=[am]))
    C.append(Case("ft-out-dotdot", ["finetune", "alias/model.onnx", "--data", "builtin:digits", "--epochs", "1",
                                    "--train-layers", "bias", "-o", "alias/sub/.."], (2,), keep=[am]))
    C.append(Case("ft-json-onto-model-hardlink", [*ft[:1], am, *ft[2:], "-o", R / "hj", "--json", R / "hard.onnx"],
                  (2,), keep=[am, R / "hard.onnx"]))
    C.append(Case("predict-o-model-dotdot", ["predict", "alias/model.onnx", "builtin:digits", "-o",
                                             "alias/sub/../model.onnx"], (2,), keep=[am]))
    C.append(Case("predict-o-model-hardlink", ["predict", am, "builtin:digits", "-o", R / "hard.onnx"], (2,),
                  keep=[am, R / "hard.onnx"]))
    C.append(Case("predict-json-model-symlinkdir", ["predict", am, "builtin:digits", "--json",
                                                    R / "alias-link" / "model.onnx"], (2,), keep=[am]))
    C.append(Case("predict-o-equals-json", ["predict", am, "builtin:digits", "-o", R / "same.out", "--json",
                                            R / "same.out"], (2,), check=no_file(R / "same.out")))
    # predict -o onto an image of DATA reached through a symlinked folder
    imgs = R / "imgs"
    for k in ("a", "b"):
        (imgs / k).mkdir(parents=True)
        for j in range(3):
            png(imgs / k / f"{j}.png", "L")
    os.symlink(imgs, R / "imgs-link")
    C.append(Case("predict-o-image-via-link", ["predict", base, imgs, "-o", R / "imgs-link" / "a" / "0.png"], (2,),
                  keep=[imgs / "a" / "0.png"]))
    C.append(Case("predict-stdin-o-listed-image-rel", ["predict", base, "-", "-o", "imgs/b/1.png"], (2,),
                  stdin=b"imgs-link/b/1.png\n", keep=[imgs / "b" / "1.png"]))
    C.append(Case("ft-json-onto-power-log", [*ft, "-o", R / "jpl", "--power-log", R / "pl-ok.csv",
                                             "--json", R / "pl-ok.csv"], (2,), keep=[R / "pl-ok.csv"]))

    # -- predict: stdin, formats, odd images, odd npz
    C.append(Case("predict-stdin-crlf", ["predict", base, "-", "--format", "csv", "--top-k", "1"], (0,),
                  stdin=b"imgs/a/0.png\r\nimgs/b/0.png\r\n", check=stdout_has("imgs/b/0.png")))
    C.append(Case("predict-stdin-blank-lines", ["predict", base, "-", "--format", "jsonl"], (0, 2),
                  stdin=b"\n\nimgs/a/0.png\n\n"))
    C.append(Case("predict-stdin-empty", ["predict", base, "-"], (2,), stdin=b""))
    C.append(Case("predict-stdin-folder-line", ["predict", base, "-"], (2,), stdin=b"imgs\n"))
    C.append(Case("predict-stdin-missing", ["predict", base, "-"], (2,), stdin=b"imgs/a/0.png\nnope.png\n"))
    C.append(Case("predict-stdin-bom", ["predict", base, "-", "--top-k", "1"], (0, 2),
                  stdin=b"\xef\xbb\xbfimgs/a/0.png\n"))
    for k in ("0", "-1", "6", "1000000000000"):
        C.append(Case(f"predict-topk-{k}", ["predict", base, "builtin:digits", "--top-k", k], (0, 2)
                      if k in ("6", "1000000000000") else (2,)))
    for b in ("0", "-3", "100000000", "1"):
        C.append(Case(f"predict-batch-{b}", ["predict", base, "builtin:digits", "--batch", b, "--top-k", "1",
                                             "--format", "csv", "-o", R / f"pb{b}.csv"],
                      (0,) if b == "1" else (2,), timeout=180))
    odd = R / "odd"
    odd.mkdir()
    for mode, ext, kw in [("CMYK", "jpg", {}), ("1", "png", {}), ("I;16", "png", {}), ("LA", "png", {}),
                          ("RGBA", "webp", {}), ("P", "gif", {}), ("F", "tiff", {}), ("I", "tiff", {}),
                          ("YCbCr", "jpg", {}), ("RGB", "bmp", {}), ("L", "tiff", {"compression": "tiff_lzw"})]:
        p = odd / f"m-{mode.replace(';', '')}.{ext}"
        try:
            png(p, mode, **kw)
        except Exception:
            continue
        C.append(Case(f"predict-image-{mode}-{ext}", ["predict", base, p, "--top-k", "1", "--format", "jsonl"],
                      (0, 2), check=lambda o, e, c: "" if c == 2 or b'"top"' in o or b"top1" in o or o.strip() else
                      "no prediction"))
    # animated GIF and multi-page TIFF: first frame or refusal
    from PIL import Image
    frames = [Image.new("L", (16, 16), v) for v in (0, 255)]
    frames[0].save(odd / "anim.gif", save_all=True, append_images=frames[1:])
    frames[0].save(odd / "multi.tiff", save_all=True, append_images=frames[1:])
    (odd / "zero.png").write_bytes(b"")
    for n in ("anim.gif", "multi.tiff"):
        C.append(Case(f"predict-image-{n}", ["predict", base, odd / n], (0, 2)))
    C.append(Case("predict-image-empty-file", ["predict", base, odd / "zero.png"], (2,)))
    # npz
    npzs = {
        "object": dict(data=np.array([np.zeros((8, 8)), np.zeros((4, 4))], dtype=object), label=np.array([0, 1])),
        "mismatch": dict(data=np.random.rand(10, 8, 8).astype("float32"), label=np.arange(7) % 2),
        "labels-float": dict(data=np.random.rand(6, 8, 8).astype("float32"), label=np.array([0, 1, 0.5, 1, 0, 1])),
        "labels-nan": dict(data=np.random.rand(6, 8, 8).astype("float32"), label=np.array([0, 1, np.nan, 1, 0, 1])),
        "labels-neg": dict(data=np.random.rand(6, 8, 8).astype("float32"), label=np.array([0, 1, -1, 1, 0, 1])),
        "labels-str": dict(data=np.random.rand(6, 8, 8).astype("float32"), label=np.array(list("ababab"))),
        "labels-2d": dict(data=np.random.rand(6, 8, 8).astype("float32"), label=np.zeros((6, 2), "int64")),
        "data-bool": dict(data=np.random.rand(6, 8, 8) > 0.5, label=np.arange(6) % 2),
        "data-complex": dict(data=np.random.rand(6, 8, 8).astype("complex64"), label=np.arange(6) % 2),
        "data-str": dict(data=np.array([["x"] * 8] * 6), label=np.arange(6) % 2),
        "data-0samples": dict(data=np.zeros((0, 8, 8), "float32"), label=np.zeros(0, "int64")),
        "data-1d": dict(data=np.random.rand(64).astype("float32"), label=np.arange(64) % 2),
        "data-5d": dict(data=np.random.rand(2, 2, 1, 8, 8).astype("float32"), label=np.arange(2)),
        "data-zero-size-hw": dict(data=np.zeros((4, 0, 8), "float32"), label=np.arange(4) % 2),
        "data-scalar": dict(data=np.float32(1.0), label=np.int64(0)),
        "data-datetime": dict(data=np.zeros((4, 8, 8), "datetime64[s]"), label=np.arange(4) % 2),
        "classnames-object": dict(data=np.random.rand(4, 8, 8).astype("float32"), label=np.arange(4) % 2,
                                  class_names=np.array([None, {"a": 1}], dtype=object)),
    }
    for name, arrays in npzs.items():
        p = R / f"n-{name}.npz"
        np.savez(p, **arrays)
        C.append(Case(f"predict-npz-{name}", ["predict", base, p, "--top-k", "1"], (2,), keep=[p]))
        C.append(Case(f"ft-npz-{name}", ["finetune", base, "--data", p, "--epochs", "1", "--train-layers", "bias",
                                         "-o", R / f"ftn-{name}"], (2,), keep=[p],
                      check=no_file(R / f"ftn-{name}" / "model.onnx")))
    # npz whose zip holds a pickled object array only behind a name with a path
    with zipfile.ZipFile(R / "n-traversal.npz", "w") as zf:
        buf = io.BytesIO()
        np.save(buf, np.zeros((4, 8, 8), "float32"))
        zf.writestr("../data.npy", buf.getvalue())
        buf = io.BytesIO()
        np.save(buf, np.arange(4) % 2)
        zf.writestr("label.npy", buf.getvalue())
    C.append(Case("predict-npz-traversal-name", ["predict", base, R / "n-traversal.npz"], (2,)))

    # -- meter logs (finetune --power-log; a good log covers the run and gives exit 0)
    plo = power_log(R / "pl-ok.csv", "timestamp,power (W)", log_rows())
    logs = {
        "crlf": (power_log(R / "pl-crlf.csv", "timestamp,power (W)", log_rows(), newline="\r\n"), (0,)),
        "cr-only": (power_log(R / "pl-cr.csv", "timestamp,power (W)", log_rows(), newline="\r"), (0,)),
        "utf8-bom": (power_log(R / "pl-bom.csv", "timestamp,power (W)", log_rows(), bom=b"\xef\xbb\xbf"), (0,)),
        "utf16-bom": (power_log(R / "pl-u16.csv", "timestamp,power (W)", log_rows(), encoding="utf-16"), (0, 2)),
        "latin1-micro": (power_log(R / "pl-l1.csv", "timestamp,voltage (V),current (\xb5A)",
                                   [r + ",1000000" for r in log_rows()], encoding="latin-1"), (0, 2)),
        "unix-us-no-unit": (power_log(R / "pl-us.csv", "timestamp,power (W)",
                                      log_rows(fmt_t=lambda t: f"{t * 1e6:.0f}")), (0, 2)),
        "unix-ns-unit": (power_log(R / "pl-ns.csv", "timestamp (ns),power (W)",
                                   log_rows(fmt_t=lambda t: f"{t * 1e9:.0f}")), (0, 2)),
        "time-minutes-unit": (power_log(R / "pl-min.csv", "time (min),power (W)",
                                        log_rows(fmt_t=lambda t: f"{t / 60:.5f}")), (0, 2)),
        "huge-power": (power_log(R / "pl-huge.csv", "timestamp,power (W)", log_rows(fmt_w=lambda w: "1e30")), (2,)),
        "huge-kw": (power_log(R / "pl-kw.csv", "timestamp,power (kW)", log_rows(fmt_w=lambda w: "1e306")), (2,)),
        "nan-power": (power_log(R / "pl-nan.csv", "timestamp,power (W)", log_rows(fmt_w=lambda w: "nan")), (2,)),
        "nan-time": (power_log(R / "pl-nant.csv", "timestamp,power (W)", ["nan,1.0", "nan,1.0"]), (2,)),
        "decimal-comma": (power_log(R / "pl-dc.csv", "timestamp;power (W)",
                                    [r.replace(",", ";").replace(".", ",") for r in log_rows()]), (0, 2)),
        "backwards-big": (power_log(R / "pl-back.csv", "timestamp,power (W)",
                                    log_rows()[:100] + log_rows(span=(-1000, 900))), (2,)),
        "year-1": (power_log(R / "pl-y1.csv", "timestamp,power (W)",
                             ["0001-01-01T00:00:00,1.0", "0001-01-01T00:00:01,1.0"]), (2,)),
        "year-9999": (power_log(R / "pl-y9.csv", "timestamp,power (W)",
                                ["9999-12-31T23:59:58,1.0", "9999-12-31T23:59:59,1.0"]), (2,)),
        "mixed-tz": (power_log(R / "pl-tz.csv", "timestamp,power (W)",
                               ["2026-12-03T10:00:00+00:00,1", "2026-12-03T10:00:01,1"]), (2,)),
        "dup-times": (power_log(R / "pl-dup.csv", "timestamp,power (W)", [f"{time.time():.0f},1"] * 50), (2,)),
        "header-only": (power_log(R / "pl-ho.csv", "timestamp,power (W)", []), (2,)),
        "negative-current": (power_log(R / "pl-negi.csv", "timestamp,voltage (V),current (A)",
                                       [r + ",-0.5" for r in log_rows()]), (0, 2)),
        "two-power-cols": (power_log(R / "pl-2p.csv", "timestamp,power (mW),power (W)",
                                     [r + ",2.5" for r in log_rows(fmt_w=lambda w: "2500")]), (0,)),
        "very-long-line": (power_log(R / "pl-long.csv", "timestamp,power (W)",
                                     [f"{time.time():.0f}," + "9" * 5000000]), (2,)),
    }
    for name, (path, exp) in logs.items():
        out = R / f"ftpl-{name}"
        C.append(Case(f"ft-powerlog-{name}", [*ft, "-o", out, "--power-log", path, "--json", out.with_suffix(".json")],
                      exp, keep=[path], check=energy_sane(out.with_suffix(".json"))))
    fifo = R / "pl-fifo.csv"
    os.mkfifo(fifo)
    C.append(Case("ft-powerlog-fifo-no-writer", [*ft, "-o", R / "ftpl-fifo", "--power-log", fifo], (2,), timeout=90))
    C.append(Case("ft-powerlog-dev-zero", [*ft, "-o", R / "ftpl-zero", "--power-log", "/dev/zero"], (2,), timeout=90,
                  preexec=lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_AS,
                                                                    (3 << 30, 3 << 30))))
    C.append(Case("ft-powerlog-dev-null", [*ft, "-o", R / "ftpl-null", "--power-log", "/dev/null"], (2,)))
    C.append(Case("ft-powerlog-ok", [*ft, "-o", R / "ftpl-ok", "--power-log", plo], (0,), keep=[plo]))
    for g in ("nan", "-1", "inf", "1e400", "0", "100000000"):
        C.append(Case(f"ft-grid-intensity-{g}", [*ft, "-o", R / f"gi{g}", "--grid-intensity", g, "--device",
                                                 "rpi4b-4gb"], (0, 2) if g in ("0",) else (2,)))
    for cty in ("XX", "de", "D", "DEUX", "", "ÄÖ"):
        C.append(Case(f"ft-country-{cty or 'empty'}", [*ft, "-o", R / f"cty{cty}", "--country", cty, "--device",
                                                       "rpi4b-4gb"], (0,) if cty == "de" else (2,)))
    C.append(Case("ft-country-and-grid", [*ft, "-o", R / "cg", "--country", "DE", "--grid-intensity", "300"], (2,)))
    for v in ("nan", "-1", "0", "inf"):
        C.append(Case(f"profile-battery-{v}", ["profile", base, "--device", "rpi4b-4gb", "--runs", "3", "--warmup",
                                               "0", "--battery-wh", v], (2,)))
    for v in ("0/h", "-5/h", "nan/h", "1e400/h", "5/min", "5"):
        C.append(Case(f"profile-rate-{v}", ["profile", base, "--device", "rpi4b-4gb", "--runs", "3", "--warmup",
                                            "0", "--rate", v], (0, 2) if v in ("5",) else (2,)))
    for v in ("nan", "-1", "inf"):
        C.append(Case(f"profile-budget-mj-{v}", ["profile", base, "--runs", "3", "--warmup", "0", "--budget-mj", v],
                      (2,)))
    for v in ("0", "-1", "nan", "1e-9"):
        C.append(Case(f"profile-timeout-{v}", ["profile", base, "--runs", "3", "--warmup", "0", "--timeout", v],
                      (1, 2) if v == "1e-9" else (2,)))
    for v in ("0", "0,1", "1,,2", "1000000", "-1"):
        C.append(Case(f"profile-threads-{v}", ["profile", base, "--runs", "3", "--warmup", "0", "--threads", v],
                      (0, 2) if v == "1000000" else (2,)))

    # -- more outputs and names
    os.symlink("/dev/zero", R / "pl-zero-link.csv")
    C.append(Case("ft-powerlog-symlink-to-dev-zero", [*ft, "-o", R / "ftpl-zl", "--power-log", R / "pl-zero-link.csv"],
                  (2,), timeout=90))
    os.symlink(R / "dangling-target.csv", R / "dangling.csv")
    C.append(Case("predict-o-dangling-symlink", ["predict", base, "builtin:digits", "--format", "csv", "-o",
                                                 R / "dangling.csv"], (0, 2),
                  check=lambda o, e, c: "" if c != 0 or (os.path.islink(R / "dangling.csv") and
                                                         (R / "dangling-target.csv").is_file()) else
                  "symlink replaced or target not written"))
    ro = R / "readonly"
    ro.mkdir()
    os.chmod(ro, 0o555)
    C.append(Case("predict-o-readonly-dir", ["predict", base, "builtin:digits", "-o", ro / "p.csv"],
                  (2,) if os.geteuid() else (0, 2)))
    C.append(Case("ft-data-stdin-dash", ["finetune", base, "--data", "-", "--epochs", "1", "-o", R / "fds"], (2,)))
    C.append(Case("ft-out-dev-null", [*ft, "-o", "/dev/null"], (2,)))
    C.append(Case("predict-stdin-nul", ["predict", base, "-"], (2,), stdin=b"imgs/a/0.png\x00x\n"))
    names = R / "names"
    (names / "c").mkdir(parents=True)
    weird = ["a,b.png", 'q"x.png', "new\nline.png", " lead.png", "tab\t.png"]
    for n in weird:
        png(names / "c" / n, "L")
    (names / "d").mkdir()
    png(names / "d" / "plain.png", "L")

    def csv_rows(path, count):
        def check(out, err, code):
            import csv as _csv
            rows = list(_csv.reader(io.StringIO(Path(path).read_text(), newline="")))
            got = sorted(r[0].rsplit("/", 1)[-1] for r in rows[1:])
            want = sorted([*weird, "plain.png"])
            return "" if len(rows) == count + 1 and got == want else f"csv rows {len(rows) - 1} names {got[:3]}"
        return check

    def jsonl_rows(path):
        def check(out, err, code):
            rows = [json.loads(x) for x in Path(path).read_text().splitlines()]
            got = sorted(r["input"].rsplit("/", 1)[-1] for r in rows)
            return "" if got == sorted([*weird, "plain.png"]) else f"jsonl names {got[:3]}"
        return check
    C.append(Case("predict-csv-weird-names", ["predict", base, names, "--format", "csv", "-o", R / "wn.csv"], (0,),
                  check=csv_rows(R / "wn.csv", len(weird) + 1)))
    C.append(Case("predict-jsonl-weird-names", ["predict", base, names, "--format", "jsonl", "-o", R / "wn.jsonl"],
                  (0,), check=jsonl_rows(R / "wn.jsonl")))

    # -- names over NAME_MAX in every option that names a file
    long = "L" * 300
    for cid, argv in [("predict-o", ["predict", base, "builtin:digits", "-o", R / f"{long}.csv"]),
                      ("predict-json", ["predict", base, "builtin:digits", "--json", R / f"{long}.json"]),
                      ("profile-report", ["profile", base, "--runs", "2", "--warmup", "0", "--report", R / f"{long}.md"]),
                      ("quantize-o", ["quantize", base, "--calib", "builtin:digits", "-o", R / f"{long}.onnx"]),
                      ("ft-o-inner", [*ft, "-o", R / long / "run"]),
                      ("ft-power-log", [*ft, "-o", R / "lnpl", "--power-log", R / f"{long}.csv"])]:
        C.append(Case(f"long-name-{cid}", argv, (2,)))
    # -- output folders inside DATA, options an ONNX file fixes
    C.append(Case("ft-out-inside-data", ["finetune", base, "--data", imgs, "--epochs", "1", "--train-layers", "bias",
                                         "-o", imgs / "run"], (2,),
                  check=lambda o, e, c: "" if not (imgs / "run").exists() else "wrote into DATA"))
    C.append(Case("ft-out-inside-val", [*ft, "--val", imgs, "-o", R / "imgs-link" / "b" / "run"], (2,)))
    C.append(Case("ft-onnx-input-shape-ignored", [*ft, "-o", R / "fis", "--input-shape", "1,3,16,16"], (2,)))
    C.append(Case("ft-onnx-params-ignored", [*ft, "-o", R / "fpi", "--params", base], (2,)))

    # -- resume
    # --resume on an empty OUTDIR starts the run (a kill/resume loop's first pass): an answer, not a refusal
    C.append(Case("ft-resume-nothing", [*ft, "-o", R / "rs-none", "--resume"], (0, 2)))
    C.append(Case("ft-resume-corrupt-ckpt", shell=(
        f"cd {R} && {PY} -m edgetrain finetune {base} --data builtin:digits --epochs 1 --train-layers bias -o rs1 "
        f">/dev/null 2>&1; head -c 300 rs1/checkpoint.npz > t && mv t rs1/checkpoint.npz; "
        f"{PY} -m edgetrain finetune {base} --data builtin:digits --epochs 2 --train-layers bias -o rs1 --resume"),
        args=[], expect=(2,)))
    C.append(Case("ft-resume-other-layers", shell=(
        f"cd {R} && {PY} -m edgetrain finetune {base} --data builtin:digits --epochs 1 --train-layers bias -o rs2 "
        f">/dev/null 2>&1; {PY} -m edgetrain finetune {base} --data builtin:digits --epochs 2 --train-layers lite "
        f"-o rs2 --resume"), args=[], expect=(2,)))
    C.append(Case("ft-resume-nan-ckpt", shell=(
        f"cd {R} && {PY} -m edgetrain finetune {base} --data builtin:digits --epochs 1 --train-layers bias -o rs3 "
        f">/dev/null 2>&1; {PY} -c \"import numpy as np; d=dict(np.load('rs3/checkpoint.npz', allow_pickle=False)); "
        f"k=[k for k in d if d[k].dtype.kind=='f' and d[k].size>1][0]; d[k]=d[k]*np.nan; np.savez('rs3/checkpoint.npz', **d)\"; "
        f"{PY} -m edgetrain finetune {base} --data builtin:digits --epochs 2 --train-layers bias -o rs3 --resume"),
        args=[], expect=(2,)))
    C.append(Case("ft-kill9-then-resume", shell=(
        f"cd {R} && ({PY} -m edgetrain finetune {base} --data builtin:digits --epochs 30 --train-layers bias -o rs4 "
        f">/dev/null 2>&1 & pid=$!; for i in $(seq 200); do [ -f rs4/checkpoint.npz ] && break; sleep 0.2; done; "
        f"kill -9 $pid; wait $pid 2>/dev/null); {PY} -m edgetrain finetune {base} --data builtin:digits --epochs 30 "
        f"--train-layers bias -o rs4 --resume > /dev/null && test -f rs4/model.onnx && "
        f"! ls -A rs4 | grep -q '^\\.'"), args=[], expect=(0,), timeout=240))

    # -- streams and system edges
    C.append(Case("predict-closed-pipe", shell=f"{PY} -m edgetrain predict {base} builtin:digits --top-k 1 "
                                               f"--format csv | head -1 >/dev/null; echo ${{PIPESTATUS[0]}} >&2",
                  args=[], expect=(0,), check=lambda o, e, c: "" if e.strip().splitlines()[-1] in ("0", "1", "141")
                  else "pipe exit " + e.strip().splitlines()[-1]))
    C.append(Case("predict-o-dev-full", ["predict", base, "builtin:digits", "-o", "/dev/full"], (1, 2)))
    C.append(Case("predict-json-dev-full", ["predict", base, "builtin:digits", "--json", "/dev/full"], (1, 2)))
    C.append(Case("ft-json-dev-full", [*ft, "-o", R / "djf", "--json", "/dev/full"], (1, 2)))
    C.append(Case("predict-ulimit-f", shell=f"ulimit -f 1; {PY} -m edgetrain predict {base} builtin:digits "
                                            f"--format jsonl -o {R}/uf.jsonl", args=[], expect=(1, 2),
                  check=no_file(R / "uf.jsonl")))
    C.append(Case("ft-ulimit-f", shell=f"ulimit -f 20; {PY} -m edgetrain finetune {base} --data builtin:digits "
                                       f"--epochs 1 --train-layers bias -o {R}/uff", args=[], expect=(1, 2),
                  check=no_file(R / "uff" / "model.onnx")))
    C.append(Case("predict-ulimit-v", shell=f"ulimit -v 400000; {PY} -m edgetrain predict {base} builtin:digits",
                  args=[], expect=(0, 1, 2)))
    C.append(Case("ft-ulimit-v", shell=f"ulimit -v 500000; {PY} -m edgetrain finetune {base} --data builtin:digits "
                                       f"--epochs 1 --train-layers bias -o {R}/uvv", args=[], expect=(0, 1, 2, 3)))
    bad = R / b"badname-\xff".decode("utf-8", "surrogateescape")
    (bad / "a").mkdir(parents=True)
    (bad / "b\udcfe").mkdir()
    for j in range(3):
        png(bad / "a" / f"\udce9{j}.png", "L")
        png(bad / "b\udcfe" / f"{j}.png", "L")
    for fmt in ("table", "csv", "jsonl"):
        C.append(Case(f"predict-lc-c-nonutf8-{fmt}", ["predict", base, bad, "--format", fmt, "--json",
                                                      R / f"lc-{fmt}.json"], (0,),
                      extra_env={"LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": ""}))
    C.append(Case("ft-lc-c-nonutf8-out", ["finetune", base, "--data", bad, "--epochs", "1", "--train-layers", "bias",
                                          "--val-split", "0.5", "-o", R / "lc-out\udcff", "--allow-chance"],
                  (0, 3), extra_env={"LC_ALL": "C", "LANG": "C"}))
    deep = R
    for _k in range(22):
        deep = deep / ("d" * 200)
    C.append(Case("predict-o-long-path", ["predict", base, "builtin:digits", "-o", deep / "p.csv"], (2,)))
    C.append(Case("ft-out-long-path", [*ft, "-o", deep], (2,)))
    C.append(Case("ft-out-name-too-long", [*ft, "-o", R / ("x" * 300)], (2,)))

    # -- Python API
    api = f"import edgetrain, sys\nsys.path.insert(0, {str(REPO)!r})\n"

    def api_case(cid, body, expect_exc=True, keep=()):
        code = api + "try:\n    " + body + "\nexcept edgetrain.UsageError as e:\n    print('USAGE', e.line()); " \
               "sys.exit(2)\nprint('OK')"
        return Case(cid, [], (2,) if expect_exc else (0,), api=code, keep=keep)
    C.append(api_case("api-predict-output-is-model", f"edgetrain.predict({str(am)!r}, 'builtin:digits', "
                                                     f"output={str(R / 'alias-link' / 'model.onnx')!r})", keep=[am]))
    C.append(api_case("api-finetune-out-none", f"edgetrain.finetune({str(base)!r}, 'builtin:digits', None, "
                                               "epochs=1, train_layers='bias')"))
    C.append(api_case("api-finetune-bad-layers-type", f"edgetrain.finetune({str(base)!r}, 'builtin:digits', "
                                                      f"{str(R / 'apl')!r}, epochs=1, train_layers=3)"))
    C.append(api_case("api-finetune-epochs-float", f"edgetrain.finetune({str(base)!r}, 'builtin:digits', "
                                                   f"{str(R / 'apf')!r}, epochs=1.5, train_layers='bias')"))
    C.append(api_case("api-finetune-epochs-bool", f"edgetrain.finetune({str(base)!r}, 'builtin:digits', "
                                                  f"{str(R / 'apb')!r}, epochs=True, train_layers='bias')"))
    C.append(api_case("api-finetune-unknown-option", f"edgetrain.finetune({str(base)!r}, 'builtin:digits', "
                                                     f"{str(R / 'apu')!r}, epoch=1)"))
    C.append(api_case("api-predict-data-bytes-nonutf8", f"edgetrain.predict({str(base)!r}, "
                                                        f"{os.fsencode(str(bad))!r}, top_k=1)", expect_exc=False))
    api_topk = api_case("api-predict-topk-str", f"edgetrain.predict({str(base)!r}, 'builtin:digits', top_k='3')")
    api_topk.expect = (0, 2)  # '3' read as 3, as the CLI reads it
    C.append(api_topk)
    C.append(api_case("api-predict-model-int", "edgetrain.predict(5, 'builtin:digits')"))
    C.append(api_case("api-predict-data-list", f"edgetrain.predict({str(base)!r}, ['a.png'])"))
    C.append(api_case("api-finetune-memory-budget-neg", f"edgetrain.finetune({str(base)!r}, 'builtin:digits', "
                                                        f"{str(R / 'apm')!r}, epochs=1, memory_budget=-1)"))
    C.append(api_case("api-finetune-power-log-dir", f"edgetrain.finetune({str(base)!r}, 'builtin:digits', "
                                                    f"{str(R / 'apd')!r}, epochs=1, power_log={str(R)!r})"))
    C.append(api_case("api-finetune-grid-nan", f"edgetrain.finetune({str(base)!r}, 'builtin:digits', "
                                               f"{str(R / 'apg')!r}, epochs=1, grid_intensity=float('nan'))"))

    # -- fleet: option limits (no coordinator is started when the options are refused)
    F = os.environ.get("CAMPAIGN_FLEET_PYTHON", "/work/main/.venv-numpy2/bin/python")
    (R / "fx" / "model").mkdir(parents=True)
    (R / "fx" / "model" / "model.onnx").write_bytes(raw)
    for cid, argv in [
        ("fleet-serve-rounds-0", ["fleet", "serve", base, "--rounds", "0", "--val", "builtin:digits", "-o",
                                  R / "fs0"]),
        ("fleet-serve-port-70000", ["fleet", "serve", base, "--val", "builtin:digits", "-o", R / "fs1", "--port",
                                    "70000"]),
        ("fleet-serve-min-clients-0", ["fleet", "serve", base, "--val", "builtin:digits", "-o", R / "fs2",
                                       "--min-clients", "0"]),
        ("fleet-serve-fraction-nan", ["fleet", "serve", base, "--val", "builtin:digits", "-o", R / "fs3",
                                      "--fraction", "nan"]),
        ("fleet-serve-round-timeout-inf", ["fleet", "serve", base, "--val", "builtin:digits", "-o", R / "fs4",
                                           "--round-timeout", "inf"]),
        ("fleet-serve-no-device-comes", ["fleet", "serve", base, "--val", "builtin:digits", "-o", R / "fs5",
                                         "--min-clients", "1", "--join-timeout", "3", "--round-timeout", "10",
                                         "--rounds", "1", "--port", "9311"]),
        ("fleet-serve-rundir-in-val", ["fleet", "serve", base, "--val", imgs, "-o", imgs / "run", "--port", "9312"]),
        ("fleet-join-port-65536", ["fleet", "join", "127.0.0.1:65536", "--data", "builtin:digits", "-o",
                                   R / "fj6"]),
        ("fleet-serve-model-in-export-dir", ["fleet", "serve", R / "fx" / "model" / "model.onnx", "--val",
                                             "builtin:digits", "-o", R / "fx", "--port", "9313"]),
        ("fleet-serve-json-onto-model-hardlink", ["fleet", "serve", am, "--val", "builtin:digits", "-o", R / "fs6",
                                                  "--json", R / "hard.onnx", "--port", "9314"]),
        ("fleet-join-bad-address", ["fleet", "join", "not an address", "--data", "builtin:digits", "-o",
                                    R / "fj0"]),
        ("fleet-join-port-0", ["fleet", "join", "127.0.0.1:0", "--data", "builtin:digits", "-o", R / "fj1"]),
        ("fleet-join-max-wait-nan", ["fleet", "join", "127.0.0.1:1", "--data", "builtin:digits", "--max-wait",
                                     "nan", "-o", R / "fj2"]),
        ("fleet-join-max-wait-inf", ["fleet", "join", "127.0.0.1:1", "--data", "builtin:digits", "--max-wait",
                                     "inf", "-o", R / "fj3"]),
        ("fleet-join-nobody", ["fleet", "join", "127.0.0.1:1", "--data", "builtin:digits", "--max-wait", "5",
                               "-o", R / "fj4"]),
        ("fleet-join-state-is-data", ["fleet", "join", "127.0.0.1:1", "--data", imgs, "--max-wait", "5",
                                      "-o", imgs]),
        ("fleet-join-budget-tiny", ["fleet", "join", "127.0.0.1:1", "--data", "builtin:digits", "--max-wait", "5",
                                    "--memory-budget", "1KB", "-o", R / "fj5"]),
    ]:
        C.append(Case(cid, [], (1, 2), shell=" ".join(shlex.quote(str(a)) for a in [F, "-m", "edgetrain", *argv]),
                      timeout=120, keep=[base, am, R / "hard.onnx", R / "fx" / "model" / "model.onnx"]))
    return C


def _printable(text: str) -> str:
    """One line whatever a name holds: control characters and undecodable bytes as escapes."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="")
    ap.add_argument("-j", type=int, default=2)
    ns = ap.parse_args()
    base = fixtures()
    todo = [c for c in cases(base) if ns.k in c.id]
    fails = 0
    with ThreadPoolExecutor(ns.j) as pool:
        for case, (code, problems, last, dt) in zip(todo, pool.map(Case.run, todo)):
            ok = not problems
            fails += not ok
            last, cmd = _printable(last), _printable(case.command())
            print(f"{case.id}\t{cmd}\texpect {'/'.join(map(str, case.expect))}\tgot {code} "
                  f"({dt:.0f}s) {'; '.join(problems)} | {last}\t{'PASS' if ok else 'FAIL'}", flush=True)
    print(f"TOTAL {len(todo)} cases, {len(todo) - fails} passed, {fails} failed (work folder {ROOT})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
