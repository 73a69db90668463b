#!/usr/bin/env bash
# Installs every build and test dependency of essaim from Debian bookworm packages, by name.
# Idempotent: packages already present are skipped by apt; safe to run on every build.
#   scripts/install-deps.sh [--arm64]
set -euo pipefail
packages=(
  build-essential cmake ninja-build git ca-certificates pkg-config
  clang libclang-rt-14-dev           # libFuzzer, ASan/UBSan runtimes
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libpcre2-dev libboost-dev libssl-dev libsqlite3-dev
  libutf8proc-dev                    # Unicode NFC before pre-tokenisation
  python3                            # test helpers
  python3-jinja2                     # the oracle of the chat-template engine's test (tests/text/jinja_oracle.py)
  curl                               # the demo talks to essaim serve
  openssl                            # the relay tests make throw-away TLS certificates with it
  jq                                 # scripts/bench-vs-llama.sh (JSON of the comparison)
  libpq-dev postgresql               # the coordinator's PostgreSQL store; its tests start a throw-away cluster
  chromium                           # the coordinator dashboard's headless-browser test
  ccache                             # scripts/test.sh: the CUDA build takes the release build's objects from it
  universal-ctags                    # scripts/check-function-length.sh (a test: no long function without a stated reason)
  libsimgrid-dev                     # essaim-sim: the swarm at scale on SimGrid (docs/scale.md)
)
# The reference JS tokenizer test and the openai client test (tests/serve/js) need node + npm; a machine that already has them (e.g. from
# NodeSource, whose nodejs conflicts with Debian's npm) keeps its own.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
# --arm64 (the test suite): the ARM64 phone worker (scripts/build-arm64.sh) needs Debian's cross toolchain,
# the target's libraries through multiarch (dpkg's arm64 architecture), and qemu-user to run its tests here.
if [[ "${1:-}" == "--arm64" ]]; then
  packages+=(g++-aarch64-linux-gnu qemu-user libssl-dev:arm64 libgtest-dev:arm64 libboost-dev:arm64 libpcre2-dev:arm64
    libutf8proc-dev:arm64)
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO dpkg --add-architecture arm64
  fi
fi
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
