"""The route's GET /metrics (producer.http.metrics): every request counted by route template, method and
status with its duration, labels bounded whatever callers send (no ids, no raw paths, no made-up
methods), no API key needed, left out of the OpenAPI document, and off with an empty --metrics-path."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from producer.auth import KeyRing, new_key
from producer.http.app import create_app
from producer.testing import assert_ok

MODEL = "vela2-demo"
S1 = {"model": MODEL, "id": "s-metrics-1", "input": {"user": "Where is my refund?"},
      "tasks": [{"name": "intent", "kind": "choice", "options": ["refund", "other"]}]}


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, its labels): value} of a Prometheus text."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def labels(**kw: str) -> frozenset:
    return frozenset(kw.items())


def test_every_request_is_counted_by_its_route_template_method_and_status(vela2_redis, vela2_fake_worker):
    with TestClient(create_app(vela2_redis.url, MODEL, keys=None)) as http:
        assert_ok(http.post("/v1/system_one", json=S1).json())
        assert http.get(f"/v1/results/{S1['id']}").status_code == 200
        assert http.post("/v1/system_one", json={**S1, "tasks": []}).status_code == 422
        assert http.get("/no/such/path/s-secret-id").status_code == 404
        assert http.request("BREW", "/healthz").status_code == 405
        got = http.get("/metrics")
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
    assert "s-metrics-1" not in got.text and "s-secret-id" not in got.text and "BREW" not in got.text
    found = samples(got.text)
    count = "vela2_http_requests_total"
    assert found[(count, labels(route="/v1/system_one", method="POST", status="200"))] == 1
    assert found[(count, labels(route="/v1/system_one", method="POST", status="422"))] == 1
    assert found[(count, labels(route="/v1/results/{request_id}", method="GET", status="200"))] == 1
    assert found[(count, labels(route="unmatched", method="GET", status="404"))] == 1
    assert found[(count, labels(route="/healthz", method="other", status="405"))] == 1
    hist = "vela2_http_request_duration_seconds_count"
    assert found[(hist, labels(route="/v1/system_one", method="POST"))] == 2
    assert found[("vela2_http_request_duration_seconds_sum", labels(route="/v1/system_one", method="POST"))] > 0
    assert found[("vela2_http_requests_in_flight", labels())] == 1  # the /metrics read itself
    assert any(name == "process_resident_memory_bytes" for name, _ in found)


def test_metrics_need_no_key_and_are_no_part_of_the_api_document(vela2_redis):
    key, entry = new_key("acme")
    app = create_app(vela2_redis.url, MODEL, keys=KeyRing([entry]))
    with TestClient(app) as http:
        assert http.post("/v1/system_one", json=S1).status_code == 401  # the API needs the key
        got = http.get("/metrics")
        assert got.status_code == 200
        assert samples(got.text)[("vela2_http_requests_total", labels(route="/v1/system_one", method="POST",
                                                                      status="401"))] == 1
        assert "/metrics" not in http.get("/openapi.json").json()["paths"]


def test_an_empty_metrics_path_serves_none(vela2_redis):
    with TestClient(create_app(vela2_redis.url, MODEL, keys=None, metrics_path="")) as http:
        assert http.get("/metrics").status_code == 404
        assert http.get("/healthz").status_code == 200


def test_another_metrics_path(vela2_redis):
    with TestClient(create_app(vela2_redis.url, MODEL, keys=None, metrics_path="/internal/prom")) as http:
        assert http.get("/metrics").status_code == 404
        assert "vela2_http_requests_total" in http.get("/internal/prom").text


def test_the_docs_table_lists_every_family():
    import re
    from pathlib import Path

    from producer.http.metrics import RouteMetrics

    m = RouteMetrics()
    # as scraped: a counter family `x` is exposed as `x_total`
    exported = {f.name + "_total" if f.type == "counter" else f.name for f in m.registry.collect()}
    page = (Path(__file__).resolve().parents[3] / "docs" / "operations" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_]+)", page.split("<!-- route-metrics-table -->")[1], re.M))
    assert exported == documented
