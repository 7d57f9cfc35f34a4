"""The route's settings, declared once (producer.http.settings.Settings): `vela2 http`'s flags are made from
the declaration (each with its help and default), a flag given reaches the Settings of the app that
is served, and a value a setting's check refuses is rejected naming the flag and the value. No
server: uvicorn.run is replaced by a stand-in that keeps the app it is given."""

from __future__ import annotations

import os
import re
from dataclasses import fields
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from producer.http import app as http_app
from producer.http.server import OWN_FLAGS, build_parser
from producer.http.settings import FlagSetting, Settings, flag_settings
from vela2.errors import ConfigError

SPECS = flag_settings()
# a value other than the default for each plain setting of type str (the numbers: derived below)
STRINGS = {"broker_url": "redis://127.0.0.1:6390/1", "host": "localhost", "model": "vela2-other",
           "log_level": "warning", "metrics_path": "/internal/metrics"}


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No VELA2_* / REDIS* variable: a flag's default may come from one."""
    for name in [k for k in os.environ if k.startswith(("VELA2_", "REDIS"))]:
        monkeypatch.delenv(name)


def _other(spec: FlagSetting) -> Any:
    """A valid value of `spec` other than its default."""
    if spec.type is str:
        return STRINGS[spec.name]
    return spec.default * 2 + 1 if spec.type is int else spec.default + 0.25


def test_every_field_has_flags_and_each_plain_setting_one() -> None:
    plain = {s.name for s in SPECS}
    assert {f.name for f in fields(Settings)} == plain | set(OWN_FLAGS)
    assert not plain & set(OWN_FLAGS)
    assert len({s.flag for s in SPECS}) == len(SPECS)
    assert set(STRINGS) == {s.name for s in SPECS if s.type is str}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.flag)
def test_the_help_lists_each_flag_with_its_help_and_default(spec: FlagSetting) -> None:
    parser = build_parser()
    assert parser.get_default(spec.name) == spec.default
    # each option's entry: its "  --flag METAVAR" and its help (on one line, or the next when the flag is long)
    entries = [" ".join(e.split()) for e in re.split(r"\n(?=  -)", parser.format_help())]
    line = next((e for e in entries if e.startswith(f"{spec.flag} {spec.metavar} ")), None)
    assert line is not None, f"{spec.flag} is not in vela2 http --help"
    if spec.help is not None:
        assert spec.help in line
    if spec.default not in (None, False):  # argparse's "(default: X)"; 0 and None are not told (vela2.cli)
        assert re.search(rf"\(?default: {re.escape(str(spec.default))}\)?$", line), line


def _served(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Settings:
    """The Settings of the app `vela2 http ARGV` serves (uvicorn.run replaced: nothing is served)."""
    served: list[FastAPI] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.append(app))
    assert http_app.main(argv) == 0
    (app,) = served
    app.state.vela2.uploads.shutdown()
    settings: Settings = app.state.vela2.settings
    return settings


def test_each_flag_reaches_the_settings_of_the_app_served(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--no-auth"]
    for spec in SPECS:
        argv += [spec.flag, str(_other(spec))]
    settings = _served(monkeypatch, argv)
    for spec in SPECS:
        assert getattr(settings, spec.name) == _other(spec), spec.flag
    assert settings.keys is None


def test_the_defaults_reach_the_settings_and_the_environment_gives_some(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _served(monkeypatch, ["--no-auth"])
    assert all(getattr(settings, spec.name) == spec.default for spec in SPECS)
    monkeypatch.setenv("VELA2_MODEL", "vela2-from-env")
    monkeypatch.setenv("VELA2_BROKER_URL", "redis://127.0.0.1:6391/2")
    settings = _served(monkeypatch, ["--no-auth"])
    assert (settings.model, settings.broker_url) == ("vela2-from-env", "redis://127.0.0.1:6391/2")


@pytest.mark.parametrize("spec", [s for s in SPECS if s.check is not None], ids=lambda s: s.flag)
def test_a_value_its_check_refuses_is_rejected_naming_the_flag_and_the_value(
        spec: FlagSetting, capsys: pytest.CaptureFixture[str]) -> None:
    bad = "0" if spec.check == "> 0" else "-1"
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([spec.flag, bad])
    assert e.value.code == 2
    assert f"argument {spec.flag}: must be {spec.check}; got {bad}" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=rf"^{spec.name} must be {re.escape(spec.check or '')}; got {bad}"):
        Settings(keys=None, **{spec.name: spec.type(bad)})


def test_a_value_not_of_its_type_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--redis-connections", "many"])
    assert "argument --redis-connections: must be an integer; got many" in capsys.readouterr().err


def test_create_app_takes_any_setting_by_name_and_refuses_others() -> None:
    app = http_app.create_app("redis://127.0.0.1:1/0", "vela2-demo", keys=None, timeout_s=3.0,
                              tenant_quotas=None, webhooks=None)
    settings: Settings = app.state.vela2.settings
    app.state.vela2.uploads.shutdown()
    assert (settings.timeout_s, settings.max_wait_s, settings.tenant_quotas) == (3.0, 60.0, {})
    with pytest.raises(TypeError, match="timeout"):
        http_app.create_app(keys=None, timeout=3.0)


def test_the_no_worker_grace_is_off_or_at_least_three_beats(capsys: pytest.CaptureFixture[str]) -> None:
    from producer.liveness import MIN_GRACE_S

    assert build_parser().parse_args(["--no-worker-grace-s", "0"]).no_worker_grace_s == 0  # never
    assert build_parser().parse_args(["--no-worker-grace-s", str(MIN_GRACE_S)]).no_worker_grace_s == MIN_GRACE_S
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--no-worker-grace-s", str(MIN_GRACE_S / 2)])
    assert f"must be 0 (never) or >= {MIN_GRACE_S:g}; got {MIN_GRACE_S / 2:g}" in capsys.readouterr().err
