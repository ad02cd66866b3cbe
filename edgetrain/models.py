"""MODEL references -> Gluon blocks or ONNX files, each with the preprocessing it expects.

A MODEL is ``PREFIX`` (PREFIX-symbol.json + PREFIX-NNNN.params from ``HybridBlock.export``),
``zoo:NAME`` (Gluon model zoo; random weights unless ``params`` is given), ``pkg.module:function``
(a factory returning a Block; trusted code only) or a ``.onnx`` file where a command takes one.
Parsing a reference imports nothing heavy; loading one imports mxnet (or onnx).
"""
from __future__ import annotations

import importlib
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import _lazy, envvars
from .errors import UsageError, clip
from .fileio import (atomic_path, check_output_path, disk_full_error, file_digest, is_disk_full, parse_json,
                     path_arg, temp_dir)
from .preprocess import Preprocess, default_for_shape, parse_norm, read_sidecar, sidecar_path, sidecar_text

ZOO_PREFIX = "zoo:"
PRETRAINED_SUFFIX = "@pretrained"
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_PARAMS_EPOCH = re.compile(r"-(\d{4})\.params$")


@dataclass(frozen=True)
class ModelRef:
    kind: str  # "prefix" | "zoo" | "factory" | "onnx"
    text: str
    prefix: Path | None = None
    symbol_file: Path | None = None
    params_file: Path | None = None
    onnx_file: Path | None = None
    zoo_name: str | None = None
    factory: str | None = None
    pretrained: bool = False  # zoo:NAME@pretrained: the model zoo's published ImageNet weights


@dataclass
class GluonModel:
    """A loaded Gluon block ready to run, with what it expects as input."""

    block: object  # mxnet.gluon.HybridBlock
    ref: ModelRef
    preprocess: Preprocess
    num_classes: int
    random_weights: bool = False
    notes: list[str] = field(default_factory=list)

    def predict(self, x: np.ndarray) -> np.ndarray:
        mx = _lazy.mxnet()

        out = self.block(mx.nd.array(x, dtype="float32"))
        if isinstance(out, (list, tuple)):
            out = out[0]
        return out.asnumpy()


def is_factory_ref(text: str) -> bool:
    """``pkg.module:function`` that cannot be a PREFIX on disk: neither the name of an existing file nor
    of an exported model (``model:best-symbol.json``). Only such a reference is ever imported."""
    if not _FACTORY.match(text):
        return False
    path = Path(text)
    if path.exists() or Path(f"{text}-symbol.json").exists():
        return False
    return not any(path.parent.glob(f"{glob_escape(path.name)}-[0-9][0-9][0-9][0-9].params"))


def glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)


def parse_model_ref(text: str, accept_onnx: bool = False, where: str = "MODEL") -> ModelRef:
    """Classify a MODEL reference and check its files exist; nothing heavy is imported."""
    text = path_arg(text, "model", "edgetrain.parse_model_ref")
    if text.startswith(ZOO_PREFIX):
        name = text[len(ZOO_PREFIX):]
        pretrained = name.endswith(PRETRAINED_SUFFIX)
        name = name[: -len(PRETRAINED_SUFFIX)] if pretrained else name
        if not name:
            raise UsageError("empty model zoo name", where, "write zoo:NAME, e.g. zoo:mobilenetv2_1.0")
        if "@" in name:
            raise UsageError(f"unknown weights '{name.partition('@')[2][:40]}' in '{text[:80]}'", where,
                             f"write zoo:NAME{PRETRAINED_SUFFIX} for the published pretrained weights, or zoo:NAME "
                             "with --params FILE")
        return ModelRef("zoo", text, zoo_name=name, pretrained=pretrained)
    if text.lower().endswith(".onnx"):
        path = Path(text)
        if not accept_onnx:
            raise UsageError("this command takes a Gluon model, not an ONNX file", text,
                             "pass the PREFIX, zoo:NAME or pkg.module:function the ONNX file came from")
        if not path.is_file():
            raise UsageError("ONNX file not found", text, "check the path")
        return ModelRef("onnx", text, onnx_file=path)
    if is_factory_ref(text):
        return ModelRef("factory", text, factory=text)
    return _parse_prefix(text, where)


def _parse_prefix(text: str, where: str) -> ModelRef:
    prefix = Path(text)
    for suffix in ("-symbol.json", ".params"):  # accept the symbol or params file given by mistake
        if text.endswith(suffix):
            prefix = Path(_PARAMS_EPOCH.sub("", text) if suffix == ".params" else text[: -len(suffix)])
    symbol = Path(f"{prefix}-symbol.json")
    if not symbol.is_file():
        raise UsageError(f"model not found: no {symbol.name}", str(symbol.parent),
                         "give PREFIX as written by HybridBlock.export (PREFIX-symbol.json + PREFIX-0000.params), "
                         "zoo:NAME or pkg.module:function")
    candidates = sorted(symbol.parent.glob(f"{prefix.name}-[0-9][0-9][0-9][0-9].params"))
    if not candidates:
        raise UsageError(f"model weights not found: no {prefix.name}-NNNN.params", str(symbol.parent),
                         "export the model with its parameters (HybridBlock.export)")
    return ModelRef("prefix", text, prefix=prefix, symbol_file=symbol, params_file=candidates[-1])


def load_gluon(text: str, params: str | None = None, input_shape: tuple[int, int, int] | None = None,
               hybridize: bool = True, mean=None, std=None) -> GluonModel:
    """Load a MODEL reference as a Gluon block and check it runs on its input shape.

    ``mean``/``std`` (one value per channel, or a comma-separated string) override the recorded or
    default normalisation; a PREFIX with no edgetrain record needs ``input_shape``.
    """
    model = load_gluon_unrun(path_arg(text, "model", "edgetrain.load_gluon"), params, input_shape, mean, std)
    if hybridize:
        model.block.hybridize()
    model.num_classes = _check_runs(model)
    check_finite_params(model.block, model.ref.text)
    if model.preprocess.class_names is not None and len(model.preprocess.class_names) != model.num_classes:
        model.notes.append(f"recorded {len(model.preprocess.class_names)} class names but the model has "
                           f"{model.num_classes} outputs; class names dropped")
        model.preprocess = model.preprocess.with_classes(None)
    return model


def load_gluon_unrun(text: str, params: str | None = None, input_shape: tuple[int, int, int] | None = None,
                     mean=None, std=None) -> GluonModel:
    """The MODEL reference as a Gluon block, not yet run (the profile child times its real first inference)."""
    ref = parse_model_ref(text)
    if ref.kind == "prefix":
        return _load_prefix(ref, input_shape, mean, std)
    model = _load_zoo(ref, params, input_shape) if ref.kind == "zoo" else _load_factory(ref, params, input_shape)
    model.preprocess = with_norm(model.preprocess, mean, std)
    return model


def _mx_error(exc: Exception) -> str:
    """The informative line of an MXNetError (which embeds a C++ stack trace in its text)."""
    skip = ("Traceback", "File ", "Stack trace", "[bt]", "  ")
    lines = [ln.strip() for ln in str(exc).splitlines()
             if ln.strip() and not ln.startswith(skip) and not ln.strip().startswith(skip)]
    text = lines[0] if lines else type(exc).__name__
    return text.replace("MXNetError: ", "")[:300]


def _load_prefix(ref: ModelRef, input_shape, mean=None, std=None) -> GluonModel:
    mx = _lazy.mxnet()
    gluon = _lazy.from_import("mxnet", "gluon")

    pre = read_sidecar(ref.prefix)
    try:
        sym = mx.sym.load(str(ref.symbol_file))
    except Exception as exc:  # MXNetError or json errors: the file is not a symbol
        raise UsageError(f"cannot read the symbol file: {_mx_error(exc)}", str(ref.symbol_file),
                         "re-export the model with HybridBlock.export") from None
    try:
        saved = mx.nd.load(str(ref.params_file))
    except Exception as exc:
        raise UsageError(f"cannot read the params file (corrupt or truncated): {_mx_error(exc)}",
                         str(ref.params_file), "re-export the model or restore the file") from None
    names = {k.split(":", 1)[-1] for k in saved} if isinstance(saved, dict) else set()
    inputs = [n for n in sym.list_inputs() if n not in names]
    if len(inputs) != 1:
        missing = ", ".join(inputs[:5])
        raise UsageError(f"params file does not match the symbol: {len(inputs)} inputs have no weights "
                         f"({missing})", str(ref.params_file),
                         "use the params file exported together with this symbol")
    unused = names - set(sym.list_inputs())
    if unused:
        raise UsageError(f"params file does not match the symbol: {len(unused)} weights the symbol does not use "
                         f"(e.g. {sorted(unused)[0]})", str(ref.params_file),
                         "use the params file exported together with this symbol")
    notes = []
    if pre is None:
        # HybridBlock.export records no input size or normalisation: guessing 224x224 + ImageNet would
        # silently resize 32x32 images to 224 and train to chance. The size must be given.
        if not input_shape:
            raise UsageError(f"input shape unknown: {ref.prefix.name} has no edgetrain record "
                             f"({sidecar_path(ref.prefix).name})", str(ref.prefix),
                             "pass --input-shape 1,C,H,W (and --mean/--std), or write that file: "
                             '{"preprocess": {"input_shape": [C, H, W], "mean": [...], "std": [...]}}')
        pre = default_for_shape(input_shape)
        if mean is None or std is None:
            notes.append(f"no normalisation recorded with the model: using mean {list(pre.mean)} std "
                         f"{list(pre.std)} (pass --mean/--std if it was trained with others)")
    elif input_shape and tuple(input_shape) != pre.input_shape:
        pre = pre.with_shape(input_shape)
    pre = with_norm(pre, mean, std)
    if pre.input_name != inputs[0]:
        pre = Preprocess(**{**pre.__dict__, "input_name": inputs[0]})
    try:
        with _quiet_warnings():
            block = gluon.SymbolBlock.imports(str(ref.symbol_file), [inputs[0]], str(ref.params_file))
    except Exception as exc:
        raise UsageError(f"params file does not match the symbol: {_mx_error(exc)}", str(ref.params_file),
                         "use the params file exported together with this symbol") from None
    return GluonModel(block, ref, pre, num_classes=0, notes=notes)


def with_norm(pre: Preprocess, mean, std) -> Preprocess:
    """``pre`` with the mean/std the user gave (either alone keeps the other)."""
    if mean is None and std is None:
        return pre
    from dataclasses import replace

    c = pre.channels
    mean = tuple(parse_norm(mean, c, "--mean")) if mean is not None else pre.mean
    std = tuple(parse_norm(std, c, "--std")) if std is not None else pre.std
    return replace(pre, mean=mean, std=std)


def _load_zoo(ref: ModelRef, params, input_shape) -> GluonModel:
    vision = _lazy.from_import("mxnet.gluon.model_zoo", "vision")

    name = ref.zoo_name
    try:
        block = vision.get_model(name.lower(), pretrained=False)
    except ValueError as exc:  # get_model lists the names it knows in its message
        known = [ln.strip() for ln in str(exc).splitlines()[1:] if ln.strip()]
        close = [k for k in known if k.startswith(name.lower()[:4])][:6] or known[:6]
        raise UsageError(f"unknown model zoo name '{name}'", ref.text,
                         f"try one of: {', '.join(close)} ({len(known)} names in all)") from None
    default = (3, 299, 299) if "inception" in name.lower() else (3, 224, 224)
    pre = default_for_shape(tuple(input_shape or default))
    if ref.pretrained:
        if params:
            raise UsageError("both pretrained weights and --params given", ref.text,
                             f"drop {PRETRAINED_SUFFIX} to load --params, or drop --params")
        path = pretrained_params(name.lower(), ref.text)
        _load_params(block, str(path))
        return GluonModel(block, ref, pre, num_classes=0, notes=[f"pretrained weights: {path}"])
    if params:
        _load_params(block, params)
        return GluonModel(block, ref, pre, num_classes=0)
    block.initialize()
    return GluonModel(block, ref, pre, num_classes=0, random_weights=True,
                      notes=["random weights (no --params given)"])


PRETRAINED_TIMEOUT_S = 60.0       # one network wait (connect, a read that brings nothing)
PRETRAINED_DEADLINE_S = 1800.0    # the whole download (EDGETRAIN_DOWNLOAD_DEADLINE): a 1 byte/s mirror ends


def pretrained_params(name: str, where: str) -> Path:
    """The model zoo's published weights for ``name`` in MXNet's own cache (``$MXNET_HOME/models``, by
    default ~/.mxnet/models, named NAME-SHA1[:8].params as mxnet names them), downloaded once and checked
    against the SHA-1 mxnet publishes. A cached file with the right checksum is used with no network."""

    model_store = _lazy.module("mxnet.gluon.model_zoo.model_store")
    base = _lazy.module("mxnet.base")
    table = model_store._model_sha1
    if name not in table:
        raise UsageError(f"the Gluon model zoo publishes no pretrained weights for '{name}'", where,
                         f"pretrained weights exist for: {', '.join(sorted(table))}")
    sha1 = table[name]
    file_name = f"{name}-{sha1[:8]}"
    root = Path(base.data_dir()).expanduser() / "models"
    path = root / f"{file_name}.params"
    repo = envvars.get("MXNET_GLUON_REPO", model_store.apache_repo_url).rstrip("/") + "/"
    url = model_store._url_format.format(repo_url=repo, file_name=file_name)

    def digest(p: Path) -> str:
        return file_digest(p, "sha1")

    fix = (f"download {url} where there is network, unzip it and put {path.name} in {root} (SHA-1 {sha1}); "
           "edgetrain then uses it offline")
    if path.is_file():
        if digest(path) == sha1:
            return path
        stale = f"the cached file's SHA-1 is not the published {sha1[:8]}..."
    else:
        stale = None
    try:
        _download_params(url, path, file_name)
    except _NoDownload as exc:
        what = f"{stale}, and a fresh copy cannot be downloaded ({exc})" if stale else \
            f"pretrained weights for '{name}' are not cached and cannot be downloaded ({exc})"
        raise UsageError(what, str(path), ("delete it; " if stale else "") + fix) from None
    if digest(path) != sha1:
        path.unlink()
        raise UsageError(f"downloaded weights for '{name}' do not have the published SHA-1 {sha1[:8]}... (removed)",
                         url, fix)
    return path


class _NoDownload(Exception):
    pass


def _download_deadline() -> float:
    text = envvars.get("EDGETRAIN_DOWNLOAD_DEADLINE")
    if text is None:
        return PRETRAINED_DEADLINE_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise UsageError(f"EDGETRAIN_DOWNLOAD_DEADLINE must be a positive number of seconds, not '{clip(text, 40)}'",
                         "environment", "unset it (30 minutes) or give seconds, e.g. 600")
    return value


def _download_params(url: str, path: Path, file_name: str) -> None:
    """Fetch the zip mxnet publishes and put its .params at ``path`` atomically (no half file is ever left)."""
    import shutil
    import urllib.request
    import zipfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _NoDownload(f"cannot create the cache folder: {exc.strerror}") from None
    with temp_dir("pretrained", dir=path.parent) as tmp:
        zipped = Path(tmp) / f"{file_name}.zip"
        deadline = _download_deadline()
        end = time.monotonic() + deadline
        try:
            with urllib.request.urlopen(url, timeout=min(PRETRAINED_TIMEOUT_S, deadline)) as resp, \
                    open(zipped, "wb") as out:
                while True:
                    if time.monotonic() > end:
                        raise _NoDownload(f"not finished within the {deadline:g} s deadline "
                                          f"({out.tell():,} bytes received; EDGETRAIN_DOWNLOAD_DEADLINE sets it)")
                    chunk = resp.read1(1 << 20)  # what has arrived (read() would wait for the whole 1 MiB)
                    if not chunk:
                        break
                    out.write(chunk)
            with zipfile.ZipFile(zipped) as zf, zf.open(f"{file_name}.params") as member:
                with atomic_path(path, "pretrained weights") as dst, open(dst, "wb") as out:
                    shutil.copyfileobj(member, out, 1 << 20)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:  # URLError, timeout, no such member
            reason = getattr(exc, "reason", None) or exc
            raise _NoDownload(clip(str(reason), 120)) from None


def _load_factory(ref: ModelRef, params, input_shape) -> GluonModel:
    gluon = _lazy.from_import("mxnet", "gluon")

    module_name, func_name = ref.factory.split(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # a factory in the user's working folder
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import module '{module_name}': {exc}", ref.text,
                         "check the module is importable from here (PYTHONPATH)") from None
    except SyntaxError as exc:
        raise UsageError(f"factory module '{module_name}' has a syntax error: {exc.msg} (line {exc.lineno})",
                         exc.filename or ref.text, "fix the module") from None
    except Exception as exc:  # the module raised while importing: the user's code, reported as theirs
        raise UsageError(f"factory module '{module_name}' raised {type(exc).__name__} on import: "
                         f"{clip(str(exc), 150)}", ref.text, "fix the module (EDGETRAIN_DEBUG=1 shows the traceback)") \
            from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UsageError(f"module '{module_name}' has no function '{func_name}'", ref.text, "check the name")
    import inspect

    try:
        inspect.signature(func).bind()
    except TypeError:
        raise UsageError(f"factory '{func_name}' cannot be called without arguments", ref.text,
                         "give every parameter a default, or wrap it in a function that takes none") from None
    except ValueError:  # builtins without a signature: just call them
        pass
    try:
        block = func()
    except Exception as exc:
        raise UsageError(f"factory '{func_name}' raised {type(exc).__name__}: {clip(str(exc), 150)}", ref.text,
                         "fix the factory (EDGETRAIN_DEBUG=1 shows the traceback)") from None
    if not isinstance(block, gluon.HybridBlock):
        kind = "a Block that cannot be hybridized" if isinstance(block, gluon.Block) else type(block).__name__
        raise UsageError(f"factory returned {kind}, not a gluon.HybridBlock", ref.text,
                         "return a HybridBlock (HybridSequential, a model zoo network, ...)")
    pre = getattr(block, "edgetrain_preprocess", None)
    pre = Preprocess.from_dict(pre, ref.text) if isinstance(pre, dict) else default_for_shape(input_shape or (3, 224, 224))
    if input_shape and tuple(input_shape) != pre.input_shape:
        pre = pre.with_shape(input_shape)
    if params:
        _load_params(block, params)
        return GluonModel(block, ref, pre, num_classes=0)
    uninitialised = [p for p in block.collect_params().values() if p._data is None and not p._deferred_init]
    if uninitialised:
        block.initialize()
        return GluonModel(block, ref, pre, num_classes=0, random_weights=True,
                          notes=["random weights (factory returned an uninitialised block; no --params given)"])
    return GluonModel(block, ref, pre, num_classes=0)


def _load_params(block, params: str) -> None:
    path = Path(params)
    if not path.is_file():
        raise UsageError("params file not found", params, "check the path")
    try:
        block.load_parameters(str(path))
    except Exception as exc:
        raise UsageError(f"params file does not match the model: {_mx_error(exc)}", params,
                         "use the params saved from this architecture (save_parameters)") from None


def check_finite_params(block, where: str) -> None:
    """A model holding NaN/inf weights is refused at load: ReLU maps NaN to 0, so its outputs can look
    fine while it is broken (an export would "pass", an int8 model sits at chance)."""
    for name, p in block.collect_params().items():
        try:
            arr = p.data().asnumpy()
        except Exception:  # deferred/uninitialised: nothing to check yet
            continue
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
            raise UsageError(f"model weights hold {bad} non-finite value(s) (NaN/inf) in {clip(name, 80)}", where,
                             "the model is broken (a diverged training?): use an earlier checkpoint")


def _check_runs(model: GluonModel) -> int:
    """Run one zero batch: proves the shape fits and gives the number of outputs (classes)."""
    import contextlib
    import io

    x = np.zeros(model.preprocess.batch_shape(1), dtype="float32")
    try:
        # mxnet prints "infer_shape error. Arguments: ..." to stdout before raising; the error says it better
        with contextlib.redirect_stdout(io.StringIO()):
            y = model.predict(x)
    except Exception as exc:
        # no memory is not a wrong shape: std::bad_alloc, or mxnet's own allocator under ulimit -v ("Check failed:
        # ret == 0 (12 vs. 0) : AlignedMallocPitch failed", 12 = ENOMEM)
        if isinstance(exc, MemoryError) or any(s in str(exc) for s in ("bad_alloc", "AlignedMalloc")):
            from .errors import RunFailed

            raise RunFailed(f"out of memory running the model once ({_mx_error(exc)})", model.ref.text,
                            "free memory, or raise the address-space limit (ulimit -v)") from None
        raise UsageError(f"input shape {','.join(map(str, model.preprocess.batch_shape(1)))} does not fit the "
                         f"model: {_mx_error(exc)}", model.ref.text,
                         "pass the shape the model was built for with --input-shape") from None
    if y.ndim != 2:
        raise UsageError(f"model output has shape {y.shape}; edgetrain expects (batch, classes)", model.ref.text,
                         "use an image-classification model")
    return int(y.shape[1])


class _quiet_warnings:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def save_prefix(model: GluonModel, prefix: str | Path, extra: dict | None = None) -> dict[str, Path]:
    """Write ``PREFIX-symbol.json``, ``PREFIX-0000.params`` and the preprocessing record, each atomically.
    A full disk is a one-line error and leaves the old files (if any) as they were."""
    prefix = Path(path_arg(prefix, "prefix", "edgetrain.save_prefix"))
    check_output_path(Path(f"{prefix}-symbol.json"), "model")
    with temp_dir("save", dir=prefix.parent) as tmp:  # PID-named: a SIGKILLed save's is removed next time
        tmp_prefix = Path(tmp) / "model"
        model.block.hybridize()
        model.predict(np.zeros(model.preprocess.batch_shape(1), dtype="float32"))
        try:
            model.block.export(str(tmp_prefix), epoch=0)
        except Exception as exc:  # MXNet reports a failed write as MXNetError, not OSError
            import shutil

            if is_disk_full(exc) or shutil.disk_usage(tmp).free < (1 << 20):
                raise disk_full_error(OSError(28, "No space left on device"), prefix, "model") from None
            raise
        out = {"symbol": Path(f"{prefix}-symbol.json"), "params": Path(f"{prefix}-0000.params"),
               "preprocess": sidecar_path(prefix)}
        for key, src in (("symbol", Path(f"{tmp_prefix}-symbol.json")), ("params", Path(f"{tmp_prefix}-0000.params"))):
            with atomic_path(out[key], "model") as dst:
                dst.write_bytes(src.read_bytes())
        with atomic_path(out["preprocess"], "model") as dst:
            dst.write_text(sidecar_text(model.preprocess, extra), encoding="utf-8")
    return out


@dataclass
class OnnxModel:
    path: Path
    proto: Any  # onnx.ModelProto (onnx is imported lazily: no type to name here)
    preprocess: Preprocess | None
    metadata: dict


def load_onnx(path: str | Path) -> OnnxModel:
    """Read an ONNX file and the edgetrain preprocessing stored in its metadata_props (if any)."""
    path = Path(path_arg(path, "path", "edgetrain.load_onnx"))
    onnx = _lazy.onnx()

    if not path.is_file():
        raise UsageError("ONNX file not found", str(path), "check the path")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:
        raise UsageError(f"not a readable ONNX model: {str(exc).splitlines()[0][:200]}", str(path),
                         "export it again") from None
    meta = {p.key: p.value for p in proto.metadata_props}
    pre = None
    if "edgetrain.preprocess" in meta:
        try:
            record = parse_json(meta["edgetrain.preprocess"])
        except ValueError as exc:
            raise UsageError(f"malformed edgetrain metadata 'edgetrain.preprocess': {clip(str(exc), 100)}",
                             str(path), "export the model again with `edgetrain export`") from None
        if not isinstance(record, dict):
            raise UsageError("malformed edgetrain metadata 'edgetrain.preprocess': not a JSON object", str(path),
                             "export the model again with `edgetrain export`")
        pre = Preprocess.from_dict(record, f"{path} metadata 'edgetrain.preprocess'")
    check_onnx_ops(proto, str(path))
    _check_finite_initializers(proto, str(path))
    return OnnxModel(path, proto, pre, meta)


def _check_finite_initializers(proto, where: str) -> None:
    numpy_helper = _lazy.from_import("onnx", "numpy_helper")

    for init in proto.graph.initializer:
        if init.data_type not in (1, 10, 11, 16):  # float, float16, double, bfloat16
            continue
        try:
            arr = numpy_helper.to_array(init)
        except Exception:  # external data not found etc.: ONNX Runtime reports it properly
            continue
        if not np.isfinite(arr).all():
            raise UsageError(f"ONNX weights hold non-finite values (NaN/inf) in {clip(init.name, 80)}", where,
                             "the model is broken (a diverged training?): export it again from good weights")


# Operator domains ONNX Runtime's CPU provider implements; any other domain is a custom op it cannot run.
KNOWN_OP_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc", "ai.onnx.preview.training"}


def check_onnx_ops(proto, where: str) -> None:
    """An operator from a custom domain (no registered kernel) is the model's problem, named as such,
    not a failure blamed later on the data it was run with."""
    def nodes(graph):
        for n in graph.node:
            yield n
            for a in n.attribute:
                if a.g is not None and a.g.node:
                    yield from nodes(a.g)
                for g in a.graphs:
                    yield from nodes(g)

    local = {f.domain for f in proto.functions}
    for n in nodes(proto.graph):
        if n.domain not in KNOWN_OP_DOMAINS and n.domain not in local:
            raise UsageError(f"ONNX model uses the custom operator {clip(n.domain, 60)}::{clip(n.op_type, 60)} "
                             f"(node {clip(n.name, 60)!r}), which ONNX Runtime has no kernel for", where,
                             "export the model with standard ONNX operators")
