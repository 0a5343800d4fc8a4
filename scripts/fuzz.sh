#!/usr/bin/env bash
# Builds the libFuzzer targets (clang 14, ASan+UBSan) and fuzzes one of them.
#
#   scripts/fuzz.sh TARGET SECONDS      TARGET: onnx_import | config | yaml_config | npy | idx | tensor_pb | all
#
# SPARSEBIT_FUZZ_BUILD names the build to use (default build-fuzz/, configured here on first use);
# a clang build with -DSPARSEBIT_SANITIZE=ON serves as well (CI fuzzes in its sanitizer build).
# The corpus lives in BUILD/corpus/TARGET (seeded from the repository's fixtures and the
# installed ONNX test data on first use, and kept between runs); findings go to
# BUILD/findings/TARGET/. Turn a finding into a regression test by copying it to
# tests/fuzz/regressions/TARGET/ (FuzzRegressions.* replays those in the normal test suite).
# Exits non-zero when the fuzzer finds a crash, a leak, a sanitizer report or an input slower
# than 10 s.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:?usage: scripts/fuzz.sh TARGET SECONDS}"
seconds="${2:?usage: scripts/fuzz.sh TARGET SECONDS}"
build="${SPARSEBIT_FUZZ_BUILD:-$root/build-fuzz}"
targets=(onnx_import config yaml_config npy idx tensor_pb image)
if [[ "$target" == all ]]; then
  for t in "${targets[@]}"; do "$0" "$t" "$seconds"; done
  exit 0
fi
[[ " ${targets[*]} " == *" $target "* ]] || { echo "unknown target '$target' (one of: ${targets[*]} all)" >&2; exit 2; }

if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARSEBIT_FUZZ=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_COMPILER=clang++-14 > /dev/null
fi
cmake --build "$build" --target "fuzz_$target" -j "$(nproc)" > /dev/null

corpus="$build/corpus/$target"
if [[ ! -d "$corpus" ]]; then
  mkdir -p "$corpus"
  testdata=/usr/share/libonnx-testdata/data/node
  case "$target" in
    onnx_import)
      cp "$root"/tests/fixtures/*.onnx "$corpus/"
      cp "$root"/tests/conformance/extra/*/model.onnx "$corpus/" 2>/dev/null || true
      for d in "$testdata"/test_{conv,gemm,relu,resize,reshape,slice,gather,split,concat,layer_normalization}*; do
        [[ -f "$d/model.onnx" ]] && cp "$d/model.onnx" "$corpus/$(basename "$d").onnx"
      done ;;
    config)
      cp "$root"/configs/*.toml "$corpus/"
      cp "$root"/examples/plugin-template/*.toml "$corpus/" 2>/dev/null || true ;;
    yaml_config)
      cp "$root"/examples/original_yaml/*.yaml "$corpus/" ;;
    npy)
      cp "$root"/tests/observers/data.npy "$corpus/"
      /usr/bin/python3 - "$corpus" <<'PY'
import sys, numpy as np
for i, (dt, shape) in enumerate([("<f4", (2, 3)), ("<i8", (4,)), ("|u1", (1, 2, 2)), ("<f8", ()), ("|b1", (3,))]):
    np.save(f"{sys.argv[1]}/seed{i}.npy", np.arange(int(np.prod(shape))).reshape(shape).astype(dt))
for version in ((2, 0), (3, 0)):  # the longer header-length field
    np.lib.format.write_array(open(f"{sys.argv[1]}/v{version[0]}.npy", "wb"), np.ones((2, 5), np.float32), version=version)
PY
      ;;
    idx)
      cp /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz "$corpus/labels.gz"
      # The first bytes of each file, read without a pipe: `zcat | head` ends zcat with SIGPIPE,
      # which pipefail turns into a failure.
      /usr/bin/python3 - "$corpus" <<'PY'
import gzip, sys
for name, file, size in (("labels_plain", "t10k-labels-idx1-ubyte.gz", 200), ("images_plain", "t10k-images-idx3-ubyte.gz", 4000)):
    with gzip.open(f"/usr/share/datasets/fashion-mnist/{file}") as f:
        open(f"{sys.argv[1]}/{name}", "wb").write(f.read(size))
PY
      ;;
    image)  # small images of each format, as PIL writes them
      /usr/bin/python3 - "$corpus" <<'PY'
import sys
from PIL import Image
for i, (mode, size) in enumerate((("RGB", (7, 5)), ("L", (16, 3)), ("RGBA", (4, 9)))):
    im = Image.new(mode, size, (30, 120, 200, 255)[: len(mode)] if mode != "L" else 90)
    for ext in ("png", "bmp", "jpg"):
        if not (ext == "jpg" and mode == "RGBA"):
            im.save(f"{sys.argv[1]}/seed{i}.{ext}")
PY
      ;;
    tensor_pb)
      for d in "$testdata"/test_{abs,cast_FLOAT_to_FLOAT16,gather_0,reshape_reordered_all_dims,and2d,argmax_default_axis_example}; do
        [[ -f "$d/test_data_set_0/input_0.pb" ]] && cp "$d/test_data_set_0/input_0.pb" "$corpus/$(basename "$d").pb"
      done ;;
  esac
fi
findings="$build/findings/$target"
mkdir -p "$findings"
echo "fuzzing $target for ${seconds}s (corpus: $(ls "$corpus" | wc -l) files)"
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$build/bin/fuzz_$target" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
  -malloc_limit_mb=4096 -artifact_prefix="$findings/" -print_final_stats=1 2>&1 | tail -n 15
