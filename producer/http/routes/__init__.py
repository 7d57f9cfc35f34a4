"""The routes of `vela2 http`, one module per family, each an APIRouter: `requests` (POST
/v1/system_one), `results` (GET /v1/results/{id}, GET /v1/results?id=), `batches` (/v1/batches: bulk
jobs) and `health` (/healthz, /readyz). producer.http.app includes them in this order, which is the
order of the OpenAPI document.

The handlers take the shared state and the caller's tenant as dependencies (producer.http.deps).
They carry no docstrings on purpose: FastAPI publishes a handler's docstring as its operation's
description in the OpenAPI document, which is a contract; what a route does is its module's
docstring and its summary.
"""
