"""The wire protocol: everything that travels through Redis between producers and workers.

Both sides import this package and never each other (tests/unit/test_layers.py checks it):

- `keys` — every Redis key and queue name (ours and kombu's);
- `messages` — Celery protocol-2 messages: building them, and decoding a delivery into requests;
- `results` — the stored result meta: writing it (write-once) beside reading it back.

Standard library, pydantic and vela2.api.schemas / errors / config only: no celery, no torch, no
redis import (callers hand in their client).
"""
