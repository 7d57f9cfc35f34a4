"""vela2.wire.urls: the Redis URL from a file, passwords spotted in argv, masking, sentinel:// URLs and
their own passwords, and the settings that read them."""

from __future__ import annotations

import logging

import pytest

from vela2.errors import ConfigError
from vela2.wire.urls import (
    BROKER_SCHEMES,
    PASSWORD_IN_ARGV,
    RESULT_STORE_SCHEMES,
    check_url,
    has_password,
    mask_url,
    parse_sentinel_url,
    read_url_file,
    url_from_args,
    warn_if_password_in_argv,
)
from worker.settings import WorkerSettings


def test_read_url_file(tmp_path):
    f = tmp_path / "url"
    f.write_text("  redis://:s3cret@10.0.0.5:6380/2  \nignored\n")
    assert read_url_file(f) == "redis://:s3cret@10.0.0.5:6380/2"
    f.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_url_file(f)
    with pytest.raises(ConfigError, match="cannot read the Redis URL file"):
        read_url_file(tmp_path / "missing")


@pytest.mark.parametrize(("url", "secret"), [
    ("redis://:pw@host:6379/0", True), ("rediss://user:pw@host/1", True), ("redis://host/0?password=pw", True),
    ("redis://user@host/0", False), ("redis://127.0.0.1:6379/0", False), ("unix:///tmp/r.sock", False),
])
def test_has_password(url, secret):
    assert has_password(url) is secret


def test_a_password_in_argv_is_warned_about_once(caplog):
    log = logging.getLogger("test.redis_url")
    argv = ["in.jsonl", "out.jsonl", "--redis", "redis://:pw@h:6379/0"]
    with caplog.at_level(logging.WARNING, logger="test.redis_url"):
        assert warn_if_password_in_argv(argv, log)
        assert warn_if_password_in_argv(argv, log)  # the same argv: no second line
        assert warn_if_password_in_argv(["--redis=redis://:pw@h/1"], log)
        assert not warn_if_password_in_argv(["--redis", "redis://h:6379/0"], log)
    assert [r.getMessage() for r in caplog.records] == [PASSWORD_IN_ARGV, PASSWORD_IN_ARGV]


def test_the_file_wins_over_the_flag(tmp_path):
    f = tmp_path / "url"
    f.write_text("redis://:pw@from-file:6379/0\n")
    log = logging.getLogger("test.redis_url")
    assert url_from_args("redis://flag:6379/0", str(f), [], log) == "redis://:pw@from-file:6379/0"
    assert url_from_args("redis://flag:6379/0", None, [], log) == "redis://flag:6379/0"


def test_worker_settings_read_the_url_file(tmp_path):
    f = tmp_path / "url"
    f.write_text("redis://:pw@from-file:6379/3\n")
    env = {"VELA2_REDIS_URL": "redis://env:6379/0", "VELA2_REDIS_URL_FILE": str(f)}
    assert WorkerSettings.from_env(env).redis_url == "redis://:pw@from-file:6379/3"
    assert WorkerSettings.from_env({"VELA2_REDIS_URL": "redis://env:6379/0"}).redis_url == "redis://env:6379/0"
    with pytest.raises(ConfigError, match="cannot read the Redis URL file"):
        WorkerSettings.from_env({"VELA2_REDIS_URL_FILE": str(tmp_path / "missing")})
    assert WorkerSettings().metrics_host == "127.0.0.1"


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:s3cret@host:6379/0", "redis://:**@host:6379/0"),
    ("amqp://guest:s3cret@mq:5672/vela", "amqp://guest:**@mq:5672/vela"),
    ("redis://host/0?password=s3cret&db=1", "redis://host/0?password=**&db=1"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
])
def test_mask_url_hides_the_password_only(url, shown):
    assert mask_url(url) == shown


@pytest.mark.parametrize(("url", "problem"), [
    ("foo://u:s3cret@host/0", "has scheme 'foo'"),
    ("127.0.0.1:6379", "has scheme"),
    ("redis://:s3cret@/0", "names no host"),
    ("redis://:s3cret@host:notaport/0", "is not a valid URL"),
])
def test_check_url_refuses_with_the_url_masked(url, problem):
    with pytest.raises(ConfigError, match=problem) as e:
        check_url(url, "broker", BROKER_SCHEMES)
    assert "the broker URL" in str(e.value) and "s3cret" not in str(e.value)


def test_worker_settings_check_both_urls():
    assert WorkerSettings(redis_url="redis://a:6379/0").resolved_broker_url == "redis://a:6379/0"
    split = WorkerSettings(redis_url="redis://a:6379/0", broker_url="redis://b:6379/1")
    assert split.resolved_broker_url == "redis://b:6379/1"
    split.validate()
    with pytest.raises(ConfigError, match="the broker URL 'nats://b:4222'"):
        WorkerSettings(redis_url="redis://a:6379/0", broker_url="nats://b:4222").validate()
    with pytest.raises(ConfigError, match="the result store URL 'http://a'"):
        WorkerSettings(redis_url="http://a").validate()


def test_broker_url_from_env_and_file(tmp_path):
    f = tmp_path / "broker"
    f.write_text("redis://:pw@b:6379/3\n")
    env = {"VELA2_BROKER_URL": "redis://x:6379/0", "VELA2_BROKER_URL_FILE": str(f)}
    assert WorkerSettings.from_env(env).broker_url == "redis://:pw@b:6379/3"
    assert WorkerSettings.from_env({"VELA2_BROKER_URL": "redis://x:6379/0"}).broker_url == "redis://x:6379/0"
    assert WorkerSettings.from_env({}).broker_url is None


SENTINEL = "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://10.0.0.2:26380?master_name=main"


def test_a_sentinel_url_is_read_masked_and_checked():
    s = parse_sentinel_url(SENTINEL)
    assert s.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380)) and s.master_name == "main"
    assert (s.db, s.password, s.username) == (2, "s3cret", None) and "s3cret" not in repr(s)
    assert s.kombu_url() == "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://:s3cret@10.0.0.2:26380/2"
    assert mask_url(SENTINEL) == "sentinel://:**@10.0.0.1:26379/2;sentinel://10.0.0.2:26380?master_name=main"
    assert has_password(SENTINEL) and not has_password("sentinel://h1;sentinel://h2?master_name=m")
    assert check_url(SENTINEL, "broker", BROKER_SCHEMES) == SENTINEL
    assert check_url(SENTINEL, "result store", RESULT_STORE_SCHEMES) == SENTINEL
    assert parse_sentinel_url("sentinel://h?master_name=m").sentinels == (("h", 26379),)  # the default port
    assert s.sentinel_password is None and s.sentinel_kwargs() == {}


def test_the_sentinels_own_password_is_read_and_masked():
    url = "sentinel://:m4ster@h1:26379;sentinel://h2?master_name=main&sentinel_password=s3ntinel"
    s = parse_sentinel_url(url)
    assert (s.password, s.sentinel_password, s.master_name) == ("m4ster", "s3ntinel", "main")
    assert s.sentinel_kwargs() == {"password": "s3ntinel"} and "s3ntinel" not in repr(s)
    assert "s3ntinel" not in s.kombu_url()  # kombu takes it in the sentinel_kwargs transport option
    shown = mask_url(url)
    assert shown == "sentinel://:**@h1:26379;sentinel://h2?master_name=main&sentinel_password=**"
    assert has_password("sentinel://h1?master_name=m&sentinel_password=x")
    with pytest.raises(ConfigError, match="gives 2 different sentinel_password values"):
        parse_sentinel_url("sentinel://h1?master_name=m&sentinel_password=a;sentinel://h2?sentinel_password=b")


@pytest.mark.parametrize(("url", "problem"), [
    ("sentinel://:s3cret@h1:26379", "'sentinel://:**@h1:26379' names no master: add ?master_name=NAME"),
    ("sentinel://:s3cret@?master_name=m", "'sentinel://:**@?master_name=m' has a segment that names no sentinel host"),
    ("sentinel://h1?master_name=m;redis://:s3cret@h2", "mixes schemes"),
    ("sentinel://h1:x?master_name=m", "is not a valid URL"),
    ("sentinel://h1/a?master_name=m", "has db 'a'; expected a number"),
    ("sentinel://h1?master_name=a;sentinel://h2?master_name=b", "gives 2 different master_name values"),
])
def test_bad_sentinel_urls_are_refused_with_the_password_masked(url, problem):
    with pytest.raises(ConfigError, match="the broker URL") as e:
        check_url(url, "broker", BROKER_SCHEMES)
    assert problem in str(e.value) and "s3cret" not in str(e.value)


def test_worker_settings_take_sentinel_urls():
    WorkerSettings(redis_url=SENTINEL).validate()
    WorkerSettings(redis_url="redis://h:6379/0", broker_url=SENTINEL).validate()
    with pytest.raises(ConfigError, match="result store URL 'sentinel://:\\*\\*@h' names no master"):
        WorkerSettings(redis_url="sentinel://:pw@h").validate()


def test_a_semicolon_splits_only_sentinel_urls():
    assert mask_url("redis://:pa;ss@host:6379/0") == "redis://:**@host:6379/0"
    assert has_password("redis://:pa;ss@host:6379/0")
