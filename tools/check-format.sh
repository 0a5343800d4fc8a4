#!/usr/bin/env bash
# Checks that every tracked C++ file is formatted as .clang-format says (clang-format 14, Debian
# 12's). `tools/check-format.sh --fix` formats them in place.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
clang_format="${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}"
if [[ -z "$clang_format" ]]; then
  echo "clang-format not found: install clang-format-14 (tools/install-deps.sh does)" >&2
  exit 2
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "$root is not a git checkout: the files to check are the tracked ones" >&2
  exit 2
fi
mapfile -d '' files < <(git ls-files -z -- '*.cpp' '*.h' '*.cu' '*.cuh')
if [[ "${1:-}" == --fix ]]; then
  "$clang_format" -i "${files[@]}"
  exit 0
fi
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
if ! "$clang_format" --dry-run --Werror "${files[@]}" 2>"$report"; then
  grep -E "^[^ ]+:[0-9]+:[0-9]+: error:" "$report" | cut -d: -f1 | sort -u | sed 's/^/not formatted: /' >&2
  echo "run tools/check-format.sh --fix" >&2
  exit 1
fi
echo "${#files[@]} C++ files formatted as .clang-format says"
