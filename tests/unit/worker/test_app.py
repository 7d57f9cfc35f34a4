"""Worker settings (one source: env names, CLI flags, the docs' table), the Celery configuration
they produce, and the visibility-timeout rule."""

from __future__ import annotations

import argparse

import pytest

from vela2.errors import ConfigError
from worker import settings as worker_settings
from worker.app import create_app
from worker.runtime.checks import MIN_VISIBILITY_S, check_visibility, required_visibility_s
from worker.settings import EngineSettings, WorkerSettings, env_name, specs

ENV = {spec.name: spec.env for spec in specs()}


def test_settings_come_from_the_environment_then_overrides(demo_dir):
    env = {
        ENV["redis_url"]: "redis://127.0.0.1:7000/1",
        ENV["checkpoint"]: str(demo_dir),
        ENV["max_batch_tokens"]: "4096",
        ENV["max_wait_ms"]: "7.5",
        ENV["visibility_timeout_s"]: "120",
    }
    s = WorkerSettings.from_env(env, max_wait_ms=3, device=None)
    assert (s.redis_url, s.engine.max_batch_tokens, s.engine.max_wait_ms, s.visibility_timeout_s) == (
        "redis://127.0.0.1:7000/1",
        4096,
        3,
        120.0,
    )
    assert s.device == "cpu" and s.resolved_precision == "fp32" and s.resolved_dtype == "float32"
    assert WorkerSettings(device="cuda:0").resolved_precision == "bf16"
    assert WorkerSettings(device="cuda:0").resolved_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="VELA2_MAX_WAIT_MS must be a number; got 'soon'"):
        WorkerSettings.from_env({ENV["max_wait_ms"]: "soon"})
    with pytest.raises(ConfigError, match="precision must be one of bf16, fp32, fp8; got 'fp16'"):
        WorkerSettings(engine=EngineSettings(precision="fp16")).validate()
    with pytest.raises(ConfigError, match="unknown worker settings"):
        WorkerSettings.from_env({}, max_wait=3)
    assert WorkerSettings.from_env({ENV["idle_wait_s"]: "0.25"}).transport_options()["idle_wait_s"] == 0.25
    for bad in (0.0, 11.0, float("nan")):
        with pytest.raises(ConfigError, match=f"idle_wait_s must be from 0.01 to 10; got {bad}"):
            WorkerSettings(idle_wait_s=bad).validate()


def test_the_online_result_ttl_is_a_setting_of_its_own_validated_as_the_jobs():
    assert (WorkerSettings().online_result_expires_s, WorkerSettings().result_expires_s) == (3_600, 86_400)
    assert env_name("online_result_expires_s") == "VELA2_ONLINE_RESULT_EXPIRES_S"
    s = WorkerSettings.from_env({"VELA2_ONLINE_RESULT_EXPIRES_S": "120", "VELA2_RESULT_EXPIRES_S": "7200"})
    assert (s.online_result_expires_s, s.result_expires_s) == (120, 7_200)
    s.validate()
    WorkerSettings(result_expires_s=60).validate()  # the default online TTL is cut to it (vela2.wire.results)
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=f"online_result_expires_s must be >= 1; got {bad}"):
            WorkerSettings(online_result_expires_s=bad).validate()
    with pytest.raises(ConfigError, match="VELA2_ONLINE_RESULT_EXPIRES_S must be an integer; got '1h'"):
        WorkerSettings.from_env({"VELA2_ONLINE_RESULT_EXPIRES_S": "1h"})
    ap = argparse.ArgumentParser()
    worker_settings.add_arguments(ap)
    args = ap.parse_args(["--online-result-expires-s", "90"])
    assert worker_settings.from_arguments(args).online_result_expires_s == 90


def test_every_setting_has_one_env_name_and_one_flag():
    names = [spec.name for spec in specs()]
    assert len(names) == len(set(names))  # engine knobs and process knobs never share a name
    assert env_name("max_wait_ms") == "VELA2_MAX_WAIT_MS" and env_name("model_name") == "VELA2_MODEL"
    assert all(spec.env.startswith("VELA2_") and spec.help for spec in specs())
    ap = argparse.ArgumentParser()
    worker_settings.add_arguments(ap)
    args = ap.parse_args(["--redis", "redis://h:1/2", "--max-wait-ms", "5", "--row-tokens", "512", "--attn", "flex"])
    s = worker_settings.from_arguments(args)
    assert (s.redis_url, s.engine.max_wait_ms, s.engine.row_tokens, s.attn) == ("redis://h:1/2", 5.0, 512, "flex")
    with pytest.raises(SystemExit):
        ap.parse_args(["--max-batch-tokens", "many"])


def test_the_app_is_json_only_late_ack_solo_with_online_before_backfill(demo_dir):
    s = WorkerSettings(checkpoint=str(demo_dir), visibility_timeout_s=90, max_buffered=64)
    app = create_app(s)
    conf = app.conf
    assert conf.task_serializer == conf.result_serializer == "json"
    assert list(conf.accept_content) == ["json"]
    assert conf.task_acks_late and conf.worker_pool == "solo" and conf.worker_concurrency == 1
    assert conf.worker_prefetch_multiplier == 64
    assert [q.name for q in conf.task_queues] == ["vela2.vela2-demo", "vela2.vela2-demo.backfill"]
    opts = conf.broker_transport_options
    assert opts["queue_order_strategy"] == "priority" and opts["visibility_timeout"] == 90
    assert opts["unacked_restore_interval"] <= 9 and opts["unacked_restore_throttle"] == 1
    assert conf.result_expires == 86_400
    app.close()


def test_the_app_imports_without_a_checkpoint():
    app = create_app(WorkerSettings())
    assert app.conf.task_default_queue == "celery"
    app.close()


def test_the_visibility_rule_names_every_number():
    assert required_visibility_s(20, 1.5) == pytest.approx(0.02 + 4 * 1.5)
    assert required_visibility_s(20, 0.01) == MIN_VISIBILITY_S  # never below the floor
    check_visibility(6.02, 20, 1.5)
    with pytest.raises(ConfigError) as e:
        check_visibility(6.0, 20, 1.5)
    msg = str(e.value)
    for part in ("visibility timeout 6 s is too short", "max(5 s", "max_wait 0.02 s", "4 x worst batch 1.500 s",
                 "= 6.0 s"):
        assert part in msg
