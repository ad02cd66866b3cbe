"""Generators of hostile inputs. Each returns the paths it wrote; every case carries an id for pytest."""
from __future__ import annotations

import io
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np


# --- .npz ---------------------------------------------------------------------------------------------

FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int16", "int32", "int64", "uint16")
LAYOUTS = {"NHW": (8, 6, 6), "NHWC1": (8, 6, 6, 1), "NHWC3": (8, 6, 6, 3), "NCHW": (8, 3, 6, 6)}


def labels(n: int = 8, k: int = 2) -> np.ndarray:
    return np.arange(n) % k


def nonfinite_cases():
    """(id, data array, labels): one NaN/+inf/-inf in each float dtype and layout, anywhere in the data."""
    rng = np.random.RandomState(0)
    for dtype in FLOAT_DTYPES:
        for layout, shape in LAYOUTS.items():
            for bad in ("nan", "inf", "-inf"):
                data = rng.rand(*shape).astype(dtype)
                pos = tuple(int(rng.randint(0, d)) for d in shape)
                data[pos] = float(bad)
                yield f"{dtype}-{layout}-{bad}", data, labels(shape[0])


def scaled_cases():
    """(id, data, expected factor): raw 0..255 pixels stored as every dtype but uint8, and 0..1 floats."""
    rng = np.random.RandomState(1)
    for dtype in FLOAT_DTYPES + INT_DTYPES:
        data = rng.randint(0, 256, (8, 6, 6)).astype(dtype)
        data[0, 0, 0] = 255
        yield f"{dtype}-0..255", data, 1 / 255
    for dtype in FLOAT_DTYPES:
        yield f"{dtype}-0..1", rng.rand(8, 6, 6).astype(dtype), 1.0
    yield "uint16-0..65535", rng.randint(0, 65536, (8, 6, 6)).astype("uint16") | 4096, 1 / 65535


def unscalable_cases():
    """Data that is not pixels on any known scale: normalised (negative), or beyond 16 bits."""
    rng = np.random.RandomState(2)
    for dtype in ("float32", "float64", "int32", "int64"):
        yield f"{dtype}-negative", (rng.randn(8, 6, 6) * 50).astype(dtype)
        yield f"{dtype}-huge", (rng.rand(8, 6, 6) * 1e6 + 70000).astype(dtype)


def huge_label_cases(k: int = 3):
    """(id, labels, class_names or None): one label far beyond the class count."""
    for big in (k, 10**5, 10**9, 2**40, 2**62):
        lab = labels(8, k).astype(np.int64)
        lab[5] = big
        yield f"label-{big}", lab, None
        yield f"label-{big}-named", lab.copy(), np.array([f"c{i}" for i in range(k)])


def write_npz(path: Path, compress: bool = False, **arrays) -> Path:
    (np.savez_compressed if compress else np.savez)(path, **arrays)
    return path


def _npy_header(shape, dtype: str) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                               "shape": tuple(shape)})
    return buf.getvalue()


def lying_npz(path: Path, claimed_shape=(1000000, 224, 224, 3), real_samples: int = 4) -> Path:
    """'data' whose .npy header claims ``claimed_shape`` (150 GB by default) over a few real bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("data.npy", _npy_header(claimed_shape, "uint8") + bytes(real_samples * 64))
        buf = io.BytesIO()
        np.save(buf, labels(real_samples).astype(np.int64))
        zf.writestr("label.npy", buf.getvalue())
    return path


def bomb_npz(path: Path, mbytes: int = 512, samples: int | None = None) -> Path:
    """A real compressed bomb: ``mbytes`` MB of uint8 zeros deflated to well under 1% of that, with a
    matching label array; written in a stream (this process never holds the expanded array)."""
    n = samples or mbytes * 16  # 64 KiB per sample (256x256)
    shape = (n, 256, 256)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        with zf.open("data.npy", "w", force_zip64=True) as fh:
            fh.write(_npy_header(shape, "uint8"))
            block = bytes(256 * 256 * 16)
            for _ in range(n // 16):
                fh.write(block)
        buf = io.BytesIO()
        np.save(buf, labels(n).astype(np.int64))
        zf.writestr("label.npy", buf.getvalue())
    return path


def corrupt_npz_cases(tmp: Path, good: Path):
    """(id, path): a valid .npz truncated, bit-flipped, not a zip, empty, with an object array."""
    raw = good.read_bytes()
    out = []
    for cut in (10, len(raw) // 3, len(raw) - 30):
        p = tmp / f"trunc{cut}.npz"
        p.write_bytes(raw[:cut])
        out.append((f"truncated-{cut}", p))
    flipped = bytearray(raw)
    mid = len(raw) // 2
    flipped[mid:mid + 16] = bytes(b ^ 0x5A for b in flipped[mid:mid + 16])
    (tmp / "flip.npz").write_bytes(bytes(flipped))
    out.append(("bitflip", tmp / "flip.npz"))
    (tmp / "text.npz").write_text("hello " * 1000)
    out.append(("text", tmp / "text.npz"))
    (tmp / "empty.npz").write_bytes(b"")
    out.append(("empty", tmp / "empty.npz"))
    np.savez(tmp / "obj.npz", data=np.array([object()] * 8, dtype=object), label=labels(8))
    out.append(("object", tmp / "obj.npz"))
    return out


# --- images -------------------------------------------------------------------------------------------

def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(w: int, h: int, rows: bytes | None = None, claim: tuple[int, int] | None = None) -> bytes:
    """A grayscale PNG; ``claim`` writes a different size into its header than its pixel stream holds."""
    cw, ch = claim or (w, h)
    ihdr = struct.pack(">IIBBBBB", cw, ch, 8, 0, 0, 0, 0)
    if rows is None:
        rows = b"".join(b"\x00" + bytes(w) for _ in range(h))
    idat = zlib.compress(rows, 9)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def png_bomb(w: int = 20000, h: int = 20000) -> bytes:
    """A real decompression bomb: w*h zero pixels (400 MP by default) in a few hundred kB."""
    comp = zlib.compressobj(9)
    row = b"\x00" + bytes(w)
    parts = [comp.compress(row) for _ in range(h)]
    parts.append(comp.flush())
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", b"".join(parts))
            + _png_chunk(b"IEND", b""))


def good_jpeg(w: int = 16, h: int = 16, seed: int = 0) -> bytes:
    from PIL import Image

    rng = np.random.RandomState(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.randint(0, 255, (h, w, 3)).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def good_png(w: int = 16, h: int = 16, seed: int = 0) -> bytes:
    from PIL import Image

    rng = np.random.RandomState(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.randint(0, 255, (h, w)).astype(np.uint8), mode="L").save(buf, "PNG")
    return buf.getvalue()


def oversized_image_cases():
    """(id, bytes): images whose header says more pixels than the limit (real bombs and lying headers)."""
    yield "png-bomb-400MP", png_bomb()
    yield "png-header-claims-60000x60000", png_bytes(4, 4, claim=(60000, 60000))
    yield "png-header-claims-2^31-wide", png_bytes(4, 4, claim=(2**31 - 1, 1))
    jpeg = bytearray(good_jpeg())
    sof = jpeg.find(b"\xff\xc0")
    jpeg[sof + 5:sof + 9] = struct.pack(">HH", 65000, 65000)  # height, width in the SOF0 header
    yield "jpeg-header-claims-65000x65000", bytes(jpeg)


def undecodable_image_cases():
    """(id, bytes): images whose header is fine (they pass the scan) but whose stream does not decode."""
    png = good_png(32, 32)
    idat = png.find(b"IDAT")
    yield "png-truncated-idat", png[: idat + 20]
    bad = bytearray(png)
    bad[idat + 30:idat + 40] = bytes(10)  # pixel stream damaged: CRC and zlib both fail
    yield "png-damaged-idat", bytes(bad)
    yield "png-not-zlib", png_bytes(8, 8)[:41] + b"\x00" * 40
    jpeg = good_jpeg(64, 64)
    yield "jpeg-truncated-half", jpeg[: len(jpeg) // 2]
    yield "jpeg-truncated-tail", jpeg[:-40]


def image_folder(root: Path, extra: dict[str, bytes] | None = None, per_class: int = 4) -> Path:
    """Two classes of good 16x16 images, plus ``extra`` files (name -> bytes) in the first class."""
    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (root / c / f"{i}.png").write_bytes(good_png(seed=i + (10 if c == "b" else 0)))
    for name, data in (extra or {}).items():
        (root / "a" / name).write_bytes(data)
    return root


# --- YAML -------------------------------------------------------------------------------------------------

def billion_laughs(levels: int = 12, width: int = 10) -> str:
    """Nested aliases: ``width ** levels`` leaves from a few hundred bytes of text."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * width)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"name: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def billion_laughs_mapping(levels: int = 12, width: int = 10) -> str:
    """The same with mappings: each level a mapping whose values all alias the level below."""
    lines = ["m0: &m0 {" + ", ".join(f"k{j}: lol" for j in range(width)) + "}"]
    for i in range(1, levels):
        lines.append(f"m{i}: &m{i} {{" + ", ".join(f"k{j}: *m{i - 1}" for j in range(width)) + "}")
    lines.append(f"name: *m{levels - 1}")
    return "\n".join(lines) + "\n"


def deep_yaml(depth: int = 5000, flow: bool = True) -> str:
    if flow:
        return "name: " + "[" * depth + "]" * depth + "\n"
    return "".join("  " * i + f"k{i}:\n" for i in range(depth)) + "  " * depth + "v: 1\n"


def hostile_yaml_cases():
    """(id, bytes): YAML that must be refused quickly with one line."""
    yield "billion-laughs", billion_laughs().encode()
    yield "billion-laughs-mapping", billion_laughs_mapping().encode()
    yield "deep-flow-5000", deep_yaml(5000).encode()
    yield "deep-flow-100000", deep_yaml(100000).encode()
    yield "deep-block-2000", deep_yaml(2000, flow=False).encode()
    yield "latin1", "name: caf\xe9\npower: \xb5W\n".encode("latin-1")
    yield "utf16", "name: pi\n".encode("utf-16")
    yield "binary", bytes(range(256)) * 8
    yield "huge-scalar", b"name: " + b"x" * (3 << 20) + b"\n"
    yield "python-tag", b"name: !!python/object/apply:os.system ['true']\n"
