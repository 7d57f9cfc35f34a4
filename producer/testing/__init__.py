"""Test your code against Vela 2 without a GPU worker: `FakeWorker` (fake_worker) answers what a
backend queues, on fakeredis or any Redis, as the real worker stores it, with the stub's answers
(stub), the model's or a function's (answers); `assert_ok` (assertions); `pytest_plugin` holds the
`vela2_*` fixtures pytest loads wherever vela2 is installed."""

from producer.testing.answers import MODEL, AnswerFn, model_answerer
from producer.testing.assertions import assert_ok
from producer.testing.fake_worker import Drained, FakeWorker
from producer.testing.stub import FAKE_META_KEY, STUB, fake_digest, stub_answers, stub_render

__all__ = ["FAKE_META_KEY", "MODEL", "STUB", "AnswerFn", "Drained", "FakeWorker", "assert_ok", "fake_digest",
           "model_answerer", "stub_answers", "stub_render"]
