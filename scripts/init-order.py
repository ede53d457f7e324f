#!/usr/bin/env python3
"""Write each Lambda function's init-order.ld: the code its start-up runs, to be linked first.

For each function (scripts/bench-lambda.py's FUNCTIONS), this
  1. builds it release with its symbols kept (own target directory, target/init-order),
  2. runs it under `valgrind --tool=callgrind` against bench-lambda.py's emulated Runtime API
     with a deployment's environment, and has callgrind dump at its first `next`,
  3. takes the functions of the binary that ran (callgrind's names, checked against the
     binary's symbol table) and writes them to functions/<name>/init-order.ld as a linker
     script: one output section, `.text.init`, in front of `.text`.

The build script every function shares (functions/link-init-first.rs) links with that file.
Symbols are named with the parts that differ from build to build and from target to target
wildcarded (the comment above `pattern` says which), so one file serves the x86_64
build `make bench` measures and the arm64 one `sam build` ships; init runs the same Rust code
on both. Run it again when init changes (a function's peak RSS in `make bench` creeps back
towards twice the hello world's): the script prints how much of each binary it placed.

Usage: scripts/init-order.py [--only hookwise-ingest ...]
Needs valgrind (installed with apt-get if missing). Takes ~10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_DIR = REPO / "target" / "init-order"

spec = importlib.util.spec_from_file_location("bench_lambda", REPO / "scripts" / "bench-lambda.py")
bench_lambda = sys.modules["bench_lambda"] = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
spec.loader.exec_module(bench_lambda)

# What differs between two builds of the same function, in v0 symbol names (set for every
# crate in .cargo/config.toml): `Cs<base62>_` is a crate's hash, which depends on the target
# and the build's metadata; `B<base62>_` a back reference to an earlier position of the name,
# which moves when a hash before it is longer or shorter. After the function's path may come
# the crate that instantiated it (generic code is copied into each crate that uses it, and
# LTO keeps whichever copy inlining left) and a number LTO gave it (`.6102`) when names
# clashed. A v0 path delimits itself, so `<path>*` matches any copy of that function, and
# no other function.
CRATE_HASH = re.compile(r"Cs[0-9A-Za-z]*_")
BACK_REFERENCE = re.compile(r"B[0-9A-Za-z]*_")
LTO_NUMBER = re.compile(r"\.[0-9]+$")


def function_path(symbol: str) -> str:
    """A v0 symbol without its instantiating crate and LTO number."""
    symbol = LTO_NUMBER.sub("", symbol)
    crate_by_reference = re.search(r"B[0-9A-Za-z]*_$", symbol)
    if crate_by_reference:
        return symbol[: crate_by_reference.start()]
    for crate in CRATE_HASH.finditer(symbol):  # an instantiating crate: Cs<hash>_<n><n chars>$
        rest = symbol[crate.end() :]
        digits = re.match(r"[0-9]+", rest)
        if digits and len(rest) - digits.end() == int(digits.group()):
            return symbol[: crate.start()]
    return symbol


def pattern(symbol: str) -> str:
    """A glob that matches `symbol`'s function in any build of the same code, for any target."""
    if not symbol.startswith("_R"):
        return symbol  # C: the name is the name
    path = BACK_REFERENCE.sub("B*_", CRATE_HASH.sub("Cs*_", function_path(symbol)))
    return path + "*"


def text_symbols(binary: Path) -> dict[str, int]:
    """The binary's function symbols and their sizes (nm; the binary keeps its symbols)."""
    out = subprocess.run(
        ["nm", "--defined-only", "--format=posix", str(binary)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    symbols = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[1] in "TtWw":
            symbols[parts[0]] = int(parts[3], 16)
    return symbols


def callgrind_functions(path: Path) -> list[str]:
    """Every function name in a callgrind output file, in order of first appearance.

    Names are compressed: the first `fn=(7) name` (or `cfn=`) gives id 7 its name, later lines
    say `fn=(7)` only. A function appears only if it ran (as `fn=`) or was called (`cfn=`)."""
    names = []
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"c?fn=\(\d+\) (.+)$", line)
        if m:
            names.append(m.group(1))
    return names


def profile(binary: str, bin_dir: Path, workdir: Path) -> Path:
    """Run `binary`'s init under callgrind until its first `next`; the output file."""
    out = workdir / f"{binary}.callgrind"
    launcher = ["valgrind", "--tool=callgrind", "--demangle=no", f"--callgrind-out-file={out}"]

    def dumps() -> list[Path]:  # callgrind numbers them: <file>.1
        return list(workdir.glob(f"{out.name}.*"))

    def dump(pid: int) -> None:
        subprocess.run(["callgrind_control", "--dump", str(pid)], capture_output=True, check=True)
        size = 0
        for _ in range(100):  # written when the client next runs: wait until it stops growing
            time.sleep(0.2)
            now = sum(p.stat().st_size for p in dumps())
            if now and now == size:
                return
            size = now
        sys.exit(f"init-order: callgrind wrote no dump for {binary}")

    template_vars = bench_lambda.template_variables(bench_lambda.TEMPLATE)
    bench = bench_lambda.Bench(bin_dir, template_vars, 180.0, workdir, launcher=launcher, on_ready=dump)
    result = bench_lambda.Result(binary)
    try:
        bench.once(binary, result, record=True)
    finally:
        bench.close()
    if result.failure:
        sys.exit(f"init-order: {binary} under callgrind: {result.failure}")
    return dumps()[0]


def linker_script(binary: str, patterns: list[str], placed_kib: float, total_kib: float) -> str:
    lines = [
        f"/* The code {binary}'s init runs, linked ahead of the rest: see functions/link-init-first.rs.",
        f"   Written by scripts/init-order.py (do not edit): {len(patterns)} functions, {placed_kib:.0f} KiB of",
        f"   the {total_kib:.0f} KiB of code in the x86_64 build it profiled. */",
        "SECTIONS {",
        "  .text.init : {",
    ]
    # A function in .text.<symbol>, or .text.unlikely.<symbol> if LLVM took it to be cold.
    lines += [f"    *(.text.{p} .text.unlikely.{p})" for p in patterns]
    lines += ["  }", "} INSERT BEFORE .text;", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(bench_lambda.FUNCTIONS), help="these functions only")
    args = parser.parse_args()
    functions = args.only or list(bench_lambda.FUNCTIONS)

    if not shutil.which("valgrind"):
        print("init-order: installing valgrind (apt-get)", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-qq", "valgrind"], check=True)

    print(f"init-order: building {', '.join(functions)} (release, symbols kept, {TARGET_DIR})", file=sys.stderr)
    packages = [arg for f in functions for arg in ("-p", f)]
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET_DIR), CARGO_PROFILE_RELEASE_STRIP="false")
    subprocess.run(["cargo", "build", "--release", "--locked", *packages], cwd=REPO, env=env, check=True)
    bin_dir = TARGET_DIR / "release"

    with tempfile.TemporaryDirectory(prefix="init-order-") as tmp:
        for binary in functions:
            workdir = Path(tmp) / binary
            workdir.mkdir()
            print(f"init-order: {binary}: init under callgrind", file=sys.stderr)
            symbols = text_symbols(bin_dir / binary)
            ran = [name for name in callgrind_functions(profile(binary, bin_dir, workdir)) if name in symbols]
            ran = list(dict.fromkeys(ran))
            patterns = list(dict.fromkeys(pattern(name) for name in ran))
            placed = sum(symbols[name] for name in ran) / 1024
            total = sum(symbols.values()) / 1024
            directory = binary.removeprefix("hookwise-")
            out = REPO / "functions" / directory / "init-order.ld"
            out.write_text(linker_script(binary, patterns, placed, total))
            print(
                f"init-order: {binary}: {len(ran)} of {len(symbols)} functions ran in init, "
                f"{placed:.0f} of {total:.0f} KiB: {out.relative_to(REPO)}",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
