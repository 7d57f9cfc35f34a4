"""Redis Sentinel URLs without a sentinel: the worker app and the client are built for them."""

from __future__ import annotations

import pytest

from producer.client import Client
from worker.app import create_app
from worker.settings import WorkerSettings

MODEL = "vela2-demo"


def test_the_worker_app_takes_sentinel_urls_for_broker_and_backend(demo_dir):
    url = "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://10.0.0.2?master_name=main"
    app = create_app(WorkerSettings(redis_url=url, checkpoint=str(demo_dir)))
    assert app.conf.broker_transport == "worker.transport.redis:SentinelTransport"
    assert app.conf.broker_transport_options["master_name"] == "main"
    assert app.conf.broker_transport_options["queue_order_strategy"] == "priority"  # the Redis options kept
    assert app.conf.result_backend_transport_options == {"master_name": "main", "sentinel_kwargs": {}}
    assert app.conf.broker_url == "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://:s3cret@10.0.0.2:26379/2"
    assert "s3cret" not in app.backend.as_uri()
    guarded = create_app(WorkerSettings(redis_url=url + "&sentinel_password=s3ntinel", checkpoint=str(demo_dir)))
    assert guarded.conf.broker_transport_options["sentinel_kwargs"] == {"password": "s3ntinel"}
    assert guarded.conf.result_backend_transport_options["sentinel_kwargs"] == {"password": "s3ntinel"}


# --- failovers during a run -------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["sentinel://h1;sentinel://h2:26380/3?master_name=m"])
def test_client_builds_a_sentinel_master_client(url):
    client = Client(url, model=MODEL)
    pool = client.redis.connection_pool
    assert pool.service_name == "m" and pool.connection_kwargs["db"] == 3
    assert [(c.connection_pool.connection_kwargs["host"], c.connection_pool.connection_kwargs["port"])
            for c in pool.sentinel_manager.sentinels] == [("h1", 26379), ("h2", 26380)]
