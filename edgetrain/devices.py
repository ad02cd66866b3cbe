"""Device profiles (bundled in devices/, or a user's YAML), and which of them this host counts as.

Pure Python on purpose: the CLI resolves ``--device`` before mxnet/onnxruntime load, so nothing here may
import them.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


from .config import DeviceProfile, load_yaml, validate
from .fileio import parse_yaml, path_arg
from .errors import UsageError
from .host import HostInfo

BUNDLED_PACKAGE = "edgetrain._devices"
PROFILE_SUFFIXES = (".yaml", ".yml")


# --- profiles ---------------------------------------------------------------------------------------

def _bundled_files() -> dict[str, object]:
    """Bundled profile name -> Traversable; found through the package so any install layout works."""
    root = resources.files(BUNDLED_PACKAGE)
    return {entry.name.rsplit(".", 1)[0]: entry for entry in root.iterdir()
            if entry.is_file() and entry.name.endswith(PROFILE_SUFFIXES)}


def bundled_names() -> list[str]:
    return sorted(_bundled_files())


def _load_bundled(name: str, entry) -> DeviceProfile:
    source = f"bundled profile devices/{entry.name}"
    data = parse_yaml(entry.read_text(encoding="utf-8"), source)  # a broken bundled file says which
    profile = validate(data, DeviceProfile, source)
    if profile.name != name:
        raise UsageError(f"profile name '{profile.name}' differs from its file name", source,
                         "make 'name' equal to the file name without .yaml")
    return profile


def list_profiles() -> list[DeviceProfile]:
    """Every bundled profile, validated, sorted by name."""
    return [_load_bundled(name, entry) for name, entry in sorted(_bundled_files().items())]


def _looks_like_path(text: str) -> bool:
    return os.sep in text or "/" in text or text.endswith(PROFILE_SUFFIXES) or Path(text).is_file()


def load_device(name_or_path: str) -> DeviceProfile:
    """A bundled profile by name, or a user's profile YAML by path."""
    if not isinstance(name_or_path, str):  # a name is a str; a path may be os.PathLike or bytes
        name_or_path = path_arg(name_or_path, "device", "edgetrain.load_device")
    text = name_or_path.strip()
    if not text:
        raise UsageError("empty device name", "--device", f"use one of: {', '.join(bundled_names())}")
    files = _bundled_files()
    if text in files:
        return _load_bundled(text, files[text])
    if _looks_like_path(text):
        return load_yaml(Path(text), DeviceProfile)
    raise UsageError(f"unknown device '{text}'", "--device",
                     f"use one of: {', '.join(sorted(files))}; or give a path to a profile YAML")


def match_profile(host: HostInfo, profiles: list[DeviceProfile] | None = None) -> DeviceProfile | None:
    """The bundled profile this host counts as (None if none): exact arch/cores, closest RAM."""
    candidates = [p for p in (profiles if profiles is not None else list_profiles()) if host.matches(p)]
    if not candidates:
        return None
    return min(candidates, key=lambda p: abs(p.ram_mb - host.ram_mb))
