#!/usr/bin/env bash
# Installs the build into a temporary prefix and checks what users of the install get: the
# layout, a binary that finds its plugins with no environment variable, and a CMake package
# that builds an out-of-tree plugin the installed binary then loads.
#   check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"; src="$2"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null

fail() { echo "FAIL: $*"; exit 1; }
for f in bin/sparsebit lib/libsparsebit_sdk.so include/sparsebit/sdk/plugin.h include/sparsebit/sdk/op.h include/sparsebit/core/quant_model.h \
         lib/cmake/Sparsebit/SparsebitConfig.cmake lib/cmake/Sparsebit/SparsebitPlugin.cmake; do
  [[ -e "$prefix/$f" ]] || fail "missing $f"
done
n_plugins=$(ls "$prefix"/lib/sparsebit/plugins/*.so | wc -l)
(( n_plugins >= 8 )) || fail "expected the shipped plugins under lib/sparsebit/plugins, found $n_plugins"

# The installed binary finds its plugins beside its own library, with no environment variable.
json="$(env -u SPARSEBIT_PLUGIN_PATH "$prefix/bin/sparsebit" plugins --json)"
loaded=$(grep -c '"status": "loaded"' <<<"$json")
(( loaded == n_plugins )) || fail "installed binary loaded $loaded of $n_plugins plugins"
grep -q "\"$prefix/lib/sparsebit/plugins\"" <<<"$json" || fail "installed binary searched the wrong folder"

env -u SPARSEBIT_PLUGIN_PATH "$prefix/bin/sparsebit" -q quantize "$src/examples/fashion_mnist/fashion_mnist_cnn.onnx" \
  -c "$src/configs/w8a8_tensorrt.toml" --calib /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz \
  --calib-count 64 -o "$work/q.onnx" || fail "installed binary could not quantize"

# The Python package, where the build has it: installed under the prefix's dist-packages, it
# loads the installed core library and plugins (not the build tree's).
if [[ -d "$build/python/sparsebit" ]]; then
  module="$(find "$prefix" -name '_sparsebit*.so' | head -1)"
  [[ "$module" == "$prefix"/lib/python3*/dist-packages/sparsebit/* ]] || fail "Python package not under dist-packages: '$module'"
  env -u SPARSEBIT_PLUGIN_PATH PYTHONPATH="$(dirname "$(dirname "$module")")" /usr/bin/python3 - "$prefix" "$src" <<'PY' ||
import os, sys
import numpy as np
import sparsebit
prefix, src = sys.argv[1], sys.argv[2]
assert sparsebit.__file__.startswith(prefix), sparsebit.__file__
files = [p["file"] for p in sparsebit.plugins() if p["status"] == "loaded"]
assert files and all(f.startswith(prefix + "/lib/sparsebit/plugins/") for f in files), files
qm = sparsebit.QuantModel(os.path.join(src, "examples/fashion_mnist/fashion_mnist_cnn.onnx"),
                          os.path.join(src, "configs/w8a8_tensorrt.toml"))
qm.calibrate(np.random.default_rng(0).random((64, 1, 28, 28), dtype=np.float32))
assert qm.forward(np.zeros((2, 1, 28, 28), np.float32)).shape == (2, 10)
PY
    fail "the installed Python package did not work"
fi

# An out-of-tree plugin against the installed SDK.
mkdir -p "$work/plugin"
cp "$src/tests/plugin_host/fixtures/good_extra.cpp" "$work/plugin/"
cat >"$work/plugin/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(extra_plugin CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(Sparsebit REQUIRED)
sparsebit_add_plugin(good_extra SOURCES good_extra.cpp)
CMAKE
cmake -S "$work/plugin" -B "$work/plugin/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null || fail "find_package(Sparsebit) failed"
cmake --build "$work/plugin/build" >/dev/null || fail "the out-of-tree plugin did not build"
out="$(SPARSEBIT_PLUGIN_PATH="$work/plugin/build/plugins" "$prefix/bin/sparsebit" plugins)"
grep -q "loaded  fixture.good_extra" <<<"$out" || fail "the out-of-tree plugin was not loaded: $out"

# sparsebit_add_plugin refuses, at build time, a module without the entry point.
mkdir -p "$work/broken"
printf 'extern "C" int not_a_plugin() { return 1; }\n' >"$work/broken/broken.cpp"
cat >"$work/broken/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(broken_plugin CXX)
find_package(Sparsebit REQUIRED)
sparsebit_add_plugin(broken SOURCES broken.cpp)
CMAKE
cmake -S "$work/broken" -B "$work/broken/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
if build_log="$(cmake --build "$work/broken/build" 2>&1)"; then fail "a plugin without SPARSEBIT_PLUGIN built"; fi
grep -q "SPARSEBIT_PLUGIN(" <<<"$build_log" || fail "no entry-point message: $build_log"
[[ ! -e "$work/broken/build/plugins/sparsebit_broken.so" ]] || fail "the broken plugin was left behind"

# A plugin links the SDK library alone: one that calls into the core (here load_onnx, whose
# header is installed for applications) fails to link instead of loading with a hidden dependency.
mkdir -p "$work/reach"
cat >"$work/reach/reach.cpp" <<'CPP'
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/plugin.h"
namespace {
void register_all(sparsebit::Registrar&) { sparsebit::load_onnx("model.onnx"); }
}  // namespace
SPARSEBIT_PLUGIN("fixture.reach_into_core", "1.0", register_all)
CPP
cat >"$work/reach/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(reach_plugin CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(Sparsebit REQUIRED)
sparsebit_add_plugin(reach SOURCES reach.cpp)
CMAKE
cmake -S "$work/reach" -B "$work/reach/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
if reach_log="$(cmake --build "$work/reach/build" 2>&1)"; then fail "a plugin calling into the core linked"; fi
grep -q "undefined reference to .*sparsebit::load_onnx" <<<"$reach_log" || fail "no undefined-reference message: $reach_log"
needed="$(readelf -d "$prefix"/lib/sparsebit/plugins/*.so)"
grep -q "libsparsebit_sdk" <<<"$needed" || fail "the shipped plugins do not link the SDK library"
if grep -q "libsparsebit_core" <<<"$needed"; then fail "a shipped plugin links the core"; fi

# The plugin template, built out of tree, loaded through [plugins] paths, exported and run in ORT.
"$src/examples/plugin-template/run.sh" "$prefix" "$work/template" || fail "the plugin template run failed"
echo "install layout, plugin discovery, out-of-tree plugins and the template: ok"
