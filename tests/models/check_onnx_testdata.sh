#!/usr/bin/env bash
# Quantizes (W8A8, ONNX Runtime backend) every ONNX test-data model that make_old_opset_models.py
# wrote to MODELS_DIR/onnx_*/ and checks each against ONNX Runtime with check_model.sh.
#
#   tests/models/check_onnx_testdata.sh SPARSEBIT_BINARY MODELS_DIR
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
passed=0 failed=0
for dir in "$2"/onnx_*/; do
  name="$(basename "$dir")"
  if "$here/check_model.sh" "$1" "$2" "$name" > "$dir/check.log" 2>&1; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL $name:"
    tail -5 "$dir/check.log"
  fi
done
echo "$passed passed, $failed failed"
[[ $passed -gt 0 && $failed -eq 0 ]]
