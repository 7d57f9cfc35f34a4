"""producer.auth: keys files, hashing, and what a header gets (the route itself: test_producer_http)."""

from __future__ import annotations

import json
import re

import pytest

from producer.auth import ApiKey, KeyRing, Refusal, hash_key, main, new_key
from vela2.errors import ConfigError


def test_new_keys_check_and_are_scoped_to_their_models():
    key_a, a = new_key("acme")
    key_b, b = new_key("beta", ["vela2-9b"])
    assert key_a != key_b and key_a.startswith("vela2_") and a.sha256 == hash_key(key_a)
    ring = KeyRing.parse(a.line() + "\n# a comment\n\n" + b.line() + "\n", "keys")
    assert ring.check(f"Bearer {key_a}", "vela2-demo") == a
    assert ring.check(f"bearer  {key_b} ", "vela2-9b") == b
    refused = ring.check(f"Bearer {key_b}", "vela2-demo")
    assert isinstance(refused, Refusal) and refused.status == 403 and "tenant 'beta'" in refused.message
    for header in (None, "", "Bearer", "Basic abc", f"Token {key_a}", "Bearer nope", "Bearer " + "x" * 10_000):
        r = ring.check(header, "vela2-demo")
        assert isinstance(r, Refusal) and r.status == 401 and r.type == "unauthorized", header


def test_only_hashes_are_stored():
    key, entry = new_key("acme")
    assert key not in entry.line() and json.loads(entry.line()) == {"tenant": "acme", "sha256": hash_key(key)}


@pytest.mark.parametrize(("line", "why"), [
    ("not json", "not JSON"),
    ('{"tenant": "a"}', "sha256 must be 64"),
    ('{"tenant": "", "sha256": "' + "0" * 64 + '"}', "a tenant name is 1-64 characters"),
    ('{"tenant": "a/b", "sha256": "' + "0" * 64 + '"}', "a tenant name is 1-64 characters"),
    ('{"tenant": "a", "sha256": "' + "A" * 64 + '"}', "sha256 must be 64"),
    ('{"tenant": "a", "sha256": "' + "0" * 64 + '", "models": "m"}', "models must be a list"),
    ('{"tenant": "a", "sha256": "' + "0" * 64 + '", "key": "k"}', "an object with tenant"),
])
def test_a_bad_keys_line_is_refused_naming_its_line(line, why):
    with pytest.raises(ConfigError, match=f"keys line 2: {why}"):
        KeyRing.parse("\n" + line, "keys")


def test_keys_from_a_file_and_the_environment(tmp_path):
    _, a = new_key("acme")
    _, b = new_key("beta")
    f = tmp_path / "keys.jsonl"
    f.write_text(a.line() + "\n")
    ring = KeyRing.load(None, {"VELA2_API_KEYS_FILE": str(f), "VELA2_API_KEYS": b.line()})
    assert [k.tenant for k in ring.keys] == ["acme", "beta"]
    assert len(KeyRing.load(None, {})) == 0
    with pytest.raises(ConfigError, match="cannot read the API keys file"):
        KeyRing.load(str(tmp_path / "missing"), {})


def test_the_new_command_prints_the_key_then_its_line(capsys):
    assert main(["new", "acme", "--models", "vela2-demo,vela2-9b"]) == 0
    key, line = capsys.readouterr().out.splitlines()
    entry = json.loads(line)
    assert entry == {"tenant": "acme", "sha256": hash_key(key), "models": ["vela2-9b", "vela2-demo"]}
    ring = KeyRing.parse(line, "out")
    assert isinstance(ring.check(f"Bearer {key}", "vela2-demo"), ApiKey)


def test_quotas_in_the_keys_file_are_read_and_checked():
    from producer.quotas import Quotas

    digest = "a" * 64
    ring = KeyRing.parse(f'{{"tenant": "acme", "sha256": "{digest}", "quotas": {{"requests_per_s": 50}}}}', "k")
    assert ring.keys[0].quotas == Quotas(requests_per_s=50)
    assert KeyRing.parse(ring.keys[0].line(), "again").keys[0] == ring.keys[0]  # the line round-trips
    for quotas, message in [('{"requests_per_s": 0}', "quotas.requests_per_s must be a positive integer; got 0"),
                            ('{"requests_per_s": 1.5}', "must be a positive integer; got 1.5"),
                            ('{"tokens": 5}',
                             "unknown quotas ['tokens']; known: ['job_lines', 'live_jobs', 'queued', 'requests_per_s', "
                             "'stored_bytes', 'tokens_per_s']"),
                            ('[5]', "quotas must be an object")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            KeyRing.parse(f'{{"tenant": "acme", "sha256": "{digest}", "quotas": {quotas}}}', "k")
