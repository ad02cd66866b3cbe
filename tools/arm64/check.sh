#!/usr/bin/env bash
# Prove the ARM path under QEMU user-mode emulation: an arm64 Debian root (trixie: what Raspberry Pi OS
# is built on now, Python 3.13 and numpy 2; bookworm: the previous release, Python 3.11), edgetrain
# installed into a venv inside it from this checkout, then `edgetrain doctor --fix` (what a Pi user
# runs: on Python >= 3.12 it also installs mxnet 1.9.1 without its numpy<2 pin) and the smoke suite
# (tools/arm64/smoke.py).
#
# Run as root on a Debian/Ubuntu x86-64 host:  bash tools/arm64/check.sh
#
# Environment:
#   EDGETRAIN_ARM_CACHE   where the root, wheels and stamps live (default /var/cache/edgetrain-arm64/SUITE);
#                         outside the clone because CI clones afresh each run. Delete it for a cold run
#                         (never while this script runs: /dev is bind-mounted into the root then).
#   EDGETRAIN_ARM_CPU     the CPU QEMU emulates (default cortex-a72, a Raspberry Pi 4's core).
#   EDGETRAIN_ARM_MIRROR  Debian mirror for debootstrap (default: the host's own apt source).
#   EDGETRAIN_ARM_SUITE   trixie (default; Debian 13, Python 3.13) or bookworm (Debian 12, Python 3.11).
#   EDGETRAIN_ARM_PREPARE_ONLY=1  build the root and install the venv, then stop before the smoke suite (CI
#                         runs this in the background while the native stages run; the full run then reuses both).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$REPO/tools/arm64"
SUITE=${EDGETRAIN_ARM_SUITE:-trixie}
CACHE=${EDGETRAIN_ARM_CACHE:-/var/cache/edgetrain-arm64/$SUITE}
CPU=${EDGETRAIN_ARM_CPU:-cortex-a72}
ROOT="$CACHE/root"
WHEELS="$CACHE/wheels"
# What the root holds; changing this list rebuilds the root.
ROOT_PACKAGES="python3,python3-venv,python3-pip,libopenblas0-openmp,liblapacke,ca-certificates"
VENV=/opt/edgetrain-venv      # inside the root
PLATFORMS=(--platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux_2_28_aarch64)

started=$(date +%s)
log() { printf '[arm64 %4ds] %s\n' "$(( $(date +%s) - started ))" "$*"; }
die() { printf '[arm64] FAILED: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (debootstrap, binfmt_misc and mounts need it)"
case "$(uname -m)" in
  x86_64) ;;
  aarch64) die "this host is already aarch64: run edgetrain's tests natively instead" ;;
  *) die "unsupported host arch $(uname -m) (expected x86_64)" ;;
esac
command -v apt-get >/dev/null || die "needs a Debian/Ubuntu host (apt-get)"

# --- host tools ------------------------------------------------------------------------------------
need=()
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v update-binfmts >/dev/null || need+=(binfmt-support)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  # CI's native stage may install chromium at the same time: wait for apt's lock rather than fail on it
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- binfmt handler --------------------------------------------------------------------------------
BINFMT=/proc/sys/fs/binfmt_misc
if [ ! -e "$BINFMT/register" ]; then
  mount -t binfmt_misc binfmt_misc "$BINFMT" || die "cannot mount binfmt_misc on $BINFMT (a container without privileges?); set EDGETRAIN_SKIP_ARM=1 to skip the ARM stage on purpose"
fi
if [ ! -e "$BINFMT/qemu-aarch64" ]; then
  update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
fi
if [ ! -e "$BINFMT/qemu-aarch64" ] && [ -r /usr/lib/binfmt.d/qemu-aarch64.conf ]; then
  # binfmt-support declined (e.g. no systemd); register the packaged line directly
  grep -v '^#' /usr/lib/binfmt.d/qemu-aarch64.conf > "$BINFMT/register" || true
fi
[ -e "$BINFMT/qemu-aarch64" ] || die "could not register the qemu-aarch64 binfmt handler"
grep -qx enabled "$BINFMT/qemu-aarch64" || echo 1 > "$BINFMT/qemu-aarch64"
grep -qx enabled "$BINFMT/qemu-aarch64" || die "the qemu-aarch64 binfmt handler is registered but disabled"
# F (fix-binary): the kernel keeps the interpreter open, so the root needs no copy of qemu. A handler
# registered by something else without it is replaced by the packaged one, which has it.
if ! grep -q '^flags:.*F' "$BINFMT/qemu-aarch64" && [ -r /usr/lib/binfmt.d/qemu-aarch64.conf ]; then
  log "re-registering qemu-aarch64 with the F flag (was: $(grep flags "$BINFMT/qemu-aarch64"))"
  echo -1 > "$BINFMT/qemu-aarch64"
  grep -v '^#' /usr/lib/binfmt.d/qemu-aarch64.conf > "$BINFMT/register"
fi
grep -q '^flags:.*F' "$BINFMT/qemu-aarch64" || die "the qemu-aarch64 handler lacks the F flag: $(grep flags "$BINFMT/qemu-aarch64")"
log "binfmt: $(grep interpreter "$BINFMT/qemu-aarch64"), $(grep flags "$BINFMT/qemu-aarch64")"

mkdir -p "$CACHE"
CACHE=$(realpath "$CACHE"); ROOT="$CACHE/root"; WHEELS="$CACHE/wheels"   # as /proc/PID/root shows it
exec 9>"$CACHE/lock"
if ! flock -n 9; then
  log "another ARM check is running (it holds $CACHE/lock); waiting for it"
  flock -w 1800 9 || die "another ARM check held $CACHE/lock for 30 minutes"
fi

# --- mounts: tracked, always undone ----------------------------------------------------------------
MOUNTED=()
mounts_under() { awk -v r="$1" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/mounts | sort -r; }
kill_inside() {   # processes this script started inside the root that outlived the smoke suite
  local pid pids=()
  for pid in /proc/[0-9]*; do
    [ "$(readlink "$pid/root" 2>/dev/null)" = "$ROOT" ] && pids+=("${pid#/proc/}")
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  echo "[arm64] stopping leftover processes in the root: ${pids[*]}" >&2
  kill -TERM "${pids[@]}" 2>/dev/null || true
  sleep 3
  kill -KILL "${pids[@]}" 2>/dev/null || true
  sleep 1
}
unmount_all() {
  local i
  [ ${#MOUNTED[@]} -gt 0 ] && kill_inside
  for (( i=${#MOUNTED[@]}-1; i>=0; i-- )); do
    umount "${MOUNTED[$i]}" 2>/dev/null || umount -l "${MOUNTED[$i]}" || echo "[arm64] could not unmount ${MOUNTED[$i]}" >&2
  done
  MOUNTED=()
}
trap 'rc=$?; unmount_all; exit $rc' EXIT
trap 'exit 130' INT TERM
bind() {   # bind <source> <target inside the root>
  mount --bind "$1" "$2"; MOUNTED+=("$2")
}
safe_rm() {   # remove a (partial) root, refusing while anything is mounted inside it
  local left
  left=$(mounts_under "$1")
  if [ -n "$left" ]; then
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done <<<"$left"
  fi
  left=$(mounts_under "$1")
  [ -z "$left" ] || die "refusing to delete $1: still mounted: $left"
  rm -rf --one-file-system "$1"
}
# A previous run killed with SIGKILL cannot have run its trap: clear its mounts first.
stale=$(mounts_under "$ROOT")
if [ -n "$stale" ]; then
  log "clearing stale mounts: $(echo $stale)"
  while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done <<<"$stale"
fi

# --- the arm64 root (built once, reused) -----------------------------------------------------------
host_mirror() {
  local m=""
  if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
    m=$(awk 'tolower($1)=="uris:" {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$m" ] || m=$(cat /etc/apt/sources.list.d/*.sources | awk 'tolower($1)=="uris:" && $2 !~ /security/ {print $2; exit}')
  fi
  if [ -z "$m" ] && [ -r /etc/apt/sources.list ]; then
    m=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
  fi
  echo "$m"
}
want_stamp="$SUITE $ROOT_PACKAGES"
if [ -f "$CACHE/root.ok" ] && [ "$(cat "$CACHE/root.ok")" = "$want_stamp" ] && [ -x "$ROOT/usr/bin/python3" ]; then
  log "reusing the arm64 root at $ROOT"
else
  MIRROR=${EDGETRAIN_ARM_MIRROR:-$(host_mirror)}
  [ -n "$MIRROR" ] || die "no Debian mirror found in the host's apt sources; set EDGETRAIN_ARM_MIRROR"
  # Debian's arm64 packages live beside amd64's on a Debian mirror; an Ubuntu host needs a ports mirror.
  case "$MIRROR" in *ubuntu*) [ -n "${EDGETRAIN_ARM_MIRROR:-}" ] || die "an Ubuntu host: set EDGETRAIN_ARM_MIRROR to a Debian mirror";; esac
  log "building an arm64 $SUITE root (one-time, ~6 min) from the host's apt mirror"
  rm -f "$CACHE/root.ok"
  [ -e "$ROOT" ] && safe_rm "$ROOT"
  [ -e "$ROOT.tmp" ] && safe_rm "$ROOT.tmp"
  # One stage: with the binfmt handler in place debootstrap can run the arm64 maintainer scripts.
  debootstrap --arch=arm64 --variant=minbase --include="$ROOT_PACKAGES" "$SUITE" "$ROOT.tmp" "$MIRROR" \
      > "$CACHE/debootstrap.log" 2>&1 || { tail -30 "$CACHE/debootstrap.log" >&2; die "debootstrap failed (log: $CACHE/debootstrap.log)"; }
  mounts=$(mounts_under "$ROOT.tmp"); [ -z "$mounts" ] || die "debootstrap left mounts: $mounts"
  mv "$ROOT.tmp" "$ROOT"
  rm -f "$ROOT/var/cache/apt/archives/"*.deb
  echo "$want_stamp" > "$CACHE/root.ok"
  log "arm64 root built"
fi

# --- wheels, fetched on the host (emulated pip would take many times longer) ------------------------
# The root's own Python (bookworm 3.11, trixie 3.13) decides which wheels to fetch. pip evaluates
# environment markers (mxnet is a dependency only below Python 3.12) with the Python it runs on, not
# --python-version: fetch with a host Python of the same version (on PATH or pyenv's).
PYVER=$(ls "$ROOT"/usr/bin/ | sed -n 's/^python\(3\.[0-9]*\)$/\1/p' | sort -V | tail -1)
[ -n "$PYVER" ] || die "no python3.N in the root's /usr/bin"
host_python() {
  local py
  for py in ${PYTHON:-} "python$PYVER" "$(pyenv root 2>/dev/null)"/versions/"$PYVER"*/bin/python"$PYVER" \
            /root/.pyenv/versions/"$PYVER"*/bin/python"$PYVER"; do
    [ -n "$py" ] && [ -x "$(command -v "$py" 2>/dev/null)" ] || continue
    "$py" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$PYVER'" 2>/dev/null || continue
    "$py" -m pip --version >/dev/null 2>&1 || continue
    command -v "$py"; return 0
  done
  return 1
}
PY=$(host_python) || die "no Python $PYVER with pip on this host (needed to fetch wheels for the root's Python $PYVER; set PYTHON)"
BUILD=$(mktemp -d)
trap 'rc=$?; unmount_all; rm -rf "$BUILD"; exit $rc' EXIT
log "building the edgetrain wheel from $REPO"
# Build from a copy: setuptools writes build/ and *.egg-info beside the sources it builds.
mkdir -p "$BUILD/src"
tar -C "$REPO" --exclude=./.git --exclude='./.venv*' --exclude=./build --exclude='*.egg-info' -cf - . | tar -C "$BUILD/src" -xf -
quiet_pip() {   # pip, without the host configuration's warnings about absent local indexes
  "$PY" -m pip "$@" 2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
}
"$PY" -m pip wheel --no-deps --wheel-dir "$BUILD/dist" "$BUILD/src" > "$BUILD/wheel.log" 2>&1 \
  || { tail -30 "$BUILD/wheel.log" >&2; die "could not build the edgetrain wheel"; }
EDGE_WHEEL=$(ls "$BUILD"/dist/edgetrain-*.whl)
log "downloading aarch64 wheels for its dependencies (Python $PYVER, with $PY)"
mkdir -p "$WHEELS"
# The host set, as a Pi user installs it (`pip install ".[host]"`): below Python 3.12 it brings mxnet, on 3.12+
# requests (what mxnet imports), mxnet then coming from `edgetrain doctor --fix`.
quiet_pip download --quiet --only-binary=:all: "${PLATFORMS[@]}" --python-version "$PYVER" \
    --implementation cp --dest "$WHEELS" "$EDGE_WHEEL[host]" \
  || die "could not download aarch64 wheels for edgetrain's dependencies"
# On Python >= 3.12 mxnet is not a dependency (its numpy<2 pin cannot be met there): `edgetrain doctor
# --fix` installs it inside, offline from these wheels, as it does online on a Pi.
quiet_pip download --quiet --no-deps --only-binary=:all: "${PLATFORMS[@]}" --python-version "$PYVER" \
    --implementation cp --dest "$WHEELS" "mxnet==1.9.1" \
  || die "could not download the aarch64 mxnet wheel"
rm -f "$WHEELS"/edgetrain-*.whl   # the dependencies are cached, edgetrain itself is always fresh

# --- mount /proc, /sys, /dev and the ARM cpuinfo into the root ------------------------------------
nproc_host=$(nproc --all)
# An ARM /proc/cpuinfo: onnxruntime's CPU detection (cpuinfo) crashes on the host's x86 one. One
# block per host CPU, so it agrees with /sys/devices/system/cpu.
awk -v n="$nproc_host" '
  BEGIN { RS=""; ORS="\n\n" }
  /^processor/ { if (!tmpl) tmpl=$0; next }
  { trailer = trailer $0 "\n" }
  END { for (i=0; i<n; i++) { b=tmpl; sub(/^processor[^\n]*/, "processor\t: " i, b); print b }
        printf "%s", trailer }' "$HERE/cpuinfo" > "$CACHE/cpuinfo"
mount -t proc proc "$ROOT/proc"; MOUNTED+=("$ROOT/proc")
bind "$CACHE/cpuinfo" "$ROOT/proc/cpuinfo"
bind /sys "$ROOT/sys"
bind /dev "$ROOT/dev"
log "mounted proc (with an ARM cpuinfo, $nproc_host CPUs), sys and dev in the root"

inside() {   # run a command in the root, as a Pi user's shell would, with the emulated CPU
  QEMU_CPU="$CPU" chroot "$ROOT" /usr/bin/env -i QEMU_CPU="$CPU" HOME=/root LANG=C.UTF-8 TERM=dumb \
    PIP_NO_INDEX=1 PIP_FIND_LINKS=/opt/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH="$VENV/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin" PYTHONDONTWRITEBYTECODE=1 "$@"
}
[ "$(inside uname -m)" = aarch64 ] || die "the root does not run as aarch64"

# --- install edgetrain inside, offline ------------------------------------------------------------
rm -rf "$ROOT/opt/wheels" && mkdir -p "$ROOT/opt/wheels"
cp "$WHEELS"/*.whl "$EDGE_WHEEL" "$ROOT/opt/wheels/"
cp "$HERE/smoke.py" "$ROOT/opt/smoke.py"
deps_stamp=$(cd "$WHEELS" && ls *.whl | sort | sha256sum | cut -c1-16)
if [ -x "$ROOT$VENV/bin/python" ] && [ "$(cat "$ROOT$VENV/.deps" 2>/dev/null)" = "$deps_stamp" ]; then
  log "reusing the venv's dependencies; reinstalling edgetrain only"
  inside pip install --quiet --no-index --no-deps --force-reinstall "/opt/wheels/$(basename "$EDGE_WHEEL")"
else
  log "creating $VENV inside the root and installing the wheels offline (emulated, ~2-4 min)"
  rm -rf "$ROOT$VENV"
  inside python3 -m venv "$VENV"
  inside pip install --quiet --no-index --find-links /opt/wheels "/opt/wheels/$(basename "$EDGE_WHEEL")[host]"
  echo "$deps_stamp" > "$ROOT$VENV/.deps"
fi
log "installed: Python $PYVER, $(inside pip list 2>/dev/null | grep -Ei '^(edgetrain|mxnet|numpy|onnx|onnxruntime) ' | tr -s ' ' | paste -sd, -)"

if [ "${EDGETRAIN_ARM_PREPARE_ONLY:-0}" = 1 ]; then
  log "prepared (EDGETRAIN_ARM_PREPARE_ONLY=1): the root and its venv are ready; the smoke suite was not run"
  exit 0
fi

# --- the smoke suite --------------------------------------------------------------------------------
log "running the smoke suite inside the root (QEMU_CPU=$CPU)"
set +e
inside python /opt/smoke.py --fresh
rc=$?
set -e
# The other boards' cores: a wheel using an instruction a Cortex-A53 (Pi 3B+, Zero 2 W) or A76 (Pi 5) lacks
# dies with SIGILL there although it passes on the A72 (onnxruntime #23957, #24512). doctor's inference check
# runs a tiny fp32 and int8 model in a child and turns SIGILL into a failed check.
for core in ${EDGETRAIN_ARM_EXTRA_CPUS-cortex-a53 cortex-a76}; do
  [ "$core" = "$CPU" ] && continue
  set +e
  out=$(CPU=$core inside edgetrain doctor --json - 2>/dev/null)
  set -e
  verdict=$(printf '%s' "$out" | inside python -c 'import json, sys
checks = {c["name"]: c for c in json.load(sys.stdin)["checks"]}
c = checks.get("inference")
print("ok" if c and c["status"] == "ok" else "FAILED: " + (json.dumps(c)[:300] if c else "no inference check"))' \
    2>&1 || true)
  log "QEMU_CPU=$core: doctor's fp32/int8 inference check: $verdict"
  [ "$verdict" = ok ] || rc=1
done
log "ARM stage: smoke exit $rc, $(( $(date +%s) - started )) s in all"
exit $rc
