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


# --- pixels of every bit depth and sample type ---------------------------------------------------------

def _gray_palette():
    return [v for i in range(256) for v in (i, i, i)]


def _png16_rgb(path: Path, rgb16: np.ndarray) -> None:
    """A 16-bit RGB PNG (colour type 2, depth 16) written with numpy and zlib: Pillow cannot write one."""
    h, w, _ = rgb16.shape
    rows = b"".join(b"\x00" + rgb16[y].astype(">u2").tobytes() for y in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(rows))
                     + _png_chunk(b"IEND", b""))


def _pgm(path: Path, values: np.ndarray, maxval: int) -> None:
    h, w = values.shape
    body = values.astype(">u2" if maxval > 255 else "u1").tobytes()
    path.write_bytes(f"P5\n{w} {h}\n{maxval}\n".encode() + body)


def _pil(mode_of, fmt, **kw):
    """A writer saving ``mode_of(u8)`` (a Pillow image built from the 8-bit gray pixels) as ``fmt``."""
    def write(path: Path, u8: np.ndarray) -> None:
        mode_of(u8).save(path, fmt, **kw)
    return write


def _from(arr_of):
    from PIL import Image

    return lambda u8: Image.fromarray(arr_of(u8))


def _rgb(u8):
    from PIL import Image

    return Image.fromarray(np.stack([u8] * 3, axis=-1))


def _palette(u8, mode="P"):
    from PIL import Image

    im = Image.new("P", (u8.shape[1], u8.shape[0]))
    im.putdata(u8.ravel().tolist())
    im.putpalette(_gray_palette())
    if mode == "PA":
        return im.convert("PA")
    return im


def _with_alpha(u8, mode):
    from PIL import Image

    base = Image.fromarray(u8) if mode == "LA" else _rgb(u8)
    im = base.convert(mode)
    im.putalpha(200)
    return im


# (id, file suffix, writer(path, u8 gray HxW), tolerance on [0, 1], expected(u8) -> [0, 1] HxW)
# Every kind stores the same 8-bit gray picture: a lossless kind must read back as u8 / 255 exactly (to
# float rounding), a lossy one (JPEG) within its tolerance; 1-bit stores the picture thresholded.
def pixel_kinds():
    from PIL import Image

    exact = 2e-6

    def same(u8):
        return u8 / 255.0

    return [
        ("png-L-8bit", ".png", _pil(_from(lambda u8: u8), "PNG"), exact, same),
        ("png-1bit", ".png", _pil(lambda u8: Image.fromarray(u8 >= 128), "PNG"), exact,
         lambda u8: (u8 >= 128).astype(float)),
        ("bmp-1bit", ".bmp", _pil(lambda u8: Image.fromarray(u8 >= 128), "BMP"), exact,
         lambda u8: (u8 >= 128).astype(float)),
        ("png-P-palette", ".png", _pil(_palette, "PNG"), exact, same),
        ("gif-P-palette", ".gif", _pil(_palette, "GIF"), exact, same),
        ("tiff-PA", ".tif", _pil(lambda u8: _palette(u8, "PA"), "TIFF"), exact, same),
        ("png-LA", ".png", _pil(lambda u8: _with_alpha(u8, "LA"), "PNG"), exact, same),
        ("png-RGB-8bit", ".png", _pil(_rgb, "PNG"), exact, same),
        ("png-RGBA", ".png", _pil(lambda u8: _with_alpha(u8, "RGBA"), "PNG"), exact, same),
        ("tiff-CMYK", ".tif", _pil(lambda u8: _rgb(u8).convert("CMYK"), "TIFF"), exact, same),
        ("jpeg-CMYK", ".jpg", _pil(lambda u8: _rgb(u8).convert("CMYK"), "JPEG", quality=100), 0.04, same),
        ("tiff-YCbCr", ".tif", _pil(lambda u8: _rgb(u8).convert("YCbCr"), "TIFF"), 0.01, same),
        ("jpeg-YCbCr", ".jpg", _pil(lambda u8: _rgb(u8).convert("YCbCr"), "JPEG", quality=100), 0.04, same),
        ("tiff-LAB", ".tif", _pil(lambda u8: _rgb(u8).convert("LAB"), "TIFF"), 0.03, same),
        ("png-I;16", ".png", _pil(_from(lambda u8: u8.astype(np.uint16) * 257), "PNG"), exact, same),
        ("png-RGB-16bit", ".png", lambda p, u8: _png16_rgb(p, np.stack([u8.astype(np.uint16) * 257] * 3, -1)),
         exact, same),
        ("pgm-16bit-Pillow", ".pgm", _pil(_from(lambda u8: u8.astype(np.uint16) * 257), "PPM"), exact, same),
        ("pgm-maxval-65535", ".pgm", lambda p, u8: _pgm(p, u8.astype(np.uint16) * 257, 65535), exact, same),
        ("pgm-maxval-1023", ".pgm", lambda p, u8: _pgm(p, np.round(u8 / 255.0 * 1023), 1023), 1e-3,
         lambda u8: np.round(u8 / 255.0 * 1023) / 1023),
        ("pgm-maxval-100", ".pgm", lambda p, u8: _pgm(p, np.round(u8 / 255.0 * 100), 100), 2.5e-3,
         lambda u8: np.round(u8 / 255.0 * 100) / 100),
        ("tiff-I;16", ".tif", _pil(_from(lambda u8: u8.astype(np.uint16) * 257), "TIFF"), exact, same),
        ("tiff-I-int32", ".tif", _pil(_from(lambda u8: u8.astype(np.int32) * 257), "TIFF"), exact, same),
        ("tiff-F-float32", ".tif", _pil(_from(lambda u8: u8.astype(np.float32) / np.float32(255)), "TIFF"),
         exact, same),
    ]


def refused_pixel_kinds():
    """(id, suffix, writer(path, u8), what the one-line error says): pixels on no scale edgetrain can know."""
    def f32(fn):
        return _pil(_from(lambda u8: fn(u8).astype(np.float32)), "TIFF")

    def i32(fn):
        return _pil(_from(lambda u8: fn(u8).astype(np.int32)), "TIFF")

    def nan(u8):
        x = u8 / 255.0
        x[0, 0] = np.nan
        return x

    return [
        ("tiff-F-0..255", ".tif", f32(lambda u8: u8 * 1.0), "float image has pixels in"),
        ("tiff-F-normalised", ".tif", f32(lambda u8: (u8 / 255.0 - 0.5) / 0.25), "float image has pixels in"),
        ("tiff-F-nan", ".tif", f32(nan), "NaN"),
        ("tiff-I-int32-over-16bit", ".tif", i32(lambda u8: u8.astype(np.int64) * 1000), "32-bit integer image"),
        ("tiff-I-int32-negative", ".tif", i32(lambda u8: u8.astype(np.int64) - 128), "32-bit integer image"),
    ]
