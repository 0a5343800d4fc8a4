#!/usr/bin/env bash
# The growth check must tell an addition from a break: on copies of the SDK headers, a new
# interface and a new Registrar method with a body at its end pass; a pure one, a virtual added
# to Quantizer, a field added to QSpec and a removed class fail, each named.
#   check_sdk_growth.sh SOURCE_DIR CXX INCLUDE...
set -euo pipefail
src="$1" cxx="$2"; shift 2
includes=(); for i in "$@"; do includes+=(-I "$i"); done
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
check() { python3 "$src/tools/check-sdk-growth.py" --cxx "$cxx" --released "$src/sdk/include" --current "$work/include" "${includes[@]}" 2>&1; }
fresh() { rm -rf "$work/include"; mkdir -p "$work/include/sparsebit"; cp -r "$src/sdk/include/sparsebit/sdk" "$work/include/sparsebit/"; }
h="$work/include/sparsebit/sdk"

fresh
printf '\nnamespace sparsebit {\nclass KeepsNotes {\n public:\n  virtual ~KeepsNotes() = default;\n  virtual void note() = 0;\n};\n}  // namespace sparsebit\n' >>"$h/quantizer.h"
# Registrar is the last class of registrar.h: its "};" is the file's last.
plant_registrar() { perl -0pi -e "s/\n};\n(\n}  \/\/ namespace sparsebit\n)\$/\n  $1\n};\n\$1/" "$h/registrar.h"; }
plant_registrar 'virtual void add_later(const std::string\& name) { (void)name; }'
grep -q add_later "$h/registrar.h" || fail "could not plant the Registrar method"
out="$(check)" || fail "a new interface and a Registrar method at the end failed: $out"
grep -q "1 new" <<<"$out" || fail "the new interface was not seen: $out"

fresh
plant_registrar 'virtual void add_later(const std::string\& name) = 0;'
grep -q "add_later.*= 0" "$h/registrar.h" || fail "could not plant the pure Registrar method"
if out="$(check)"; then fail "a pure virtual added to Registrar passed: $out"; fi
grep -q "sparsebit::Registrar: a virtual added at its end is pure" <<<"$out" || fail "the failure does not name it: $out"

fresh
sed -i 's|  virtual bool affine_grid() const { return true; }|&\n  virtual void added_later() {}|' "$h/quantizer.h"
grep -q added_later "$h/quantizer.h" || fail "could not plant the added virtual"
if out="$(check)"; then fail "a virtual added to Quantizer passed: $out"; fi
grep -q "sparsebit::Quantizer: its virtual table changed" <<<"$out" || fail "the failure does not name Quantizer: $out"

fresh
sed -i 's|struct SPARSEBIT_API QSpec {|&\n  int added_later = 0;|' "$h/quant.h"
grep -q added_later "$h/quant.h" || fail "could not plant the QSpec field"
if out="$(check)"; then fail "a field added to QSpec passed: $out"; fi
grep -q "sparsebit::QSpec changed size" <<<"$out" || fail "the failure does not name QSpec: $out"

fresh
sed -i 's|PenaltyOnDevice|PenaltyOnDeviceRenamed|g' "$h/quantizer.h"
if out="$(check)"; then fail "a removed interface passed: $out"; fi
grep -q "sparsebit::PenaltyOnDevice was removed" <<<"$out" || fail "the failure does not name the removed class: $out"
echo "SDK growth check: additions pass, a new virtual, a new field and a removal fail: ok"
