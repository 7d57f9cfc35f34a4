"""Every setting of a worker process, declared once.

`WorkerSettings` holds the process knobs and, nested, the engine's (`EngineSettings`). From each
field's name, type, default and help come the environment variable (`VELA2_<NAME>`, what
`celery -A worker.app worker` reads), the `vela2 worker` flag (`--name-with-dashes`) and the
settings table of docs/reference/settings.md (`python -m worker.settings` prints it; `python -m
stack.docs_gen --write` rewrites the page, and a test fails when it is stale).
Standard library and vela2.config only: the process harness and the CLI import this module
without celery or torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any

from vela2.config import DEFAULT_MAX_BATCH_TOKENS, LIMITS, PRECISIONS, Vela2Config, default_precision
from vela2.errors import ConfigError
from vela2.wire.results import DEFAULT_ONLINE_RESULT_EXPIRES_S, DEFAULT_RESULT_EXPIRES_S
from vela2.wire.urls import BROKER_SCHEMES, RESULT_STORE_SCHEMES, check_url, read_url_file
from worker.obs.logs import LOG_FORMATS

ENV_PREFIX = "VELA2_"
ATTN_BACKENDS = ("sdpa", "flex")
DTYPES = ("float32", "bfloat16")


def setting(default: Any, help: str, *, env: str | None = None, flag: str | None = None,
            choices: tuple[str, ...] | None = None) -> Any:
    """A settings field: its default, its one-line help, and (rarely) a name other than the rule's."""
    return field(default=default, metadata={"help": help, "env": env, "flag": flag, "choices": choices})


@dataclass(frozen=True)
class EngineSettings:
    """The batching engine's knobs (worker.engine.loop)."""

    max_batch_tokens: int = setting(DEFAULT_MAX_BATCH_TOKENS, "padded tokens (longest x count) per device batch")
    max_wait_ms: float = setting(
        20.0, "longest an online request waits for company while company is on its way (requests in render), "
        "and backfill alone for a full batch; a free device takes online work at once otherwise")
    target_p99_ms: float = setting(
        0.0, "cap each batch at the tokens the device runs in a third of this (a request waits at most a running "
        "batch and its own): lower latency for less throughput; 0: batches up to max_batch_tokens")
    fair_batch_ms: float = setting(
        -1.0, "while one tenant's backlog shares the device with other tenants' requests, cap each batch at this "
        "much device time, so another tenant's request waits at most a short batch (less throughput for the "
        "backlog meanwhile); -1: auto, twice a lone short batch; 0: off (full batches; fair order only)")
    precision: str | None = setting(
        None, "run_batch precision (bf16, fp32, or fp8: opt-in); default bf16 on CUDA, fp32 elsewhere",
        choices=PRECISIONS)
    render_threads: int = setting(2, "CPU threads that render rows ahead of the device and decode results")
    cpu_processes: int = setting(-1, "processes that render rows and decode results instead of the threads "
                                     "(spawned, each with the tokenizer); -1: auto (on a GPU min(4, cores - 2), "
                                     "on a CPU 0); 0: threads")
    max_message_bytes: int = setting(LIMITS.max_message_bytes, "larger messages get a limit_exceeded error")
    row_tokens: int = setting(0, "pack several short sequences per row of this many tokens; 0: one per row")
    max_attempts: int = setting(3, "deliveries a request may crash a worker in before it is dead-lettered")
    attempts_ttl_s: int = setting(86_400, "TTL of a request's attempt counter (outlives many redeliveries)")
    wait_replicas: int = setting(0, "ack a message only once this many replicas of the result store's Redis hold "
                                    "its results (Redis WAIT; Sentinel: a failover then cannot lose an answer whose "
                                    "message was acked; at start the worker waits redis_wait_s for that many "
                                    "replicas to be connected, else refuses to start); 0: the master's reply is enough")


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker process needs; `from_env()` reads the VELA2_* variables."""

    redis_url: str = setting("redis://127.0.0.1:6379/0", "result store URL (results, attempt counters, dead "
                                                        "letters, heartbeats; redis://, rediss://, unix://, or "
                                                        "sentinel://...?master_name=NAME); also the broker unless "
                                                        "broker_url",
                             flag="--redis")
    redis_url_file: str | None = setting(None, "read the Redis URL from this file's first line (keeps a password "
                                               "off the command line); wins over redis_url")
    broker_url: str | None = setting(None, "broker URL (redis://, rediss://, sentinel://...?master_name=NAME, or "
                                           "amqp:// for RabbitMQ); default: redis_url", flag="--broker")
    broker_url_file: str | None = setting(None, "read the broker URL from this file's first line; wins over "
                                                "broker_url")
    checkpoint: str | None = setting(None, "checkpoint directory (required)")
    device: str = setting("cpu", "cuda:0, cpu, ...: one worker process per device")
    dtype: str | None = setting(None, "backbone dtype; default float32 for fp32, else bfloat16", choices=DTYPES)
    visibility_timeout_s: float = setting(3600.0, "a dead worker's messages return to the queue after this long "
                                                  "(a live worker renews what it holds)")
    max_buffered: int = setting(2048, "messages the worker holds at once (the broker prefetch count); one "
                                      "full batch of short online rows is ~500, and the engine renders the "
                                      "next ones while the device runs")
    result_expires_s: int = setting(DEFAULT_RESULT_EXPIRES_S, "TTL of the stored results of bulk jobs' lines (read "
                                                              "back when the job ends)")
    online_result_expires_s: int = setting(DEFAULT_ONLINE_RESULT_EXPIRES_S,
                                           "TTL of the stored results of every other request (online, backfill: "
                                           "read by their waiters within seconds); at most result_expires_s (a "
                                           "longer one is cut to it)")
    shutdown_timeout_s: float = setting(60.0, "warm shutdown: finish what is held within this, return the rest")
    idle_wait_s: float = setting(1.0, "an idle worker waits on its model's doorbell (rung by our producers' "
                                      "pushes onto an empty list: those are taken at once) at most this long, then "
                                      "looks at every "
                                      "queue list: the longest a message pushed without it (plain Celery "
                                      "send_task, kombu's priority sub-lists) waits on an idle worker; 0.01-10")
    metrics_port: int = setting(0, "serve Prometheus metrics on this port; 0: off")
    metrics_host: str = setting("127.0.0.1", "interface the metrics are served on (0.0.0.0: every interface, "
                                             "e.g. inside a container scraped over its network)")
    redis_wait_s: float = setting(60.0, "at start, wait this long for Redis to answer, then exit non-zero")
    model_name: str | None = setting(None, "queue naming; default the checkpoint's name", env="VELA2_MODEL",
                                     flag="--model")
    hostname: str | None = setting(
        None, "the worker's Celery node name, as Flower, celery inspect, vela2 status and the heartbeats name it "
        "(Celery's rules: %h, %n and %d expand; a name without @ is a host, celery@NAME); default "
        "vela2-MODEL-DEVICE-PID@%h, unique per model, device and process on a host")
    attn: str = setting("sdpa", "attention backend: sdpa (dense tree mask) or flex (block-sparse, compiled)",
                        choices=ATTN_BACKENDS)
    batch_invariant: int = setting(
        0, "1: batch-invariant mode: every answer the same bits whatever it is batched with (token-wise work in "
        "fixed chunks, attention per sequence; Llama-style backbones only); costs throughput (docs: Reproducible "
        "answers)")
    compile_cache_dir: str | None = setting(
        None, "directory for torch.compile's inductor and Triton caches: mount a volume that survives restarts "
        "and a restarted worker reuses its compiled kernels; default torch's own (under /tmp, lost with the "
        "container)")
    verify_mb_s: float = setting(
        400.0, "read rate (MB/s) of the background check of a checkpoint's weights against its manifest.json "
        "once the worker serves (a file that differs stops the worker taking work); 0: trust the manifest")
    random_weights: int = setting(0, "1: seeded random weights instead of the stored ones (benchmarks only)")
    device_process: int = setting(-1, "1: run the model in a spawned process of its own (no other thread there "
                                      "takes the GIL its kernel launches need); 0: in a thread of the worker "
                                      "process; -1: auto (1 on a GPU, 0 on a CPU)")
    switch_interval_ms: float = setting(0.5, "Python's thread switch interval (sys.setswitchinterval; Python's "
                                             "default is 5): a thread of the worker process (the device thread "
                                             "too, where the model runs in one) waits at most this for the GIL")
    task_events: int = setting(0, "1: send Celery task events for Flower (also on with `celery worker -E`)")
    log_format: str = setting("text", "text: Celery's log lines; json: one JSON object per line (with the "
                                      "request id where a line is about one request)", choices=LOG_FORMATS)
    allow_mixed: int = setting(0, "1: start even while another live worker serves the same model name from a "
                                  "checkpoint with another digest (a rolling upgrade); 0: refuse to start")
    engine: EngineSettings = field(default_factory=EngineSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> WorkerSettings:
        """Settings from VELA2_* variables, then `overrides` (flat names, e.g. max_wait_ms=5) that are
        not None (CLI flags)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for spec in specs():
            raw = env.get(spec.env)
            if raw is not None and raw != "":
                values[spec.name] = spec.parse(raw, spec.env)
        unknown = set(overrides) - {s.name for s in specs()}
        if unknown:
            raise ConfigError(f"unknown worker settings {sorted(unknown)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        if values.get("redis_url_file"):
            values["redis_url"] = read_url_file(values["redis_url_file"])
        if values.get("broker_url_file"):
            values["broker_url"] = read_url_file(values["broker_url_file"])
        return cls.from_flat(values)

    @classmethod
    def from_flat(cls, values: Mapping[str, Any]) -> WorkerSettings:
        """Settings from flat names (engine knobs beside process knobs)."""
        engine_names = {f.name for f in fields(EngineSettings)}
        engine = EngineSettings(**{k: v for k, v in values.items() if k in engine_names})
        return cls(**{k: v for k, v in values.items() if k not in engine_names}, engine=engine)

    @property
    def resolved_broker_url(self) -> str:
        """The broker's URL: broker_url, else the result store's (one Redis for both)."""
        return self.broker_url or self.redis_url

    @property
    def resolved_precision(self) -> str:
        return self.engine.precision or default_precision(self.device)

    @property
    def resolved_dtype(self) -> str:
        if self.dtype:
            return self.dtype
        # the same rule as every other serving path (vela2.model.checkpoint.serving_dtype)
        return "float32" if self.resolved_precision == "fp32" else "bfloat16"

    def engine_settings(self) -> EngineSettings:
        """The engine's knobs with the precision resolved for this device."""
        return replace(self.engine, precision=self.resolved_precision)

    def resolved_model_name(self) -> str:
        """The model name the queues are named after (reads the checkpoint's config.json)."""
        if self.model_name:
            return self.model_name
        if not self.checkpoint:
            raise ConfigError(f"no checkpoint: pass --checkpoint or set {env_name('checkpoint')}")
        return Vela2Config.read(self.checkpoint).name

    def resolved_cpu_processes(self) -> int:
        """How many render / decode processes to start (cpu_processes, with -1 resolved)."""
        n = self.engine.cpu_processes
        if n >= 0:
            return n
        if not self.device.startswith("cuda"):
            return 0
        return max(1, min(4, (os.cpu_count() or 2) - 2))

    def resolved_device_process(self) -> bool:
        """Whether the model runs in a process of its own (device_process, with -1 resolved)."""
        if self.device_process >= 0:
            return bool(self.device_process)
        return self.device.startswith("cuda")

    def validate(self) -> None:
        """Raise ConfigError naming the first inconsistent setting (a URL of the wrong scheme included,
        its password masked)."""
        check_url(self.redis_url, "result store", RESULT_STORE_SCHEMES)
        check_url(self.resolved_broker_url, "broker", BROKER_SCHEMES)
        for spec in specs():
            value = spec.get(self)
            if spec.choices and value is not None and value not in spec.choices:
                raise ConfigError(f"{spec.name} must be one of {', '.join(spec.choices)}; got {value!r}")
        for name in ("max_batch_tokens", "max_buffered", "render_threads", "result_expires_s",
                     "online_result_expires_s", "max_attempts", "max_message_bytes", "attempts_ttl_s"):
            if _get(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1; got {_get(self, name)}")
        for name in ("max_wait_ms", "target_p99_ms", "shutdown_timeout_s", "row_tokens", "metrics_port",
                     "redis_wait_s"):
            if _get(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0; got {_get(self, name)}")
        if self.engine.fair_batch_ms < 0 and self.engine.fair_batch_ms != -1:
            raise ConfigError(f"fair_batch_ms must be >= 0 (or -1: auto); got {self.engine.fair_batch_ms}")
        if self.engine.cpu_processes < -1:
            raise ConfigError(f"cpu_processes must be >= -1 (-1: auto); got {self.engine.cpu_processes}")
        if self.device_process not in (-1, 0, 1):
            raise ConfigError(f"device_process must be -1 (auto), 0 or 1; got {self.device_process}")
        if self.switch_interval_ms <= 0:
            raise ConfigError(f"switch_interval_ms must be > 0; got {self.switch_interval_ms}")
        if not 0.01 <= self.idle_wait_s <= 10:  # NaN fails this too
            raise ConfigError(f"idle_wait_s must be from 0.01 to 10; got {self.idle_wait_s}")
        if self.visibility_timeout_s <= 0:
            raise ConfigError(f"visibility_timeout_s must be > 0; got {self.visibility_timeout_s}")

    def transport_options(self) -> dict[str, Any]:
        """kombu Redis transport options: priority queue order, visibility timeout, and a restore
        sweep often enough that a dead worker's messages come back soon after the timeout."""
        return {
            "visibility_timeout": self.visibility_timeout_s,
            "queue_order_strategy": "priority",
            "unacked_restore_interval": max(1, min(10, int(self.visibility_timeout_s // 10))),
            "unacked_restore_throttle": 1,
            "idle_wait_s": self.idle_wait_s,  # worker.transport.redis.IDLE_WAIT_OPTION
        }


# --- what is derived from the fields ---------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One flat setting: its name, type, default, help, environment variable and flag."""

    name: str
    type: type
    optional: bool
    default: Any
    help: str
    env: str
    flag: str
    choices: tuple[str, ...] | None
    nested: bool  # an engine knob (WorkerSettings.engine.<name>)

    def get(self, settings: WorkerSettings) -> Any:
        return getattr(settings.engine if self.nested else settings, self.name)

    def parse(self, raw: str, source: str) -> Any:
        """A string (environment, command line) as this setting's type; ConfigError naming `source`."""
        if self.type is str:
            return raw
        try:
            return self.type(raw)
        except ValueError:
            raise ConfigError(f"{source} must be {'an integer' if self.type is int else 'a number'}; "
                              f"got {raw!r}") from None


_TYPES = {"int": int, "float": float, "str": str, "int | None": int, "float | None": float, "str | None": str}


def _spec(f: Field, nested: bool) -> Spec:
    kind = str(f.type)
    default = f.default if f.default is not MISSING else None
    meta = f.metadata
    return Spec(
        name=f.name,
        type=_TYPES[kind],
        optional=kind.endswith("| None"),
        default=default,
        help=meta["help"],
        env=meta.get("env") or ENV_PREFIX + f.name.upper(),
        flag=meta.get("flag") or "--" + f.name.replace("_", "-"),
        choices=meta.get("choices"),
        nested=nested,
    )


def specs() -> Iterator[Spec]:
    """Every flat setting, process knobs first, then the engine's."""
    for f in fields(WorkerSettings):
        if f.name != "engine":
            yield _spec(f, nested=False)
    for f in fields(EngineSettings):
        yield _spec(f, nested=True)


def _get(settings: WorkerSettings, name: str) -> Any:
    return next(s for s in specs() if s.name == name).get(settings)


def env_name(name: str) -> str:
    """The environment variable of a flat setting (`max_wait_ms` -> `VELA2_MAX_WAIT_MS`)."""
    for spec in specs():
        if spec.name == name:
            return spec.env
    raise KeyError(f"no worker setting {name!r}")


def to_env(values: Mapping[str, Any]) -> dict[str, str]:
    """Flat settings as the environment of a worker process (None values are left out)."""
    return {env_name(k): str(v) for k, v in values.items() if v is not None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, default None (unset flags leave the environment's value)."""
    for spec in specs():
        default = "" if spec.default is None else f"; default {spec.default}"
        parser.add_argument(spec.flag, dest=spec.name, type=_flag_parser(spec), choices=spec.choices, default=None,
                            help=f"{spec.help} (${spec.env}{default})".replace("%", "%%"))


def _flag_parser(spec: Spec) -> Any:
    def parse(raw: str) -> Any:
        try:
            return spec.parse(raw, spec.flag)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def from_arguments(args: argparse.Namespace) -> WorkerSettings:
    """Settings from parsed flags over the VELA2_* environment."""
    return WorkerSettings.from_env(**{spec.name: getattr(args, spec.name) for spec in specs()})


def markdown_table() -> str:
    """The settings table of the docs (docs/reference/settings.md): name, flag, variable, default, help."""
    lines = ["| setting | flag | environment | default | what |", "|---|---|---|---|---|"]
    for spec in specs():
        default = "—" if spec.default is None else f"`{spec.default}`"
        lines.append(f"| `{spec.name}` | `{spec.flag}` | `{spec.env}` | {default} | {spec.help} |")
    return "\n".join(lines)


if __name__ == "__main__":
    # `python -m worker.settings` prints the table (stack.docs_gen writes it into the docs)
    sys.stdout.write(markdown_table() + "\n")
