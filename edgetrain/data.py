"""DATA references -> labelled samples preprocessed for a model.

DATA is an image folder (one sub-folder per class; JPEG/PNG, grayscale or colour), an ``.npz`` with
``data`` and ``label`` arrays (loaded with ``allow_pickle=False``; optional ``class_names``), or
``builtin:digits`` (the UCI 8x8 handwritten digits that ship with edgetrain). Samples are decoded
lazily, batch by batch, so an image folder larger than RAM can still be read.
"""
from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import UsageError
from .preprocess import Preprocess

BUILTIN_PREFIX = "builtin:"
BUILTINS = ("digits",)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


@dataclass
class Dataset:
    """Labels up front; pixels decoded and preprocessed on demand by ``batch``."""

    source: str
    class_names: list[str]
    labels: np.ndarray  # int64, (N,)
    _raw: Callable[[int], np.ndarray]  # index -> HxWxC float32 in [0, 1]
    preprocess: Preprocess
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    _index: np.ndarray | None = None  # positions into the raw source (for subsets)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def batch(self, idx) -> np.ndarray:
        """Preprocessed float32 samples (len(idx), C, H, W)."""
        idx = np.asarray(idx, dtype=np.int64)
        src = self._index[idx] if self._index is not None else idx
        out = np.empty((len(idx), *self.preprocess.input_shape), dtype=np.float32)
        for i, j in enumerate(src):
            out[i] = to_model_input(self._raw(int(j)), self.preprocess)
        return out

    def raw_batch(self, idx) -> np.ndarray:
        """The samples as read, before mean/std: (len(idx), H, W, C) float32 in [0, 1]."""
        idx = np.asarray(idx, dtype=np.int64)
        src = self._index[idx] if self._index is not None else idx
        return np.stack([self._raw(int(j)) for j in src]).astype(np.float32)

    def arrays(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        n = len(self) if limit is None else min(limit, len(self))
        return self.batch(np.arange(n)), self.labels[:n]

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
        return self.subset(rng.permutation(rest)), self.subset(rng.permutation(np.flatnonzero(held_mask)))

    def select_classes(self, classes) -> "Dataset":
        """Only the samples of the given class indices (names and numbering unchanged)."""
        mask = np.isin(self.labels, list(classes))
        return self.subset(np.flatnonzero(mask))


def to_model_input(img: np.ndarray, pre: Preprocess) -> np.ndarray:
    """HxWxC float32 in [0,1] -> CxHxW normalised for the model."""
    from PIL import Image

    h, w = pre.hw
    if img.shape[2] != pre.channels:
        if pre.channels == 1:  # ITU-R 601 luma, as PIL's convert('L')
            img = (img[..., :3] @ np.array([0.299, 0.587, 0.114], dtype=np.float32))[..., None]
        else:
            img = np.repeat(img[..., :1], 3, axis=2)
    if img.shape[0] != h or img.shape[1] != w:
        chans = [np.asarray(Image.fromarray(np.ascontiguousarray(img[..., c]), mode="F")
                            .resize((w, h), Image.BILINEAR)) for c in range(img.shape[2])]
        img = np.stack(chans, axis=2)
    mean = np.asarray(pre.mean, dtype=np.float32)
    std = np.asarray(pre.std, dtype=np.float32)
    return ((img - mean) / std).transpose(2, 0, 1).astype(np.float32, copy=False)


def load_data(ref: str, pre: Preprocess, where: str = "--data") -> Dataset:
    """Resolve a DATA reference for a model that takes ``pre``."""
    ref = str(ref)
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX):]
        if name not in BUILTINS:
            raise UsageError(f"unknown built-in data set '{name}'", where, "use one of: "
                             + ", ".join(BUILTIN_PREFIX + b for b in BUILTINS))
        return _load_digits(pre, ref)
    path = Path(ref)
    if not path.exists():
        raise UsageError("data not found", ref, "give an image folder, an .npz file or builtin:digits")
    if path.is_dir():
        return _load_folder(path, pre, where)
    if path.suffix.lower() == ".npz":
        return _load_npz(path, pre, where)
    raise UsageError("unsupported data file", ref, "give an image folder (one sub-folder per class), "
                     "an .npz with 'data' and 'label', or builtin:digits")


def _check_classes(n: int, source: str, where: str) -> None:
    if n < 2:
        raise UsageError(f"data has {n} class{'es' if n != 1 else ''}; classification needs at least 2",
                         source, "add a sub-folder (or label) per class")


def _load_digits(pre: Preprocess, ref: str) -> Dataset:
    raw = resources.files("edgetrain._builtin").joinpath("digits.csv.gz").read_bytes()
    table = np.loadtxt(gzip.decompress(raw).decode("ascii").splitlines(), delimiter=",", dtype=np.float32)
    pixels = (table[:, :64] / 16.0).reshape(-1, 8, 8, 1).astype(np.float32)
    labels = table[:, 64].astype(np.int64)
    return Dataset(ref, [str(d) for d in range(10)], labels, lambda i: pixels[i], pre)


def _load_npz(path: Path, pre: Preprocess, where: str) -> Dataset:
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = set(npz.files)
            missing = {"data", "label"} - keys
            if missing:
                raise UsageError(f".npz has no '{sorted(missing)[0]}' array (has: {', '.join(sorted(keys)) or 'none'})",
                                 str(path), "save it with np.savez(path, data=images, label=labels)")
            data, label = npz["data"], npz["label"]
            names = npz["class_names"] if "class_names" in keys else None
    except UsageError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise UsageError(".npz holds Python objects, which edgetrain never unpickles", str(path),
                             "save plain numeric arrays (and class_names as a string array)") from None
        raise UsageError(f"cannot read .npz: {exc}", str(path), "check the file") from None
    except Exception as exc:  # zipfile.BadZipFile, OSError, EOFError: not an .npz
        raise UsageError(f"cannot read .npz (corrupt or not an .npz): {exc}", str(path), "check the file") from None
    if label.ndim != 1 or not np.issubdtype(label.dtype, np.integer):
        raise UsageError(f"'label' must be a 1-D integer array, got {label.dtype} {label.shape}", str(path),
                         "store class indices 0..K-1")
    if data.shape[0] != label.shape[0]:
        raise UsageError(f"'data' has {data.shape[0]} samples but 'label' has {label.shape[0]}", str(path),
                         "store one label per sample")
    if len(label) == 0:
        raise UsageError(".npz holds no samples", str(path), "add samples")
    if label.min() < 0:
        raise UsageError(f"negative label {int(label.min())}", str(path), "store class indices 0..K-1")
    images, scale = _as_nhwc(data, path)
    k = int(label.max()) + 1
    if names is not None:
        names = [str(n) for n in names.tolist()]
        if len(names) < k:
            raise UsageError(f"{len(names)} class_names but labels go up to {k - 1}", str(path),
                             "give one name per class")
        k = len(names)
    _check_classes(k, str(path), where)
    # converted sample by sample: uint8 data stays uint8 in memory (a quarter of float32)
    return Dataset(str(path), names or [str(i) for i in range(k)], label.astype(np.int64),
                   lambda i: images[i].astype(np.float32) * scale, pre)


def _as_nhwc(data: np.ndarray, path: Path) -> tuple[np.ndarray, float]:
    """NHW, NHWC, or NCHW (channel axis of size 1 or 3 at position 1) -> an NHWC view, and the pixel scale
    (uint8 0..255 -> 1/255; float 0..1 -> 1)."""
    if data.ndim == 3:
        data = data[..., None]
    elif data.ndim == 4 and data.shape[1] in (1, 3) and data.shape[3] not in (1, 3):
        data = data.transpose(0, 2, 3, 1)
    if data.ndim != 4 or data.shape[3] not in (1, 3, 4):
        raise UsageError(f"'data' has shape {data.shape}; expected images as N,H,W or N,H,W,C (C=1/3) or N,C,H,W",
                         str(path), "reshape the array")
    if data.dtype == np.uint8:
        return data[..., :3], 1.0 / 255.0
    if np.issubdtype(data.dtype, np.floating) or np.issubdtype(data.dtype, np.integer):
        return data[..., :3], 1.0
    raise UsageError(f"'data' has dtype {data.dtype}; expected uint8 (0..255) or float (0..1)", str(path),
                     "convert the array")


def _load_folder(root: Path, pre: Preprocess, where: str) -> Dataset:
    from PIL import Image, UnidentifiedImageError

    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise UsageError("image folder has no class sub-folders", str(root),
                         "put each class's images in a sub-folder named after the class")
    _check_classes(len(classes), str(root), where)
    files, labels, skipped = [], [], 0
    for ci, name in enumerate(classes):
        for f in sorted((root / name).rglob("*")):
            if not f.is_file() or f.name.startswith("."):
                continue
            try:
                with Image.open(f) as im:
                    im.verify()
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
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
    if np.count_nonzero(counts) < 2:
        raise UsageError(f"only one class folder has images ({classes[int(np.argmax(counts))]})", str(root),
                         "classification needs images in at least 2 class folders")

    def read(i: int) -> np.ndarray:
        with Image.open(files[i]) as im:
            im = im.convert("L" if pre.channels == 1 else "RGB")
            h, w = pre.hw
            if im.size != (w, h):
                im = im.resize((w, h), Image.BILINEAR)
            arr = np.asarray(im, dtype=np.float32) / 255.0
        return arr[..., None] if arr.ndim == 2 else arr

    return Dataset(str(root), classes, np.asarray(labels, dtype=np.int64), read, pre, skipped, notes)
