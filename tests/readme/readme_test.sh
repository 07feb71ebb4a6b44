#!/usr/bin/env bash
# The README's commands, run as typed (docs/testing.md, "The README test"). Every ```bash block
# of README.md runs, in order, line by line, in a scratch folder that stands in for the
# repository root (links to build/, configs/ and launch/), except a block right after a
# `<!-- readme-test: skip: REASON -->` line. A long step is shortened by arguments appended to
# its line (shorten() below), never by editing it. Any line that fails fails the test, naming
# the README line.
#
# Usage: readme_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail

src=${1:?usage: readme_test.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: readme_test.sh SOURCE_DIR BUILD_DIR}
readme="$src/README.md"
[[ -f "$readme" && -x "$build/tessera" ]] || { echo "no $readme or $build/tessera" >&2; exit 2; }

scratch=$(mktemp -d "${TMPDIR:-/tmp}/tessera-readme.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
ln -s "$(cd "$build" && pwd)" "$scratch/build"
ln -s "$(cd "$src" && pwd)/configs" "$scratch/configs"
ln -s "$(cd "$src" && pwd)/launch" "$scratch/launch"

# What a line gets appended to run in a test's time (each option is one the README's lines do
# not give, so nothing is given twice): trainings a few steps without budgets and a one-view
# eval (point diffusion: its learning-rate warm-up within them); the demo scene smaller.
train_args='--set train.steps=6 --set train.epochs=0 --set train.time_budget_minutes=0 --set eval.max_views=1'
shorten() {
  local line=$1
  case "$line" in
    *"tessera synth --preset objects"*) echo " --views 16 --width 48 --height 48" ;;
    *"tessera train "*--print-config*) echo "" ;;
    *"tessera train "*demo_diffusion*) echo " $train_args --set diffusion.warmup_steps=2" ;;
    *"tessera train "*) echo " $train_args" ;;
    *"launch/captures "*) echo " --set train.steps=4 --set train.epochs=0 --set train.time_budget_minutes=0 --set eval.max_views=1" ;;
    *) echo "" ;;
  esac
}

# The blocks: "LINE_NUMBER<TAB>COMMAND" for every line to run.
lines=$(awk '
  /^<!-- readme-test: skip:/ { skip = 1; next }
  /^```bash$/ { inside = 1; skipping = skip; skip = 0; next }
  /^```/ { inside = 0; next }
  { if (!inside) { if ($0 !~ /^[[:space:]]*$/) skip = 0; next } }
  inside && !skipping && $0 !~ /^[[:space:]]*(#|$)/ { print NR "\t" $0 }
' "$readme")
count=$(printf '%s\n' "$lines" | grep -c . || true)
[[ $count -ge 10 ]] || { echo "README.md: found only $count command lines to run" >&2; exit 1; }

cd "$scratch"
n=0
while IFS=$'\t' read -r number command; do
  n=$((n + 1))
  extra=$(shorten "$command")
  echo "[$n/$count] README.md:$number: $command${extra:+   (+$extra)}"
  # The line as typed (comments and all), with the shortening arguments before its comment.
  code=${command%%  #*}
  comment=${command#"$code"}
  if ! bash -o pipefail -c "$code$extra $comment" </dev/null >"$scratch/out.txt" 2>&1; then
    echo "FAILED: README.md:$number: $command" >&2
    tail -40 "$scratch/out.txt" >&2
    exit 1
  fi
done <<<"$lines"
[[ $n -eq $count ]] || { echo "ran $n of the $count command lines" >&2; exit 1; }
echo "all $count README command lines ran"
