"""DATA references -> labelled samples preprocessed for a model.

DATA is an image folder (one sub-folder per class; JPEG/PNG, grayscale or colour), an ``.npz`` with
``data`` and ``label`` arrays (loaded with ``allow_pickle=False``; optional ``class_names``), or
``builtin:digits`` (the UCI 8x8 handwritten digits that ship with edgetrain). Samples are decoded
lazily, batch by batch, so an image folder larger than RAM can still be read.

Every size that comes from the input is checked before it is used: an .npz's arrays from their npy
headers against the memory budget (a compressed bomb is refused before it expands), labels against the
class count (``class_names``, the model's outputs, or at most ``MAX_CLASSES``), images against a pixel
limit before they are decoded. NaN/inf pixels are refused at load. The pixel scale of an .npz follows a
documented rule, stated in the dataset's notes: uint8 -> x/255; any other integer or float data whose
values all lie in 0..1 -> as they are, in 0..255 -> x/255, in 0..65535 -> x/65535; anything else (e.g.
data already normalised, with negative values) is refused. An .npz may state its scale itself with a
scalar ``scale`` array (pixels * scale must then lie in 0..1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from . import envvars
from .errors import UsageError, clip
from .preprocess import Preprocess

if TYPE_CHECKING:
    import zipfile

BUILTIN_PREFIX = "builtin:"
BUILTINS = ("digits",)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
# Every size that comes from the input is checked before it is used. An image over this many pixels is
# refused before it is decoded (decompression bombs, lying headers): 40 MP is a 7300x5500 photo.
MAX_IMAGE_PIXELS = int(envvars.get("EDGETRAIN_MAX_IMAGE_PIXELS", str(40_000_000)))
# Without class_names the class count is the largest label + 1; more than this is a corrupt label.
MAX_CLASSES = 100_000
# Pixel scale, by documented rule (README, DATA): uint8 -> /255; other integers and floats: all values
# within 0..1 -> as they are, within 0..255 -> /255, within 0..65535 -> /65535 (16-bit); anything else is
# refused. An .npz may state its own scale with a scalar 'scale' array (pixels * scale must lie in 0..1).
_SCALE_RULES = ((1.0, 1.0, "0..1"), (255.0, 1.0 / 255.0, "0..255"), (65535.0, 1.0 / 65535.0, "0..65535"))


@dataclass
class Dataset:
    """Labels up front; pixels decoded and preprocessed on demand by ``batch``."""

    source: str
    class_names: list[str]
    labels: np.ndarray  # int64, (N,)
    _raw: Callable[[int], np.ndarray]  # index -> HxWxC: float32 in [0, 1], or uint8 (an image file: pixel / 255)
    preprocess: Preprocess
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    _index: np.ndarray | None = None  # positions into the raw source (for subsets)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def batch(self, idx, out: np.ndarray | None = None) -> np.ndarray:
        """Preprocessed float32 samples (len(idx), C, H, W), written into ``out`` when given."""
        idx = np.asarray(idx, dtype=np.int64)
        src = self._index[idx] if self._index is not None else idx
        if out is None:
            out = np.empty((len(idx), *self.preprocess.input_shape), dtype=np.float32)
        for i, j in enumerate(src):
            to_model_input(self._raw(int(j)), self.preprocess, out[i])
        return out

    def raw_batch(self, idx) -> np.ndarray:
        """The samples as read, before mean/std: (len(idx), H, W, C) float32 in [0, 1]."""
        idx = np.asarray(idx, dtype=np.int64)
        src = self._index[idx] if self._index is not None else idx
        return np.stack([unit_scale(self._raw(int(j))) for j in src]).astype(np.float32)

    def arrays(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every sample, or a stratified ``sample(limit)`` of them: never the first ``limit`` of a sorted source."""
        ds = self if limit is None or limit >= len(self) else self.sample(limit)
        return ds.batch(np.arange(len(ds))), np.asarray(ds.labels)

    def sample(self, n: int, seed: int = 0) -> "Dataset":
        """Up to ``n`` samples for a check or a calibration, drawn by ``stratified`` (every class when it can)."""
        return self.subset(stratified(self.labels, n, seed))

    def subset(self, idx) -> "Dataset":
        idx = np.asarray(idx, dtype=np.int64)
        base = self._index[idx] if self._index is not None else idx
        return Dataset(self.source, self.class_names, self.labels[idx], self._raw, self.preprocess,
                       self.skipped, list(self.notes), base)

    def shuffled(self, seed: int) -> "Dataset":
        return self.subset(np.random.RandomState(seed).permutation(len(self)))

    def split(self, fraction: float, seed: int = 0) -> tuple["Dataset", "Dataset"]:
        """Stratified split: (rest, held-out ``fraction``), every class in both where it has 2+ samples."""
        if not 0.0 < fraction < 1.0:
            raise UsageError(f"split fraction must be between 0 and 1, got {fraction}", "--val-split",
                             "use e.g. 0.2")
        rng = np.random.RandomState(seed)
        held = []
        for c in np.unique(self.labels):
            members = np.flatnonzero(self.labels == c)
            rng.shuffle(members)
            k = int(round(len(members) * fraction))
            if len(members) >= 2:
                k = min(max(k, 1), len(members) - 1)
            held.extend(members[:k].tolist())
        held_mask = np.zeros(len(self), dtype=bool)
        held_mask[held] = True
        rest = np.flatnonzero(~held_mask)
        # one or two samples, or only one-sample classes: a part left empty would end in a division by
        # zero once the work is done (issue 26); refused here, before any of it
        if not held or not len(rest):
            n, k = len(self), len(np.unique(self.labels))
            single = " (every class has one sample)" if n == k else ""
            if not held:
                raise UsageError(f"holding out {fraction:.0%} of {n} sample(s) in {k} class(es) leaves none to "
                                 f"measure accuracy on{single}", self.source,
                                 "give held-out data with --val, or at least 2 samples in a class")
            raise UsageError(f"holding out {fraction:.0%} of {n} sample(s) in {k} class(es) leaves none to train "
                             f"on{single}", self.source, "give more samples, or a smaller --val-split")
        return self.subset(rng.permutation(rest)), self.subset(rng.permutation(np.flatnonzero(held_mask)))

    def select_classes(self, classes) -> "Dataset":
        """Only the samples of the given class indices (names and numbering unchanged)."""
        mask = np.isin(self.labels, list(classes))
        return self.subset(np.flatnonzero(mask))


def stratified(labels, n: int, seed: int = 0) -> np.ndarray:
    """Indices of ``min(n, len(labels))`` samples, the one sampler of every check and calibration (issue 26: the
    first 16 of a folder sorted by class are all one class). Deterministic for a seed. Every class is drawn
    when ``n`` >= the number of classes, the rest in proportion to the class sizes (largest remainder);
    ``n`` < classes draws ``n`` distinct classes, a seeded choice. Within a class the members are a seeded
    choice; the indices come out round-robin across classes, so any prefix of them is spread too."""
    labels = np.asarray(labels).reshape(-1)
    total = int(labels.size)
    n = max(0, min(int(n), total))
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.RandomState(seed)
    classes, counts = np.unique(labels, return_counts=True)
    if n < len(classes):
        take = np.zeros(len(classes), dtype=np.int64)
        take[rng.choice(len(classes), n, replace=False)] = 1
    else:
        take = np.ones(len(classes), dtype=np.int64)
        share = counts / total * (n - len(classes))
        take += np.minimum(np.floor(share).astype(np.int64), counts - 1)
        left = n - int(take.sum())
        order = np.argsort(-(share - np.floor(share)), kind="stable")
        while left > 0:  # largest remainder first; a class with no member left gives its turn away
            for c in order:
                if left and take[c] < counts[c]:
                    take[c] += 1
                    left -= 1
    picked = []
    for c, k in zip(classes, take):
        members = np.flatnonzero(labels == c)
        picked.append(np.sort(rng.choice(members, int(k), replace=False)) if k else members[:0])
    rounds = [p[i] for i in range(int(take.max())) for p in picked if i < len(p)]
    return np.asarray(rounds, dtype=np.int64)


def unit_scale(img: np.ndarray) -> np.ndarray:
    """A reader's sample on the [0, 1] scale: an 8-bit image (uint8) as float32 pixel / 255, else as it is."""
    return img.astype(np.float32) / np.float32(255.0) if img.dtype == np.uint8 else img


class ParallelReader:
    """``Dataset.batch`` on ``threads`` threads: this one and ``threads - 1`` helpers, each decoding a share
    of the rows into one batch (Pillow's decoders and NumPy's arithmetic release the GIL). For work that
    alternates with a runtime on the same cores, never beside it: the feature pass decodes, then ONNX
    Runtime runs (its workers told to stop spinning after each run), so no more than ``threads`` threads
    are busy at any moment."""

    def __init__(self, threads: int):
        from concurrent.futures import ThreadPoolExecutor

        self.parts = max(1, threads)
        self._out: np.ndarray | None = None  # one batch buffer, reused: a new one per batch grew the heap
        self.helpers = (ThreadPoolExecutor(self.parts - 1, thread_name_prefix="edgetrain-decode")
                        if self.parts > 1 else None)

    def batch(self, ds: "Dataset", idx) -> np.ndarray:
        """The rows of ``idx``, in a buffer this reader reuses: valid until its next call."""
        idx = np.asarray(idx, dtype=np.int64)
        shape = (len(idx), *ds.preprocess.input_shape)
        if self._out is None or self._out.shape[0] < shape[0] or self._out.shape[1:] != shape[1:]:
            self._out = np.empty(shape, dtype=np.float32)
        out = self._out[:len(idx)]
        parts = min(self.parts, len(idx))
        if self.helpers is None or parts < 2:
            return ds.batch(idx, out)
        cuts = [len(idx) * k // parts for k in range(parts + 1)]
        from concurrent import futures

        shares = [self.helpers.submit(ds.batch, idx[a:b], out[a:b]) for a, b in zip(cuts[1:-1], cuts[2:])]
        try:
            ds.batch(idx[:cuts[1]], out[:cuts[1]])
        finally:
            futures.wait(shares)  # every helper done before the batch is used or an error leaves
        for share in shares:
            share.result()  # a helper's error (an image that cannot be decoded) is raised here
        return out

    def close(self) -> None:
        if self.helpers is not None:
            self.helpers.shutdown(wait=True)


def to_model_input(img: np.ndarray, pre: Preprocess, out: np.ndarray | None = None) -> np.ndarray:
    """HxWxC (float32 in [0,1], or an 8-bit image) -> CxHxW normalised for the model, written into ``out``
    when given (a row of a batch). The same float32 operations in the same order as
    ``(float32(pixel) / 255 - mean) / std``, so the same bits, but straight into the CHW buffer with no
    temporaries: 0.09 ms instead of 0.33 ms for a 160x160 RGB image, and an 8-bit image is scaled there
    too (its float copy and the /255 array cost another 0.2 ms)."""
    from PIL import Image

    h, w = pre.hw
    mean = np.asarray(pre.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(pre.std, dtype=np.float32)[:, None, None]
    if img.dtype == np.uint8 and img.shape == (h, w, pre.channels):  # an image file, read at the model's size
        if out is None:
            out = np.empty((pre.channels, h, w), dtype=np.float32)
        np.divide(img.transpose(2, 0, 1), np.float32(255.0), out=out)
        out -= mean
        out /= std
        return out
    img = unit_scale(img)
    if img.shape[2] != pre.channels:
        if pre.channels == 1:  # ITU-R 601 luma, as PIL's convert('L')
            img = (img[..., :3] @ np.array([0.299, 0.587, 0.114], dtype=np.float32))[..., None]
        else:
            img = np.repeat(img[..., :1], 3, axis=2)
    if img.shape[0] != h or img.shape[1] != w:
        chans = [np.asarray(Image.fromarray(np.ascontiguousarray(img[..., c], dtype=np.float32), mode="F")
                            .resize((w, h), Image.BILINEAR)) for c in range(img.shape[2])]
        img = np.stack(chans, axis=2)
    if out is None:
        out = np.empty((img.shape[2], h, w), dtype=np.float32)
    if img.dtype != np.float32:  # another reader's precision: computed in it, then rounded, as before
        out[...] = (img.transpose(2, 0, 1) - mean) / std
        return out
    np.subtract(img.transpose(2, 0, 1), mean, out=out)
    out /= std
    return out


def load_data(ref: str, pre: Preprocess, where: str = "--data", num_classes: int | None = None,
              max_bytes: int | None = None) -> Dataset:
    """Resolve a DATA reference for a model that takes ``pre``.

    ``num_classes``: the model's class count when it is known (labels at or over it are refused before
    anything is allocated). ``max_bytes``: the memory the arrays of an .npz may take once read (default:
    half of the memory available now); checked from the file's headers before anything is read whole.
    """
    from .fileio import path_arg

    ref = path_arg(ref, "data", where)
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX):]
        if name not in BUILTINS:
            raise UsageError(f"unknown built-in data set '{name}'", where, "use one of: "
                             + ", ".join(BUILTIN_PREFIX + b for b in BUILTINS))
        ds = _load_digits(pre, ref)
    elif not Path(ref).exists():
        raise UsageError("data not found", ref, "give an image folder, an .npz file or builtin:digits")
    elif Path(ref).is_dir():
        ds = _load_folder(Path(ref), pre, where)
    elif Path(ref).suffix.lower() == ".npz":
        ds = _load_npz(Path(ref), pre, where, num_classes, max_bytes)
    else:
        raise UsageError("unsupported data file", ref, "give an image folder (one sub-folder per class), "
                     "an .npz with 'data' and 'label', or builtin:digits")
    if num_classes is not None and int(ds.labels.max(initial=0)) >= num_classes:
        raise UsageError(f"label {int(ds.labels.max())} is out of range for a model with {num_classes} classes",
                         ref, f"store class indices 0..{num_classes - 1}")
    return ds


def _check_classes(n: int, source: str, where: str) -> None:
    if n < 2:
        raise UsageError(f"data has {n} class{'es' if n != 1 else ''}; classification needs at least 2",
                         source, "add a sub-folder (or label) per class")


def _load_digits(pre: Preprocess, ref: str) -> Dataset:
    # gzip, zipfile and importlib.resources are imported where they are used: `edgetrain predict` on an
    # image folder starts without them (its start-up stays within 10% of a bare ONNX Runtime loop)
    import gzip
    from importlib import resources

    raw = resources.files("edgetrain._builtin").joinpath("digits.csv.gz").read_bytes()
    table = np.loadtxt(gzip.decompress(raw).decode("ascii").splitlines(), delimiter=",", dtype=np.float32)
    pixels = (table[:, :64] / 16.0).reshape(-1, 8, 8, 1).astype(np.float32)
    labels = table[:, 64].astype(np.int64)
    return Dataset(ref, [str(d) for d in range(10)], labels, lambda i: pixels[i], pre)


def _load_npz(path: Path, pre: Preprocess, where: str, num_classes: int | None = None,
              max_bytes: int | None = None) -> Dataset:
    import zipfile

    src = str(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise UsageError(f"cannot read .npz (corrupt or not an .npz): {exc}", src, "check the file") from None
    with zf:
        members = {n[:-4]: n for n in zf.namelist() if n.endswith(".npy")}
        missing = {"data", "label"} - set(members)
        if missing:
            raise UsageError(f".npz has no '{sorted(missing)[0]}' array (has: {', '.join(sorted(members)) or 'none'})",
                             src, "save it with np.savez(path, data=images, label=labels)")
        # Shapes and dtypes from the npy headers: sizes are checked before anything is read whole.
        heads = {k: npy_header(zf, members[k], src) for k in ("data", "label", "class_names", "scale")
                 if k in members}
        budget = max_bytes if max_bytes is not None else default_read_budget()
        need = sum(nbytes for _shape, _dtype, nbytes in heads.values())
        if need > budget:
            dshape, ddtype, _ = heads["data"]
            raise UsageError(f".npz arrays take {_mb(need)} once read (data {ddtype} {dshape}), over the "
                             f"{_mb(budget)} allowed", src, "split the data into smaller files, store it as uint8, "
                             "or raise --memory-budget")
        lshape, ldtype, _ = heads["label"]
        if len(lshape) != 1 or ldtype.kind not in "iu":
            raise UsageError(f"'label' must be a 1-D integer array, got {ldtype} {lshape}", src,
                             "store class indices 0..K-1")
        dshape, ddtype, _ = heads["data"]
        if not dshape or dshape[0] != lshape[0]:
            raise UsageError(f"'data' has {dshape[0] if dshape else 0} samples but 'label' has {lshape[0]}", src,
                             "store one label per sample")
        if lshape[0] == 0:
            raise UsageError(".npz holds no samples", src, "add samples")
        if ddtype.kind not in "uif" or ddtype.kind == "c":
            raise UsageError(f"'data' has dtype {ddtype}; expected uint8 (0..255) or float (0..1)", src,
                             "convert the array")
        label = _read_member(zf, members["label"], src)
        names = _read_member(zf, members["class_names"], src) if "class_names" in members else None
        scale_given = _read_member(zf, members["scale"], src) if "scale" in members else None
        if label.min() < 0:
            raise UsageError(f"negative label {int(label.min())}", src, "store class indices 0..K-1")
        top = int(label.max())
        if names is not None:
            if names.ndim != 1 or names.dtype.kind not in "US":
                raise UsageError(f"'class_names' must be a 1-D string array, got {names.dtype} {names.shape}", src,
                                 "store them as np.array(['cat', 'dog', ...])")
            if len(names) <= top:
                raise UsageError(f"{len(names)} class_names but labels go up to {clip(str(top), 20)}", src,
                                 "give one name per class")
        elif num_classes is not None and top >= num_classes:
            raise UsageError(f"label {clip(str(top), 20)} is out of range for a model with {num_classes} classes",
                             src, f"store class indices 0..{num_classes - 1}")
        elif top >= MAX_CLASSES:
            raise UsageError(f"label {clip(str(top), 20)} implies {clip(str(top + 1), 20)} classes (at most "
                             f"{MAX_CLASSES:,} without class_names)", src,
                             "store class indices 0..K-1, or add class_names")
        data = _read_member(zf, members["data"], src)
    images = _as_nhwc(data, path)
    scale, rule = _pixel_scale(images, scale_given, src)
    k = len(names) if names is not None else top + 1
    names = [clip(str(n), 100) for n in names.tolist()] if names is not None else None
    _check_classes(k, src, where)
    ds = Dataset(src, names or [str(i) for i in range(k)], label.astype(np.int64),
                 lambda i: images[i].astype(np.float32) * scale, pre)
    ds.notes.append(f"pixel scale: {rule}")
    # converted sample by sample: uint8 data stays uint8 in memory (a quarter of float32)
    return ds


def default_read_budget() -> int:
    """Half of the memory this process may still take: the smallest of MemAvailable, the cgroup's
    memory.max and the address-space limit (RLIMIT_AS); 2 GiB where none can be read."""
    limits = []
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            limits.append(int(text))
    except OSError:
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append(max(0, soft - _vm_size()))
    except (ImportError, OSError, ValueError):
        pass
    return min(limits) // 2 if limits else 2 << 30


def _vm_size() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB" if n >= 2**20 else f"{n / 1024:,.1f} kB"


def npy_header(zf: zipfile.ZipFile, member: str, src: str) -> tuple[tuple, np.dtype, int]:
    """(shape, dtype, bytes once read) of one .npy member, from its header alone; object arrays refused."""
    import zipfile

    from numpy.lib import format as npformat

    name = member[:-4]
    try:
        with zf.open(member) as fh:
            version = npformat.read_magic(fh)
            reader = {(1, 0): npformat.read_array_header_1_0, (2, 0): npformat.read_array_header_2_0}.get(version)
            if reader is None:
                raise ValueError(f"unsupported .npy version {version}")
            shape, _fortran, dtype = reader(fh)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError) as exc:
        raise UsageError(f"cannot read .npz array '{clip(name, 40)}' (corrupt or not an .npz): {exc}", src,
                         "check the file") from None
    if dtype.hasobject:
        raise UsageError(".npz holds Python objects, which edgetrain never unpickles", src,
                         "save plain numeric arrays (and class_names as a string array)")
    count = 1
    for d in shape:
        count *= int(d)
    nbytes = count * dtype.itemsize
    info = zf.getinfo(member)
    if nbytes > info.file_size:  # the header promises more than the member holds: a lying header
        raise UsageError(f".npz array '{clip(name, 40)}' claims {shape} {dtype} ({_mb(nbytes)}) but holds "
                         f"{_mb(info.file_size)}", src, "the file is corrupt: save it again")
    return tuple(int(d) for d in shape), dtype, nbytes


def _read_member(zf: zipfile.ZipFile, member: str, src: str) -> np.ndarray:
    import zipfile

    from numpy.lib import format as npformat

    try:
        with zf.open(member) as fh:
            return npformat.read_array(fh, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError) as exc:
        raise UsageError(f"cannot read .npz array '{clip(member[:-4], 40)}' (corrupt or truncated): "
                         f"{clip(str(exc), 120)}", src, "check the file") from None


def _as_nhwc(data: np.ndarray, path: Path) -> np.ndarray:
    """NHW, NHWC, or NCHW (channel axis of size 1 or 3 at position 1) -> an NHWC view."""
    if data.ndim == 3:
        data = data[..., None]
    elif data.ndim == 4 and data.shape[1] in (1, 3) and data.shape[3] not in (1, 3):
        data = data.transpose(0, 2, 3, 1)
    if data.ndim != 4 or data.shape[3] not in (1, 3, 4):
        raise UsageError(f"'data' has shape {clip(str(data.shape), 60)}; expected images as N,H,W or N,H,W,C "
                         "(C=1/3) or N,C,H,W", str(path), "reshape the array")
    if data.shape[1] == 0 or data.shape[2] == 0:  # images of no pixels: every sample would be the mean
        raise UsageError(f"'data' has shape {clip(str(data.shape), 60)}: images with no pixels", str(path),
                         "give images at least 1x1")
    if data.dtype == np.bool_ or data.dtype.kind not in "uif":
        raise UsageError(f"'data' has dtype {data.dtype}; expected uint8 (0..255) or float (0..1)", str(path),
                         "convert the array")
    return data[..., :3]


def _pixel_scale(images: np.ndarray, given, src: str) -> tuple[float, str]:
    """The factor that brings the pixels to 0..1 and the rule that chose it; non-finite values refused.

    Reads the array in slices, so no full-size temporary is made.
    """
    lo, hi = np.inf, -np.inf
    step = max(1, (16 << 20) // max(1, images[0].nbytes))
    for i in range(0, len(images), step):
        part = images[i:i + step]
        if part.dtype.kind == "f":
            finite = np.isfinite(part)
            if not finite.all():
                first = i + int(np.argwhere(~finite)[0][0])
                raise UsageError(f"'data' holds non-finite values (NaN or inf), first in sample {first}", src,
                                 "remove or repair those samples")
        if part.size:
            lo, hi = min(lo, float(part.min())), max(hi, float(part.max()))
    span = f"values {lo:g}..{hi:g}"
    if given is not None:
        try:
            scale = float(np.asarray(given).reshape(-1)[0]) if np.asarray(given).size == 1 else None
        except (TypeError, ValueError):
            scale = None
        if scale is None or not np.isfinite(scale) or scale <= 0:
            raise UsageError("'scale' must be one positive number (pixels * scale in 0..1)", src,
                             "store e.g. scale=np.float32(1/255)")
        if lo * scale < -1e-3 or hi * scale > 1 + 1e-3:
            raise UsageError(f"'data' {span} times the stored scale {scale:g} fall outside 0..1", src,
                             "store the scale that maps the pixels to 0..1")
        return scale, f"x {scale:g} (the .npz's 'scale'; {span})"
    if images.dtype == np.uint8:
        return 1.0 / 255.0, f"uint8 0..255 read as x/255 ({span})"
    if lo >= 0:
        for top, scale, name in _SCALE_RULES:
            if hi <= top:
                how = "as they are" if scale == 1.0 else f"as x/{top:g}"
                return scale, f"{images.dtype} {span} within {name}, read {how}"
    raise UsageError(f"'data' ({images.dtype}) has {span}: not pixels in 0..1, 0..255 or 0..65535", src,
                     "store raw pixels (edgetrain applies the model's mean/std itself), or add a 'scale' "
                     "array to the .npz so that pixels * scale lie in 0..1")


class _TooLarge(UsageError):
    pass


def _open_image(path: Path):
    """PIL image with its header read and its pixel count checked; nothing decoded yet."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS  # PIL's own bomb check agrees with ours (it raises at 2x)
    try:
        im = Image.open(path)
    except Image.DecompressionBombError as exc:
        raise _TooLarge(f"image is over the pixel limit of {MAX_IMAGE_PIXELS:,} ({clip(str(exc), 80)})",
                        str(path), "resize it, remove it, or raise EDGETRAIN_MAX_IMAGE_PIXELS") from None
    w, h = im.size
    if w < 1 or h < 1 or w * h > MAX_IMAGE_PIXELS:
        im.close()
        raise _TooLarge(f"image of {w}x{h} pixels is over the limit of {MAX_IMAGE_PIXELS:,}", str(path),
                        "resize it, remove it, or raise EDGETRAIN_MAX_IMAGE_PIXELS")
    return im


def _load_folder(root: Path, pre: Preprocess, where: str) -> Dataset:
    from PIL import Image, UnidentifiedImageError

    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise UsageError("image folder has no class sub-folders", str(root),
                         "put each class's images in a sub-folder named after the class")
    _check_classes(len(classes), str(root), where)
    files, labels, skipped, wide = [], [], 0, set()
    for ci, name in enumerate(classes):
        for f in sorted((root / name).rglob("*")):
            if not f.is_file() or f.name.startswith("."):
                continue
            try:
                with _open_image(f) as im:  # reads the header only: the pixel limit holds before decode
                    if im.mode in _SIXTEEN_BIT or im.mode in ("I", "F"):
                        wide.add("F" if im.mode == "F" else "16-bit" if im.mode in _SIXTEEN_BIT else "I")
                    im.verify()
            except _TooLarge:
                raise
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError):
                skipped += 1
                continue
            files.append(f)
            labels.append(ci)
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(classes))
    if not files:
        raise UsageError(f"image folder has no readable images ({skipped} other files skipped)", str(root),
                         "add JPEG or PNG images to the class sub-folders")
    empty = [classes[i] for i in np.flatnonzero(counts == 0)]
    notes = [f"{skipped} file(s) that are not images were skipped"] if skipped else []
    if empty:
        notes.append(f"class folder(s) with no images: {', '.join(empty)}")
    if wide:  # the rule above, said where it applies
        said = {"16-bit": "16-bit images as x/65535", "I": "32-bit integer images as x/65535 (0..65535 only)",
                "F": "float images as they are (0..1 only)"}
        notes.append("pixel scale: 8-bit images read as x/255, " + ", ".join(said[k] for k in sorted(wide)))
    if np.count_nonzero(counts) < 2:
        raise UsageError(f"only one class folder has images ({classes[int(np.argmax(counts))]})", str(root),
                         "classification needs images in at least 2 class folders")

    def read(i: int) -> np.ndarray:
        return read_image(files[i], pre)

    return Dataset(str(root), classes, np.asarray(labels, dtype=np.int64), read, pre, skipped, notes)


DRAFT_GAP = 2  # a JPEG is decoded at no less than twice the model's input size (then resized)


# Pixel scale of an image file, by documented rule (README, DATA; issue 26): 8-bit modes (1, L, P, PA, LA,
# RGB, RGBA, CMYK, YCbCr, LAB, HSV...) are converted by Pillow to L or RGB and read as x/255; 16-bit modes
# (I;16*: 16-bit PNG, TIFF) as x/65535; 32-bit integer images (mode I: a PGM/PPM over 8 bits, which Pillow
# scales to 0..65535 from its maxval, or an int32 TIFF) as x/65535, refused if a value lies outside 0..65535;
# float images (mode F: float32 TIFF) as they are, refused unless every value is finite and within 0..1.
# Pillow's own convert('L') clips the first three to white and reads the last as black.
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def _wide_pixels(im, path, pre: Preprocess) -> np.ndarray:
    """An image of mode I;16*, I or F as HxWxC float32 in [0, 1] at the model's size and channels (the rule
    above): every sample of a folder has one shape, whatever its file's kind."""
    from PIL import Image

    mode = im.mode
    lo, hi = im.getextrema()
    if mode == "F":
        arr = np.asarray(im, dtype=np.float32)
        if not np.isfinite(arr).all():
            raise UsageError("float image has NaN or infinite pixels", str(path), "repair or remove the file")
        if lo < 0 or hi > 1:
            raise UsageError(f"float image has pixels in {lo:g}..{hi:g}; edgetrain reads float images as 0..1",
                             str(path), "scale it to 0..1, or save it as an 8- or 16-bit image")
        scale = 1.0
    elif mode in _SIXTEEN_BIT or im.format in ("PPM", "PGM"):
        scale = 1.0 / 65535.0
    else:
        if lo < 0 or hi > 65535:
            raise UsageError(f"32-bit integer image has pixels in {lo}..{hi}; edgetrain reads integer images over "
                             "8 bits as 16-bit (0..65535)", str(path), "save it as an 8- or 16-bit image")
        scale = 1.0 / 65535.0
    f = im if mode == "F" else im.convert("F")
    h, w = pre.hw
    if f.size != (w, h):
        f = f.resize((w, h), Image.BILINEAR)
    arr = np.asarray(f, dtype=np.float32) * np.float32(scale)
    np.clip(arr, 0.0, 1.0, out=arr)  # float rounding of 65535/65535
    return np.repeat(arr[..., None], pre.channels, axis=2)  # the model's channels, as for 8-bit images


def read_image(path, pre: Preprocess) -> np.ndarray:
    """One image at the model's size and channels: HxWxC uint8 for 8-bit pixels (``unit_scale`` gives
    [0, 1]), float32 in [0, 1] for 16-bit, 32-bit integer and float images (the rule above). Image folders and
    `predict` decode the same way. A stream that passed the header check but does not decode (truncated,
    corrupt) is one line naming the file, never a traceback mid-run."""
    from PIL import Image  # lazy: a command that reads no image never loads Pillow

    try:
        with _open_image(path) as im:
            if im.mode in _SIXTEEN_BIT or im.mode in ("I", "F"):
                return _wide_pixels(im, path, pre)
            mode = "L" if pre.channels == 1 else "RGB"
            h, w = pre.hw
            if im.format == "JPEG":
                # decode in the DCT domain at 1/2, 1/4 or 1/8 scale, never below DRAFT_GAP x the target (what
                # Pillow's thumbnail does with its default reducing_gap): a 1024px photo for a 160px model
                # decodes at 256px, several times faster, and the resize below gives nearly the same pixels
                im.draft(mode, (w * DRAFT_GAP, h * DRAFT_GAP))
            try:
                im = im.convert(mode)
            except ValueError:  # a colour space Pillow converts only to RGB (LAB)
                try:
                    im = im.convert("RGB").convert(mode)
                except ValueError:
                    raise UsageError(f"image mode {im.mode} cannot be converted to {mode} by Pillow", str(path),
                                     "save it as an 8-bit grayscale or RGB image (PNG or JPEG)") from None
            if im.size != (w, h):
                im = im.resize((w, h), Image.BILINEAR)
            arr = np.asarray(im)
    except UsageError:
        raise
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        raise UsageError(f"image cannot be decoded: {clip(str(exc), 120)}", str(path),
                         "repair or remove the file") from None
    return arr[..., None] if arr.ndim == 2 else arr
