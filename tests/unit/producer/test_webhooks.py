"""producer.webhooks without processes: the signature against the Standard Webhooks reference vector,
the allowlist's matching, and the event of each ended status."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from producer.webhooks import WebhookPolicy, event, new_secret, sign
from vela2.errors import ConfigError


def test_the_signature_matches_the_standard_webhooks_reference_vector():
    # the reference example of the Standard Webhooks specification (and its libraries' tests)
    got = sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330,
               b'{"test": 2432232314}')
    assert got == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert new_secret().startswith("whsec_") and new_secret() != new_secret()


def test_the_allowlist_names_origins_exactly():
    policy = WebhookPolicy(("https://hooks.example.com", "https://*.corp.example", "http://127.0.0.1:8080",
                            "http://10.0.0.7:*"), secret=new_secret())
    allowed = ["https://hooks.example.com/a?b=1", "https://HOOKS.example.com:443/", "https://x.corp.example/h",
               "http://127.0.0.1:8080/h", "http://10.0.0.7:9999/h"]
    refused = ["http://hooks.example.com/a", "https://hooks.example.com:8443/", "https://hooks.example.com.evil.io/",
               "https://corp.example/", "http://127.0.0.1:8081/", "http://127.0.0.1/", "https://u:p@hooks.example.com/",
               "ftp://hooks.example.com/", "hooks.example.com", "", None, 42, "https://hooks.example.com:99999/"]
    assert [policy.problem(u, None) for u in allowed] == [None] * len(allowed)
    assert all(policy.problem(u, None) is not None for u in refused)
    assert "--webhook-allow" in WebhookPolicy((), new_secret()).problem("https://hooks.example.com/", None)
    assert "secret" in WebhookPolicy(("https://hooks.example.com",)).problem("https://hooks.example.com/", None)
    tenant_only = WebhookPolicy(("https://hooks.example.com",), tenant_secrets={"acme": new_secret()})
    assert tenant_only.problem("https://hooks.example.com/", "acme") is None
    assert tenant_only.problem("https://hooks.example.com/", "beta") is not None  # no secret of its own
    with pytest.raises(ConfigError, match="--webhook-allow 'hooks.example.com/path'"):
        WebhookPolicy(("hooks.example.com/path",))


def test_each_ended_status_has_its_event_and_one_id_for_every_attempt():
    for status in ("completed", "failed", "expired", "cancelled"):
        info = SimpleNamespace(id="batch_1", status=status, ended_at=1700000000.5, beat=None, created_at=1.0)
        evt = event(info)
        assert evt["type"] == f"batch.{status}" and evt["data"] == {"id": "batch_1"} and evt["object"] == "event"
        assert evt["created_at"] == 1700000000 and evt == event(info) and evt["id"].startswith("evt_")
    with pytest.raises(KeyError):
        event(SimpleNamespace(id="b", status="in_progress", ended_at=None, beat=None, created_at=1.0))
