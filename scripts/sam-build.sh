#!/usr/bin/env bash
# `sam build` without Docker: SAM's rust-cargolambda build method runs cargo-lambda (PyPI; it
# brings zig, which cross-links for arm64) once per function, then this checks that each
# function's artifact is an arm64 Linux executable named `bootstrap`, as provided.al2023 wants.
#
#   scripts/sam-build.sh           the release build `sam deploy` ships (LTO): what the test
#                                  command builds, and runs under qemu
#   scripts/sam-build.sh --debug   the same path in the dev profile (SAM_BUILD_MODE=debug), quicker
#
# Installs the Rust target for arm64 if rustup lacks it, and the pinned PyPI tools if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=release
if [[ "${1:-}" == "--debug" ]]; then
  mode=debug
  export SAM_BUILD_MODE=debug
  # No debug info: a check of the build path needs none, and it is most of the link time
  # and of the binaries' size (~380 MB each with it).
  export CARGO_PROFILE_DEV_DEBUG=0
fi

if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  echo "sam-build: adding the aarch64-unknown-linux-gnu target (rustup)"
  rustup target add aarch64-unknown-linux-gnu
fi
if ! command -v sam >/dev/null || ! command -v cargo-lambda >/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
  hash -r
fi

started=$(date +%s)
# samconfig.toml turns on beta_features (rust-cargolambda is one) and the build cache.
sam build --beta-features
echo "sam-build: $mode build of the four functions took $(( $(date +%s) - started )) s"

# Every function in template.yaml with a cargo-lambda build: its artifact must be there.
python3 - <<'EOF'
import importlib.util, pathlib, re, shutil, subprocess, sys
import yaml  # PyYAML, which aws-sam-cli depends on

spec = importlib.util.spec_from_file_location("bench_lambda", "scripts/bench-lambda.py")
bench_lambda = sys.modules["bench_lambda"] = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
spec.loader.exec_module(bench_lambda)

# provided.al2023 ships glibc 2.34: a binary asking for newer symbols would not start there.
RUNTIME_GLIBC = (2, 34)


def newest_glibc(path):
    """The newest GLIBC_x.y symbol version the binary needs (objdump, from binutils)."""
    out = subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True, check=True).stdout
    versions = {tuple(int(p) for p in v.split(".")) for v in re.findall(r"GLIBC_([0-9]+(?:\.[0-9]+)+)", out)}
    return max(versions, default=None)


class Loader(yaml.SafeLoader):
    pass


# CloudFormation's short-form tags (!Ref, !GetAtt, ...) as plain values.
Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
template = yaml.load(open("template.yaml"), Loader=Loader)
functions = [name for name, r in template["Resources"].items()
             if r.get("Metadata", {}).get("BuildMethod") == "rust-cargolambda"]
bad = []
for name in functions:
    path = pathlib.Path(".aws-sam/build") / name / "bootstrap"
    if not path.is_file():
        bad.append(f"{name}: no {path}")
        continue
    head = path.read_bytes()[:20]
    machine = int.from_bytes(head[18:20], "little")
    if head[:4] != b"\x7fELF" or machine != 0xB7:  # EM_AARCH64
        bad.append(f"{name}: {path} is not an arm64 ELF executable (machine {machine:#x})")
        continue
    glibc = newest_glibc(path) if shutil.which("objdump") else None
    if glibc and glibc > RUNTIME_GLIBC:
        bad.append(f"{name}: needs glibc {'.'.join(map(str, glibc))}, the runtime has {'.'.join(map(str, RUNTIME_GLIBC))}")
        continue
    needs = f", needs glibc {'.'.join(map(str, glibc))}" if glibc else ""
    init = bench_lambda.init_section_kib(path)
    if not init:
        bad.append(f"{name}: {path} has no .text.init: its init code was not linked first (init-order.ld)")
        continue
    print(f"sam-build: {name:<20} {path} ({path.stat().st_size / 1e6:.1f} MB, arm64 ELF{needs}, init's code {init:.0f} KiB first)")
if not functions:
    bad.append("template.yaml has no rust-cargolambda functions")
if bad:
    sys.exit("sam-build: " + "; ".join(bad))
EOF
