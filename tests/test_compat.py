"""The one door to mxnet/onnx/onnxruntime and the compatibility layer behind it, in fresh child processes
(real mxnet, real numpy, real ONNX Runtime sessions).

On numpy 1.23.5 nothing needs restoring, so the children delete names from the real numpy before
opening the door: what numpy 2 removed is then missing here too, and the layer must restore it for mxnet
alone. CI also runs this file on the newest numpy 2.x and on Python 3.13 (`.ci/run`), where the names
are missing for real.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from edgetrain.compat import distutils_version, numpy_names

pytestmark = pytest.mark.compat
EDGETRAIN = Path(numpy_names.__file__).resolve().parents[1]


def child(code: str, env_extra: dict | None = None, timeout: float = 300, drop: tuple = ()) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and k not in drop}
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    out = json.loads(lines[-1][len("RESULT "):])
    out["stderr"] = proc.stderr
    return out


# Every name the layer knows, removed from the real numpy in the child before the door opens.
REMOVE_ALL = """
import warnings
import numpy
from edgetrain.compat import numpy_names
removed = []
for alias in numpy_names.ALIASES:
    if alias.name in vars(numpy) and alias.name not in ("bool", "int"):
        delattr(numpy, alias.name)
        removed.append(alias.name)
"""


def test_restored_names_reach_mxnet_and_never_numpy():
    out = child(REMOVE_ALL + """
import json, sys
before = dict(vars(numpy))
from edgetrain import _lazy
mx = _lazy.mxnet()
after = dict(vars(numpy))
applied = numpy_names.applied()
view = numpy_names._state.view
res = {
    "removed": removed,
    "restored": sorted(a.name for a in applied.restored),
    # numpy's own submodules imported meanwhile (numpy.testing, ...) are numpy's doing, nothing else is
    "numpy_unchanged": all(k in after and before[k] is after[k] for k in before) and all(
        type(v).__name__ == "module" and v.__name__ == "numpy." + k for k, v in after.items() if k not in before),
    "numpy_lacks": sorted(n for n in removed if n in vars(numpy)),
    "sys_numpy_is_real": sys.modules["numpy"] is numpy,
    "mx_pzero": mx.numpy.PZERO, "mx_ninf": str(mx.numpy.NINF),
    "mx_alltrue_is_all": mx.numpy.fallback.alltrue is numpy.all,
    "view_in_non_mxnet": sorted(name for name, mod in list(sys.modules.items())
                                if mod is not None and not name.startswith("mxnet")
                                and name not in ("__main__", "__mp_main__")   # this script holds it
                                and any(v is view for v in list(vars(mod).values()))),
    "dot": mx.nd.dot(mx.nd.ones((2, 3)), mx.nd.ones((3, 2))).asnumpy().tolist(),
}
print("RESULT " + json.dumps(res))
""")
    # the child removed what numpy < 2 had; on numpy 2 those were already gone
    assert set(out["removed"]) <= set(out["restored"])
    assert {"PZERO", "NINF", "alltrue", "sometrue", "product", "round_", "in1d", "trapz", "compat"} <= \
        set(out["restored"])
    assert out["numpy_unchanged"] and out["numpy_lacks"] == [] and out["sys_numpy_is_real"]
    assert out["mx_pzero"] == 0.0 and out["mx_ninf"] == "-inf" and out["mx_alltrue_is_all"]
    # only mxnet's own modules hold the view; edgetrain's own modules (imported before) and every other
    # library see the real numpy
    assert out["view_in_non_mxnet"] == [], out["view_in_non_mxnet"]
    assert out["dot"] == [[3.0, 3.0], [3.0, 3.0]]


def test_a_name_numpy_still_has_is_never_shadowed():
    # for every alias: if this numpy has the name, mxnet gets numpy's own object (np.bool on numpy 2 is
    # numpy's bool type, not Python's bool); if it lacks it, numpy still lacks it after the door
    out = child("""
import json, warnings
import numpy
from edgetrain import _lazy
from edgetrain.compat import numpy_names
present = {}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for a in numpy_names.ALIASES:
        try:
            present[a.name] = id(getattr(numpy, a.name))
        except AttributeError:
            pass
_lazy.mxnet()
view = numpy_names._state.view
res = {"shadowed": [], "leaked": [], "restored": sorted(a.name for a in numpy_names.applied().restored)}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for a in numpy_names.ALIASES:
        if a.name in present:
            # numpy's own object (names numpy < 2 answers from __getattr__ make a new one per lookup)
            own = a.name not in vars(numpy) or getattr(view, a.name) is vars(numpy)[a.name]
            if not own or a.name in res["restored"]:
                res["shadowed"].append(a.name)
        elif hasattr(numpy, a.name):
            res["leaked"].append(a.name)
print("RESULT " + json.dumps(res))
""")
    assert out["shadowed"] == [] and out["leaked"] == []
    assert out["restored"] == sorted(a.name for a in numpy_names.missing(np))


def test_missing_lists_exactly_the_absent_names():
    # the real numpy: whatever it lacks is listed, whatever it has is not
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        absent = {a.name for a in numpy_names.ALIASES if not hasattr(np, a.name)}
    assert {a.name for a in numpy_names.missing(np)} == absent
    for a in numpy_names.ALIASES:
        assert a.removed_in in ("1.24", "2.0", "2.4"), a
        assert a.mxnet_reads.startswith("mxnet/") or "mxnet" in a.mxnet_reads, a


def test_restored_values_behave_like_the_old_numpy():
    view = numpy_names.NumpyForMxnet(np, {a.name: a.value(np) for a in numpy_names.ALIASES})
    x = np.array([[3, 1], [2, 5]])
    assert view.PZERO == 0.0 and str(view.NZERO) == "-0.0" and view.PINF == float("inf")
    assert view.NaN != view.NaN and view.NINF == -float("inf")
    assert view.alltrue(x > 0) and not view.sometrue(x > 9)
    assert view.product(x) == 30 and view.round_(2.567, 1) == pytest.approx(2.6)
    assert view.msort(x).tolist() == [[2, 1], [3, 5]]
    assert view.in1d([[1, 2], [3, 4]], [2, 3]).tolist() == [False, True, True, False]
    assert view.trapz([1.0, 2.0, 3.0]) == 4.0
    assert view.compat.basestring is str and view.bool is bool and view.int is int
    with pytest.raises(RuntimeError, match="NEP 32"):
        view.mirr([1, 2], 0.1, 0.1)
    # everything else is numpy's own object
    assert view.ndarray is np.ndarray and view.float32 is np.float32 and view.linalg is np.linalg


def test_distutils_stand_in_is_used_only_when_missing_and_never_leaks():
    # Python < 3.12 has distutils, 3.12+ does not (unless setuptools provides it): block it here so the
    # stand-in is exercised on every Python, then check nobody else can see it.
    out = child("""
import json, sys
sys.modules["distutils"] = None           # `import distutils` now raises ImportError
sys.modules["distutils.version"] = None
from edgetrain import _lazy
from edgetrain.compat import numpy_names
mx = _lazy.mxnet()
try:
    import distutils.version
    visible = True
except ImportError:
    visible = False
fallback = sys.modules["mxnet.numpy_op_fallback"]
print("RESULT " + json.dumps({"stand_in": numpy_names.applied().distutils_stand_in, "visible_after": visible,
                              "mx_strict": fallback.StrictVersion.__module__}))
""")
    assert out["stand_in"] is True
    assert out["visible_after"] is False
    assert out["mx_strict"] == "edgetrain.compat.distutils_version"


PAIRS = [("1.23.5", "1.17"), ("2.4.6", "1.17"), ("2.5.5", "1.15"), ("1.9", "1.10"), ("1.10.0", "1.10"),
         ("2.0.0rc1", "1.17"), ("1.26.4", "1.26.4"), ("1.2", "1.2.0")]
STRICT = [("1.23.5", "1.6.0"), ("2.4.6", "1.6.0"), ("1.6.0", "1.6"), ("1.6.0a1", "1.6.0"), ("0.9", "1.6.0")]


@pytest.mark.parametrize("a,b", PAIRS)
def test_loose_version_orders_as_distutils(a, b):
    ours = distutils_version.LooseVersion
    got = (ours(a) < ours(b), ours(a) == ours(b), ours(a) > ours(b))
    expected = _distutils_order("LooseVersion", a, b)
    if expected is None:   # Python >= 3.12 without setuptools' shim: the rules, written out
        num = lambda v: [int(p) for p in v.split(".") if p.isdigit()]  # noqa: E731
        expected = (num(a) < num(b), num(a) == num(b), num(a) > num(b))
    assert got == expected


@pytest.mark.parametrize("a,b", STRICT)
def test_strict_version_orders_as_distutils(a, b):
    ours = distutils_version.StrictVersion
    got = (ours(a) < ours(b), ours(a) == ours(b), ours(a) > ours(b))
    expected = _distutils_order("StrictVersion", a, b)
    if expected is not None:
        assert got == expected
    assert ours("2.5.5") >= ours("1.6.0") and ours("1.6.0a1") < ours("1.6.0")


def _distutils_order(kind, a, b):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from distutils import version
        except ImportError:
            return None
    cls = getattr(version, kind)
    if isinstance(cls, type) and cls.__module__.startswith("edgetrain"):
        return None
    return (cls(a) < cls(b), cls(a) == cls(b), cls(a) > cls(b))


# --- the door --------------------------------------------------------------------------------------

HEAVY = ("mxnet", "onnx", "onnxruntime")


def _heavy_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno} import {a.name}" for a in node.names
                      if a.name.split(".")[0] in HEAVY]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in HEAVY:
            found.append(f"{path.name}:{node.lineno} from {node.module}")
    return found


def test_every_heavy_import_in_edgetrain_goes_through_the_door():
    offenders = []
    for path in sorted(EDGETRAIN.rglob("*.py")):
        if path.name != "_lazy.py":
            offenders += _heavy_imports(path)
    assert offenders == []


def test_the_import_check_can_fail(tmp_path):
    # the control for the test above
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import onnxruntime as ort\n    from mxnet import gluon\n    import numpy\n")
    assert _heavy_imports(bad) == ["bad.py:2 import onnxruntime", "bad.py:3 from mxnet"]


ORT_SESSION = """
import json, os, sys
from pathlib import Path
mode = sys.argv[1] if len(sys.argv) > 1 else "door"
if mode == "door":
    from edgetrain import _lazy, runtime
    from edgetrain.compat import numpy_names
    ort = _lazy.onnxruntime()
    helper, TensorProto = _lazy.from_import("onnx", "helper", "TensorProto")
else:
    import onnxruntime as ort
    from onnx import helper, TensorProto
import numpy as np
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
m.ir_version = 7
if mode == "door":
    sess = _lazy.ort_session(m.SerializeToString(), threads=1)
else:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
y = sess.run(None, {"x": np.array([-1.0, 0.5, 2.0], np.float32)})[0]
home = Path(os.environ["HOME"])
print("RESULT " + json.dumps({"y": y.tolist(), "written": sorted(str(p.relative_to(home))
                                                         for p in home.rglob("*")),
                              "xdg": os.environ.get("XDG_CACHE_HOME")}))
"""


def test_onnxruntime_door_writes_nothing_in_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = child(ORT_SESSION, {"HOME": str(home)}, drop=("XDG_CACHE_HOME",))
    assert out["y"] == [0.0, 0.5, 2.0]
    assert out["written"] == []
    assert out["xdg"] is None     # the redirection lasted only while onnxruntime loaded
    assert "telemetry" not in out["stderr"]


def test_onnxruntime_without_the_door_does_write_in_home(tmp_path):
    # the control: the test above could not fail if ONNX Runtime wrote nothing anyway
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    proc = subprocess.run([sys.executable, "-c", ORT_SESSION, "raw"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout.split("RESULT ", 1)[1])["written"]
    if not written:
        pytest.skip("this onnxruntime writes no telemetry files (nothing for the door to prevent)")
    assert any(".onnxruntime" in w for w in written)


def _fake_package(tmp_path: Path, name: str, body: str) -> Path:
    fake = tmp_path / "fake"
    (fake / name).mkdir(parents=True)
    (fake / name / "__init__.py").write_text(body)
    return fake


CLI_EXPORT = ["-m", "edgetrain", "export", "edgetrain.nets:digits_cnn", "-o"]


@pytest.mark.parametrize("body,what,fix", [
    ('raise ModuleNotFoundError("No module named \'mxnet\'", name="mxnet")\n', "mxnet 1.9.1 is not installed",
     "edgetrain doctor --fix"),
    ('raise OSError("libgomp.so.1: cannot open shared object file: No such file or directory")\n',
     "mxnet cannot load: libgomp.so.1 is missing", "edgetrain doctor"),
    ('raise ModuleNotFoundError("No module named \'requests\'", name="requests")\n',
     "mxnet cannot load: it imports requests, which is not installed", "pip install requests"),
])
def test_mxnet_that_cannot_load_is_one_line_exit_2(tmp_path, body, what, fix):
    fake = _fake_package(tmp_path, "mxnet", body)
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    env["PYTHONPATH"] = str(fake)
    out = tmp_path / "m.onnx"
    proc = subprocess.run([sys.executable, *CLI_EXPORT, str(out)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and what in lines[0], proc.stderr
    assert fix in lines[0]
    assert "Traceback" not in proc.stderr and not out.exists()


def test_door_puts_the_requested_thread_cap_in_place_before_mxnet_loads():
    out = child("""
import json, os
from edgetrain import _lazy, runtime
runtime.apply_threads(1)
os.environ["OMP_NUM_THREADS"] = "7"     # changed behind the cap's back
mx = _lazy.mxnet()
print("RESULT " + json.dumps({"omp": os.environ["OMP_NUM_THREADS"],
                              "banner": os.environ.get("MXNET_SUBGRAPH_VERBOSE"),
                              "opened": _lazy.opened()}))
""")
    assert out["omp"] == "1" and out["banner"] == "0" and out["opened"] == ["mxnet"]


def test_from_import_and_module_open_the_right_door():
    out = child("""
import json, sys
from edgetrain import _lazy
TensorProto, helper = _lazy.from_import("onnx", "TensorProto", "helper")
quant = _lazy.module("onnxruntime.quantization")
print("RESULT " + json.dumps({"opened": _lazy.opened(), "mxnet_loaded": "mxnet" in sys.modules,
                              "quant": quant.__name__, "helper": helper.__name__}))
""")
    assert out["opened"] == ["onnx", "onnxruntime"] and out["mxnet_loaded"] is False
    assert out["quant"] == "onnxruntime.quantization" and out["helper"] == "onnx.helper"
    with pytest.raises(ValueError):
        from edgetrain import _lazy
        _lazy.module("numpy")


def test_a_plain_import_mxnet_after_edgetrain_gets_the_same_preparation():
    # a user's factory module or script that does `import mxnet` itself, once edgetrain is loaded
    out = child(REMOVE_ALL + """
import json, os
from edgetrain import runtime
runtime.apply_threads(1)
import mxnet as mx
restored = {a.name for a in numpy_names.applied().restored}
print("RESULT " + json.dumps({"pzero": mx.numpy.PZERO, "all_back": set(removed) <= restored,
                              "omp": os.environ["OMP_NUM_THREADS"], "numpy_lacks": "PZERO" not in vars(numpy)}))
""")
    assert out["pzero"] == 0.0 and out["all_back"] and out["omp"] == "1" and out["numpy_lacks"]
