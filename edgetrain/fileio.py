"""Reading inputs and writing outputs safely.

Outputs: a failure never leaves a half-written file (temp file, fsync, rename); no output is the same
file as an input or as another output (``check_outputs``, before any work); a full disk is a one-line
error. Temp files and folders carry the writer's PID, and those of dead processes are removed at the
next start (a SIGKILL cannot run a ``finally``). Inputs: text files (YAML) are read with a size bound,
from regular files only, and parsed with limits on aliases and nesting.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import re
import time
from pathlib import Path

from . import envvars
from .errors import EdgetrainError, RunFailed, UsageError, clip

# Temp names carry the writer's PID: .NAME.edgetrain-tmp-PID.XXXXXXXX.tmp beside an output,
# [.]edgetrain-tmp-WHAT-PID-XXXXXXXX folders. Only names of exactly this form are ever cleaned.
TEMP_TAG = "edgetrain-tmp"
_STALE_NAME = (re.compile(r"^\..+\.edgetrain-tmp-(\d+)\.[a-z0-9_]{8}\.tmp$"),
               re.compile(r"^\.?edgetrain-tmp-[a-z_]+-(\d+)-[a-z0-9_]{8}$"))
MAX_TEXT_BYTES = 1 << 20  # a device profile or recipe is a few kB
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 100_000  # nodes once every alias is expanded


def path_arg(value, name: str, where: str) -> str:
    """A path (or MODEL/DATA reference) handed to the Python API, as the str edgetrain works with: str or
    os.PathLike; bytes are decoded as the os module does (os.fsdecode). Anything else -- None, a number --
    is one UsageError naming the argument, never str()'d into a file named "None" or "b'...'"."""
    if isinstance(value, str) and value.strip():
        check_path_length(value, name)
        return value
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not isinstance(value, str):
        got = "None" if value is None else f"{type(value).__name__} {value!r:.40}"
        raise UsageError(f"{name} must be a path (str or os.PathLike), not {got}", where,
                         "pass a str or a pathlib.Path")
    if not value.strip():
        raise UsageError(f"{name} is an empty path", where, "pass a file name")
    check_path_length(value, name)
    return value


def check_folder_outside_data(folder, folder_opt: str, data_refs: dict) -> None:
    """Refuse, before any work, an output folder (OUTDIR, RUNDIR, a fleet device's state) that is an image
    DATA folder or inside one: what it writes there (its logs, its run files) becomes a class folder of that
    DATA the next time it is read, and the user's data is no longer what they gave. ``data_refs`` maps the
    option (``--data``, ``--val``) to its value; an .npz, a ``builtin:`` or None is skipped."""
    if folder is None:
        return
    out = Path(os.path.realpath(str(folder)))
    for opt, ref in data_refs.items():
        if ref is None or not os.path.isdir(str(ref)):
            continue
        root = Path(os.path.realpath(str(ref)))
        if out == root or root in out.parents:
            raise UsageError(f"{folder_opt} is inside the image folder {opt} ({clip(str(ref), 100)}): what it "
                             f"writes there would become a class of that data", str(folder),
                             f"give {folder_opt} a folder outside {opt}")


PATH_MAX, NAME_MAX = 4096, 255  # Linux's (limits.h); most file systems' names stop at 255 bytes


def check_path_length(value: str, name: str) -> None:
    """A path the system cannot open (over PATH_MAX bytes, or a name in it over NAME_MAX) is one UsageError
    before any work, not an OSError from wherever it is first opened."""
    raw = os.fsencode(value)
    if len(raw) >= PATH_MAX:
        raise path_too_long(value, f"{name} is {len(raw):,} bytes long, over the system's {PATH_MAX - 1:,}")
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        raise path_too_long(value, f"{name} holds a name {len(longest):,} bytes long, over the {NAME_MAX} a "
                                   "file system allows")


def path_too_long(path, what: str = "a path is too long for the system") -> UsageError:
    return UsageError(what, clip(os.fsdecode(path), 120), "give a shorter path (or a shorter name in it)")


# An output that names a stream is written through, never replaced: a device (``-o /dev/null``), a FIFO,
# or a name for an open file descriptor (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``). A symlink to
# a file is followed: its target is written atomically (temp file beside the target, then rename), and the
# link stays a link. A socket is refused.
_FD_LINK = re.compile(r"^/(?:proc/[^/]+/fd|dev/fd)/\d+$|^/dev/std(?:out|err)$")
STREAM, FILE = "stream", "file"


def output_target(path: Path | str, what: str = "output") -> tuple[str, Path]:
    """(STREAM, path): write through ``path`` in place, appending when it names an open descriptor's
    regular file; (FILE, target): replace ``target`` atomically (``path`` itself, or where its symlinks lead)."""
    import stat

    path = Path(path)
    hop, through_fd = os.path.abspath(path), False
    for _ in range(40):  # the kernel's own limit on a chain of links
        if _FD_LINK.match(hop):
            through_fd = True
        if not os.path.islink(hop):
            break
        hop = os.path.normpath(os.path.join(os.path.dirname(hop), os.readlink(hop)))
    else:
        raise UsageError(f"{what} is a symlink loop", str(path), "give a file name")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"cannot write the {what}: {exc.strerror}", str(path), "choose another location") from None
    if st is not None:
        if stat.S_ISSOCK(st.st_mode):
            raise UsageError(f"{what} is a socket", str(path), "give a file name, a FIFO or a device")
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            return STREAM, path
        if through_fd and stat.S_ISREG(st.st_mode):
            return STREAM, path
    elif through_fd:
        raise UsageError(f"{what} names a file descriptor that is not open", str(path), "give a file name")
    if os.path.islink(path):
        return FILE, Path(os.path.realpath(path))
    return FILE, path


def check_output_path(path: Path, what: str = "output") -> Path:
    """Fail early, before any work, if ``path`` cannot be written as a file (or written through, when it
    names a device, a FIFO or an open descriptor)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{what} path is a directory", str(path), "give a file name")
    kind, target = output_target(path, what)
    if kind == STREAM:
        if not os.access(path, os.W_OK):
            raise UsageError(f"{what} is not writable", str(path), "choose another location")
        return path
    if target.is_dir():
        raise UsageError(f"{what} path is a symlink to a directory", str(path), "give a file name")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{what} folder does not exist", str(parent), "create it first")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{what} folder is not writable", str(parent), "choose another location")
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"{what} file is not writable", str(target), "choose another location")
    return path


@contextlib.contextmanager
def atomic_path(path: Path, what: str = "output"):
    """Yield a temp path; on success it is fsynced and renamed onto ``path`` (the temp file beside it).

    A symlink is followed: its target is replaced and the link kept. A device, FIFO or open descriptor
    (``/dev/null``, ``/dev/stdout``) is written through once the work is done: the temp file is then in
    $TMPDIR and copied into it. A full disk (or quota) while writing becomes a one-line UsageError naming
    the output; the temp file is removed and ``path`` keeps its old content.
    """
    import tempfile  # here: `edgetrain predict` without -o or --json starts without it

    path = check_output_path(Path(path), what)
    kind, target = output_target(path, what)
    folder = target.parent if kind == FILE else None
    clean_stale_temps(folder)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{TEMP_TAG}-{os.getpid()}.", suffix=".tmp",
                                   dir=folder)
    except OSError as exc:
        raise _disk_error(exc, path, what) from None
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes it 0600; the output gets a normal file's mode
    try:
        try:
            yield tmp_path
            if kind == STREAM:
                _write_through(tmp_path, path)
            else:
                with open(tmp_path, "rb+") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp_path, target)
        except OSError as exc:
            if exc.errno in _DISK_ERRNOS:
                raise _disk_error(exc, path, what) from None
            if exc.errno == errno.EPIPE:
                raise UsageError(f"the reader of the {what} closed it before it was written", str(path),
                                 "keep the reading end open until edgetrain exits") from None
            raise
        if kind == FILE:
            fsync_dir(target.parent)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_npz(fh, arrays: dict) -> None:
    """``np.savez(fh, **arrays)`` that leaves nothing behind when a write fails (a full disk, ulimit -f):
    numpy's own leaves its ZipFile open, and when that is collected after the file was closed it prints
    "Exception ignored ... ValueError: seek of closed file". Here the archive is closed either way."""
    import zipfile

    import numpy as np

    with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


def _write_through(src: Path, dst: Path) -> None:
    """Copy ``src`` into the stream ``dst`` (a device, a FIFO: opening blocks until it has a reader; an open
    descriptor's file: appended, as the descriptor's own writes would be)."""
    import stat

    flags = os.O_WRONLY
    if stat.S_ISREG(os.stat(dst).st_mode):
        flags |= os.O_APPEND
    fd = os.open(dst, flags)
    try:
        with open(src, "rb") as fh:
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
    finally:
        os.close(fd)


_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _disk_error(exc: OSError, path: Path, what: str) -> UsageError:
    if exc.errno == errno.EFBIG:  # RLIMIT_FSIZE (Python ignores SIGXFSZ: the write fails with EFBIG instead)
        return UsageError(f"the file size limit (ulimit -f) stopped the writing of the {what} (File too large)",
                          str(path), "raise the limit (ulimit -f unlimited) or write it elsewhere")
    if exc.errno in _DISK_ERRNOS:
        return UsageError(f"no space left to write the {what} ({os.strerror(exc.errno)})", str(path),
                          "free some space or write it elsewhere")
    return UsageError(f"cannot write the {what}: {exc.strerror or exc}", str(path), "choose another location")


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS


def disk_full_error(exc: OSError, path, what: str = "output") -> UsageError:
    """The one-line error for an OSError raised while writing ``path`` (for writers that are not atomic_path)."""
    return _disk_error(exc, Path(path), what)


def ensure_free_space(folder: Path, nbytes: int, what: str, margin: int = 64 << 20) -> None:
    """Refuse before writing ``nbytes`` into ``folder`` if the file system cannot hold them (plus a margin)."""
    import shutil

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if nbytes + margin > free:
        raise UsageError(f"the {what} needs {nbytes / 2**20:,.0f} MB but {folder} has {free / 2**20:,.0f} MB free",
                         str(folder), "free some space, or lower the memory budget's disk use")


# --- temp files that outlive a SIGKILL ----------------------------------------------------------------

def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(name: str) -> bool:
    for pattern in _STALE_NAME:
        m = pattern.match(name)
        if m:
            return int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1)))
    return False


def clean_stale_temps(folder: Path | str | None = None) -> list[str]:
    """Remove edgetrain temp files and folders in ``folder`` (default: $TMPDIR) whose writer is dead."""
    import shutil
    import tempfile

    folder = Path(folder) if folder is not None else Path(tempfile.gettempdir())
    removed = []
    patterns = (f".*.{TEMP_TAG}-*.tmp", f"{TEMP_TAG}-*", f".{TEMP_TAG}-*")
    seen = set()
    for pattern in patterns:
        for name in glob.glob(os.path.join(glob.escape(str(folder)), pattern)):
            if name in seen or not _stale(os.path.basename(name)):
                continue
            seen.add(name)
            try:
                if os.path.isdir(name) and not os.path.islink(name):
                    shutil.rmtree(name, ignore_errors=True)
                else:
                    os.unlink(name)
                removed.append(name)
            except OSError:
                pass
    return removed


@contextlib.contextmanager
def temp_dir(what: str, dir: Path | str | None = None):  # noqa: A002 - tempfile's name
    """A temp folder named after this process (``edgetrain-WHAT-PID-XXXX``, hidden when beside an
    output); stale ones of dead processes in the same place are removed first."""
    import shutil
    import tempfile

    clean_stale_temps(dir)
    prefix = f"{'.' if dir is not None else ''}{TEMP_TAG}-{what}-{os.getpid()}-"
    try:
        path = tempfile.mkdtemp(prefix=prefix, dir=None if dir is None else str(dir))
    except OSError as exc:
        raise _disk_error(exc, Path(dir or tempfile.gettempdir()), "temporary files") from None
    try:
        yield Path(path)
    except EdgetrainError:
        raise
    except Exception as exc:
        # A full scratch file system fails in whoever writes there: an OSError, or a library's own error
        # (ONNX Runtime's "Protobuf serialization failed"). Either is the disk's, said in one line.
        if is_disk_full(exc) or _nearly_full(path):
            raise _scratch_error(exc, Path(path), user_folder=dir is not None) from None
        cut = cut_at_size_limit(path)
        if cut is not None:  # a library's own writer (ONNX Runtime's profiler) stopped short, and the reader failed
            raise _scratch_error(OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(cut)), Path(path),
                                 user_folder=dir is not None) from None
        raise
    finally:
        shutil.rmtree(path, ignore_errors=True)


def cut_at_size_limit(folder) -> Path | None:
    """A file under ``folder`` as large as the file size limit (ulimit -f) allows: one a writer outside
    Python (ONNX Runtime's, in C++) may have stopped short at without saying so (SIGXFSZ is ignored, and
    such a writer drops the EFBIG). None when there is no limit or no such file."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    for f in Path(folder).rglob("*"):
        with contextlib.suppress(OSError):
            if f.is_file() and f.stat().st_size >= limit:
                return f
    return None


def _nearly_full(folder, slack: int = 1 << 20) -> bool:
    import shutil

    try:
        return shutil.disk_usage(folder).free < slack
    except OSError:
        return False


def scratch_error(exc: OSError, folder: Path | str) -> EdgetrainError:
    """The one-line error for a temporary file in ``folder`` (TMPDIR's) that a full disk or ulimit -f cut short
    (for writers of their own scratch files: a child writing its result for its parent)."""
    return _scratch_error(exc, Path(folder), user_folder=False)


def _scratch_error(exc: BaseException, folder: Path, user_folder: bool) -> EdgetrainError:
    """No room for temporary files: beside the user's output (their folder: exit 2), or in TMPDIR (exit 1)."""
    reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else "No space left on device"
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return UsageError(f"the file size limit (ulimit -f) stopped the writing of temporary files ({reason})",
                          str(folder.parent), "raise the limit (ulimit -f unlimited)")
    if user_folder:
        return UsageError(f"no space left for temporary files ({reason})", str(folder.parent),
                          "free some space there or write the output elsewhere")
    return RunFailed(f"no space left for temporary files ({reason})", f"TMPDIR {folder.parent}",
                     "free some space there, or point TMPDIR at a folder with room")


# --- outputs never overwrite inputs -------------------------------------------------------------------

_PREFIX_FILES = ("-symbol.json", "-edgetrain.json")


def _family(ref, existing_only: bool) -> list[Path]:
    """The files a path-like reference names: itself, and the files a PREFIX expands to."""
    if ref is None:
        return []
    text = str(ref)
    if not text or text == "-":
        return []
    out = [Path(text)]
    out += [Path(text + s) for s in _PREFIX_FILES]
    if existing_only:
        out += [Path(p) for p in glob.glob(glob.escape(text) + "-[0-9][0-9][0-9][0-9].params")]
    else:
        out.append(Path(text + "-0000.params"))
    return [p for p in out if not existing_only or p.exists()]


def _same(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _is_char_device(path: Path) -> bool:
    import stat

    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def check_outputs(inputs: dict | None = None, outputs: dict | None = None, prefix_outputs=()) -> None:
    """Refuse, before any work, an output that is the same file as an input or as another output.

    ``inputs`` and ``outputs`` map the option that names a file (``MODEL``, ``--calib``, ``-o``,
    ``--json``) to its value (None and ``-`` are skipped). An input is compared with everything a PREFIX
    expands to (PREFIX-symbol.json, PREFIX-NNNN.params, PREFIX-edgetrain.json); an output named in
    ``prefix_outputs`` is compared with the PREFIX files it will write. Paths are compared resolved
    (symlinks, ``..``) and by inode (hard links).
    """
    ins = [(opt, p) for opt, ref in (inputs or {}).items() for p in _family(ref, existing_only=True)]
    outs = []
    for opt, ref in (outputs or {}).items():
        if ref is None or str(ref) in ("", "-"):
            continue
        if opt in prefix_outputs:
            outs += [(opt, p) for p in _family(ref, existing_only=False)]
        else:
            outs.append((opt, Path(str(ref))))
    for i, (oopt, opath) in enumerate(outs):
        for iopt, ipath in ins:
            if _same(opath, ipath):
                also = f" ({clip(ipath, 120)})" if str(ipath) != str(opath) else ""
                raise UsageError(f"{oopt} would overwrite the input {iopt}{also}", str(opath),
                                 f"write {oopt} to another file")
        for oopt2, opath2 in outs[i + 1:]:
            if oopt2 != oopt and _same(opath, opath2) and not _is_char_device(opath):  # -o /dev/null --json /dev/null
                raise UsageError(f"{oopt} and {oopt2} name the same file", str(opath),
                                 f"give {oopt2} another file name")


def check_outputs_not_files(outputs: dict | None, files, what: str = "input") -> None:
    """Refuse, before any work, an output that is one of ``files`` (the images a DATA folder holds, or those
    listed on standard input): compared by inode, so another spelling, a symlink or a hard link is caught.
    Only outputs that exist as regular files can be one of them; a device (``/dev/null``) never is."""
    import stat

    idents = {}
    for opt, ref in (outputs or {}).items():
        if ref is None or str(ref) in ("", "-"):
            continue
        try:
            st = os.stat(ref)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            idents[(st.st_dev, st.st_ino)] = (opt, str(ref))
    if not idents:
        return
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            continue
        hit = idents.get((st.st_dev, st.st_ino))
        if hit:
            opt, ref = hit
            raise UsageError(f"{opt} would overwrite the {what} {clip(f, 120)}", ref, f"write {opt} to another file")


# --- bounded text input -------------------------------------------------------------------------------

def read_text_bounded(path: Path | str, what: str = "file", limit: int = MAX_TEXT_BYTES) -> str:
    """A regular file's text, UTF-8, at most ``limit`` bytes: a FIFO, /dev/zero or a 2 GB file is refused
    without being read to its end."""
    import stat

    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise UsageError("file not found", str(path), "check the path") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what}: {exc.strerror}", str(path), "check its permissions") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, pipe or socket)"
            raise UsageError(f"{what} is {kind}", str(path), "give a YAML file")
        if st.st_size > limit:
            raise UsageError(f"{what} is {st.st_size:,} bytes, over the limit of {limit:,}", str(path),
                             "give the real file; it should be a few kB")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:  # a file that grows while read
                raise UsageError(f"{what} is over the limit of {limit:,} bytes", str(path), "give the real file")
            chunks.append(chunk)
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                         str(path), "save it as UTF-8") from None


def parse_yaml(text: str, source: str):
    """``yaml.safe_load`` with limits: nesting depth, and node count with every alias expanded (a
    billion-laughs document is refused before anything is built from it)."""
    import yaml

    def syntax(exc):
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        return UsageError(f"not valid YAML: {clip(getattr(exc, 'problem', None) or exc, 120)}", where,
                          "fix the syntax")

    try:
        depth = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    mark = event.start_mark
                    raise UsageError(f"YAML nested deeper than {MAX_YAML_DEPTH} levels", f"{source}:{mark.line + 1}",
                                     "flatten the file")
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_expansion(node, source)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise syntax(exc) from None
    except RecursionError:
        raise UsageError("YAML nested too deep", source, "flatten the file") from None


# edgetrain's own JSON (results, records, metadata) is under 10 levels deep; what Python reads of a deeper
# document recursively (json.loads past ~1000 levels, json.dumps, every walk of it) would end in a RecursionError.
MAX_JSON_DEPTH = MAX_YAML_DEPTH


def parse_json(text: str | bytes, max_depth: int = MAX_JSON_DEPTH):
    """``json.loads``, with a document nested deeper than ``max_depth`` a ValueError like any other malformed
    JSON (the readers' ``except ValueError`` gives their one line), never a RecursionError."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > max_depth:
                raise ValueError(f"JSON nested deeper than {max_depth} levels")
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return doc


def _check_expansion(root, source: str) -> None:
    """Count nodes as if every alias were expanded (aliases share nodes: a DAG, sized with memo)."""
    import yaml

    sizes: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done or not children:
            sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
            if sizes[key] > MAX_YAML_NODES:
                raise UsageError(f"YAML expands to more than {MAX_YAML_NODES:,} nodes through its aliases "
                                 "(&anchor/*alias)", source, "write the values out; a profile or recipe needs few")
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


def read_yaml(path: Path | str, what: str = "file"):
    """Read and parse a YAML file with every bound above."""
    return parse_yaml(read_text_bounded(path, what), str(path))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes, what: str = "output") -> None:
    with atomic_path(path, what) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str, what: str = "output") -> None:
    """UTF-8; a file name's undecodable bytes (held as surrogates: a non-UTF-8 name, or any non-ASCII name
    under an ASCII locale) are written back as the bytes they were."""
    atomic_write_bytes(path, text.encode("utf-8", "surrogateescape"), what)


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Which option of a command names an input file and which an output: one table for every command.
_INPUT_FIELDS = ("data", "calib", "val", "params", "device", "power_log")
_FINETUNE_FILES = ("model", "model.onnx", "metrics.json", "checkpoint.npz")  # training.outdir: what OUTDIR gets


def check_command_outputs(model, opts, json_path: str | None = None) -> None:
    """``check_outputs`` for a command's parsed options: MODEL and the DATA/--params/--device files are
    inputs; -o (a file, an int8 PREFIX, or a finetune OUTDIR's files), --report and --json are outputs."""
    inputs = {"MODEL": model}
    for name in _INPUT_FIELDS:
        value = getattr(opts, name, None)
        if isinstance(value, (str, Path)):
            inputs[f"--{name.replace('_', '-')}"] = value
    outputs, prefixes = {}, []
    output = getattr(opts, "output", None)
    if output is not None and hasattr(opts, "calib") and getattr(opts, "backend", None) == "mxnet":
        prefixes.append("-o")  # quantize --backend mxnet writes a PREFIX
    if isinstance(output, str):  # quantize / export: the model written
        outputs["-o"] = output
    out_dir = getattr(opts, "out", None)
    if isinstance(out_dir, str) and hasattr(opts, "epochs"):  # finetune OUTDIR
        for name in _FINETUNE_FILES:
            outputs[f"-o {name}"] = str(Path(out_dir) / name)
        prefixes.append("-o model")
    report = getattr(opts, "report", None)
    if isinstance(report, str):
        outputs["--report"] = report
    outputs["--json"] = json_path
    check_outputs(inputs, outputs, prefix_outputs=tuple(prefixes))


def file_digest(path, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes, read in chunks."""
    with open(path, "rb") as fh:
        if hasattr(hashlib, "file_digest"):
            return hashlib.file_digest(fh, algorithm).hexdigest()
        digest = hashlib.new(algorithm)  # Python 3.10 (JetPack 6) has no hashlib.file_digest
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
        return digest.hexdigest()


MEMO_ENTRIES = 512  # the most files a digest memo remembers (the oldest are forgotten first)
MEMO_SETTLED_NS = 2_000_000_000  # a file changed this close to its hashing is hashed again next time


def remembered_digest(path, memo: Path | None) -> str:
    """``file_digest(path)`` (SHA-256), remembered in the JSON file ``memo`` by the file's identity: device,
    inode, size, modification and status-change times (git's index does the same). A file whose identity
    is unchanged is not read again: any write to it, a rename over it or a ``touch`` changes the status-change
    time, which no user call can set back. A file changed within two seconds of its hashing is hashed
    again next time (a write in the same clock tick cannot hide). ``memo`` None: always hashed.

    SHA-256 of a 14 MB MobileNetV2 costs ~10 ms here and ~0.15 s on a Raspberry Pi 4 (no SHA
    instructions); a fine-tune hashes its weights, its exported frozen part and its template every run."""
    path = Path(path)
    if memo is None:
        return file_digest(path)
    st = path.stat()
    key = str(path.resolve())
    ident = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    try:
        entries = json.loads(memo.read_text(encoding="utf-8"))
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError):
        entries = {}
    known = entries.get(key)
    if isinstance(known, list) and len(known) == 7 and known[:5] == ident:
        return known[6]
    hashed_at = time.time_ns()
    digest = file_digest(path)
    if path.stat().st_ctime_ns != st.st_ctime_ns:  # written while being read: do not remember this one
        return digest
    if max(st.st_mtime_ns, st.st_ctime_ns) < hashed_at - MEMO_SETTLED_NS:
        entries.pop(key, None)
        entries[key] = [*ident, hashed_at, digest]
        for old in list(entries)[:-MEMO_ENTRIES]:
            entries.pop(old)
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(memo, json.dumps(entries), "digest memo")
        except (OSError, UsageError):
            pass  # a read-only or full cache folder: hashed every time, as before
    return digest


def cache_root() -> Path | None:
    """edgetrain's per-user cache folder: ``EDGETRAIN_CACHE_DIR`` (empty: none), else $XDG_CACHE_HOME/edgetrain."""
    env = envvars.get("EDGETRAIN_CACHE_DIR")
    if env is not None:
        return Path(env) if env.strip() else None
    base = envvars.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgetrain"
