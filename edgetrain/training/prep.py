"""The mxnet child of a Gluon model's fine-tune: ``python -m edgetrain.training.prep SPEC.json``.

It loads the Gluon model, writes its template (symbol + every weight: the fine-tuned PREFIX is written from
it at the end) and exports the whole model through edgetrain's Gluon->ONNX converter, with Gluon's outputs
on real samples (the parent checks ONNX Runtime against them before it trusts the export). Every
``--train-layers`` choice then trains that ONNX graph; the run itself imports no mxnet. A user error is
written to error.json for the parent to raise as its own.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from .. import envvars, procmem, runtime
from ..convert import build_onnx
from ..data import load_data
from ..errors import EdgetrainError
from ..fileio import atomic_path, atomic_write_bytes, atomic_write_text, write_npz
from ..models import load_gluon
from . import store
from .gluon import (BASE_ONNX, PREP_FORMAT, REFERENCE_FILE, VALIDATE_SAMPLES, graph_of,
                    write_template)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(spec["dir"])
    try:
        prepare(spec, out)
    except EdgetrainError as exc:
        if envvars.get("EDGETRAIN_DEBUG") == "1":
            raise
        (out / "error.json").write_text(json.dumps({"type": type(exc).__name__, "what": exc.what,
                                                    "where": exc.where, "fix": exc.fix}))
        return exc.exit_code
    return 0


def prepare(spec: dict, out: Path) -> None:
    """Load the base model, write its template, its ONNX export and Gluon's reference outputs for it.

    Ordered for the lowest peak (mxnet's import alone is ~140 MB): the references are computed one sample at a
    time, and the ONNX Runtime side of the check runs in the parent (which loads ONNX Runtime anyway)."""
    runtime.apply_threads(spec["threads"])
    model = load_gluon(spec["model"], params=spec["params"],
                       input_shape=tuple(spec["input_shape"]) if spec["input_shape"] else None)
    pre = model.preprocess
    g = graph_of(model.block, pre.input_name)
    prep = {"format": PREP_FORMAT, "key": spec["key"], "preprocess": pre.to_dict(), "data_name": g.data_name,
            "head": g.head, "notes": list(model.notes), "random_weights": bool(model.random_weights), "checked": False,
            **write_template(out, g)}
    del g
    ds = load_data(spec["data"], pre, max_bytes=spec.get("max_bytes"))  # the budget holds in the child too
    x, _ = ds.arrays(VALIDATE_SAMPLES)
    del ds
    want = np.concatenate([model.predict(x[i:i + 1]) for i in range(len(x))])
    store.release_freed_memory()
    # the exporter's own checker pass is skipped (it would double the peak): ONNX Runtime runs the result
    # against Gluon's outputs in the parent before it is trusted
    atomic_write_bytes(out / BASE_ONNX, build_onnx(model, check=False).SerializeToString(), "base model")
    with atomic_path(out / REFERENCE_FILE, "reference outputs") as tmp:
        with open(tmp, "wb") as fh:
            write_npz(fh, {"x": x, "want": want})
    prep.update({"validated_on": len(x), "onnx_sha256": store.file_sha(out / BASE_ONNX),
                 "peak_rss_mb": procmem.peak_rss_mb() or 0.0})
    atomic_write_text(out / "prep.json", json.dumps(prep), "template")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
