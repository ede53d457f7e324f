#!/usr/bin/env bash
# `sam local invoke` and `sam local start-api` of the four functions, with no Docker registry:
#
#   scripts/sam-local.sh test            the test command's step: tests/tests/sam_local.rs, under
#                                        scripts/aws-test-services.sh (moto, DynamoDB Local) unless
#                                        that already runs around it
#   scripts/sam-local.sh run -- CMD...   Docker, the image and the local build around any command
#   scripts/sam-local.sh sam ARGS...     one sam command, e.g.
#                                          scripts/sam-local.sh sam local invoke --config-env local \
#                                            DeliverFunction --event infra/events/deliver-sqs.json
#   scripts/sam-local.sh build           only the local build (no Docker)
#
# Each part is timed:
#   1. Docker. Debian's docker.io is installed with apt if dockerd is missing, and a dockerd of
#      its own is started (data under .hookwise/sam-local/docker, the image cache; no bridge and
#      no iptables rules: the functions' containers share the host's network) unless DOCKER_HOST
#      names a daemon to use instead. It is stopped at the end, and every container made here
#      is removed.
#   2. The image SAM wants for provided.al2023 on x86_64, public.ecr.aws/lambda/provided:al2023-x86_64
#      (samcli/local/docker/lambda_image.py), made with `docker import` of a minimal root file
#      system of this machine's own files: the glibc the function binaries link, /bin/sh, mv and
#      chmod (SAM's own build of its `rapid` image on top runs `mv` and `chmod` to add the runtime
#      interface emulator its PyPI wheel ships). Skipped while the files are unchanged; an image
#      of that name that is not this script's (the real one, pulled) is used as it is.
#   3. The local build, .hookwise/sam-local/build, laid out as `sam build` lays it out: the x86_64
#      function binaries of the shared build (HOOKWISE_LAMBDA_BIN_DIR, else target/debug) each as
#      <Function>/bootstrap, and template.yaml with each CodeUri pointing there. Nothing is
#      compiled for it. Two additions: the variables infra/env.json sets that template.yaml does
#      not declare (the SDK's endpoints) are declared, or sam local would drop them; and the
#      functions run on x86_64 through the template's Architecture parameter (samconfig.toml's
#      `local` environment sets it). The glibc <= 2.34 check of the artifacts `sam deploy` ships
#      stays scripts/sam-build.sh's: this image has the host's newer glibc.
#   4. .hookwise/sam-local/bin/sam: the installed sam, with `--docker-network host` doing what it
#      says. SAM 1.170 accepts the option but leaves the container on Docker's default network
#      (aws/aws-sam-cli#4236); this wrapper creates it with the host's network instead, and gives
#      the emulator ports of its own on 127.0.0.1 (SAM's port, and a free one for the runtime
#      API), so several containers (start-api's warm ones) run side by side.
#
# `run` exports DOCKER_HOST, HOOKWISE_SAM_LOCAL_SAM (the wrapper), HOOKWISE_SAM_LOCAL_TEMPLATE
# (the local build's template) and HOOKWISE_TEST_SAM_LOCAL=1, which makes the test run, and fail
# rather than skip when something is missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/scripts/$(basename "${BASH_SOURCE[0]}")"
SAM_LOCAL_DIR="${SAM_LOCAL_DIR:-$ROOT/.hookwise/sam-local}"
# dockerd's sockets (its own, containerd's) must stay under the 108 bytes of a socket path.
SAM_LOCAL_RUN_DIR="${SAM_LOCAL_RUN_DIR:-/tmp/hookwise-sam-local-$(id -u)}"
SAM_LOCAL_ENV_VARS="${SAM_LOCAL_ENV_VARS:-$ROOT/infra/env.json}"
BASE_IMAGE="public.ecr.aws/lambda/provided:al2023-x86_64"
RAPID_IMAGE="public.ecr.aws/lambda/provided:al2023-rapid-x86_64"
ROOTFS_LABEL="hookwise.sam-local.rootfs"
CONTAINER_LABEL="hookwise.sam-local"
PY="${PYTHON:-python3}"

_log() { echo "sam-local: $*" >&2; }
_die() { _log "$*"; exit 1; }

# `_timed "what" command...`: run it, then say how long it took.
_timed() {
  local what=$1 started=$SECONDS
  shift
  "$@"
  _log "$what: $((SECONDS - started)) s"
}

_sudo() {
  if [[ $(id -u) == 0 ]]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    _die "need root for: $*"
  fi
}

_arch_check() {
  [[ "$(uname -m)" == x86_64 ]] || _die "sam local here runs the x86_64 image; this machine is $(uname -m)"
}

# --- 1. Docker ----------------------------------------------------------------------------

_STARTED_DOCKERD=""

docker_install() {
  if command -v dockerd >/dev/null && command -v docker >/dev/null; then return; fi
  _log "installing docker.io (apt)"
  export DEBIAN_FRONTEND=noninteractive
  if ! _sudo apt-get install -y --no-install-recommends docker.io >/dev/null; then
    _sudo apt-get update -qq
    _sudo apt-get install -y --no-install-recommends docker.io >/dev/null
  fi
  hash -r
}

_docker_answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# A dockerd this script started in a run that was killed: stop it (it holds our data root).
_docker_leftover() {
  local pidfile="$SAM_LOCAL_RUN_DIR/dockerd.pid" pid
  if [[ -f "$pidfile" ]]; then
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "--data-root $SAM_LOCAL_DIR/docker"; then
      _log "stopping the dockerd (pid $pid) an earlier run left behind"
      _docker_stop_pid "$pid"
    fi
    rm -f "$pidfile"
  fi
  # What a killed dockerd left mounted.
  _unmount_under "$SAM_LOCAL_RUN_DIR" "$SAM_LOCAL_DIR/docker"
}

_docker_stop_pid() {
  local pid=$1
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
  _log "dockerd (pid $pid) did not stop within 30 s; killing it"
  kill -9 "$pid" 2>/dev/null || true
}

docker_up() {
  if [[ -n "${DOCKER_HOST:-}" ]]; then
    _docker_answers || _die "DOCKER_HOST=$DOCKER_HOST does not answer"
    _log "using the Docker daemon at $DOCKER_HOST"
    return
  fi
  docker_install
  mkdir -p "$SAM_LOCAL_DIR/docker" "$SAM_LOCAL_RUN_DIR"
  _docker_leftover
  export DOCKER_HOST="unix://$SAM_LOCAL_RUN_DIR/docker.sock"
  # No bridge, NAT or forwarding: the functions' containers use the host's network, and
  # SAM's image build needs none; so dockerd changes nothing in the host's network set-up.
  dockerd \
    --data-root "$SAM_LOCAL_DIR/docker" \
    --exec-root "$SAM_LOCAL_RUN_DIR/exec" \
    --pidfile "$SAM_LOCAL_RUN_DIR/dockerd.pid" \
    --host "$DOCKER_HOST" \
    --containerd-namespace hookwise-sam-local \
    --containerd-plugins-namespace hookwise-sam-local-plugins \
    --bridge none --iptables=false --ip-forward=false --ip-masq=false \
    >"$SAM_LOCAL_DIR/dockerd.log" 2>&1 9>&- &
  _STARTED_DOCKERD=$!
  for _ in $(seq 1 120); do
    if _docker_answers; then
      _log "dockerd $(docker version --format '{{.Server.Version}}') (pid $_STARTED_DOCKERD, $(docker info --format '{{.Driver}}') storage) on $DOCKER_HOST"
      return
    fi
    kill -0 "$_STARTED_DOCKERD" 2>/dev/null || break
    sleep 0.5
  done
  _log "dockerd did not answer; its log:"
  tail -n 30 "$SAM_LOCAL_DIR/dockerd.log" >&2
  return 1
}

docker_down() {
  local ids
  if [[ -n "${DOCKER_HOST:-}" ]] && _docker_answers; then
    ids=$(docker ps -aq --filter "label=$CONTAINER_LABEL" 2>/dev/null || true)
    if [[ -n "$ids" ]]; then
      _log "removing $(wc -w <<<"$ids") container(s) left running"
      # shellcheck disable=SC2086
      docker rm -f $ids >/dev/null 2>&1 || true
    fi
  fi
  if [[ -n "$_STARTED_DOCKERD" ]]; then
    _docker_stop_pid "$_STARTED_DOCKERD"
    wait "$_STARTED_DOCKERD" 2>/dev/null || true
    _STARTED_DOCKERD=""
    _unmount_under "$SAM_LOCAL_RUN_DIR" "$SAM_LOCAL_DIR/docker"
    rm -rf "$SAM_LOCAL_RUN_DIR/exec" "$SAM_LOCAL_RUN_DIR/dockerd.pid"
    _log "dockerd stopped"
  fi
}

# What a stopped dockerd leaves mounted (its network namespace file), deepest first.
_unmount_under() {
  local dir mounts=()
  for dir in "$@"; do
    while read -r _ mnt _; do
      [[ "$mnt" == "$dir"/* ]] && mounts+=("$mnt")
    done </proc/mounts
  done
  ((${#mounts[@]})) || return 0
  printf '%s\n' "${mounts[@]}" | awk '{ print length, $0 }' | sort -rn | cut -d' ' -f2- |
    while read -r mnt; do umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true; done
}

# --- 2. The image -------------------------------------------------------------------------

# The function binaries, by logical id: "IngestFunction hookwise-ingest" lines.
_functions() {
  "$PY" - "$ROOT/template.yaml" <<'EOF'
import sys
from samcli.yamlhelper import yaml_parse
template = yaml_parse(open(sys.argv[1]).read())
for name, r in template["Resources"].items():
    if r.get("Metadata", {}).get("BuildMethod") == "rust-cargolambda":
        print(name, r["Metadata"]["BuildProperties"]["Binary"])
EOF
}

# Write the root file system's tar to $1 (deterministic: the same files give the same bytes)
# and print its SHA-256. The rest of the arguments are the binaries whose libraries it holds.
_rootfs() {
  "$PY" - "$@" <<'EOF'
import hashlib, io, os, stat, subprocess, sys, tarfile

out, binaries = sys.argv[1], sys.argv[2:]
# What SAM's build of its rapid image runs: RUN mv ... && chmod +x ...
TOOLS = ["/bin/sh", "/bin/mv", "/bin/chmod"]
needed = set(TOOLS)
for exe in binaries + TOOLS:
    ldd = subprocess.run(["ldd", exe], capture_output=True, text=True, check=True).stdout
    for line in ldd.splitlines():
        words = line.split()
        path = words[words.index("=>") + 1] if "=>" in words else (words[0] if words else "")
        if path.startswith("/"):
            needed.add(path)

entries = {}

def entry(name, kind, mode, data=b"", link=""):
    ti = tarfile.TarInfo(name.lstrip("/"))
    ti.type, ti.mode, ti.size, ti.linkname = kind, mode, len(data), link
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "root", "root"
    entries.setdefault(ti.name, (ti, data))

def add(path):
    """`path` as this machine has it: each directory and symlink on the way (followed), then the file."""
    parts = path.strip("/").split("/")
    here = ""
    for i, part in enumerate(parts):
        here += "/" + part
        st = os.lstat(here)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(here)
            entry(here, tarfile.SYMTYPE, 0o777, link=target)
            add(os.path.normpath(os.path.join(os.path.dirname(here), target, *parts[i + 1:])))
            return
        if stat.S_ISDIR(st.st_mode):
            entry(here, tarfile.DIRTYPE, 0o755)
        else:
            with open(here, "rb") as f:
                entry(here, tarfile.REGTYPE, stat.S_IMODE(st.st_mode), f.read())

for path in sorted(needed):
    add(path)
if os.path.isfile("/etc/ssl/certs/ca-certificates.crt"):
    add("/etc/ssl/certs/ca-certificates.crt")
for d, mode in [("/etc", 0o755), ("/opt", 0o755), ("/root", 0o700), ("/tmp", 0o1777),
                ("/var", 0o755), ("/var/runtime", 0o755), ("/var/task", 0o755)]:
    entry(d, tarfile.DIRTYPE, mode)
for name, text in [
    ("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
    ("/etc/group", "root:x:0:\n"),
    ("/etc/nsswitch.conf", "hosts: files dns\n"),
    ("/etc/os-release", 'NAME="Hookwise sam local base"\nID=hookwise-sam-local\n'
     'PRETTY_NAME="provided.al2023 stand-in: this machine\'s glibc and a shell (scripts/sam-local.sh)"\n'),
]:
    entry(name, tarfile.REGTYPE, 0o644, text.encode())

buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
    for name in sorted(entries):
        ti, data = entries[name]
        tar.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
with open(out, "wb") as f:
    f.write(buf.getvalue())
print(hashlib.sha256(buf.getvalue()).hexdigest())
EOF
}

image_build() {
  local tar="$SAM_LOCAL_DIR/rootfs.tar" sum have bins=()
  while read -r _ binary; do bins+=("$BIN_DIR/$binary"); done < <(_functions)
  sum=$(_rootfs "$tar" "${bins[@]}")
  if have=$(docker image inspect --format "{{index .Config.Labels \"$ROOTFS_LABEL\"}}" "$BASE_IMAGE" 2>/dev/null); then
    if [[ "$have" == "$sum" ]]; then
      _log "$BASE_IMAGE: cached (root file system ${sum:0:12})"
      rm -f "$tar"
      return
    elif [[ -z "$have" || "$have" == "<no value>" ]]; then
      _log "$BASE_IMAGE: not this script's (a pulled one?); using it as it is"
      rm -f "$tar"
      return
    fi
  fi
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV LAMBDA_TASK_ROOT=/var/task' \
    --change 'ENV LAMBDA_RUNTIME_DIR=/var/runtime' \
    --change 'WORKDIR /var/task' \
    --change "LABEL $ROOTFS_LABEL=$sum" \
    "$tar" "$BASE_IMAGE" >/dev/null
  # SAM builds its rapid image on the base once, and never again while it is there.
  docker image rm -f "$RAPID_IMAGE" >/dev/null 2>&1 || true
  _log "$BASE_IMAGE: imported, $(($(stat -c %s "$tar") / 1024)) KiB (root file system ${sum:0:12}, glibc $(getconf GNU_LIBC_VERSION | cut -d' ' -f2))"
  rm -f "$tar"
}

# --- 3. The local build -------------------------------------------------------------------

BIN_DIR="${HOOKWISE_LAMBDA_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/debug}"

_need_sam() {
  if ! "$PY" -c 'import samcli' 2>/dev/null; then
    _log "installing the pinned Python tools (tests/requirements.txt)"
    "$PY" -m pip install --quiet --disable-pip-version-check -r "$ROOT/tests/requirements.txt"
    hash -r
  fi
}

local_build() {
  local build="$SAM_LOCAL_DIR/build" missing=() name binary
  while read -r name binary; do
    [[ -x "$BIN_DIR/$binary" ]] || missing+=("$binary")
  done < <(_functions)
  if ((${#missing[@]})); then
    [[ -z "${HOOKWISE_LAMBDA_BIN_DIR:-}" ]] ||
      _die "HOOKWISE_LAMBDA_BIN_DIR=$HOOKWISE_LAMBDA_BIN_DIR has no ${missing[*]}"
    _log "building ${missing[*]} (debug, x86_64)"
    local args=()
    for binary in "${missing[@]}"; do args+=(-p "$binary"); done
    (cd "$ROOT" && cargo build --locked --bins "${args[@]}")
  fi
  rm -rf "$build"
  mkdir -p "$build"
  while read -r name binary; do
    mkdir -p "$build/$name"
    # A hard link when it can (same file system): nothing copied, nothing to go stale, as
    # the next run links the binaries again.
    ln -f "$BIN_DIR/$binary" "$build/$name/bootstrap" 2>/dev/null || cp "$BIN_DIR/$binary" "$build/$name/bootstrap"
  done < <(_functions)
  "$PY" - "$ROOT/template.yaml" "$build" "$SAM_LOCAL_ENV_VARS" <<'EOF'
import json, os, re, subprocess, sys
from samcli.yamlhelper import yaml_dump, yaml_parse

source, build, env_file = sys.argv[1:4]
template = yaml_parse(open(source).read())
functions = {name: r for name, r in template["Resources"].items()
             if r.get("Metadata", {}).get("BuildMethod") == "rust-cargolambda"}

# As `sam build` writes it: each function's CodeUri is its directory beside the template.
for name, r in functions.items():
    r["Properties"]["CodeUri"] = name
    r["Metadata"]["SamResourceId"] = name

# sam local passes a function only the variables its template declares (values from
# --env-vars replace theirs): declare what the env file sets and the template does not.
def variables(node):
    return node.setdefault("Environment", {}).setdefault("Variables", {})
globals_vars = variables(template["Globals"]["Function"])
declared = set(globals_vars) | {v for r in functions.values() for v in variables(r["Properties"])}
env = json.load(open(env_file))
added = []
for scope, values in env.items():
    target = globals_vars if scope == "Parameters" else variables(functions[scope]["Properties"])
    for key, value in values.items():
        if key not in declared:
            target[key] = value
            added.append(key)
with open(os.path.join(build, "template.yaml"), "w") as f:
    f.write(yaml_dump(template))

def newest_glibc(path):
    out = subprocess.run(["objdump", "-T", path], capture_output=True, text=True).stdout
    found = {tuple(int(p) for p in v.split(".")) for v in re.findall(r"GLIBC_([0-9]+(?:\.[0-9]+)+)", out)}
    return ".".join(map(str, max(found))) if found else "?"

for name in functions:
    path = os.path.join(build, name, "bootstrap")
    head = open(path, "rb").read(20)
    machine = int.from_bytes(head[18:20], "little")
    if head[:4] != b"\x7fELF" or machine != 0x3E:  # EM_X86_64
        sys.exit(f"sam-local: {path} is not an x86_64 ELF executable (machine {machine:#x})")
    print(f"sam-local: {name:<20} bootstrap {os.path.getsize(path) / 1e6:.0f} MB, x86_64, needs glibc {newest_glibc(path)}",
          file=sys.stderr)
print(f"sam-local: {build}/template.yaml (CodeUri per function; declared from {os.path.basename(env_file)}: "
      f"{', '.join(added) or 'nothing'})", file=sys.stderr)
EOF
}

# --- 4. The sam wrapper -------------------------------------------------------------------

sam_wrapper() {
  local bin="$SAM_LOCAL_DIR/bin/sam" python
  python=$("$PY" -c 'import sys; print(sys.executable)')
  mkdir -p "$(dirname "$bin")"
  {
    echo "#!$python"
    cat <<'EOF'
"""sam, with `--docker-network host` doing what it says (written by scripts/sam-local.sh).

SAM 1.170 takes the option but creates a function's container on Docker's default network
and publishes the emulator's port 8080 (samcli/local/docker/container.py skips only the
network's `connect` for "host": aws/aws-sam-cli#4236). Here such a container is created
with the host's network instead, with the label scripts/sam-local.sh cleans up by, and the
emulator listens on the host port SAM chose for it, its runtime API on a free one of its
own: start-api's warm containers run side by side on 127.0.0.1 and reach moto, DynamoDB
Local and webhook receivers there.
"""
import socket
import sys
import threading

import docker.models.containers
from samcli.local.docker import container as sam_container

LABEL = "hookwise.sam-local"
_state = threading.local()
_sam_create = sam_container.Container.create
_docker_create = docker.models.containers.ContainerCollection.create
# What this leans on (aws-sam-cli 1.170, pinned in tests/requirements.txt): fail loudly if it moved.
_assigned = sam_container.Container.__init__.__code__.co_names
if not isinstance(getattr(sam_container.Container, "network_id", None), property) or not all(
    a in _assigned for a in ("rapid_port_host", "_entrypoint", "_container_host_interface")
):
    sys.exit("sam-local: this SAM CLI's Container is not the one the host-network wrapper knows; update it")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _create(self, *args, **kwargs):
    entry = list(self._entrypoint or [])
    if self.network_id != "host" or not entry or not entry[0].endswith("/aws-lambda-rie"):
        return _sam_create(self, *args, **kwargs)
    interface = self._container_host_interface
    if interface in ("", "0.0.0.0"):
        interface = "127.0.0.1"
    self._entrypoint = entry + [
        "--runtime-interface-emulator-address", f"{interface}:{self.rapid_port_host}",
        "--runtime-api-address", f"127.0.0.1:{_free_port()}",
    ]
    _state.host = True
    try:
        return _sam_create(self, *args, **kwargs)
    finally:
        _state.host = False


def _docker(self, image, command=None, **kwargs):
    if getattr(_state, "host", False):
        kwargs.pop("ports", None)  # nothing to publish: the emulator is on the host already
        kwargs["network_mode"] = "host"
        kwargs["labels"] = {**(kwargs.get("labels") or {}), LABEL: "1"}
    return _docker_create(self, image, command, **kwargs)


sam_container.Container.create = _create
docker.models.containers.ContainerCollection.create = _docker

from samcli.cli.main import cli  # noqa: E402

sys.argv[0] = "sam"
sys.exit(cli())
EOF
  } >"$bin"
  chmod +x "$bin"
  export HOOKWISE_SAM_LOCAL_SAM="$bin"
}

# --- Putting it together ------------------------------------------------------------------


setup() {
  _arch_check
  mkdir -p "$SAM_LOCAL_DIR"
  # One run at a time: they share the data root, the image and the build directory.
  exec 9>"$SAM_LOCAL_DIR/lock"
  if ! flock -n 9; then
    _log "waiting for another run of this script to finish"
    flock 9
  fi
  _need_sam
  # No telemetry, and no credential lookup at the instance metadata address (off this machine).
  export SAM_CLI_TELEMETRY=0 AWS_EC2_METADATA_DISABLED=true
  export SAM_CLI_CONTAINER_CONNECTION_TIMEOUT="${SAM_CLI_CONTAINER_CONNECTION_TIMEOUT:-60}"
  _timed "local build (no compilation)" local_build
  export HOOKWISE_SAM_LOCAL_TEMPLATE="$SAM_LOCAL_DIR/build/template.yaml"
  sam_wrapper
  _timed "Docker up" docker_up
  _timed "base image" image_build
  export HOOKWISE_TEST_SAM_LOCAL=1
}

teardown() {
  local status=$?
  trap - EXIT
  docker_down
  exit "$status"
}

main() {
  cd "$ROOT"
  case "${1:-}" in
    run)
      shift
      [[ "${1:-}" == "--" ]] && shift
      (($#)) || { echo "usage: $0 run -- COMMAND..." >&2; exit 2; }
      trap teardown EXIT
      trap 'exit 130' INT TERM
      setup
      local started=$SECONDS status=0
      # Without the lock's descriptor: a process the command leaves behind must not hold it.
      "$@" 9>&- || status=$?
      _log "$(basename "$1"): $((SECONDS - started)) s (exit $status)"
      exit "$status"
      ;;
    test)
      if [[ -z "${HOOKWISE_TEST_MOTO_URL:-}" || -z "${HOOKWISE_TEST_DYNAMODB_LOCAL_URL:-}" ]]; then
        exec "$ROOT/scripts/aws-test-services.sh" run -- "$SELF" test
      fi
      # --workspace: the shared build's feature set, so only the test itself is compiled.
      "$SELF" run -- cargo test --workspace --locked --test sam_local -- --nocapture
      ;;
    sam)
      shift
      "$SELF" run -- bash -c '"$HOOKWISE_SAM_LOCAL_SAM" "$@"' sam "$@"
      ;;
    build)
      _arch_check
      _need_sam
      _timed "local build (no compilation)" local_build
      ;;
    *)
      sed -n '2,12p' "$SELF" | sed 's/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
}

main "$@"
