#!/usr/bin/env python3
"""Cold start of the four Lambda functions, first invocation included, against two baselines.

Runs each function binary (hookwise-ingest, -deliver, -scheduler, -dead-letter) and two
baselines built the same way, `lambda-hello` (tests/lambda-hello: the bare lambda_runtime
hello world) and `lambda-getitem` (tests/lambda-getitem: lambda_runtime and the trimmed
aws-sdk-dynamodb making one GetItem, the floor for a function that talks to DynamoDB),
against an emulated Lambda Runtime API on 127.0.0.1, with a deployment's environment
(template.yaml's variables, what Lambda itself sets), the tables on DynamoDB Local and the
queues, SES v2 and KMS on moto. Each process gets one real first event, from the stage the
Rust helper tests/examples/bench_lambda_seed.rs provisions and seeds (the tests' own code):

  hookwise-ingest       an HTTP API request `POST /v1/events` with a tenant's API key;
  hookwise-deliver      an SQS batch of one: a pending delivery's first attempt, which it
                        signs and POSTs to a receiver this script runs on 127.0.0.1, and stores;
  hookwise-scheduler    the EventBridge tick (infra/events/scheduler-scheduled.json);
  hookwise-dead-letter  an SQS batch of one: a dead delivery's task (its owner is emailed);
  lambda-getitem        the key of a delivery's item; lambda-hello  a small JSON it echoes.

Each answer is checked (a 2xx API response naming one delivery, no batchItemFailures, the
receiver's POST with the event's webhook-id, the item found, ...), and after the run the
deliveries' items (delivered) and moto's emails (one per dead letter): a failed invocation
fails the binary. Measured, per process:

  wall        from just before exec (Python's spawn included, the same on every side) until
              the Runtime API receives the first invocation's response;
  CPU         user + system time of the whole process (every thread, exited ones too) until
              then: os.wait4's rusage once the process is killed. It is killed while it waits
              for the answer to its response POST, which the emulator holds, so nothing after
              the response is counted. The sum is the scheduler's exact runtime; its split
              into user and sys is the kernel's estimate from tick samples, rough at a few ms;
  peak RSS    VmHWM (/proc/<pid>/status) when the response arrives: the high-water mark of
              the exec'd image over init and the whole invocation (not ru_maxrss, which can
              carry the forking Python's own);
  init        the older figures: exec until the first `GET .../invocation/next`, the VmHWM
              and CPU (schedstat) then, the sockets open then (none should be, but the
              Runtime API's), the binaries' sizes and the size of `.text.init`.

Goal (issue 34): each function's CPU for the whole first invocation within 1.3x of
lambda-getitem's. Ratios against both baselines are printed for CPU, wall and RSS; the older
goal (init within 1.5x of the hello world's start-up and RSS) is printed too.

Binaries run interleaved, round after round (hello, getitem, ingest, hello, getitem, deliver,
...), so machine noise hits them all alike; the warm-up round is not counted. Then the
page-cache-cold rounds: before each start, `echo 3 > /proc/sys/vm/drop_caches` (the whole
page cache: the binary, the shared libraries not mapped by a running process, the CA
certificates...), or where that is not allowed posix_fadvise(DONTNEED) on the binary only
(its shared libraries stay cached). On a VM the host may still cache the disk.

`--init-only` runs the older benchmark: no emulators, no event, each process measured until
its first `next` (AWS_ENDPOINT_URL then points at a local port that counts connections and
drops them; scripts/init-order.py uses this mode's Bench).

This script builds nothing: scripts/bench-lambda.sh builds the release binaries and the
stage helper, starts moto and DynamoDB Local (scripts/aws-test-services.sh) and runs it;
`--bin-dir target/profiling` measures a quicker build.

Usage: scripts/bench-lambda.py [--bin-dir DIR] [--runs N] [--cold-runs N] [--json FILE]
                               [--seeder PATH] [--init-only]
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
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "template.yaml"
SEEDER = REPO / "target" / "debug" / "examples" / "bench_lambda_seed"

HELLO = "lambda-hello"
GETITEM = "lambda-getitem"
BASELINES = [HELLO, GETITEM]
# Each function binary and its template.yaml resource (for its own environment variables).
FUNCTIONS = {
    "hookwise-ingest": "IngestFunction",
    "hookwise-deliver": "DeliverFunction",
    "hookwise-scheduler": "SchedulerFunction",
    "hookwise-dead-letter": "DeadLetterFunction",
}
# The older goal: init (exec to the first `next`) within 1.5x of the hello world's, and RSS.
GOAL_RATIO = 1.5
# Issue 34's: the whole first invocation's CPU within 1.3x of the GetItem function's.
INVOCATION_GOAL_RATIO = 1.3
# The invocation's deadline (Lambda-Runtime-Deadline-Ms): template.yaml's longest timeout.
DEADLINE_SECONDS = 60
HELLO_EVENT = {"hello": "world"}

ACCOUNT = "123456789012"
REGION = "us-east-1"
STACK = "hookwise"

# Plausible values of the variables template.yaml sets (each must parse as
# shared/aws/src/config.rs's FunctionConfig wants): what a stack named `hookwise` in
# us-east-1 with the template's default parameters would give the functions. On a stage,
# the seeder's values (the emulators' tables, queues and key) replace them.
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
    "HOOKWISE_SERVICE": STACK,
    # The Ingest function's own (the portal's branding and the secrets' reveal): the
    # template's parameters' defaults.
    "HOOKWISE_PORTAL_FRAME_ANCESTORS": "",
    "HOOKWISE_PORTAL_NAME": "",
    "HOOKWISE_PORTAL_ACCENT": "",
    "HOOKWISE_PORTAL_LOGO": "",
    "HOOKWISE_REVEAL_SECRETS": "false",
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
    """What template.yaml sets for `binary` (a baseline: the Globals, as if deployed there)."""
    globals_vars, own = template_vars
    return list(globals_vars) + own.get(FUNCTIONS.get(binary, ""), [])


def deployment_env(
    binary: str,
    template_vars: TemplateVars,
    port: int,
    sink_port: int,
    home: str,
    bin_dir: Path,
    stage_env: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment Lambda gives `binary`: template.yaml's variables, then Lambda's own.

    Without a stage, every AWS endpoint is the local sink (nothing is called during init);
    with one, `stage_env` (the seeder's: the emulators' resources, endpoints and test
    credentials) goes over it."""
    names = variable_names(binary, template_vars)
    short = binary.removeprefix("hookwise-")
    # SAM names a function after its stack and resource, with a random suffix.
    resource = FUNCTIONS.get(binary, "LambdaBaselineFunction")
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
    if stage_env is not None:
        # The emulators take the stage's test credentials: no session token.
        env.pop("AWS_SESSION_TOKEN")
        env.update(stage_env)
    return env


# --- the emulated Runtime API ----------------------------------------------------------


@dataclass
class Run:
    """One process's start-up (and first invocation, given an event), as the Runtime API sees it."""

    binary: str
    event: dict | None = None  # the first invocation's; None: measured until the first `next`
    pid: int = 0
    started: float = 0.0  # perf_counter just before Popen
    spawned: float = 0.0  # perf_counter when Popen returned (the child has exec'd)
    first_next: float | None = None
    status: dict[str, int] = field(default_factory=dict)  # /proc/<pid>/status at the first `next`, kB
    cpu_ns: int | None = None  # the process's threads' time on CPU until the first `next`
    responded: float | None = None  # perf_counter when the invocation's response (or error) arrived
    response: str | None = None
    response_error: bool = False  # posted to .../error, not .../response
    status_at_response: dict[str, int] = field(default_factory=dict)
    cpu_ns_at_response: int | None = None  # schedstat, live threads only (rusage is the headline)
    init_error: str | None = None
    sockets: list[str] = field(default_factory=list)  # at the first `next`, but the Runtime API's
    other: list[str] = field(default_factory=list)  # requests the emulator does not expect
    arrived: threading.Event = field(default_factory=threading.Event)  # measured point reached, or init/error
    released: threading.Event = field(default_factory=threading.Event)  # held requests may end


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
    # Headers and body are two writes: with Nagle's algorithm the body would wait for the
    # client's delayed ACK of the headers (tens of ms of nothing in the wall time).
    disable_nagle_algorithm = True
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

    def answer(self, code: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the process was killed meanwhile

    def hold(self, run: Run) -> None:
        """Keep the process waiting for this request's answer until the bench has killed it."""
        run.released.wait(timeout=120)
        self.close_connection = True

    def do_GET(self):
        now = time.perf_counter()
        run = self.run()
        if self.path != f"{RUNTIME_API_PREFIX}/invocation/next" or run is None:
            if run is not None:
                run.other.append(f"GET {self.path}")
            self.answer(404, {"errorMessage": f"unexpected GET {self.path}", "errorType": "NotFound"})
            return
        if run.first_next is not None or run.event is None:
            if run.first_next is None:
                run.first_next = now
                self.measure_first_next(run)
                run.arrived.set()
            # Init only (the bench kills the process at its first `next`), or a second
            # `next`: no event comes.
            self.hold(run)
            return
        run.first_next = now
        self.measure_first_next(run)
        deadline_ms = int((time.time() + DEADLINE_SECONDS) * 1000)
        request_id = f"bench-{run.pid}"
        self.answer(
            200,
            run.event,
            {
                "Lambda-Runtime-Aws-Request-Id": request_id,
                "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
                "Lambda-Runtime-Invoked-Function-Arn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{run.binary}",
                "Lambda-Runtime-Trace-Id": "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0",
            },
        )

    def measure_first_next(self, run: Run) -> None:
        try:
            run.status = proc_status(run.pid)
            run.cpu_ns = proc_cpu_ns(run.pid)
            run.sockets = proc_sockets(run.pid, exclude_port=self.server.server_address[1])
        except OSError:
            pass

    def do_POST(self):
        now = time.perf_counter()
        body = self.body().decode("utf-8", "replace")
        run = self.run()
        if self.path == f"{RUNTIME_API_PREFIX}/init/error":
            if run is not None:
                run.init_error = body or "(empty body)"
                run.arrived.set()
            self.answer(202, {"status": "OK"})
        elif m := re.fullmatch(rf"{RUNTIME_API_PREFIX}/invocation/[^/]+/(response|error)", self.path):
            if run is None or run.event is None or run.responded is not None:
                if run is not None:
                    run.other.append(f"POST {self.path}: {body[:200]}")
                self.answer(202, {"status": "OK"})
                return
            run.responded, run.response, run.response_error = now, body, m.group(1) == "error"
            try:
                # The process waits for this request's answer (no CPU): its peak RSS is whole.
                run.status_at_response = proc_status(run.pid)
                run.cpu_ns_at_response = proc_cpu_ns(run.pid)
            except OSError:
                pass
            run.arrived.set()
            self.hold(run)
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


# --- the stage: a receiver, the seeded emulators, the checks -----------------------------


class Receiver(ThreadingHTTPServer):
    """The webhooks' endpoint on 127.0.0.1: `/ok` answers 200 (the Deliver events' POSTs,
    recorded by webhook-id), `/fail` 500 (the seeder's attempts that kill its dead letters)."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        self.lock = threading.Lock()
        self.ok_ids: list[str] = []
        self.failed = 0
        self.thread = threading.Thread(target=self.serve_forever, name="receiver", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def got(self, webhook_id: str) -> bool:
        with self.lock:
            return webhook_id in self.ok_ids

    def close(self):
        self.shutdown()
        self.server_close()


class ReceiverHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: Receiver

    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ok = self.path == "/ok"
        with self.server.lock:
            if ok:
                self.server.ok_ids.append(self.headers.get("webhook-id", ""))
            else:
                self.server.failed += 1
        self.send_response(200 if ok else 500)
        self.send_header("Content-Length", "0")
        self.end_headers()


@dataclass
class Stage:
    """What the seeder made: the functions' environment, and each round's event per binary
    (with what to check after it)."""

    env: dict[str, str]
    rounds: list[dict]
    moto_url: str
    dynamodb_url: str
    receiver: Receiver

    def event(self, round_no: int, binary: str) -> dict:
        return HELLO_EVENT if binary == HELLO else self.rounds[round_no][binary]["event"]


def seed(seeder: Path, rounds: int, receiver: Receiver) -> Stage:
    """Run the seeder (tests/examples/bench_lambda_seed.rs) for `rounds` rounds of events."""
    for var in ("HOOKWISE_TEST_MOTO_URL", "HOOKWISE_TEST_DYNAMODB_LOCAL_URL"):
        if not os.environ.get(var):
            sys.exit(
                f"bench-lambda: {var} is not set: run under scripts/aws-test-services.sh run -- ... "
                "(scripts/bench-lambda.sh does), or pass --init-only"
            )
    if not seeder.is_file():
        sys.exit(
            f"bench-lambda: no {seeder}: build it first, "
            "`cargo build --locked -p hookwise-tests --example bench_lambda_seed`"
        )
    out = subprocess.run(
        [str(seeder), "--rounds", str(rounds), "--receiver", receiver.url],
        cwd=REPO,
        stdout=subprocess.PIPE,
        check=True,
    ).stdout
    doc = json.loads(out)
    return Stage(doc["env"], doc["rounds"], doc["moto_url"], doc["dynamodb_url"], receiver)


def check_response(binary: str, run: Run, expect: dict, stage: Stage) -> str | None:
    """Why the invocation did not succeed, if it did not."""
    if run.response_error:
        return f"posted an invocation error: {run.response}"
    try:
        out = json.loads(run.response or "")
    except ValueError:
        return f"answered no JSON: {run.response!r:.300}"
    if binary == HELLO:
        ok = out == HELLO_EVENT
    elif binary == GETITEM:
        ok = out == {"found": True}
    elif binary == "hookwise-ingest":
        try:
            body = json.loads(out.get("body") or "")
        except ValueError:
            body = {}
        ok = out.get("statusCode") in range(200, 300) and len(body.get("deliveries") or []) == 1
    elif binary in ("hookwise-deliver", "hookwise-dead-letter"):
        ok = isinstance(out, dict) and not out.get("batchItemFailures")
        if ok and binary == "hookwise-deliver" and not stage.receiver.got(expect["webhook_id"]):
            return f"answered {out} but the receiver got no POST with webhook-id {expect['webhook_id']}"
    else:  # the scheduler: its tick's report
        ok = isinstance(out, dict)
    return None if ok else f"answered {run.response!r:.500}"


def dynamodb_get_item(url: str, table: str, pk: str, sk: str) -> dict | None:
    """GetItem on DynamoDB Local (which checks no signature), standard library only."""
    request = urllib.request.Request(
        url,
        data=json.dumps({"TableName": table, "Key": {"pk": {"S": pk}, "sk": {"S": sk}}}).encode(),
        headers={
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "DynamoDB_20120810.GetItem",
            "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/dynamodb/aws4_request, "
            "SignedHeaders=host;x-amz-target, Signature=00",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read()).get("Item")


def check_stage(stage: Stage, invoked: dict[str, list[int]]) -> dict[str, str]:
    """After the run, what the invocations were to leave behind: each delivery the Deliver
    function was given stored as delivered, each dead letter's owner emailed (moto's SES v2).
    Why, by binary, where it is not so."""
    why = {}
    table = stage.env["HOOKWISE_TABLE"]
    for r in invoked.get("hookwise-deliver", []):
        delivery = stage.rounds[r]["hookwise-deliver"]["delivery_id"]
        item = dynamodb_get_item(stage.dynamodb_url, table, f"DLV#{delivery}", "#DELIVERY") or {}
        status = item.get("status", {}).get("S")
        if status != "delivered":
            why["hookwise-deliver"] = f"delivery {delivery} (round {r}) is {status!r} in the table, not delivered"
            break
    owners = [stage.rounds[r]["hookwise-dead-letter"]["owner"] for r in invoked.get("hookwise-dead-letter", [])]
    if owners:
        with urllib.request.urlopen(f"{stage.moto_url}/moto-api/data.json", timeout=30) as resp:
            data = resp.read().decode("utf-8", "replace")
        missing = [o for o in owners if o not in data]
        if missing:
            why["hookwise-dead-letter"] = f"no email to {len(missing)} of {len(owners)} owners in moto, e.g. {missing[0]}"
    return why


# --- the benchmark ---------------------------------------------------------------------


@dataclass
class Samples:
    """Whole first invocations (exec to the response) of one binary, warm or page-cache-cold."""

    wall_ms: list[float] = field(default_factory=list)
    user_ms: list[float] = field(default_factory=list)
    sys_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # user + sys (rusage)
    schedstat_ms: list[float] = field(default_factory=list)  # live threads' time on CPU (a cross-check)
    hwm_kib: list[int] = field(default_factory=list)
    anon_kib: list[int] = field(default_factory=list)
    file_kib: list[int] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    init_ms: list[float] = field(default_factory=list)  # exec to the first `next`
    spawn_ms: list[float] = field(default_factory=list)  # just before Popen to its return (exec'd)


@dataclass
class Result:
    binary: str
    # Init: exec to the first `next` (warm rounds).
    startup_ms: list[float] = field(default_factory=list)
    hwm_kib: list[int] = field(default_factory=list)
    rss_kib: list[int] = field(default_factory=list)
    anon_kib: list[int] = field(default_factory=list)  # of it, heap, stacks, relocated data
    file_kib: list[int] = field(default_factory=list)  # of it, the binary's and libraries' pages
    cpu_ms: list[float] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    # The whole first invocation.
    warm: Samples = field(default_factory=Samples)
    cold: Samples = field(default_factory=Samples)
    invoked_rounds: list[int] = field(default_factory=list)  # stage rounds whose event it took (counted)
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
        stage: Stage | None = None,
    ):
        """`launcher` goes before each binary's path (scripts/init-order.py: valgrind); `on_ready`
        is called with the process's pid at its first `next` (init only), before it is killed.
        With a `stage`, the environment points at its emulators, and `once` may be given an event."""
        self.bin_dir = bin_dir
        self.launcher = launcher or []
        self.on_ready = on_ready
        self.template_vars = template_vars
        self.timeout = timeout
        self.workdir = workdir
        self.stage = stage
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

    def once(
        self,
        binary: str,
        result: Result,
        record: bool,
        event: dict | None = None,
        check=None,
        cold: str | None = None,
    ) -> None:
        """One start of `binary`: until its first `next` without an `event`; with one, until
        its response to that event, which `check(run)` judges (a reason it failed, or None).
        `cold`: how to empty the page cache first (`drop_caches` or `fadvise`), and the
        figures go to `result.cold`."""
        path = self.bin_dir / binary
        env = deployment_env(
            binary,
            self.template_vars,
            self.api.server_address[1],
            self.sink.port,
            str(self.home),
            self.bin_dir,
            self.stage.env if self.stage else None,
        )
        run = Run(binary, event=event)
        out_path, err_path = self.workdir / f"{binary}.stdout", self.workdir / f"{binary}.stderr"
        self.sink.take()
        if cold:
            evict(cold, path)
        usage = None
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
                run.spawned = time.perf_counter()
                self.children.add(proc)
                run.pid = proc.pid
                deadline = run.started + self.timeout
                while not run.arrived.wait(0.02):
                    exited = proc.poll()
                    if exited is not None or time.perf_counter() > deadline:
                        break
                # A last look: the request may have come as the process exited.
                arrived = run.arrived.is_set()
                if arrived and run.init_error is None and event is None and self.on_ready is not None:
                    self.on_ready(proc.pid)
                if run.init_error is not None and exited is None:
                    # It exits after init/error (printing why): let it, so its output is whole.
                    try:
                        exited = proc.wait(timeout=2)
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                if proc is not None:
                    usage = kill(proc)
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
        elif not arrived or run.first_next is None or (event is not None and run.responded is None):
            awaited = "its first `next`" if event is None else "its first response"
            if exited is not None:
                why = f"exited with status {exited} before {awaited}"
            else:
                why = f"no {awaited} within {self.timeout:g} s"
        elif event is not None and check is not None:
            why = check(run)
        if why:
            result.failure = why + "\n" + output_tail(out_path, err_path)
            return
        if not record:
            return
        if not cold:
            result.startup_ms.append((run.first_next - run.started) * 1e3)
            if "VmHWM" in run.status:
                result.hwm_kib.append(run.status["VmHWM"])
                result.rss_kib.append(run.status["VmRSS"])
                result.anon_kib.append(run.status.get("RssAnon", 0))
                result.file_kib.append(run.status.get("RssFile", 0))
                result.threads.append(run.status.get("Threads", 0))
            if run.cpu_ns is not None:
                result.cpu_ms.append(run.cpu_ns / 1e6)
        if event is None or usage is None:
            return
        s = result.cold if cold else result.warm
        s.wall_ms.append((run.responded - run.started) * 1e3)
        s.init_ms.append((run.first_next - run.started) * 1e3)
        s.spawn_ms.append((run.spawned - run.started) * 1e3)
        s.user_ms.append(usage.ru_utime * 1e3)
        s.sys_ms.append(usage.ru_stime * 1e3)
        s.cpu_ms.append((usage.ru_utime + usage.ru_stime) * 1e3)
        if run.cpu_ns_at_response is not None:
            s.schedstat_ms.append(run.cpu_ns_at_response / 1e6)
        st = run.status_at_response
        if "VmHWM" in st:
            s.hwm_kib.append(st["VmHWM"])
            s.anon_kib.append(st.get("RssAnon", 0))
            s.file_kib.append(st.get("RssFile", 0))
            s.threads.append(st.get("Threads", 0))


def kill(proc: subprocess.Popen):
    """Kill and reap the process: its rusage (every thread's CPU time), unless it had already
    been reaped (it exited on its own)."""
    if proc.returncode is not None:
        return None
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:
        proc.wait()
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage


def drop_caches_allowed() -> bool:
    """Whether this process may write /proc/sys/vm/drop_caches (root, /proc/sys not read-only)."""
    return os.access("/proc/sys/vm/drop_caches", os.W_OK)


def evict(how: str, binary: Path) -> None:
    """Empty the page cache before a cold start: all of it (drop_caches), or the binary's pages."""
    if how == "drop_caches":
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    else:
        fd = os.open(binary, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


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


def schedule(binaries: list[str], baselines: list[str]) -> list[str]:
    """One round: the baselines before each function."""
    order = []
    for b in binaries:
        order += [*baselines, b]
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
    parser.add_argument(
        "--cold-runs", type=int, default=3, help="page-cache-cold rounds after the warm ones (default 3; 0: none)"
    )
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds a start may take (default 20)")
    parser.add_argument("--seeder", type=Path, default=SEEDER, help=f"the stage helper (default {SEEDER})")
    parser.add_argument(
        "--init-only", action="store_true", help="the older benchmark: until the first `next`, no emulators"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file as JSON")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not sys.platform.startswith("linux"):
        sys.exit("bench-lambda: Linux only (it reads /proc/<pid>/status)")

    bin_dir = args.bin_dir.resolve()
    baselines = [HELLO] if args.init_only else BASELINES
    binaries = [*baselines, *FUNCTIONS]
    missing = [b for b in binaries if not (bin_dir / b).is_file()]
    if missing:
        sys.exit(
            f"bench-lambda: {', '.join(missing)} not in {bin_dir}: build them first, e.g.\n"
            "  cargo build --release --locked -p hookwise-ingest -p hookwise-deliver "
            "-p hookwise-scheduler -p hookwise-dead-letter -p lambda-hello -p lambda-getitem\n"
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
    cold_runs = 0 if args.init_only else args.cold_runs
    cold_how = None
    if cold_runs:
        cold_how = "drop_caches" if drop_caches_allowed() else "fadvise"

    # SIGTERM as an exception too, so the finally below kills the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = {b: Result(b) for b in binaries}
    stage_problems: dict[str, str] = {}
    receiver = None if args.init_only else Receiver()
    try:
        stage = None
        if receiver is not None:
            stage = seed(args.seeder, args.warmup + args.runs + cold_runs, receiver)
        with tempfile.TemporaryDirectory(prefix="bench-lambda-") as tmp:
            bench = Bench(bin_dir, template_vars, args.timeout, Path(tmp), stage=stage)
            try:
                print(
                    f"bench-lambda: {bin_dir}, {args.warmup} warm-up + {args.runs} rounds"
                    + (f" + {cold_runs} page-cache-cold ({cold_how})" if cold_runs else "")
                    + f" (Runtime API on 127.0.0.1:{bench.api.server_address[1]}"
                    + (
                        f"; tables on {stage.dynamodb_url}, queues, SES and KMS on {stage.moto_url}, "
                        f"receiver on {receiver.url})"
                        if stage
                        else f", AWS_ENDPOINT_URL sink on 127.0.0.1:{bench.sink.port})"
                    ),
                    file=sys.stderr,
                )
                for round_no in range(args.warmup + args.runs + cold_runs):
                    record = round_no >= args.warmup
                    cold = cold_how if round_no >= args.warmup + args.runs else None
                    live = [b for b in FUNCTIONS if results[b].failure is None]
                    for binary in schedule(live, baselines) if live else baselines:
                        result = results[binary]
                        if result.failure is not None:
                            continue
                        if stage is None:
                            bench.once(binary, result, record)
                            continue
                        expect = stage.rounds[round_no].get(binary, {})
                        bench.once(
                            binary,
                            result,
                            record,
                            event=stage.event(round_no, binary),
                            check=lambda run, b=binary, e=expect: check_response(b, run, e, stage),
                            cold=cold,
                        )
                        if record and result.failure is None and round_no not in result.invoked_rounds:
                            result.invoked_rounds.append(round_no)
                    if any(results[b].failure is not None for b in baselines):
                        break
            finally:
                bench.close()
        if stage is not None:
            stage_problems = check_stage(stage, {b: r.invoked_rounds for b, r in results.items()})
            for b, why in stage_problems.items():
                results[b].failure = results[b].failure or f"after the run: {why}"
    finally:
        if receiver is not None:
            receiver.close()

    return report(args, bin_dir, results, baselines, cold_how)


def summary(s: Samples, base: dict[str, Samples]) -> dict | None:
    """Medians of one binary's whole first invocations, and their ratios to each baseline's."""
    if not s.wall_ms:
        return None
    out = {
        "samples": len(s.wall_ms),
        "wall_ms_median": median(s.wall_ms),
        "wall_ms_min": min(s.wall_ms),
        "wall_ms_max": max(s.wall_ms),
        "cpu_ms_median": median(s.cpu_ms),
        "cpu_ms_min": min(s.cpu_ms),
        "user_ms_median": median(s.user_ms),
        "sys_ms_median": median(s.sys_ms),
        "cpu_schedstat_ms_median": median(s.schedstat_ms),
        "peak_rss_mib_median": median(s.hwm_kib) / 1024 if s.hwm_kib else None,
        "rss_anon_mib_median": median(s.anon_kib) / 1024 if s.anon_kib else None,
        "rss_file_mib_median": median(s.file_kib) / 1024 if s.file_kib else None,
        "threads": median(s.threads),
        "init_ms_median": median(s.init_ms),
        "spawn_ms_median": median(s.spawn_ms),
        "ratios": {},
        "wall_ms": [round(x, 3) for x in s.wall_ms],
        "cpu_ms": [round(x, 3) for x in s.cpu_ms],
        "peak_rss_kib": s.hwm_kib,
    }
    for name, b in base.items():
        if not b.wall_ms:
            continue
        out["ratios"][name] = {
            "cpu": median(s.cpu_ms) / median(b.cpu_ms),
            "wall": median(s.wall_ms) / median(b.wall_ms),
            "peak_rss": median(s.hwm_kib) / median(b.hwm_kib) if s.hwm_kib and b.hwm_kib else None,
        }
    return out


def report(args, bin_dir: Path, results: dict[str, Result], baselines: list[str], cold_how: str | None) -> int:
    hello = results[HELLO]
    base_ms, base_hwm = median(hello.startup_ms), median(hello.hwm_kib)
    rows = []
    for b, r in results.items():
        size = (bin_dir / b).stat().st_size
        ms, hwm = median(r.startup_ms), median(r.hwm_kib)
        rows.append(
            {
                "name": b,
                "baseline": b in baselines,
                "failed": r.failure,
                # Init: exec to the first `next` (the older figures; keys unchanged).
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
                # The whole first invocation: exec to its response.
                "first_invocation": {
                    "warm": summary(r.warm, {x: results[x].warm for x in baselines}),
                    "cold": summary(r.cold, {x: results[x].cold for x in baselines}),
                },
            }
        )
    by_name = {row["name"]: row for row in rows}
    functions = [row for row in rows if not row["baseline"]]
    goals = {}

    if not args.init_only:
        for temp, label in (("warm", "page cache warm"), ("cold", f"page cache cold: {cold_how}")):
            if not any(row["first_invocation"][temp] for row in rows):
                continue
            header = (
                f"{'first invocation, ' + temp:<26}{'wall ms':>9}{'CPU ms':>8}{'user':>7}{'sys':>7}{'RSS MiB':>9}"
                f"{'init ms':>9}  {'x getitem: CPU':>14}{'wall':>6}{'RSS':>6}  {'x hello: CPU':>12}{'wall':>6}{'RSS':>6}"
            )
            print(header)
            print("-" * len(header))
            for row in rows:
                s = row["first_invocation"][temp]
                if row["failed"] and not s:
                    print(f"{row['name']:<26}{'FAILED':>9}")
                    continue
                if not s:
                    continue
                g, h = s["ratios"].get(GETITEM, {}), s["ratios"].get(HELLO, {})
                print(
                    f"{row['name']:<26}{s['wall_ms_median']:>9.2f}{s['cpu_ms_median']:>8.2f}{s['user_ms_median']:>7.2f}"
                    f"{s['sys_ms_median']:>7.2f}{fmt(s['peak_rss_mib_median'], '.1f'):>9}{s['init_ms_median']:>9.2f}  "
                    f"{fmt(g.get('cpu'), '.2f'):>14}{fmt(g.get('wall'), '.2f'):>6}{fmt(g.get('peak_rss'), '.2f'):>6}  "
                    f"{fmt(h.get('cpu'), '.2f'):>12}{fmt(h.get('wall'), '.2f'):>6}{fmt(h.get('peak_rss'), '.2f'):>6}"
                )
            n = by_name[HELLO]["first_invocation"][temp]
            runs = max((r["first_invocation"][temp] or {}).get("samples", 0) for r in functions) if functions else 0
            print(
                f"({label}; medians of {n['samples'] if n else 0} starts of each baseline (one before each function) "
                f"and {runs} of each function; "
                f"wall: exec to the response, Python's spawn included ({fmt(n and n['spawn_ms_median'], '.2f')} ms for "
                f"the hello world); CPU: user + sys, rusage; RSS: VmHWM at the response; init: exec to the first `next`)"
            )
            print()
            if temp == "warm":
                key = f"first_invocation_cpu_within_{INVOCATION_GOAL_RATIO}x_of_{GETITEM}"
                over = []
                unknown = []
                for r in functions:
                    s = r["first_invocation"]["warm"]
                    ratio = s and s["ratios"].get(GETITEM, {}).get("cpu")
                    if ratio is None:
                        unknown.append(r["name"])
                    elif ratio > INVOCATION_GOAL_RATIO:
                        over.append(f"{r['name']} {ratio:.2f}x")
                goals[key] = not over and not unknown
                detail = "; ".join(x for x in (", ".join(over), ", ".join(f"{u} not measured" for u in unknown)) if x)
                print(
                    f"first invocation's CPU within {INVOCATION_GOAL_RATIO}x of {GETITEM}'s (warm): "
                    f"{'yes' if goals[key] else 'no'}" + (f" ({detail})" if detail else "")
                )
        print()

    header = (
        f"{'init (exec to 1st next)':<26}{'start-up ms':>12}{'min ms':>9}{'x hello':>9}"
        f"{'peak RSS MiB':>14}{'x hello':>9}{'size MiB':>10}{'init KiB':>10}{'CPU ms':>9}{'init conns':>12}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        if row["failed"] and not row["startup_ms"]:
            print(f"{row['name']:<26}{'FAILED':>12}")
            continue
        print(
            f"{row['name']:<26}{fmt(row['startup_ms_median'], '.2f'):>12}{fmt(row['startup_ms_min'], '.2f'):>9}"
            f"{fmt(row['startup_ratio'], '.2f'):>9}{fmt(row['peak_rss_mib_median'], '.1f'):>14}"
            f"{fmt(row['peak_rss_ratio'], '.2f'):>9}{row['size_mib']:>10.1f}{fmt(row['init_section_kib'], '.0f'):>10}"
            f"{fmt(row['cpu_ms_median'], '.1f'):>9}{row['init_connections']:>12}"
        )
    print(
        f"({args.runs} rounds after {args.warmup} warm-up, {len(hello.startup_ms)} hello-world start-ups; medians; "
        f"peak RSS: VmHWM at the first `next`; CPU ms: all threads' time on CPU by then; "
        f"{os.cpu_count()} CPUs; sizes: the files in {bin_dir}; init KiB: the code init runs, linked first)"
    )

    for key, label in (("startup_ratio", "start-up"), ("peak_rss_ratio", "RSS")):
        over = [f"{r['name']} {r[key]:.2f}x" for r in functions if r[key] is not None and r[key] > GOAL_RATIO]
        unknown = [r["name"] for r in functions if r[key] is None]
        ok = not over and not unknown and not hello.failure
        goals[f"{key.removesuffix('_ratio')}_within_{GOAL_RATIO}x"] = ok
        detail = "; ".join(x for x in (", ".join(over), ", ".join(f"{u} not measured" for u in unknown)) if x)
        print(
            f"init {label} within {GOAL_RATIO}x of {HELLO}: {'yes' if ok else 'no'}" + (f" ({detail})" if detail else "")
        )

    bootstraps = [(row["name"], p, n) for row in rows for p, n in row["arm64_bootstrap_bytes"].items()]
    if bootstraps:
        print("arm64 bootstraps:")
        for name, p, n in bootstraps:
            print(f"  {name:<22}{n / 2**20:>8.1f} MiB  {p}")
    else:
        print("arm64 bootstraps: none (scripts/sam-build.sh builds them: target/lambda/<binary>/bootstrap)")

    callers = [f"{r['name']} ({r['init_connections']})" for r in rows if r["init_connections"]]
    if callers:
        print(f"network: connections to the local sink: {', '.join(callers)}")
    elif args.init_only:
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
            "unit": {"startup": "ms", "wall": "ms", "cpu": "ms", "peak_rss": "MiB", "size": "bytes"},
            "bin_dir": str(bin_dir),
            "runs": args.runs,
            "warmup": args.warmup,
            "cold_runs": 0 if args.init_only else args.cold_runs,
            "page_cache_cold": cold_how,
            "init_only": args.init_only,
            "baseline": HELLO,
            "sdk_baseline": None if args.init_only else GETITEM,
            "goal_ratio": GOAL_RATIO,
            "invocation_goal_ratio": INVOCATION_GOAL_RATIO,
            "goals": goals,
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "machine": platform.machine()},
            "binaries": rows,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"bench-lambda: wrote {args.json}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
