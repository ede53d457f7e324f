#!/usr/bin/env python3
"""Start-up of the four Lambda functions against a minimal lambda_runtime hello world.

Runs each function binary (hookwise-ingest, -deliver, -scheduler, -dead-letter) and the
baseline `lambda-hello` (tests/lambda-hello) against an emulated Lambda Runtime API on
127.0.0.1, with the environment a deployment gives it (template.yaml's variables with
plausible values, and what Lambda itself sets), and measures:

  start-up   the time from just before exec to the arrival of the process's first
             `GET /2018-06-01/runtime/invocation/next` (init done, ready for an event);
  peak RSS   VmHWM from /proc/<pid>/status when that request arrives;
  size       each binary's file size, and the arm64 `bootstrap`s cargo-lambda and
             `scripts/sam-build.sh` leave behind, if there are any;
  init KiB   the size of its `.text.init`: the code init runs, linked ahead of the rest
             (functions/link-init-first.rs).

The goal (the issue's): each function within 1.5x of the hello world's start-up and RSS.
Binaries run interleaved, round after round (hello, ingest, hello, deliver, ...), so machine
noise hits them all alike; one round first is a warm-up that is not counted (the page cache).

Nothing leaves 127.0.0.1: the children get a clean environment (HOME an empty temporary
directory, so no ~/.aws files), fixed test credentials, and AWS_ENDPOINT_URL on a local
port that accepts and drops connections; any connection made there during init is counted
and reported. This script builds nothing: scripts/bench-lambda.sh builds the release
binaries and runs it; `--bin-dir target/profiling` measures a quicker build.

Usage: scripts/bench-lambda.py [--bin-dir DIR] [--runs N] [--json FILE]
Python 3.11, standard library only. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "template.yaml"

HELLO = "lambda-hello"
# Each function binary and its template.yaml resource (for its own environment variables).
FUNCTIONS = {
    "hookwise-ingest": "IngestFunction",
    "hookwise-deliver": "DeliverFunction",
    "hookwise-scheduler": "SchedulerFunction",
    "hookwise-dead-letter": "DeadLetterFunction",
}
GOAL_RATIO = 1.5

ACCOUNT = "123456789012"
REGION = "us-east-1"
STACK = "hookwise"

# Plausible values of the variables template.yaml sets (each must parse as
# shared/aws/src/config.rs's FunctionConfig wants): what a stack named `hookwise` in
# us-east-1 with the template's default parameters would give the functions.
TEMPLATE_VALUES = {
    "HOOKWISE_TABLE": f"{STACK}-MainTable-1QW2E3R4T5Y6U",
    "HOOKWISE_SCHEDULER_TABLE": f"{STACK}-SchedulerTable-7I8O9P0A1S2D",
    "HOOKWISE_DELIVERY_QUEUE_URL": f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{STACK}-delivery",
    "HOOKWISE_DEAD_LETTER_QUEUE_URL": f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{STACK}-dead-letter",
    "HOOKWISE_SENDER_EMAIL": "hooks@example.com",
    "HOOKWISE_SECRETS_KEY": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    "HOOKWISE_DEFAULT_RETRY_POLICY": "standard",
    "HOOKWISE_ALLOWED_TARGET_CIDRS": "",
    "HOOKWISE_RETENTION_DAYS": "30",
    "HOOKWISE_DIGEST_WINDOW_SECONDS": "300",
    "HOOKWISE_PUBLIC_API_URL": f"https://a1b2c3d4e5.execute-api.{REGION}.amazonaws.com",
    "RUST_LOG": "info",
}

RUNTIME_API_PREFIX = "/2018-06-01/runtime"


# --- template.yaml ----------------------------------------------------------------------


# Globals' variable names, and each resource's own.
TemplateVars = tuple[list[str], dict[str, list[str]]]


def template_variables(path: Path) -> TemplateVars:
    """The names of the environment variables template.yaml sets: Globals' for every
    function, and each resource's own (Resources.<Name>.Properties.Environment.Variables).

    A line-based reading of the template's block mappings (standard library only): enough for
    `Key: value` lines; block scalars, flow collections and list items are skipped over."""
    globals_vars: list[str] = []
    own: dict[str, list[str]] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the mappings the line is in
    scalar_indent = None  # inside a block scalar (`>-`, `|`) deeper than this
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        if scalar_indent is not None:
            if indent > scalar_indent:
                continue
            scalar_indent = None
        m = re.match(r"^( *)([A-Za-z0-9_.\-]+):(?:\s+(.*))?$", raw)
        if not m:
            continue  # list items, flow continuations
        key, value = m.group(2), (m.group(3) or "").split(" #")[0].strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        keys = [k for _, k in stack]
        if keys == ["Globals", "Function", "Environment", "Variables"]:
            globals_vars.append(key)
        elif len(keys) == 5 and keys[0] == "Resources" and keys[2:] == ["Properties", "Environment", "Variables"]:
            own.setdefault(keys[1], []).append(key)
        if value in {">", ">-", ">+", "|", "|-", "|+"}:
            scalar_indent = indent
        elif not value:
            stack.append((indent, key))
    if not globals_vars:
        sys.exit(f"bench-lambda: found no Globals.Function.Environment.Variables in {path}")
    return globals_vars, own


def variable_names(binary: str, template_vars: TemplateVars) -> list[str]:
    """What template.yaml sets for `binary` (the hello world: the Globals, as if deployed there)."""
    globals_vars, own = template_vars
    return list(globals_vars) + own.get(FUNCTIONS.get(binary, ""), [])


def deployment_env(
    binary: str, template_vars: TemplateVars, port: int, sink_port: int, home: str, bin_dir: Path
) -> dict[str, str]:
    """The environment Lambda gives `binary`: template.yaml's variables, then Lambda's own."""
    names = variable_names(binary, template_vars)
    short = binary.removeprefix("hookwise-")
    # SAM names a function after its stack and resource, with a random suffix.
    resource = FUNCTIONS.get(binary, "LambdaHelloFunction")
    function_name = f"{STACK}-{resource}-AbCdEf123456"
    env = {n: TEMPLATE_VALUES[n] for n in names}
    env.update(
        {
            # Lambda's reserved variables (provided.al2023, the template's 256 MB, JSON logs at INFO).
            "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{port}",
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            # The execution role's temporary credentials (fake: nothing is called).
            "AWS_ACCESS_KEY_ID": "ASIAQEXAMPLEEXAMPLE7",
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "AWS_SESSION_TOKEN": "IQoJb3JpZ2luX2VjEXAMPLE//////////wEaCXVzLWVhc3QtMSJHMEUCIQEXAMPLE=",
            "AWS_LAMBDA_FUNCTION_NAME": function_name,
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256",
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{STACK}-{short}",
            "AWS_LAMBDA_LOG_STREAM_NAME": "2026/12/03/[$LATEST]0123456789abcdef0123456789abcdef",
            "AWS_LAMBDA_LOG_FORMAT": "JSON",
            "AWS_LAMBDA_LOG_LEVEL": "INFO",
            "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
            "AWS_EXECUTION_ENV": "AWS_Lambda_provided.al2023",
            "_HANDLER": "bootstrap",
            "LAMBDA_TASK_ROOT": str(bin_dir),
            "LAMBDA_RUNTIME_DIR": "/var/runtime",
            "TZ": ":UTC",
            "LANG": "en_US.UTF-8",
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            # Tracing: Active sets these; here they point at the local sink too.
            "AWS_XRAY_CONTEXT_MISSING": "LOG_ERROR",
            "AWS_XRAY_DAEMON_ADDRESS": f"127.0.0.1:{sink_port}",
            # Not Lambda's: keep every SDK call on 127.0.0.1 (a local port that drops
            # connections, counted), should a function call out during init.
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{sink_port}",
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://127.0.0.1:{sink_port}",
        }
    )
    return env


# --- the emulated Runtime API ----------------------------------------------------------


@dataclass
class Run:
    """One process's start-up, as the Runtime API sees it."""

    binary: str
    pid: int = 0
    started: float = 0.0  # perf_counter just before Popen
    first_next: float | None = None
    status: dict[str, int] = field(default_factory=dict)  # /proc/<pid>/status, kB
    cpu_ns: int | None = None  # the process's threads' time on CPU until the first `next`
    init_error: str | None = None
    sockets: list[str] = field(default_factory=list)  # at the first `next`, but the Runtime API's
    other: list[str] = field(default_factory=list)  # requests the emulator does not expect
    arrived: threading.Event = field(default_factory=threading.Event)  # first next or init/error
    released: threading.Event = field(default_factory=threading.Event)  # the held `next` may end


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS, ... in kB, and Threads."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.startswith("Vm") or key in {"RssAnon", "RssFile", "Threads"}:
                out[key] = int(value.split()[0])
    return out


def proc_cpu_ns(pid: int) -> int | None:
    """Every thread's time on CPU so far (schedstat, ns)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


def proc_sockets(pid: int, exclude_port: int) -> list[str]:
    """The process's TCP and UDP sockets (its fds' inodes in /proc/<pid>/net/*), but those
    to `exclude_port` on 127.0.0.1: any connection made during init that is still open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = open(f"/proc/{pid}/net/{proto}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[9] not in inodes:
                continue
            local, remote = hex_address(f[1]), hex_address(f[2])
            if remote == f"127.0.0.1:{exclude_port}":
                continue
            found.append(f"{proto} listening on {local}" if remote.endswith(":0") else f"{proto} to {remote}")
    return found


def hex_address(text: str) -> str:
    """/proc/net/tcp's `0100007F:1F90` as `127.0.0.1:8080` (IPv6 too)."""
    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    # Each 32-bit word in host (little-endian) order.
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    ip = socket.inet_ntop(family, raw)
    if ip.startswith("::ffff:") and "." in ip:
        ip = ip.removeprefix("::ffff:")
    return f"{ip}:{int(port, 16)}"


class RuntimeApi(ThreadingHTTPServer):
    """The Runtime API of one process at a time (`current`)."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), RuntimeApiHandler)
        self.lock = threading.Lock()
        self.current: Run | None = None


class RuntimeApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RuntimeApi

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass

    def run(self) -> Run | None:
        with self.server.lock:
            return self.server.current

    def body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def answer(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        now = time.perf_counter()
        run = self.run()
        if self.path != f"{RUNTIME_API_PREFIX}/invocation/next" or run is None:
            if run is not None:
                run.other.append(f"GET {self.path}")
            self.answer(404, {"errorMessage": f"unexpected GET {self.path}", "errorType": "NotFound"})
            return
        if run.first_next is None:
            run.first_next = now
            try:
                run.status = proc_status(run.pid)
                run.cpu_ns = proc_cpu_ns(run.pid)
                run.sockets = proc_sockets(run.pid, exclude_port=self.server.server_address[1])
            except OSError:
                pass
            run.arrived.set()
        # Hold the request: no event comes; the bench kills the process, then lets it go.
        run.released.wait(timeout=120)
        self.close_connection = True

    def do_POST(self):
        body = self.body().decode("utf-8", "replace")
        run = self.run()
        if self.path == f"{RUNTIME_API_PREFIX}/init/error":
            if run is not None:
                run.init_error = body or "(empty body)"
                run.arrived.set()
            self.answer(202, {"status": "OK"})
        elif re.fullmatch(rf"{RUNTIME_API_PREFIX}/invocation/[^/]+/(response|error)", self.path):
            if run is not None:
                run.other.append(f"POST {self.path}: {body[:200]}")
            self.answer(202, {"status": "OK"})
        else:
            if run is not None:
                run.other.append(f"POST {self.path}")
            self.answer(404, {"errorMessage": f"unexpected POST {self.path}", "errorType": "NotFound"})


class Sink:
    """A 127.0.0.1 port that accepts connections, counts them and closes them: where
    AWS_ENDPOINT_URL points, so an SDK call during init fails at once and shows up."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.serve, name="sink", daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            with self.lock:
                self.count += 1
            conn.close()

    def take(self) -> int:
        with self.lock:
            n, self.count = self.count, 0
            return n

    def close(self):
        self.stopping.set()
        self.thread.join(timeout=2)
        self.sock.close()


# --- the benchmark ---------------------------------------------------------------------


@dataclass
class Result:
    binary: str
    startup_ms: list[float] = field(default_factory=list)
    hwm_kib: list[int] = field(default_factory=list)
    rss_kib: list[int] = field(default_factory=list)
    anon_kib: list[int] = field(default_factory=list)  # of it, heap, stacks, relocated data
    file_kib: list[int] = field(default_factory=list)  # of it, the binary's and libraries' pages
    cpu_ms: list[float] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    connections: int = 0
    sockets: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    failure: str | None = None


class Bench:
    def __init__(
        self,
        bin_dir: Path,
        template_vars: TemplateVars,
        timeout: float,
        workdir: Path,
        launcher: list[str] | None = None,
        on_ready=None,
    ):
        """`launcher` goes before each binary's path (scripts/init-order.py: valgrind); `on_ready`
        is called with the process's pid at its first `next`, before it is killed."""
        self.bin_dir = bin_dir
        self.launcher = launcher or []
        self.on_ready = on_ready
        self.template_vars = template_vars
        self.timeout = timeout
        self.workdir = workdir
        self.home = workdir / "home"
        self.home.mkdir()
        self.children: set[subprocess.Popen] = set()
        self.api = RuntimeApi()
        self.api_thread = threading.Thread(target=self.api.serve_forever, name="runtime-api", daemon=True)
        self.api_thread.start()
        self.sink = Sink()

    def close(self):
        for proc in list(self.children):
            kill(proc)
        self.children.clear()
        with self.api.lock:
            run, self.api.current = self.api.current, None
        if run is not None:
            run.released.set()
        self.api.shutdown()
        self.api.server_close()
        self.api_thread.join(timeout=5)
        self.sink.close()

    def once(self, binary: str, result: Result, record: bool) -> None:
        """One start-up of `binary` until its first `next` (or its failure)."""
        path = self.bin_dir / binary
        env = deployment_env(
            binary, self.template_vars, self.api.server_address[1], self.sink.port, str(self.home), self.bin_dir
        )
        run = Run(binary)
        out_path, err_path = self.workdir / f"{binary}.stdout", self.workdir / f"{binary}.stderr"
        self.sink.take()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            with self.api.lock:
                self.api.current = run
            proc, exited, arrived = None, None, False
            try:
                run.started = time.perf_counter()
                proc = subprocess.Popen(
                    [*self.launcher, str(path)],
                    env=env,
                    cwd=self.bin_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
                self.children.add(proc)
                run.pid = proc.pid
                deadline = run.started + self.timeout
                while not run.arrived.wait(0.02):
                    exited = proc.poll()
                    if exited is not None or time.perf_counter() > deadline:
                        break
                # A last look: the request may have come as the process exited.
                arrived = run.arrived.is_set()
                if arrived and run.init_error is None and self.on_ready is not None:
                    self.on_ready(proc.pid)
                if run.init_error is not None and exited is None:
                    # It exits after init/error (printing why): let it, so its output is whole.
                    try:
                        exited = proc.wait(timeout=2)
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                if proc is not None:
                    kill(proc)
                    self.children.discard(proc)
                with self.api.lock:
                    self.api.current = None
                run.released.set()
        connections = self.sink.take()
        if record:
            result.connections += connections
        result.unexpected.extend(u for u in run.other if u not in result.unexpected)
        result.sockets.extend(x for x in run.sockets if x not in result.sockets)
        why = None
        if run.init_error is not None:
            why = f"posted init/error: {run.init_error}"
        elif not arrived or run.first_next is None:
            if exited is not None:
                why = f"exited with status {exited} before its first `next`"
            else:
                why = f"no `next` request within {self.timeout:g} s"
        if why:
            result.failure = why + "\n" + output_tail(out_path, err_path)
            return
        if record:
            result.startup_ms.append((run.first_next - run.started) * 1e3)
            if "VmHWM" in run.status:
                result.hwm_kib.append(run.status["VmHWM"])
                result.rss_kib.append(run.status["VmRSS"])
                result.anon_kib.append(run.status.get("RssAnon", 0))
                result.file_kib.append(run.status.get("RssFile", 0))
                result.threads.append(run.status.get("Threads", 0))
            if run.cpu_ns is not None:
                result.cpu_ms.append(run.cpu_ns / 1e6)


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def output_tail(out_path: Path, err_path: Path, limit: int = 4000) -> str:
    parts = []
    for name, p in (("stderr", err_path), ("stdout", out_path)):
        text = p.read_text(errors="replace").strip()
        if len(text) > limit:
            text = "...\n" + text[-limit:]
        parts.append(f"  --- its {name} ---\n" + (indented(text) if text else "  (empty)"))
    return "\n".join(parts)


def indented(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def schedule(binaries: list[str]) -> list[str]:
    """One round: the hello world before each function."""
    order = []
    for b in binaries:
        order += [HELLO, b]
    return order


def median(xs):
    return statistics.median(xs) if xs else None


def arm64_bootstraps(binary: str) -> dict[str, int]:
    """The sizes of the arm64 bootstraps of `binary` that cargo-lambda (target/lambda/) and
    `sam build` (.aws-sam/build/<Resource>/, scripts/sam-build.sh) left, if any."""
    found = {}
    candidates = [REPO / "target" / "lambda" / binary / "bootstrap"]
    if binary in FUNCTIONS:
        candidates.append(REPO / ".aws-sam" / "build" / FUNCTIONS[binary] / "bootstrap")
    for p in candidates:
        if p.is_file():
            found[str(p.relative_to(REPO))] = p.stat().st_size
    return found


def init_section_kib(path: Path) -> float | None:
    """The size of `.text.init` in an ELF binary (any architecture; readelf, from binutils):
    the code the function's init runs, linked ahead of the rest (functions/link-init-first.rs)."""
    out = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.replace("[ ", "[").split()  # [Nr] Name Type Address Off Size ...
        if len(fields) > 5 and fields[1] == ".text.init":
            return int(fields[5], 16) / 1024
    return None


def fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", type=Path, default=REPO / "target" / "release", help="where the binaries are")
    parser.add_argument("--runs", type=int, default=15, help="rounds, each starting every binary (default 15)")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted rounds first (default 1)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a start-up may take (default 10)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file as JSON")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not sys.platform.startswith("linux"):
        sys.exit("bench-lambda: Linux only (it reads /proc/<pid>/status)")

    bin_dir = args.bin_dir.resolve()
    binaries = [HELLO, *FUNCTIONS]
    missing = [b for b in binaries if not (bin_dir / b).is_file()]
    if missing:
        sys.exit(
            f"bench-lambda: {', '.join(missing)} not in {bin_dir}: build them first, e.g.\n"
            "  cargo build --release --locked -p hookwise-ingest -p hookwise-deliver "
            "-p hookwise-scheduler -p hookwise-dead-letter -p lambda-hello\n"
            "(scripts/bench-lambda.sh does, then runs this)"
        )
    template_vars = template_variables(TEMPLATE)
    for b in binaries:
        unknown = [n for n in variable_names(b, template_vars) if n not in TEMPLATE_VALUES]
        if unknown:
            sys.exit(
                f"bench-lambda: template.yaml sets {', '.join(unknown)} for {b}; "
                "give each a plausible value in TEMPLATE_VALUES in scripts/bench-lambda.py"
            )

    # SIGTERM as an exception too, so the finally below kills the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = {b: Result(b) for b in binaries}
    with tempfile.TemporaryDirectory(prefix="bench-lambda-") as tmp:
        bench = Bench(bin_dir, template_vars, args.timeout, Path(tmp))
        try:
            print(
                f"bench-lambda: {bin_dir}, {args.warmup} warm-up + {args.runs} rounds "
                f"(Runtime API on 127.0.0.1:{bench.api.server_address[1]}, "
                f"AWS_ENDPOINT_URL sink on 127.0.0.1:{bench.sink.port})",
                file=sys.stderr,
            )
            for round_no in range(args.warmup + args.runs):
                record = round_no >= args.warmup
                live = [b for b in FUNCTIONS if results[b].failure is None]
                for binary in schedule(live) if live else [HELLO]:
                    if results[binary].failure is None:
                        bench.once(binary, results[binary], record)
                if results[HELLO].failure is not None:
                    break
        finally:
            bench.close()

    return report(args, bin_dir, results)


def report(args, bin_dir: Path, results: dict[str, Result]) -> int:
    hello = results[HELLO]
    base_ms, base_hwm = median(hello.startup_ms), median(hello.hwm_kib)
    rows = []
    for b, r in results.items():
        size = (bin_dir / b).stat().st_size
        ms, hwm = median(r.startup_ms), median(r.hwm_kib)
        rows.append(
            {
                "name": b,
                "baseline": b == HELLO,
                "failed": r.failure,
                "startup_samples": len(r.startup_ms),
                "startup_ms_median": ms,
                "startup_ms_min": min(r.startup_ms) if r.startup_ms else None,
                "startup_ms_max": max(r.startup_ms) if r.startup_ms else None,
                "startup_ratio": ms / base_ms if ms and base_ms else None,
                "peak_rss_mib_median": hwm / 1024 if hwm else None,
                "rss_at_next_mib_median": median(r.rss_kib) / 1024 if r.rss_kib else None,
                "peak_rss_ratio": hwm / base_hwm if hwm and base_hwm else None,
                "rss_anon_mib_median": median(r.anon_kib) / 1024 if r.anon_kib else None,
                "rss_file_mib_median": median(r.file_kib) / 1024 if r.file_kib else None,
                "cpu_ms_median": median(r.cpu_ms),
                "threads": median(r.threads),
                "size_bytes": size,
                "size_mib": size / 2**20,
                "size_ratio": size / (bin_dir / HELLO).stat().st_size,
                "init_section_kib": init_section_kib(bin_dir / b),
                "arm64_bootstrap_bytes": arm64_bootstraps(b),
                "init_connections": r.connections,
                "sockets_at_first_next": r.sockets,
                "unexpected_requests": r.unexpected,
                "startup_ms": [round(x, 3) for x in r.startup_ms],
                "peak_rss_kib": r.hwm_kib,
            }
        )

    header = (
        f"{'binary':<22}{'start-up ms':>12}{'min ms':>9}{'x hello':>9}"
        f"{'peak RSS MiB':>14}{'x hello':>9}{'size MiB':>10}{'init KiB':>10}{'CPU ms':>9}{'init conns':>12}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        if row["failed"]:
            print(f"{row['name']:<22}{'FAILED':>12}")
            continue
        print(
            f"{row['name']:<22}{fmt(row['startup_ms_median'], '.2f'):>12}{fmt(row['startup_ms_min'], '.2f'):>9}"
            f"{fmt(row['startup_ratio'], '.2f'):>9}{fmt(row['peak_rss_mib_median'], '.1f'):>14}"
            f"{fmt(row['peak_rss_ratio'], '.2f'):>9}{row['size_mib']:>10.1f}{fmt(row['init_section_kib'], '.0f'):>10}"
            f"{fmt(row['cpu_ms_median'], '.1f'):>9}{row['init_connections']:>12}"
        )
    print(
        f"({args.runs} rounds after {args.warmup} warm-up, {len(hello.startup_ms)} hello-world start-ups; medians; "
        f"peak RSS: VmHWM at the first `next`; CPU ms: all threads' time on CPU by then; "
        f"{os.cpu_count()} CPUs; sizes: the files in {bin_dir}; init KiB: the code init runs, linked first)"
    )

    functions = [row for row in rows if not row["baseline"]]
    goals = {}
    for key, label in (("startup_ratio", "start-up"), ("peak_rss_ratio", "RSS")):
        over = [f"{r['name']} {r[key]:.2f}x" for r in functions if r[key] is not None and r[key] > GOAL_RATIO]
        unknown = [r["name"] for r in functions if r[key] is None]
        ok = not over and not unknown and not hello.failure
        goals[f"{key.removesuffix('_ratio')}_within_{GOAL_RATIO}x"] = ok
        detail = "; ".join(x for x in (", ".join(over), ", ".join(f"{u} not measured" for u in unknown)) if x)
        print(f"{label} within {GOAL_RATIO}x of {HELLO}: {'yes' if ok else 'no'}" + (f" ({detail})" if detail else ""))

    bootstraps = [(row["name"], p, n) for row in rows for p, n in row["arm64_bootstrap_bytes"].items()]
    if bootstraps:
        print("arm64 bootstraps:")
        for name, p, n in bootstraps:
            print(f"  {name:<22}{n / 2**20:>8.1f} MiB  {p}")
    else:
        print("arm64 bootstraps: none (scripts/sam-build.sh builds them: target/lambda/<binary>/bootstrap)")

    callers = [f"{r['name']} ({r['init_connections']})" for r in rows if r["init_connections"]]
    if callers:
        print(f"network: connections to AWS_ENDPOINT_URL during init: {', '.join(callers)}")
    else:
        print("network: no function connected to AWS_ENDPOINT_URL during init")
    for row in rows:
        if row["sockets_at_first_next"]:
            print(f"network: {row['name']} had sockets open at its first `next`: {row['sockets_at_first_next']}")
        if row["unexpected_requests"]:
            print(f"note: {row['name']} made requests the emulator does not serve: {row['unexpected_requests']}")
    failed = [row for row in rows if row["failed"]]
    for row in failed:
        print(f"FAILED: {row['name']} {row['failed']}", file=sys.stderr)

    if args.json:
        doc = {
            "benchmark": "lambda-startup",
            "unit": {"startup": "ms", "peak_rss": "MiB", "size": "bytes"},
            "bin_dir": str(bin_dir),
            "runs": args.runs,
            "warmup": args.warmup,
            "baseline": HELLO,
            "goal_ratio": GOAL_RATIO,
            "goals": goals,
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "machine": platform.machine()},
            "binaries": rows,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"bench-lambda: wrote {args.json}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
