#!/usr/bin/env bash
# What runs the arm64 `bootstrap` artifacts on this x86_64 machine: Debian's qemu-user
# (qemu-aarch64) and the aarch64 C library (libc6-arm64-cross, in /usr/aarch64-linux-gnu),
# installed with apt if missing. Prints the sysroot qemu-aarch64 takes with -L.
set -euo pipefail

SYSROOT=/usr/aarch64-linux-gnu
if ! command -v qemu-aarch64 >/dev/null || [[ ! -e "$SYSROOT/lib/ld-linux-aarch64.so.1" ]]; then
  echo "qemu-arm64: installing qemu-user and libc6-arm64-cross (apt)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends qemu-user libc6-arm64-cross >&2
fi
qemu-aarch64 --version | head -1 >&2
echo "$SYSROOT"
