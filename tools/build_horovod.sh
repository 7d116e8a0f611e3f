#!/usr/bin/env bash
# Horovod for lesson 05, built from source and installed into .venv (called by tools/setup_env.sh).
#
# Horovod's last release, 0.28.1 (June 2023), does not build against today's PyTorch as released: its CMake
# files ask for C++14 and PyTorch's headers need C++17 (fixed upstream in horovod PR #3998, never released).
# So: download the pinned sdist, check its sha256, apply tools/horovod/cxx17.patch, build a wheel against
# .venv's torch (PyTorch backend, gloo controller, no MPI/TensorFlow/MXNet), keep it in .cache/horovod/ under
# a key made of the torch version, the patch's hash and the build's flavour, and install it. The next run
# finds the wheel and only checks it is installed; a new torch (or patch) gives a new key, so a new build.
#
#   TRAINUP_SKIP_HOROVOD=1      skip all of this (lesson 05 and its tests then say Horovod is missing)
#   TRAINUP_REQUIRE_HOROVOD=1   a build that cannot happen is an error (CI); otherwise one sentence, exit 0
#   HOROVOD_GPU_OPERATIONS=NCCL on a GPU machine: all-reduce on the GPUs through NCCL (needs the CUDA toolkit
#                               and NCCL; HOROVOD_NCCL_HOME if NCCL is not where CMake looks). Part of the key.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.28.1
SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
WHEEL_PKG=wheel==0.48.0   # `pip wheel --no-build-isolation` builds with what .venv has
PATCH=tools/horovod/cxx17.patch
CACHE=.cache/horovod
py=.venv/bin/python

say() { echo "build_horovod: $*"; }
# Cannot build here: an error where Horovod is required (CI), one sentence and success elsewhere.
cannot() {
  if [ "${TRAINUP_REQUIRE_HOROVOD:-0}" = 1 ]; then echo "build_horovod: $* (TRAINUP_REQUIRE_HOROVOD=1)" >&2; exit 1; fi
  say "$* -- lesson 05 will run without Horovod (set TRAINUP_SKIP_HOROVOD=1 to skip this step)."
  exit 0
}

if [ "${TRAINUP_SKIP_HOROVOD:-0}" = 1 ]; then say "skipped (TRAINUP_SKIP_HOROVOD=1)."; exit 0; fi
[ -x "$py" ] || { echo "build_horovod: no .venv yet; run tools/setup_env.sh first" >&2; exit 2; }

# Build flavour. PyPI's torch is a CUDA build: Horovod then compiles its CUDA operations and needs the CUDA
# toolkit, which CMake finds through CUDA_HOME/CUDAToolkit_ROOT. With no toolkit, torch reports no CUDA_HOME
# and Horovod builds for the CPU only.
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [ -x "$cuda_home/bin/nvcc" ]; then
  export CUDA_HOME=$cuda_home CUDAToolkit_ROOT=$cuda_home
  flavour=cuda-${HOROVOD_GPU_OPERATIONS:-cpuops}
else
  unset CUDA_HOME CUDAToolkit_ROOT HOROVOD_GPU_OPERATIONS
  flavour=cpu
fi
torch_version=$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))')
patch_hash=$(sha256sum "$PATCH" | cut -c1-12)
key=horovod-${VERSION}_torch-${torch_version}_patch-${patch_hash}_${flavour}
key=${key//+/-}
dir=$CACHE/$key
mkdir -p "$dir"

# The line of a log that says what went wrong: its first error, else its last line.
failing_line() { grep -m1 -iE '(^|[^a-z])error[: ]' "$1" || tail -1 "$1"; }
installed_key() { cat .venv/.horovod-key 2>/dev/null || true; }
install_wheel() {
  say "installing $(basename "$1") into .venv (pip's output: $dir/install.log)"
  "$py" -m pip install --no-deps --force-reinstall "$1" > "$dir/install.log" 2>&1 \
    || { echo "build_horovod: pip could not install $1: $(failing_line "$dir/install.log") (log: $dir/install.log)" >&2; exit 1; }
  "$py" -c 'import horovod.torch' || { echo "build_horovod: the wheel installed but horovod.torch does not import" >&2; exit 1; }
  echo "$key" > .venv/.horovod-key
  say "installed $(basename "$1")"
}

wheel=$(ls "$dir"/horovod-*.whl 2>/dev/null | head -1 || true)
if [ -n "$wheel" ]; then
  [ "$(installed_key)" = "$key" ] && "$py" -c 'import importlib.metadata as m; m.version("horovod")' 2>/dev/null && exit 0
  install_wheel "$wheel"; exit 0
fi
if [ -f "$dir/FAILED" ]; then
  cannot "the last build for this torch failed (log: $dir/build.log; delete $dir/FAILED to try again)"
fi

# What the build needs, checked first.
command -v "${CXX:-c++}" >/dev/null || cannot "no C++ compiler found (install g++, e.g. apt-get install g++)"
command -v cmake >/dev/null || cannot "cmake not found (install it, e.g. apt-get install cmake or pip install cmake)"
command -v make >/dev/null || cannot "make not found (install it, e.g. apt-get install make)"
command -v patch >/dev/null || cannot "patch not found (install it, e.g. apt-get install patch)"

say "building Horovod $VERSION against torch $torch_version ($flavour), once: download its source (3.5 MB),"
say "  patch it for C++17, compile a wheel (a few minutes on 2 cores), keep it in $dir/ (log: $dir/build.log)"
# The source tree lives beside the wheel it builds; one left by an interrupted build keeps its compiled objects.
src=$dir/src
sdist=$src/horovod-$VERSION.tar.gz
tree=$src/horovod-$VERSION
if ! { [ -f "$sdist" ] && echo "$SDIST_SHA256  $sdist" | sha256sum --check --quiet 2>/dev/null; }; then
  rm -rf "$src" && mkdir -p "$src"
  "$py" -m pip download --no-deps --no-binary :all: "horovod==$VERSION" -d "$src" > "$dir/download.log" 2>&1 \
    || cannot "could not download the horovod $VERSION sdist from PyPI: $(failing_line "$dir/download.log") (log: $dir/download.log)"
  echo "$SDIST_SHA256  $sdist" | sha256sum --check --quiet \
    || { echo "build_horovod: $sdist does not have the pinned sha256; not building it" >&2; exit 1; }
fi
if [ ! -d "$tree" ]; then
  tar -xzf "$sdist" -C "$src"
  patch --quiet -p1 -d "$tree" < "$PATCH" || { echo "build_horovod: $PATCH did not apply to horovod $VERSION" >&2; exit 1; }
fi
# Both C++ standard lines now say 17, and none 14 (also in a tree kept from an interrupted build).
for f in "$tree/CMakeLists.txt" "$tree/horovod/torch/CMakeLists.txt"; do
  grep -q 'set(CMAKE_CXX_STANDARD 17)' "$f" && ! grep -q 'set(CMAKE_CXX_STANDARD 14)' "$f" \
    || { echo "build_horovod: $f is not patched to C++17; delete $src and run again" >&2; exit 1; }
done

"$py" -c 'import wheel' 2>/dev/null || "$py" -m pip install --quiet "$WHEEL_PKG"
if ! HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
     HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
     "$py" -m pip wheel --no-build-isolation --no-deps --wheel-dir "$dir" "$tree" \
     > "$dir/build.log" 2>&1; then
  touch "$dir/FAILED"
  cannot "the Horovod build failed: $(failing_line "$dir/build.log") (whole log: $dir/build.log)"
fi
say "built in $(( SECONDS / 60 )) min $(( SECONDS % 60 )) s: $(ls "$dir"/horovod-*.whl | head -1)"
rm -rf "$src"
install_wheel "$(ls "$dir"/horovod-*.whl | head -1)"
