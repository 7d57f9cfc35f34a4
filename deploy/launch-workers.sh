#!/usr/bin/env bash
# Start one `vela2 worker` per visible GPU of this host, all consuming the same queues; forward
# SIGTERM / SIGINT to every worker (warm shutdown: each finishes or requeues what it holds) and wait.
#
# Usage:
#   launch-workers.sh [WORKER OPTIONS...]   e.g. --checkpoint /models/ckpt --redis redis://redis:6379/0
#   launch-workers.sh --list                print the GPUs a launch would use, one a line
#   launch-workers.sh --health              exit 0 when every worker's /metrics answers 200
#
# GPUs: the entries of CUDA_VISIBLE_DEVICES when it is set (indices or UUIDs, comma separated),
# else every GPU that `nvidia-smi -L` lists (the MIG instances of a GPU in MIG mode, by UUID).
# Worker k (0-based) runs with CUDA_VISIBLE_DEVICES=<its GPU>, so it sees exactly one device and
# gets `--device cuda:0`, and with `--metrics-port VELA2_METRICS_PORT+k` (default 9464+k); both are
# appended after WORKER OPTIONS, so they win over a --device / --metrics-port given there.
# CUDA_DEVICE_ORDER defaults to PCI_BUS_ID so that index K means what `nvidia-smi` calls GPU K.
#
# If a worker exits on its own (crash, CUDA error), the launcher stops the others and exits with a
# non-zero status, so that its supervisor (systemd, a Docker restart policy, Kubernetes) restarts
# the set. The supervisor's stop timeout must cover a worker's shutdown (see deploy/README.md).
set -uo pipefail # no -e: `wait` returns the workers' statuses, which are handled below

VELA2_BIN="${VELA2_BIN:-vela2}"
BASE_PORT="${VELA2_METRICS_PORT:-9464}"

log() { printf 'launch-workers: %s\n' "$*" >&2; }

# The GPUs to use, one a line (an index, a GPU-... or a MIG-... UUID).
visible_gpus() {
    if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
        local entry
        local -a entries
        IFS=',' read -r -a entries <<<"$CUDA_VISIBLE_DEVICES"
        for entry in "${entries[@]}"; do
            entry="${entry//[[:space:]]/}"
            # CUDA stops at the first invalid entry; -1 / NoDevFiles are the usual "no GPU" spellings.
            if [[ -z "$entry" || "$entry" == -1 || "$entry" == NoDevFiles ]]; then
                break
            fi
            printf '%s\n' "$entry"
        done
        return 0
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        log "CUDA_VISIBLE_DEVICES is unset and nvidia-smi is not on PATH: cannot tell which GPUs to use"
        return 1
    fi
    local listing
    if ! listing="$(nvidia-smi -L)"; then
        log "nvidia-smi -L failed"
        return 1
    fi
    # "GPU 0: NVIDIA H200 (UUID: GPU-...)", followed, in MIG mode, by "  MIG 3g.71gb Device 0: (UUID: MIG-...)"
    # lines: a GPU with MIG instances yields its instances, one worker each, instead of itself.
    awk '
        /^GPU [0-9]+:/ { if (gpu != "" && !mig) print gpu; gpu = $2; sub(/:$/, "", gpu); mig = 0; next }
        /^[[:space:]]+MIG / { if (match($0, /UUID: MIG-[^)]+/)) { print substr($0, RSTART + 6, RLENGTH - 6); mig = 1 } }
        END { if (gpu != "" && !mig) print gpu }
    ' <<<"$listing"
}

# Fills the global array GPUS; exits 2 when there is none.
load_gpus() {
    local listing
    listing="$(visible_gpus)" || exit 2
    GPUS=()
    if [[ -n "$listing" ]]; then
        mapfile -t GPUS <<<"$listing"
    fi
    if ((${#GPUS[@]} == 0)); then
        log "no visible GPU (CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES-<unset>}'); nothing to start"
        exit 2
    fi
}

# One HTTP GET of /metrics on 127.0.0.1:$1 with bash's /dev/tcp: no curl or python needed.
probe() {
    timeout 5 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n" >&3
        IFS= read -r status <&3 || exit 1
        [[ "$status" == HTTP/1.?" 200"* ]]
    ' probe "$1" 2>/dev/null
}

health() {
    load_gpus
    local k port
    for k in "${!GPUS[@]}"; do
        port=$((BASE_PORT + k))
        if ! probe "$port"; then
            log "worker $k (GPU ${GPUS[k]}) does not answer on :$port/metrics"
            return 1
        fi
    done
    return 0
}

case "${1:-}" in
--list)
    load_gpus
    printf '%s\n' "${GPUS[@]}"
    exit 0
    ;;
--health)
    health
    exit $?
    ;;
-h | --help)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 0
    ;;
esac

if ((BASH_VERSINFO[0] < 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] < 1))); then
    log "needs bash >= 5.1 (wait -n -p); this is $BASH_VERSION"
    exit 2
fi

load_gpus
export CUDA_DEVICE_ORDER="${CUDA_DEVICE_ORDER:-PCI_BUS_ID}"

PIDS=()
declare -A GPU_OF=()
STOPPING=0

stop_all() {
    STOPPING=1
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
}

# Background jobs of a non-interactive shell ignore SIGINT, so Ctrl-C reaches the workers as SIGTERM
# from here (Celery's warm shutdown either way).
trap 'log "SIGTERM: stopping ${#PIDS[@]} worker(s)"; stop_all' TERM
trap 'log "SIGINT: stopping ${#PIDS[@]} worker(s)"; stop_all' INT

for k in "${!GPUS[@]}"; do
    gpu="${GPUS[k]}"
    port=$((BASE_PORT + k))
    CUDA_VISIBLE_DEVICES="$gpu" VELA2_DEVICE="cuda:0" VELA2_METRICS_PORT="$port" \
        "$VELA2_BIN" worker "$@" --device cuda:0 --metrics-port "$port" &
    PIDS+=("$!")
    GPU_OF[$!]="$gpu"
    log "worker $k: pid $! on GPU $gpu, metrics on :$port"
done

status=0
while ((${#PIDS[@]} > 0)); do
    done_pid=""
    wait -n -p done_pid "${PIDS[@]}"
    rc=$?
    if [[ -z "${done_pid:-}" ]]; then
        continue # a trapped signal interrupted the wait; the trap already forwarded it
    fi
    remaining=()
    for pid in "${PIDS[@]}"; do
        [[ "$pid" == "$done_pid" ]] || remaining+=("$pid")
    done
    PIDS=("${remaining[@]}")
    if ((STOPPING == 0)); then
        # Nobody asked this worker to stop: a failure even with status 0.
        log "worker pid $done_pid (GPU ${GPU_OF[$done_pid]}) exited on its own with status $rc; stopping the others"
        status=$((rc != 0 ? rc : 1))
        stop_all
    elif ((rc != 0 && status == 0)); then
        log "worker pid $done_pid (GPU ${GPU_OF[$done_pid]}) exited with status $rc during shutdown"
        status=$rc
    fi
done
log "all workers stopped (status $status)"
exit "$status"
