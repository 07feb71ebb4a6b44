#!/usr/bin/env bash
# launch/gpu-check and launch/gpu-check-prepare refuse bad input with exit 2 and a message, and
# an incomplete bundle stops gpu-check before anything runs, with a summary saying so. (The full
# dry run needs the .debs and a CUDA build: docs/performance.md, "GPU check".)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
# expect CODE PATTERN -- COMMAND...: the exit code is CODE and stdout+stderr match PATTERN.
expect() {
  local code="$1" pattern="$2"; shift 3
  local out rc=0
  out="$("$@" 2>&1)" || rc=$?
  if [ "$rc" != "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: $* -> exit $rc (want $code), output lacks /$pattern/:"; echo "$out" | tail -n 8
    failures=$((failures + 1))
  else
    echo "ok: $* -> exit $rc"
  fi
}
check="$root/launch/gpu-check"
prepare="$root/launch/gpu-check-prepare"

expect 0 "bench-gaussians-10m" -- "$check" --help
for s in env bundle unpack libs cases tests bench-nerf bench-checkpoint bench-diffusion train sanitizer; do
  "$check" --help | grep -qE "^  $s( |$)" || { echo "FAIL: --help does not describe step $s"; failures=$((failures + 1)); }
done
expect 2 "BUNDLE and OUT_DIR are required" -- "$check"
expect 2 "BUNDLE and OUT_DIR are required" -- "$check" "$tmp"
expect 2 "unknown option '--bogus'" -- "$check" "$tmp" "$tmp/out" --bogus
expect 2 "too many arguments" -- "$check" "$tmp" "$tmp/out" extra
expect 2 "no bundle folder" -- "$check" "$tmp/missing" "$tmp/out"
expect 2 "budget must be an integer >= 60" -- "$check" "$tmp" "$tmp/out" --budget 10
expect 2 "--only: unknown step 'bogus'" -- "$check" "$tmp" "$tmp/out" --only tests,bogus
expect 2 "--sanitizer-tools: unknown tool 'bogus'" -- "$check" "$tmp" "$tmp/out" --sanitizer-tools memcheck,bogus
expect 2 "--only needs a value" -- "$check" "$tmp" "$tmp/out" --only
mkdir -p "$tmp/empty"
expect 2 "bundle is incomplete|summary" -- "$check" "$tmp/empty" "$tmp/out" --dry-run
if ! grep -q "stopped: the bundle is incomplete" "$tmp/out/summary.md" 2>/dev/null; then
  echo "FAIL: no summary.md saying the bundle is incomplete"; failures=$((failures + 1))
fi
grep -q '"failed":true' "$tmp/out/summary.json" 2>/dev/null || { echo "FAIL: summary.json does not say failed"; failures=$((failures + 1)); }

expect 0 "libopenmpi-dev" -- "$prepare" --list
expect 0 "--debs-only" -- "$prepare" --help
expect 2 "unknown argument '--bogus'" -- "$prepare" --bogus
expect 2 "--bundle needs a value" -- "$prepare" --bundle

[ "$failures" = 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all passed"
