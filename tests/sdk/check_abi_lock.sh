#!/usr/bin/env bash
# The ABI lock must catch every change to the SDK: on a copy of the headers, a comment-only edit
# passes, an added virtual fails the check, recording it without a new SDK version is refused,
# and a new minor version is recorded beside the old one and passes.
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
if out="$(check -DUPDATE=ON)"; then fail "the lock was rewritten without a new SDK version"; fi
grep -q "kSdkVersionMinor" <<<"$out" || fail "the refusal does not name the version to bump: $out"

major=$(sed -n 's/.*kSdkVersionMajor = \([0-9]*\);.*/\1/p' "$headers/version.h")
minor=$(sed -n 's/.*kSdkVersionMinor = \([0-9]*\);.*/\1/p' "$headers/version.h")
sed -i "s/kSdkVersionMinor = $minor;/kSdkVersionMinor = $((minor + 1));/" "$headers/version.h"
if check >/dev/null; then fail "SDK $major.$((minor + 1)) passed before the lock recorded it"; fi
check -DUPDATE=ON >/dev/null || fail "the lock could not record SDK $major.$((minor + 1))"
grep -q "^sdk $major.$minor = " "$work/sdk/abi.lock" || fail "the lock forgot SDK $major.$minor"
grep -q "^sdk $major.$((minor + 1)) = " "$work/sdk/abi.lock" || fail "the lock does not record SDK $major.$((minor + 1))"
check >/dev/null || fail "the new minor version does not match its record"
echo "ABI lock: comments pass, an added virtual fails, recording it needs a new SDK version: ok"
