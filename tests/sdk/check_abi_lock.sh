#!/usr/bin/env bash
# The ABI lock must catch what breaks plugins: on a copy of the SDK headers, a comment-only edit
# passes, an added virtual fails the check, rewriting the lock without a kAbiVersion bump is
# refused, and a bump with a rewritten lock passes again.
#   check_abi_lock.sh SOURCE_DIR
set -euo pipefail
src="$1"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
mkdir -p "$work/sdk" "$work/cmake"
cp -r "$src/sdk/include" "$work/sdk/"
cp "$src/sdk/abi.lock" "$work/sdk/"
cp "$src/cmake/AbiLock.cmake" "$work/cmake/"
check() { cmake -DSOURCE_DIR="$work" "$@" -P "$work/cmake/AbiLock.cmake" 2>&1; }
fail() { echo "FAIL: $*"; exit 1; }
headers="$work/sdk/include/sparsebit/sdk"

check >/dev/null || fail "the unchanged headers do not match the lock"
printf '\n// a comment\n/* and a block\n   comment */\n' >>"$headers/op.h"
check >/dev/null || fail "a comment-only change failed the check"

sed -i 's|virtual void set_training(bool training) { (void)training; }|&\n  virtual void added_later() {}|' "$headers/op.h"
grep -q added_later "$headers/op.h" || fail "could not plant the added virtual"
if out="$(check)"; then fail "an added virtual passed the check"; fi
grep -q "Bump" <<<"$out" || fail "the failure does not say what to do: $out"
if out="$(check -DUPDATE=ON)"; then fail "the lock was rewritten without a kAbiVersion bump"; fi
grep -q "kAbiVersion is still" <<<"$out" || fail "the refusal does not name kAbiVersion: $out"

abi=$(sed -n 's/.*kAbiVersion = \([0-9]*\);.*/\1/p' "$headers/version.h")
sed -i "s/kAbiVersion = $abi;/kAbiVersion = $((abi + 1));/" "$headers/version.h"
if check >/dev/null; then fail "a bumped kAbiVersion passed against the old lock"; fi
check -DUPDATE=ON >/dev/null || fail "the lock could not be rewritten after the bump"
grep -q "abi_version = $((abi + 1))" "$work/sdk/abi.lock" || fail "the rewritten lock does not record ABI $((abi + 1))"
check >/dev/null || fail "the bumped headers do not match their rewritten lock"
echo "ABI lock: comments pass, an added virtual fails, a rewrite needs a bump: ok"
