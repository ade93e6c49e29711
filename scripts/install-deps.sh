#!/usr/bin/env bash
# Installs the Debian packages (and PyPI packages for tests) ssmserve needs; idempotent, quiet when all present.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libcli11-dev libyaml-cpp-dev nlohmann-json3-dev libfmt-dev libspdlog-dev
      libutf8proc-dev libpcre2-dev libsentencepiece-dev libopenblas-openmp-dev libgtest-dev libgmock-dev
      libcpp-httplib-dev libboost1.81-dev clang libclang-rt-14-dev ccache)
# httplib: bench serve's client; Boost (Beast / Asio): ssmserve serve's HTTP transport; clang + its runtime: libFuzzer;
# ccache: scripts/test.sh's compiler cache
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
