#!/bin/sh
# Installs the Debian 12 packages k3 needs to build and test (run as root, or with sudo).
set -e
PKGS="build-essential libcjson-dev libpcre2-dev libcurl4-openssl-dev libssl-dev nginx libmicrohttpd-dev wrk libxxhash-dev liburing-dev"
# Node.js + npm run the server tests (tests/server); keep an existing install.
command -v npm >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
# fio measures the drive's own limit beside the expert store in `k3-lab bench io`.
PKGS="$PKGS fio"
# OpenBLAS: `k3-lab bench kernels` times its sgemm beside the batched products (k3-lab only).
PKGS="$PKGS libopenblas-dev"
# Open MPI (mpicc, mpirun) builds and tests the expert-parallel k3 (make MPI=1, make test-mpi).
PKGS="$PKGS openmpi-bin libopenmpi-dev"
if [ "${1:-}" = "--with-wide" ]; then PKGS="$PKGS python3-numpy"; fi
# CI also cross-compiles the NEON kernels and runs their tests under qemu (make test-neon).
if [ "${1:-}" = "--with-wide" ]; then PKGS="$PKGS gcc-aarch64-linux-gnu qemu-user"; fi
# ... and tests the AVX-512 kernels on any x86-64 through SIMDe (make test-avx512-emu).
if [ "${1:-}" = "--with-wide" ]; then PKGS="$PKGS libsimde-dev"; fi
# The chat page's browser tests (make test-web) drive Debian's Chromium; --with-wide (CI) or
# --with-web installs it.
if [ "${1:-}" = "--with-wide" ] || [ "${1:-}" = "--with-web" ]; then PKGS="$PKGS chromium"; fi
# ... and fuzzes the parsers with libFuzzer (make fuzz-smoke): Debian's clang brings
# libclang-rt-14-dev, which holds libFuzzer and the sanitizer runtimes.
if [ "${1:-}" = "--with-wide" ]; then PKGS="$PKGS clang libclang-rt-14-dev"; fi
# The Debian package (debian/, make test-deb): dpkg-buildpackage with debhelper, checked by
# lintian; --with-wide (CI) or --with-deb installs them.
if [ "${1:-}" = "--with-wide" ] || [ "${1:-}" = "--with-deb" ]; then
    PKGS="$PKGS debhelper lintian"
fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq $PKGS
