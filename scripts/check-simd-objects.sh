#!/usr/bin/env bash
# Checks the per-target objects of the SIMD kernels (kernels/CMakeLists.txt): an instruction that
# needs AVX (a VEX/EVEX mnemonic, or a ymm/zmm/mask register) may only appear in functions of the
# object's own target namespace icecache::kernels::cpu::<target>:: (anywhere in the name: then the
# symbol is that target's alone), and never in the scalar
# objects. Anything else (an inline function or template compiled for the target under a shared
# name) could be picked by the linker for every target and fault on a CPU without that ISA.
# usage: check-simd-objects.sh OBJECT... (paths contain icecache_kernels_<target>.dir)
set -euo pipefail
command -v objdump >/dev/null || { echo "objdump not found: skipped"; exit 0; }
[ "$#" -gt 0 ] || { echo "usage: $0 OBJECT..." >&2; exit 2; }
status=0
for obj in "$@"; do
  target=$(echo "$obj" | sed -n 's#.*icecache_kernels_\([a-z0-9]*\)\.dir.*#\1#p')
  [ -n "$target" ] || { echo "cannot tell the target of $obj" >&2; exit 2; }
  bad=$(objdump -d --no-show-raw-insn -C "$obj" | awk -v t="$target" '
    /^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<") + 1); fn = substr(fn, 1, length(fn) - 2); next }
    /^ *[0-9a-f]+:\t/ {
      wide = ($2 ~ /^v/) || ($0 ~ /%[yz]mm|%k[0-7]/)
      if (wide && (t == "scalar" || index(fn, "icecache::kernels::cpu::" t "::") == 0)) n[fn]++
    }
    END { for (f in n) print "  " n[f] " AVX instructions in " f }')
  if [ -n "$bad" ]; then
    echo "$obj (target $target):"
    echo "$bad"
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "ok: $# objects, AVX instructions only in their target namespaces"
exit "$status"
