#!/usr/bin/env bash
# Configures and builds essaim (Release) into build/ (or $BUILD_DIR). Extra args go to cmake;
# BUILD_TARGETS (space-separated) limits what ninja builds.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C "$BUILD_DIR" ${NINJA_JOBS:+-j "$NINJA_JOBS"} ${BUILD_TARGETS:-}
