#!/bin/sh
# Lists the functions in src/ longer than 85 lines (the house rule says ~80) that carry no reason: a comment above the function (within
# the 8 lines before its first line) saying "Kept whole: WHY". Exits 1 when there is one. Needs universal-ctags
# (scripts/install-deps.sh installs it). Run from anywhere: scripts/check-function-length.sh [MAX_LINES]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
max=${1:-85}
if ! command -v ctags >/dev/null 2>&1 || ! ctags --version 2>/dev/null | grep -q "Universal Ctags"; then
  echo "check-function-length: universal-ctags is not installed (scripts/install-deps.sh installs it)" >&2
  exit 2
fi
cd "$root"
ctags -R --languages=C++ --kinds-C++=f --fields=+ne -x --_xformat="%{end} %{line} %F %N" src |
  awk -v max="$max" '$1 != "" && $1 - $2 + 1 > max { print $1 - $2 + 1, $2, $3, $4 }' |
  sort -k3,3 -k2,2n | {
    found=0
    while read -r n line file name; do
      from=$((line > 8 ? line - 8 : 1))
      if sed -n "${from},$((line - 1))p" "$file" | grep -q "Kept whole:"; then continue; fi
      echo "$file:$line: $name is $n lines (over $max): split it, or say why above it with \"Kept whole: ...\""
      found=1
    done
    exit $found
  }
