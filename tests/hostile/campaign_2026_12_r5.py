"""Issue 37 item 8: the closing hostile campaign of round 5, aimed at what changed since round 4.

quantize's int8-whatever-the-name and its memory plan, the one EnergyRecord and its interval text, fine-tune
energy from CPU time x the device's speed factor, profile's thread count that ran, `energy attribute
--country/--grid-intensity`, predict's -o ending, tune's --momentum/--weight-decay/--min-rung, finetune's
--momentum/--weight-decay and BatchNorm training mode, old checkpoints on --resume. Each case is a real child
process (round 4's `Case`, campaign_2026_12.py), from this worktree's venv (mxnet absent: the device install).

    python tests/hostile/campaign_2026_12_r5.py [-k SUBSTRING] [-j JOBS]

The log of what it found is tests/hostile/ROUND5.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import campaign_2026_12 as r4  # noqa: E402

r4.PY = os.environ.get("CAMPAIGN_PYTHON", sys.executable)
Case, ROOT = r4.Case, r4.ROOT
BASE = Path(__file__).resolve().parents[2] / "edgetrain" / "_builtin" / "digits5.onnx"


def same_files(*pairs):
    """A check: each pair of files exists and is byte-identical."""
    def check(out, err, code):
        for a, b in pairs:
            if not (Path(a).is_file() and Path(b).is_file()):
                return f"missing {a if not Path(a).is_file() else b}"
            if Path(a).read_bytes() != Path(b).read_bytes():
                return f"{Path(a).name} differs between two runs"
        return ""
    return check


def same_weights(a, b):
    """A check: two ONNX files hold the same initializers, bit for bit (their metadata names their own folders)."""
    def check(out, err, code):
        import onnx
        ta, tb = ({t.name: t.SerializeToString() for t in onnx.load(str(p)).graph.initializer} for p in (a, b))
        return "" if ta == tb else "the weights differ from a run never stopped"
    return check


def json_check(path, pred, what):
    def check(out, err, code):
        if not Path(path).is_file():
            return f"no {path}"
        d = json.loads(Path(path).read_text())
        return "" if pred(d, out.decode(), err) else what
    return check


def is_int8(path):
    def check(out, err, code):
        import onnx
        if code != 0:
            return ""
        m = onnx.load(str(path))
        ops = {n.op_type for n in m.graph.node}
        return "" if ops & {"QuantizeLinear", "QLinearConv", "DynamicQuantizeLinear", "ConvInteger",
                            "MatMulInteger"} else f"not int8: {sorted(ops)}"
    return check


def shell(cmd_args, *more):
    return " ".join(shlex.quote(str(a)) for a in [r4.PY, "-m", "edgetrain", *cmd_args]) + "".join(more)


def cases(base: Path):
    R = ROOT
    C = []
    keep = [base]
    raw = base.read_bytes()
    (R / "empty.onnx").write_bytes(b"")
    (R / "half.onnx").write_bytes(raw[: len(raw) // 2])
    (R / "adir").mkdir()
    ro = R / "ro"
    ro.mkdir()
    ro.chmod(0o555)

    # -- quantize: the output name, the output place, the memory plan
    q = ["quantize", base, "--calib", "builtin:digits", "--no-latency", "--scheme", "rule"]
    for i, name in enumerate(["q", "q.txt", "q.ONNX", "q.fp32.onnx", "q.int8", ".onnx", "q.onnx.tmp"]):
        out = R / f"qn{i}" / name
        out.parent.mkdir()
        C.append(Case(f"q-name-{i}-{name}", [*q, "-o", out], (0, 2), check=is_int8(out), keep=keep))
    C.append(Case("q-out-is-input", [*q, "-o", base], (2,), keep=keep))
    C.append(Case("q-out-is-dir", [*q, "-o", R / "adir"], (2,), keep=keep))
    if os.geteuid():  # root writes into a read-only folder
        C.append(Case("q-out-readonly-dir", [*q, "-o", ro / "q.onnx"], (2,), keep=keep))
    C.append(Case("q-out-missing-parent", [*q, "-o", R / "nope" / "deeper" / "q.onnx"], (0, 2), keep=keep))
    C.append(Case("q-json-is-input", [*q, "-o", R / "qj.onnx", "--json", base], (2,), keep=keep))
    C.append(Case("q-json-is-output", [*q, "-o", R / "qj2.onnx", "--json", R / "qj2.onnx"], (2,), keep=keep))
    C.append(Case("q-model-empty", ["quantize", R / "empty.onnx", "--calib", "builtin:digits", "-o", R / "qe.onnx"],
                  (2,)))
    C.append(Case("q-model-truncated", ["quantize", R / "half.onnx", "--calib", "builtin:digits", "-o",
                                        R / "qh.onnx"], (2,)))
    C.append(Case("q-model-dir", ["quantize", R / "adir", "--calib", "builtin:digits", "-o", R / "qd.onnx"], (2,)))
    for i, samples in enumerate(["0", "-1", "nan", "1e300", "1.5"]):
        C.append(Case(f"q-samples-{samples}", [*q, "-o", R / f"qs{i}.onnx", "--samples", samples], (2,), keep=keep))
    for i, drop in enumerate(["nan", "-1", "inf", "101"]):
        C.append(Case(f"q-max-drop-{drop}", [*q, "-o", R / f"qm{i}.onnx", "--val", "builtin:digits",
                                             "--max-drop", drop], (2,), keep=keep))
    for i, n in enumerate(["-1", "nan", "99999"]):
        C.append(Case(f"q-max-fp32-nodes-{n}", [*q, "-o", R / f"qf{i}.onnx", "--val", "builtin:digits",
                                                "--max-fp32-nodes", n], (0, 2, 3), check=is_int8(R / f"qf{i}.onnx"),
                      keep=keep))
    # auto on this host: int8 whatever the name, and the JSON says what the terminal says
    for i, name in enumerate(["auto.onnx", "fp32.onnx"]):
        out = R / f"qa{i}" / name
        out.parent.mkdir()
        js = R / f"qa{i}.json"

        def agrees(d, o, e, out=out):
            chosen = [c for c in d["scheme"]["candidates"] if c["chosen"]]
            return (len(chosen) == 1 and chosen[0]["kind"] != "fp32" and d["size"]["int8_bytes"] ==
                    out.stat().st_size and d["size"]["change"] in o)
        C.append(Case(f"q-auto-{name}", ["quantize", base, "--calib", "builtin:digits", "-o", out, "--json", js],
                      (0,), check=r4.all_of(is_int8(out), json_check(js, agrees, "JSON and terminal disagree")),
                      keep=keep))
    # the plan on a small board: a device YAML with a budget far too small, and absurd ones
    for i, mem in enumerate(["1", "0", "-512", "nan", "1e300"]):
        y = R / f"dev{i}.yaml"
        y.write_text(Path(REPO_DEV).read_text().replace("memory_budget_mb: 320", f"memory_budget_mb: {mem}"))
        C.append(Case(f"q-plan-device-mem-{mem}", [*q, "-o", R / f"qp{i}.onnx", "--device", y], (2,),
                      check=r4.no_file(R / f"qp{i}.onnx"), keep=keep))
    C.append(Case("q-plan-zero2w-tiny", ["quantize", base, "--calib", "builtin:digits", "-o", R / "qz.onnx",
                                         "--device", "rpi-zero2w", "--no-latency"], (0,), check=is_int8(R / "qz.onnx"),
                  keep=keep))
    C.append(Case("q-two-runs-identical", [], (0,), shell=(
        shell([*q, "-o", R / "qi1.onnx"]) + " && " + shell([*q, "-o", R / "qi2.onnx"])),
        check=same_files((R / "qi1.onnx", R / "qi2.onnx")), keep=keep))

    # -- predict: -o's ending decides the format
    p = ["predict", base, "builtin:digits", "--top-k", "1"]
    for i, (name, fmt, exp) in enumerate([("x.json", "csv", 2), ("x.csv", "jsonl", 2), ("x.JSON", None, 0),
                                          ("x.json", "json", 0), ("x.txt", None, 0), ("x", None, 0),
                                          ("x.jsonl", "table", 2), (".json", None, 0), ("x.tsv", "csv", 2),
                                          ("x.json.gz", None, 0)]):
        out = R / f"pn{i}" / name
        out.parent.mkdir()
        extra = ["--format", fmt] if fmt else []

        def parses(out_, err, code, out=out, name=name, fmt=fmt):
            if code != 0:
                return "" if not out.exists() else f"left {out}"
            text = out.read_text()
            if name.lower().endswith(".json") and fmt in (None, "json"):
                json.loads(text)
            elif name.lower().endswith(".jsonl"):
                [json.loads(ln) for ln in text.splitlines()]
            return ""
        C.append(Case(f"predict-o-{name}-{fmt}", [*p, "-o", out, *extra], (exp,), check=parses, keep=keep))
    C.append(Case("predict-o-is-model", [*p, "-o", base], (2,), keep=keep))
    C.append(Case("predict-o-is-dir", [*p, "-o", R / "adir"], (2,), keep=keep))
    if os.geteuid():
        C.append(Case("predict-o-readonly", [*p, "-o", ro / "x.json"], (2,), keep=keep))
    C.append(Case("predict-o-equals-json", [*p, "-o", R / "pj.json", "--json", R / "pj.json"], (2,), keep=keep))
    C.append(Case("predict-json-identical", [], (0,), shell=(
        shell([*p, "-o", R / "pi1.json"]) + " && " + shell([*p, "-o", R / "pi2.json"])),
        check=same_files((R / "pi1.json", R / "pi2.json")), keep=keep))

    # -- finetune: --momentum / --weight-decay
    ft = ["finetune", base, "--data", "builtin:digits", "--epochs", "1", "--threads", "1"]
    for i, (opt, val, exp) in enumerate([("--momentum", "nan", 2), ("--momentum", "-0.1", 2), ("--momentum", "1", 2),
                                         ("--momentum", "1.5", 2), ("--momentum", "inf", 2),
                                         ("--momentum", "0", 0), ("--momentum", "abc", 2),
                                         ("--weight-decay", "nan", 2), ("--weight-decay", "-1", 2),
                                         ("--weight-decay", "inf", 2), ("--weight-decay", "1e300", 2),
                                         ("--weight-decay", "0", 0), ("--weight-decay", "-0", 0),
                                         ("--weight-decay", "1e6", (1, 2, 3))]):
        opt_extra = ["--optimizer", "sgd"] if opt == "--momentum" else []
        out = R / f"fm{i}"
        C.append(Case(f"ft{opt}={val}", [*ft, *opt_extra, opt, val, "-o", out],
                      exp if isinstance(exp, tuple) else (exp,),
                      check=r4.all_of(r4.no_file(out / "model.onnx"), r4.finite_json(out / "metrics.json")),
                      keep=keep))
    C.append(Case("ft-momentum-with-adam", [*ft, "--momentum", "0.5", "-o", R / "fma"], (2,), keep=keep))
    C.append(Case("ft-momentum-with-default-optimizer-0", [*ft, "--momentum", "0", "-o", R / "fma0"], (2,),
                  keep=keep))
    # resume with another value, and kill -9 then resume with the same
    for i, (first, second, exp) in enumerate([
            (["--momentum", "0.5"], ["--momentum", "0.9"], 2), (["--weight-decay", "0.01"], [], 2),
            ([], ["--weight-decay", "0"], 2), (["--momentum", "0.5"], ["--momentum", "0.5"], 0),
            (["--weight-decay", "0.01"], ["--weight-decay", "1e-2"], 0)]):
        out = R / f"fr{i}"
        a = [*ft, "--optimizer", "sgd", "--train-layers", "all", "--epochs", "2", "-o", out]
        C.append(Case(f"ft-resume-{' '.join(first) or 'default'}-then-{' '.join(second) or 'default'}", [], (exp,),
                      shell=f"{shell([*a, *first])} >/dev/null 2>&1; {shell([*a, *second, '--resume'])}",
                      keep=keep))
    for tl in ("all", "last:2", "lite"):
        out, ref = R / f"fk-{tl}", R / f"fk-{tl}-ref"
        a = [*ft, "--train-layers", tl, "--epochs", "3", "--optimizer", "sgd", "--momentum", "0.7",
             "--weight-decay", "0.001", "--batch-size", "8"]
        # kill -9 once the first epoch's checkpoint is there, resume, and compare with a run never stopped
        script = (f"{shell([*a, '-o', ref])} >/dev/null 2>&1 || exit 9; "
                  f"{shell([*a, '-o', out])} >/dev/null 2>&1 & pid=$!; "
                  f"for i in $(seq 600); do [ -f {out}/checkpoint.npz ] && break; sleep 0.05; done; "
                  f"kill -9 $pid; wait $pid; {shell([*a, '-o', out, '--resume'])}")
        C.append(Case(f"ft-kill9-resume-{tl}", [], (0,), shell=script, timeout=400,
                      check=same_files((out / "model.onnx", ref / "model.onnx")), keep=keep))
    for tl in ("all", "last:1", "lite", "bias"):
        a, b = R / f"fi-{tl}-1", R / f"fi-{tl}-2"
        args = [*ft, "--train-layers", tl, "--epochs", "2"]
        C.append(Case(f"ft-identical-{tl}", [], (0,), shell=f"{shell([*args, '-o', a])} && {shell([*args, '-o', b])}",
                      check=same_files((a / "model.onnx", b / "model.onnx")), keep=keep, timeout=300))

    # -- old and broken checkpoints on --resume
    fx = Path(__file__).resolve().parents[1] / "fixtures" / "old_checkpoints"
    for name in ("mxnet-all.npz", "numpy-head.npz"):
        out = R / f"old-{name}"
        out.mkdir()
        (out / "checkpoint.npz").write_bytes((fx / name).read_bytes())
        C.append(Case(f"ft-resume-old-{name}", [*ft, "--resume", "-o", out], (2,), keep=keep + [out / "checkpoint.npz"]))
    for name, content in [("empty", b""), ("garbage", b"\x00" * 100), ("dir", None)]:
        out = R / f"bad-ck-{name}"
        out.mkdir()
        if content is None:
            (out / "checkpoint.npz").mkdir()
        else:
            (out / "checkpoint.npz").write_bytes(content)
        C.append(Case(f"ft-resume-ck-{name}", [*ft, "--resume", "-o", out], (2,), keep=keep))
    out = R / "trunc-ck"
    C.append(Case("ft-resume-ck-truncated", [], (2,), shell=(
        f"{shell([*ft, '--train-layers', 'all', '-o', out])} >/dev/null 2>&1; "
        f"python3 -c \"import pathlib; p=pathlib.Path('{out}/checkpoint.npz'); b=p.read_bytes(); "
        f"p.write_bytes(b[:len(b)//2])\"; rm -f {out}/model.onnx; "
        f"{shell([*ft, '--train-layers', 'all', '-o', out, '--resume'])}"),
        keep=keep))
    C.append(Case("ft-resume-other-train-layers", [], (2,), shell=(
        f"{shell([*ft, '--train-layers', 'all', '-o', R / 'rtl'])} >/dev/null 2>&1; "
        f"{shell([*ft, '--train-layers', 'last:1', '-o', R / 'rtl', '--resume'])}"), keep=keep))

    # -- fine-tune energy on a device: the figure, its interval and the JSON agree
    def energy_agrees(d, o, e):
        en = d.get("energy") or {}
        unc = en.get("uncertainty") or {}
        vals = [en.get("joules"), unc.get("plus_j"), unc.get("minus_j")]
        return all(isinstance(v, (int, float)) and v == v and v >= 0 for v in vals)
    C.append(Case("ft-energy-device", [*ft, "--device", "rpi4b-4gb", "-o", R / "fe", "--json", R / "fe.json"], (0,),
                  check=json_check(R / "fe.json", energy_agrees, "energy figures not finite/non-negative"), keep=keep))
    for i, (opt, val) in enumerate([("--grid-intensity", "nan"), ("--grid-intensity", "-1"),
                                    ("--grid-intensity", "1e300"), ("--country", "XX"), ("--country", ""),
                                    ("--country", "de"), ("--grid-intensity", "0")]):
        # 0 g/kWh (an off-grid panel, a fully renewable supply) is a figure (ROUND5.md L6, fixed in rel6)
        exp = (0,) if val in ("de", "0") else (2,)
        C.append(Case(f"ft-energy-{opt}={val}", [*ft, "--device", "rpi4b-4gb", opt, val, "-o", R / f"fg{i}"], exp,
                      keep=keep))

    # -- profile: threads that ran, battery/rate/budget figures
    pr = ["profile", base, "--runs", "5", "--warmup", "1"]
    for i, th in enumerate(["0", "-1", "1,1,1", "64", "2,64", "", ",", "1,,2", "nan", "1e3"]):
        js = R / f"pt{i}.json"

        def threads_true(d, o, e):
            cores = os.cpu_count() or 1
            ths = [c.get("threads") for c in d.get("configs", [])]
            return all(isinstance(t, int) and 1 <= t <= cores for t in ths) and len(set(ths)) == len(ths)
        exp = (0,) if th in ("1,1,1", "64", "2,64") else (0, 2)
        C.append(Case(f"profile-threads-{th or 'empty'}", [*pr, "--threads", th, "--json", js], exp,
                      check=lambda o, e, c, js=js: (json_check(js, threads_true, "threads reported != ran")(o, e, c)
                                                    if c == 0 else ""), keep=keep))
    for i, (opt, val) in enumerate([("--battery-wh", "0"), ("--battery-wh", "nan"), ("--battery-wh", "-1"),
                                    ("--battery-wh", "inf"), ("--rate", "0/h"), ("--rate", "-5/h"), ("--rate", "nan/h"),
                                    ("--rate", "1e300/h"), ("--rate", "5"), ("--budget-mj", "nan"),
                                    ("--budget-mj", "-1"), ("--budget-mj", "0"), ("--country", "ZZ"),
                                    ("--grid-intensity", "-0")]):
        exp = (0, 2, 3) if val in ("0", "-0", "5") else (2,)
        C.append(Case(f"profile-{opt}={val}", [*pr, "--device", "rpi4b-4gb", opt, val, "--json", R / f"pb{i}.json"],
                      exp, check=r4.finite_json(R / f"pb{i}.json"), keep=keep))

    def interval_agrees(d, o, e):
        unc = d["energy"]["per_inference"]["uncertainty"]
        line = [ln for ln in o.splitlines() if ln.startswith("energy")][0]
        sym = abs(unc["plus_mj"] - unc["minus_mj"]) < 1e-12
        return ("±" in line) == sym and (("+" in line and "/−" in line) or sym)
    C.append(Case("profile-device-interval", [*pr, "--device", "rpi4b-4gb", "--json", R / "pi.json"], (0,),
                  check=json_check(R / "pi.json", interval_agrees, "± vs +a/-b disagrees with JSON"), keep=keep))

    # -- energy attribute
    me, log = meter_export(base)
    for i, (opt, val) in enumerate([("--country", "XX"), ("--country", ""), ("--grid-intensity", "nan"),
                                    ("--grid-intensity", "-1"), ("--grid-intensity", "inf"),
                                    ("--grid-intensity", "abc")]):
        C.append(Case(f"attribute-{opt}={val}", ["energy", "attribute", me, log, opt, val, "-o", R / f"am{i}.json"],
                      (2,), check=r4.no_file(R / f"am{i}.json")))
    C.append(Case("attribute-both-carbon-options", [], (2,), shell=(
        shell(['energy', 'attribute', me, log, '--country', 'DE', '--grid-intensity', '300']))))
    for i, (opt, val) in enumerate([("--country", "de"), ("--grid-intensity", "300"), ("--grid-intensity", "1")]):
        js = R / f"ag{i}.json"

        def grams(d, o, e):
            en = d["energy"]
            return "carbon" in json.dumps(en) and ("g CO2e" in o or "g CO2" in o)
        C.append(Case(f"attribute-ok-{opt}={val}", ["energy", "attribute", me, log, opt, val, "-o", R / f"ao{i}.json",
                                                   "--json", js], (0,),
                      check=json_check(js, grams, "no carbon in JSON or terminal")))
    C.append(Case("attribute-o-is-log", [], (2,), shell=shell(['energy', 'attribute', me, log, '-o', log]),
                  keep=[log]))
    C.append(Case("attribute-result-empty", ["energy", "attribute", R / "empty.onnx", log], (2,)))
    C.append(Case("attribute-result-dir", ["energy", "attribute", R / "adir", log], (2,)))

    # -- tune
    tu = ["tune", base, "--data", "builtin:digits", "--epochs", "1", "--threads", "1"]
    for i, grid in enumerate(["momentum=nan", "momentum=-1,0.9", "momentum=1", "weight_decay=nan",
                              "weight_decay=-1", "weight_decay=inf", "momentum=0.9", "momentum=", "momentum=0.5,0.5",
                              "weight_decay=1e300"]):
        extra = ["--grid", "optimizer=sgd"] if "momentum" in grid else []
        C.append(Case(f"tune-grid-{grid}", [*tu, "--grid", grid, *extra, "-o", R / f"tg{i}"],
                      (0, 2) if grid in ("momentum=0.5,0.5",) else ((0,) if grid == "momentum=0.9" else (2,)),
                      keep=keep, timeout=300))
    C.append(Case("tune-momentum-with-adam-only", [*tu, "--grid", "momentum=0.5,0.9", "--grid", "optimizer=adam",
                                                   "-o", R / "tma"], (2,), keep=keep))
    for i, mr in enumerate(["0", "-0.5", "nan", "inf", "1.5", "1e-9", "0.5"]):
        C.append(Case(f"tune-min-rung-{mr}", [*tu, "--epochs", "3", "--grid", "lr=0.01,0.003", "--min-rung", mr,
                                              "-o", R / f"tr{i}"], (0,) if mr in ("0.5", "1e-9") else (2,),
                      keep=keep, timeout=300))
    C.append(Case("tune-min-rung-with-grid-strategy", [*tu, "--strategy", "grid", "--grid", "lr=0.01,0.003",
                                                       "--min-rung", "0.5", "-o", R / "trg"], (2,), keep=keep))
    tr = [*tu, "--epochs", "3", "--grid", "lr=0.01,0.003", "-o", R / "trr"]
    C.append(Case("tune-resume-other-min-rung", [], (2,), shell=(
        f"{shell([*tr, '--min-rung', '0.5'])} >/dev/null 2>&1; {shell([*tr, '--min-rung', '0.7', '--resume'])}"),
        keep=keep, timeout=300))
    C.append(Case("tune-min-rung-uneven-steps", [*tu, "--grid", "lr=0.01,0.003", "--min-rung", "0.5", "--eta", "2",
                                                 "-o", R / "tru"], (0,), keep=keep, timeout=120))
    for i, w in enumerate(["latency:1e308", "energy:1e300", "latency:1e6"]):
        C.append(Case(f"tune-objective-{w}", [*tu, "--grid", "lr=0.01,0.003", "--objective", w, "-o", R / f"tob{i}"],
                      (0,) if w == "latency:1e6" else (2,), keep=keep, timeout=300))
    # kill -9 inside a fractional first rung of uneven steps, resumed: the model a run never stopped writes
    a = [*tu, "--epochs", "2", "--grid", "lr=0.01,0.003", "--min-rung", "0.5", "--eta", "2"]
    out, ref = R / "tku", R / "tku-ref"
    C.append(Case("tune-kill9-resume-uneven-rung", [], (0,), timeout=400, keep=keep, shell=(
        f"{shell([*a, '-o', ref])} >/dev/null 2>&1 || exit 9; {shell([*a, '-o', out])} >/dev/null 2>&1 & pid=$!; "
        f"for i in $(seq 600); do ls {out}/trials/*/checkpoint.npz >/dev/null 2>&1 && break; sleep 0.05; done; "
        f"kill -9 $pid; wait $pid; {shell([*a, '-o', out, '--resume'])}"),
        check=same_weights(out / "model.onnx", ref / "model.onnx")))

    # -- the per-user speed reference cache, edited or from another edgetrain
    key, rec = speed_cache(base)
    for i, (name, edit) in enumerate([("negative", {"cpu_p50_ms": -5.0}), ("nan", {"cpu_p50_ms": float("nan")}),
                                      ("string", {"cpu_p50_ms": "7.9"}), ("no-runtime", {"runtime": None}),
                                      ("zero-wall", {"p50_ms": 0})]):
        cache = R / f"cache-{name}"
        cache.mkdir()
        bad = {k: v for k, v in {**rec, **edit}.items() if v is not None}
        (cache / "device-speed-reference.json").write_text(json.dumps({key: bad}))
        js = R / f"fsc{i}.json"
        C.append(Case(f"ft-speed-cache-{name}", [*ft, "--device", "rpi4b-4gb", "-o", R / f"fsc{i}", "--json", js],
                      (0,), extra_env={"EDGETRAIN_CACHE_DIR": str(cache)}, keep=keep,
                      check=json_check(js, lambda d, o, e: 0 < d["energy"]["joules"] < 1e6,
                                       "fine-tune energy not a finite positive figure")))

    # -- predict -o - and a small batch with BatchNorm training
    C.append(Case("predict-o-dash", [*p, "-o", "-"], (0,), cwd=R / "adir",
                  check=lambda o, e, c: "wrote a file named '-'" if (R / "adir" / "-").exists() else ""))
    C.append(Case("ft-batch-2-all-said", [*ft, "--train-layers", "all", "--batch-size", "2", "-o", R / "fb1"], (0,),
                  keep=keep, check=lambda o, e, c: "" if "batches of 2 (--batch-size)" in e else
                  "BatchNorm on batches of 2 unsaid"))
    return C


def speed_cache(base):
    """A real kept speed reference (key, record): the one a fine-tune on rpi4b-4gb writes."""
    subprocess.run([r4.PY, "-m", "edgetrain", "finetune", base, "--data", "builtin:digits", "--epochs", "1",
                    "--device", "rpi4b-4gb", "-o", ROOT / "speed-ft"], env=r4.env(), check=True, capture_output=True)
    return next(iter(json.loads((ROOT / "cache" / "device-speed-reference.json").read_text()).items()))


def meter_export(base):
    """A profile --meter-export result and a meter log (2.7 W idle, 3.6 W timed, 20 Hz) covering its windows."""
    me, log = ROOT / "me.json", ROOT / "meter.csv"
    if not me.exists():
        subprocess.run([r4.PY, "-m", "edgetrain", "profile", base, "--runs", "5", "--warmup", "1", "--device",
                        "rpi4b-4gb", "--meter-export", "--json", me], env=r4.env(), check=True, capture_output=True)
        d = json.loads(me.read_text())
        t0 = min(c["idle"][0] for c in d["meter_windows"]["configs"]) - 2
        t1 = max(c["timed"][1] for c in d["meter_windows"]["configs"]) + 2
        timed = [c["timed"] for c in d["meter_windows"]["configs"]]
        rows, t = ["timestamp,power (W)"], t0
        while t < t1:
            rows.append(f"{t:.3f},{3.6 if any(a <= t <= b for a, b in timed) else 2.7:.3f}")
            t += 0.05
        log.write_text("\n".join(rows) + "\n")
    return me, log


REPO_DEV = str(Path(__file__).resolve().parents[2] / "edgetrain" / "_devices" / "rpi-zero2w.yaml")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="")
    ap.add_argument("-j", type=int, default=2)
    ns = ap.parse_args()
    (ROOT / "cache").mkdir(exist_ok=True)
    base = ROOT / "d5.onnx"
    base.write_bytes(BASE.read_bytes())
    todo = [c for c in cases(base) if ns.k in c.id]
    fails = 0
    with ThreadPoolExecutor(ns.j) as pool:
        futs = [(c, pool.submit(c.run)) for c in todo]
        for case, fut in futs:
            code, problems, last, dt = fut.result()
            ok = not problems
            fails += not ok
            print(f"{case.id}\t{r4._printable(case.command())}\texpect {'/'.join(map(str, case.expect))}\tgot {code} "
                  f"({dt:.0f}s) {'; '.join(problems)} | {r4._printable(last)}\t{'PASS' if ok else 'FAIL'}", flush=True)
    print(f"TOTAL {len(todo)} cases, {len(todo) - fails} passed, {fails} failed (work folder {ROOT})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
