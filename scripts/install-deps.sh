#!/usr/bin/env bash
# Installs every build and test dependency of essaim from Debian bookworm packages, by name.
# Idempotent: packages already present are skipped by apt; safe to run on every build.
set -euo pipefail
packages=(
  build-essential cmake ninja-build git ca-certificates pkg-config
  clang libclang-rt-14-dev           # libFuzzer, ASan/UBSan runtimes
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libpcre2-dev libboost-dev libssl-dev libsqlite3-dev
  python3                            # test helpers
  jq                                 # scripts/bench-vs-llama.sh (JSON of the comparison)
)
# The reference JS tokenizer test needs node + npm; a machine that already has them (e.g. from
# NodeSource, whose nodejs conflicts with Debian's npm) keeps its own.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
