"""The kombu and Celery internals the worker relies on (worker.transport.internals) are as it relies
on them in the installed (pinned) versions; a change is named in one line."""

from __future__ import annotations

import inspect

import pytest

from worker.transport import internals
from worker.transport.internals import INTERNALS, Internal, problem, problems


@pytest.mark.parametrize("internal", INTERNALS, ids=lambda i: i.path)
def test_every_internal_we_touch_is_as_we_rely_on_it(internal: Internal) -> None:
    assert problem(internal) is None


def test_a_change_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from kombu.transport import redis as kombu_redis

    def _brpop_read(self, timeout):  # an upgrade that changed the signature
        return None

    monkeypatch.setattr(kombu_redis.Channel, "_brpop_read", _brpop_read)
    monkeypatch.delattr(kombu_redis.Channel, "_brpop_start")
    found = problems()
    assert len(found) == 2
    assert found[1].startswith("kombu.transport.redis:Channel._brpop_read takes (self, timeout), not (self, options)")
    assert found[0].startswith("kombu.transport.redis:Channel._brpop_start is gone (kombu ")
    assert all("\n" not in line for line in found)


def test_the_overrides_of_the_transport_are_all_listed() -> None:
    """Every kombu method worker.transport.redis overrides is in the list (a new override must be
    added there, or an upgrade could change it unnoticed)."""
    from kombu.transport import redis as kombu_redis

    from worker.transport.redis import TolerantChannel, TolerantQoS

    listed = {i.path for i in INTERNALS}
    for ours, theirs, prefix in ((TolerantChannel, kombu_redis.Channel, "Channel"),
                                 (TolerantQoS, kombu_redis.QoS, "QoS")):
        overridden = {n for n, v in vars(ours).items() if inspect.isfunction(v) and hasattr(theirs, n)}
        assert overridden, ours
        missing = sorted(n for n in overridden if f"{internals.REDIS}:{prefix}.{n}" not in listed)
        assert missing == []
