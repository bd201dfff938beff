#!/usr/bin/env bash
# Build the real Dockerfile and run the image for real, on a machine with the docker client but
# no engine and no registry (this project's CI machine):
#   1. install docker.io, docker-compose and debootstrap from Debian when missing;
#   2. start a private dockerd (its own data root, socket and pid file);
#   3. make a local stand-in for the Dockerfile's base image when it cannot be pulled
#      (debootstrap'd Debian bookworm with python3 + python3-venv, tagged python:3.11-slim);
#   4. build the image from the Dockerfile unchanged, offline, from ./wheels;
#   5. run it, wait for healthy, send a V1 predict, a V2 infer and an activation request through
#      the published port and check the answers; check it is non-root, torch-free and stops
#      cleanly on SIGTERM;
#   6. run docker-compose's loadtest profile (bounded Locust run), require zero failures;
#   7. tear down what it started: containers, networks, volumes, dockerd (by pid), its bridge,
#      and the firewall chains, rules and tables dockerd added (checked against a snapshot).
# Usage: docker/e2e.sh        (as root; GELU_DOCKER_WORK sets the scratch directory)
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=${GELU_DOCKER_WORK:-/var/tmp/gelu-serve-docker}
CACHE=$WORK/cache          # kept between runs: the base image's root file system
RUN=$WORK/run              # removed at the end: dockerd's state
BASE_IMAGE=python:3.11-slim
IMAGE=gelu-serve:latest
LOADTEST_IMAGE=gelu-serve-loadtest:latest
PROJECT=gelu-e2e-$$
CONTAINER=gelu-e2e-$$
MIRROR=$(grep -rhoE 'https?://deb\.debian\.org/debian/?' /etc/apt/sources.list.d/ /etc/apt/sources.list 2>/dev/null | head -n1 || true)
MIRROR=${MIRROR:-http://deb.debian.org/debian}

log() { printf '\n== %s\n' "$*"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

export DOCKER_HOST=unix://$RUN/docker.sock DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0

# dockerd adds firewall chains and rules, and on the nf_tables backend whole tables: record the
# firewall before it starts, and put exactly that back at teardown.
normalise() { sed -e '/^#/d' -e 's/ \[[0-9]*:[0-9]*\]$//'; }  # no comments or counters
firewall_save() {
    for family in ip ip6; do
        command -v "${family}tables-save" >/dev/null && "${family}tables-save" >"$RUN/$family.before"
    done
    return 0
}
firewall_restore() {
    for family in ip ip6; do
        before=$RUN/$family.before
        [ -f "$before" ] || continue
        for table in $("${family}tables-save" | sed -n 's/^\*//p'); do
            if grep -qx "\*$table" "$before"; then
                sed -n "/^\*$table\$/,/^COMMIT\$/p" "$before" | "${family}tables-restore"
            elif "${family}tables" --version | grep -q nf_tables; then
                nft delete table "$family" "$table"
            else
                "${family}tables" -t "$table" -F && "${family}tables" -t "$table" -X
            fi
        done
        if [ "$("${family}tables-save" | normalise)" != "$(normalise <"$before")" ]; then
            echo "${family}tables differ from before dockerd started:"
            "${family}tables-save"
            return 1
        fi
    done
    echo "firewall: as before dockerd started"
}

teardown() {
    status=$?
    log "teardown"
    if [ -S "$RUN/docker.sock" ]; then
        docker-compose -p "$PROJECT" --profile loadtest down --volumes --remove-orphans >/dev/null 2>&1 || true
        docker rm -f "$CONTAINER" >/dev/null 2>&1 || true
    fi
    if [ -f "$RUN/dockerd.pid" ]; then
        pid=$(cat "$RUN/dockerd.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    firewall_restore || status=1
    ip link delete docker0 >/dev/null 2>&1 || true
    # Unmount what dockerd left mounted under its roots before removing them.
    grep -o " $RUN[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$RUN"
    exit "$status"
}
trap teardown EXIT

log "1. tools"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v nft >/dev/null || missing+=(nftables)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
docker-compose version --short

log "2. a private dockerd"
rm -rf "$RUN"
mkdir -p "$RUN" "$CACHE"
firewall_save
dockerd --data-root "$RUN/data" --exec-root "$RUN/exec" -H "$DOCKER_HOST" \
    --pidfile "$RUN/dockerd.pid" >"$RUN/dockerd.log" 2>&1 &
for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
docker info --format 'dockerd {{.ServerVersion}}, storage {{.Driver}}'

log "3. the base image $BASE_IMAGE"
if ! timeout 60 docker pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "no registry: building a local stand-in for $BASE_IMAGE from Debian packages"
    if [ ! -s "$CACHE/rootfs.tar" ]; then
        rm -rf "$CACHE/rootfs"
        debootstrap --variant=minbase --include=python3,python3-venv bookworm \
            "$CACHE/rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1
        rm -rf "$CACHE/rootfs/var/cache/apt/archives/"*.deb "$CACHE/rootfs/var/lib/apt/lists/"*
        tar -C "$CACHE/rootfs" -cf "$CACHE/rootfs.tar" .
        rm -rf "$CACHE/rootfs"
    fi
    docker import "$CACHE/rootfs.tar" "$BASE_IMAGE" >/dev/null
fi

log "4. build from the Dockerfile, offline, from ./wheels"
docker/fetch-wheels.sh wheels  # what is already there is kept; new dependencies are added
start=$(date +%s)
docker build -q --build-arg PIP_NO_INDEX=1 --target runtime -t "$IMAGE" . >/dev/null
docker build -q --build-arg PIP_NO_INDEX=1 --target loadtest -t "$LOADTEST_IMAGE" . >/dev/null
echo "built in $(( $(date +%s) - start )) s"
size=$(docker image inspect "$IMAGE" --format '{{.Size}}')
echo "serving image: $(( size / 1000000 )) MB"
user=$(docker image inspect "$IMAGE" --format '{{.Config.User}}')
[ "$user" = 10001 ] || { echo "image runs as '$user', not 10001"; exit 1; }
docker run --rm --entrypoint python3 "$IMAGE" -c '
import importlib.util, shutil, sys
bad = [m for m in ("torch", "sklearn", "onnxscript") if importlib.util.find_spec(m)]
bad += [c for c in ("gcc", "cc", "g++") if shutil.which(c)]
sys.exit(f"serving image holds {bad}" if bad else 0)'

log "5. run it, wait for healthy, ask it"
port=$(free_port)
grpc_port=$(free_port)
docker run -d --name "$CONTAINER" -p "127.0.0.1:$port:8000" -p "127.0.0.1:$grpc_port:8001" \
    -e GELU_LOG_LEVEL=info "$IMAGE" >/dev/null
for _ in $(seq 120); do
    health=$(docker inspect --format '{{.State.Health.Status}}' "$CONTAINER")
    [ "$health" = healthy ] && break
    [ "$(docker inspect --format '{{.State.Running}}' "$CONTAINER")" = true ] || break
    sleep 0.5
done
echo "health: $health"
[ "$health" = healthy ] || { docker logs "$CONTAINER"; exit 1; }
url=http://127.0.0.1:$port
row='[0,0,0.3125,0.8125,0.5625,0.0625,0,0,0,0,0.8125,0.9375,0.625,0.9375,0.3125,0,0,0.1875,0.9375,0.125,0,0.6875,0.5,0,0,0.25,0.75,0,0,0.5,0.5,0,0,0.3125,0.5,0,0,0.5625,0.5,0,0,0.25,0.6875,0,0.0625,0.75,0.4375,0,0,0.125,0.875,0.3125,0.625,0.75,0,0,0,0,0.375,0.8125,0.625,0,0,0]'
curl -sfS -X POST "$url/v1/models/digits-mlp:predict" -d "{\"instances\": [$row]}" | python3 -c '
import json, sys
p = json.load(sys.stdin)["predictions"][0]
assert p["label"] == "0" and p["class_index"] == 0, p
assert abs(sum(p["probabilities"]) - 1) < 1e-5, p
print("V1 predict: label", p["label"], "p =", round(max(p["probabilities"]), 3))'
curl -sfS -X POST "$url/v2/models/digits-autoencoder/infer" \
    -d "{\"inputs\": [{\"name\": \"input\", \"shape\": [1, 64], \"datatype\": \"FP32\", \"data\": $row}]}" | python3 -c '
import json, sys
r = json.load(sys.stdin)
(out,) = r["outputs"]
assert r["model_name"] == "digits-autoencoder" and out["name"] == "reconstruction", r
assert out["shape"] == [1, 64] and all(0 <= v <= 1 for v in out["data"]), out
print("V2 infer: reconstruction of", len(out["data"]), "values")'
curl -sfS -X POST "$url/v1/activations/gelu" -d '{"data": [-1.0, 0.0, 1.0]}' | python3 -c '
import json, math, sys
r = json.load(sys.stdin)
want = [x * 0.5 * (1 + math.erf(x / math.sqrt(2))) for x in (-1.0, 0.0, 1.0)]
assert all(abs(a - b) < 1e-6 for a, b in zip(r["data"], want)), r
print("activation: gelu(-1, 0, 1) =", r["data"])'
# The accurate kernel compiled in the image (llvmlite, as the non-root user), not the fallback.
curl -sfS "$url/v1/activations" | python3 -c '
import json, sys
kernel = json.load(sys.stdin)["accurate_kernel"]
assert kernel.startswith("compiled for "), kernel
print("activation: the accurate kernel runs", kernel)'
.venv/bin/python - "127.0.0.1:$grpc_port" <<'PY'
import sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
channel = grpc.insecure_channel(sys.argv[1])
check = health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
status = health_pb2_grpc.HealthStub(channel).Check(check, timeout=10).status
assert status == health_pb2.HealthCheckResponse.SERVING, status
print("gRPC: health SERVING on the published port")
PY
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$url/v1/models/digits-mlp:predict" -d '{"instances": [[1, 2]]}')
[ "$code" = 400 ] || { echo "bad input answered $code, not 400"; exit 1; }
docker stop -t 20 "$CONTAINER" >/dev/null
exit_code=$(docker inspect --format '{{.State.ExitCode}}' "$CONTAINER")
# The logs whole first: under pipefail, `docker logs | grep -q` fails whenever grep stops
# reading at its match before docker has written the last lines (SIGPIPE).
logs=$(docker logs "$CONTAINER" 2>&1)
grep -q "shutdown complete: both faces and the core stopped" <<<"$logs" \
    || { printf '%s\n' "$logs"; echo "no clean shutdown"; exit 1; }
echo "SIGTERM: clean shutdown, exit code $exit_code"
[ "$exit_code" = 0 ] || { echo "unexpected exit code"; exit 1; }
docker rm "$CONTAINER" >/dev/null

log "6. docker-compose, loadtest profile"
export GELU_PORT=127.0.0.1:$(free_port) GELU_GRPC_PUBLISH=127.0.0.1:$(free_port) LOADTEST_USERS=8 LOADTEST_RUN_TIME=10s
set +e
timeout 300 docker-compose -p "$PROJECT" --profile loadtest up --no-build \
    --exit-code-from loadtest loadtest >"$RUN/compose.log" 2>&1
compose_status=$?
set -e
grep -E "Aggregated|Type +Name" "$RUN/compose.log" | sed 's/^[^|]*| //' || true
if [ "$compose_status" != 0 ] || ! grep -qE "Aggregated +[0-9]+ +0\(0\.00%\)" "$RUN/compose.log"; then
    tail -50 "$RUN/compose.log"
    echo "load test failed (exit $compose_status)"
    exit 1
fi
echo "load test: zero failures"
log "docker e2e passed"
