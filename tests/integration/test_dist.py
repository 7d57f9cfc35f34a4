"""The package as a user installs it (issue 40): `make dist`'s build (`python -m build`: the sdist,
then the wheel built from it), installed into a clean virtualenv per extra with
`pip install '<wheel>[extra]' -c constraints.txt`; each runs the installed `vela2` console script
and what its extra is for. The producer-side installs (no extra, producer, testing, amqp, otel) pull
no torch; a command whose extra is missing says which one to install.

The wheel is built once per run (xdist workers share it under a lock); pip's cache is used, and
the worker's torch comes from constraints.txt's pin (the local CPU build here). About three minutes
in all on a 2-core machine, the worker's venv (torch) one to two of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

import vela2

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints.txt"
PACKAGES = ("vela2", "worker", "producer", "stack")  # pyproject's packages.find
WORKER_STACK = ("torch", "transformers", "celery")  # what a producer-side install must not pull
BUILD_TIMEOUT_S = 300
INSTALL_TIMEOUT_S = 420  # the worker's venv unpacks torch: minutes on a loaded 2-core machine
RUN_TIMEOUT_S = 180
# Variables of this test run that would change what the venv's processes do: the checkout on the path
# (it would be imported instead of the wheel), the outer pytest's options, vela2's own settings.
DROPPED_ENV_PREFIXES = ("PYTHONPATH", "PYTEST_", "VIRTUAL_ENV", "VELA2_", "OTEL_")

pytestmark = pytest.mark.timeout(INSTALL_TIMEOUT_S + 3 * RUN_TIMEOUT_S)


@dataclass(frozen=True)
class Dist:
    """What `make dist` writes: the sdist and the wheel."""

    sdist: Path
    wheel: Path


def source_files() -> list[str]:
    """The checkout's files as a fresh clone with this working tree's changes has them (tracked and
    untracked, less what .gitignore ignores), relative to the root."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True, timeout=RUN_TIMEOUT_S).stdout.decode()
    return sorted(f for f in out.split("\0") if f and (ROOT / f).is_file())


def build(out: Path) -> Dist:
    """Build as `make dist` does, from a copy of the checkout (the build writes egg-info beside the
    sources; the checkout is left alone)."""
    src = out / "src"
    for rel in source_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    run = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out / "dist"), str(src)],
                         capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return built(out)


def built(out: Path) -> Dist:
    """The one sdist and the one wheel `build` wrote under `out`."""
    (sdist,), (wheel,) = (sorted((out / "dist").glob(pattern)) for pattern in ("*.tar.gz", "*.whl"))
    return Dist(sdist, wheel)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """The sdist and the wheel of the checkout, built once per run: under xdist, by the first worker
    that asks, in the run's base temporary folder (the others wait on the lock, then reuse it)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(tmp_path_factory.mktemp("dist"))
    shared = tmp_path_factory.getbasetemp().parent / "vela2-dist"  # this run's, shared by its workers
    with FileLock(f"{shared}.lock"):
        if not (shared / "built").exists():
            shutil.rmtree(shared, ignore_errors=True)
            build(shared)
            (shared / "built").touch()
    return built(shared)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A test's folder for its venv and files; the venv is removed after the test (with torch it is
    about a gigabyte, and pytest keeps the temporary folders of three runs)."""
    yield tmp_path
    shutil.rmtree(tmp_path / "venv", ignore_errors=True)


class Venv:
    """A clean virtualenv (`python -m venv`) with the wheel installed as a user would, and its commands
    run outside the checkout (so that only the installed copy can be imported)."""

    def __init__(self, where: Path, *requirements: str):
        self.path = where / "venv"
        self.cwd = where
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_ENV_PREFIXES)}
        # no pip of its own: this test's pip installs into it (`pip --python`), which saves ensurepip's
        # seconds per venv; what lands in the venv is the same
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.path)], check=True,
                       timeout=RUN_TIMEOUT_S)
        self.pip("install", "-q", "-c", str(CONSTRAINTS), *requirements, timeout=INSTALL_TIMEOUT_S)

    def pip(self, *args: str, timeout: float = RUN_TIMEOUT_S) -> str:
        """Run pip on this venv; its stdout (fails the test with pip's output when pip fails)."""
        run = subprocess.run([sys.executable, "-m", "pip", "--python", str(self.path / "bin" / "python"), *args],
                             cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        return run.stdout

    def run(self, program: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run one of the venv's programs (`vela2`, `python`) outside the checkout."""
        return subprocess.run([str(self.path / "bin" / program), *args], cwd=self.cwd, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S)

    def ok(self, program: str, *args: str, env: dict[str, str] | None = None) -> str:
        """Run one of its programs, which must succeed; its stdout."""
        run = self.run(program, *args, env=env)
        assert run.returncode == 0, f"{program} {' '.join(args)}: {run.stdout[-3000:]}{run.stderr[-3000:]}"
        return run.stdout

    def installed(self) -> set[str]:
        """The distributions installed in it (lower case)."""
        return {d["name"].lower() for d in json.loads(self.pip("list", "--format=json"))}

    def check_console_script(self) -> None:
        """`vela2 --version` names the wheel's version, from the venv's copy of vela2, not the checkout."""
        assert self.ok("vela2", "--version").strip() == f"vela2 {vela2.__version__}"
        where = self.ok("python", "-c", "import vela2, producer; print(vela2.__file__, producer.__file__)")
        assert all(Path(p).is_relative_to(self.path) for p in where.split()), where

    def check_no_worker_stack(self) -> None:
        """A producer-side install: no torch (nor transformers, nor celery) installed or importable."""
        assert not self.installed() & set(WORKER_STACK)
        run = self.run("python", "-c", "import torch")
        assert run.returncode == 1 and "No module named 'torch'" in run.stderr

    def check_names_the_extra(self, argv: list[str], extra: str) -> None:
        """`vela2 ARGV` misses `extra`: one line that names it, exit 2, no traceback."""
        run = self.run("vela2", *argv)
        assert run.returncode == 2, run.stdout + run.stderr
        assert run.stderr.count("\n") == 1 and run.stderr.startswith(f"vela2 {argv[0]}: needs the {extra!r} extra"), \
            run.stderr
        assert f"pip install -e '.[{extra}]'" in run.stderr and f"<wheel>[{extra}]'" in run.stderr, run.stderr


def test_the_wheel_holds_every_file_of_the_packages_and_the_sdist_what_it_promises(dist: Dist) -> None:
    """The wheel: every file of vela2/, worker/, producer/ and stack/ (data files too: none is left
    behind for the code to miss at run time), nothing else, the console script and the entry
    points; the sdist: constraints.txt and the JSON Schemas beside the sources."""
    version = vela2.__version__
    assert dist.wheel.name == f"vela2-{version}-py3-none-any.whl"
    assert dist.sdist.name == f"vela2-{version}.tar.gz"
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
        entry_points = wheel.read(f"vela2-{version}.dist-info/entry_points.txt").decode()
    package_files = {f for f in source_files() if f.split("/")[0] in PACKAGES}
    assert package_files - names == set()
    assert {n.split("/")[0] for n in names} == {*PACKAGES, f"vela2-{version}.dist-info"}
    assert "vela2 = vela2.cli:main" in entry_points
    assert "worker = worker.cli:main" in entry_points and "vela2 = producer.testing.pytest_plugin" in entry_points
    with tarfile.open(dist.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "README.md", "constraints.txt", "schemas/systemone.request.schema.json",
            "schemas/systemone.answer.schema.json"} <= members
    assert package_files <= members


def test_vela2_alone_pulls_no_torch_and_a_command_that_needs_an_extra_names_it(dist: Dist, home: Path) -> None:
    """`pip install vela2`: the clients and the SystemOne schemas work; the worker, the model
    commands, the route, an amqp:// broker and traces each name the extra to install."""
    venv = Venv(home, str(dist.wheel))
    venv.check_console_script()
    venv.check_no_worker_stack()
    assert "worker" in venv.ok("vela2", "--help")
    venv.check_names_the_extra(["worker", "--checkpoint", str(home / "nowhere")], "worker")
    venv.check_names_the_extra(["demo"], "worker")  # its first miss is torch: the model extra would not do
    venv.check_names_the_extra(["init-demo", str(home / "demo")], "model")
    venv.check_names_the_extra(["http", "--no-auth"], "producer")
    (home / "in.jsonl").write_text("")
    venv.check_names_the_extra(["backfill", str(home / "in.jsonl"), str(home / "out.jsonl"),
                                "--broker", "amqp://127.0.0.1:1//", "--no-progress"], "amqp")
    # the published schemas, written by the installed copy, are the checkout's schemas/
    venv.ok("python", "-m", "vela2.api.systemone", "--write-schemas", "--dir", str(home / "schemas"))
    for schema in sorted((ROOT / "schemas").glob("*.json")):
        assert (home / "schemas" / schema.name).read_text() == schema.read_text()
    venv.ok("python", "-c", "from producer import AsyncClient, Client; Client(redis_url='redis://127.0.0.1:1/0')")


def test_the_producer_extra_serves_the_route_without_torch(dist: Dist, home: Path) -> None:
    """`pip install 'vela2[producer]'`: the route and the producer commands, no torch; `vela2
    worker` there names the worker extra."""
    venv = Venv(home, f"{dist.wheel}[producer]")
    venv.check_console_script()
    venv.check_no_worker_stack()
    assert "--redis" in venv.ok("vela2", "status", "--help")
    assert "--no-auth" in venv.ok("vela2", "http", "--help")
    venv.ok("python", "-c", "from producer.http.app import create_app; from producer import Client")
    venv.check_names_the_extra(["worker", "--checkpoint", str(home / "nowhere")], "worker")


BACKEND_TEST = '''
import pytest

from producer.testing import assert_ok

ROW = {"task": "choice:sentiment", "text": "What a lovely day.",
       "questions": [{"question": "Is it positive?", "options": ["yes", "no"]}]}


def test_answered_from_the_thread(vela2_client, vela2_fake_worker):
    result = assert_ok(vela2_client.result(vela2_client.submit(ROW), timeout_s=60))
    assert result.answers[0].decision == "yes"


@pytest.mark.vela2(thread=False)
def test_answered_on_drain(vela2_client, vela2_fake_worker):
    rid = vela2_client.submit(ROW)
    assert vela2_fake_worker.drain().answered == 1
    assert_ok(vela2_client.result(rid, timeout_s=0))
'''


def test_the_testing_extra_runs_a_backends_tests_with_the_pytest_plugin(dist: Dist, home: Path) -> None:
    """`pip install 'vela2[testing]'` (and pytest, which a backend's tests have): the plugin's
    fixtures load from the entry point and a fake worker answers, with no torch."""
    venv = Venv(home, f"{dist.wheel}[testing]", "pytest")
    venv.check_console_script()
    venv.check_no_worker_stack()
    (home / "test_backend.py").write_text(textwrap.dedent(BACKEND_TEST))
    out = venv.ok("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_backend.py")
    assert "2 passed" in out, out


def test_the_amqp_extra_makes_a_rabbitmq_publisher_without_torch(dist: Dist, home: Path) -> None:
    """`pip install 'vela2[amqp]'`: a producer's amqp:// broker gets its publisher (kombu), no torch."""
    venv = Venv(home, f"{dist.wheel}[amqp]")
    venv.check_console_script()
    venv.check_no_worker_stack()
    code = ("from producer.brokers import AmqpPublisher, connect\n"
            "p = connect('amqp://guest:guest@127.0.0.1:1//', None)\n"  # kombu connects on first publish
            "assert isinstance(p, AmqpPublisher), p\n"
            "p.close()\n")
    venv.ok("python", "-c", code)


def test_the_otel_extra_traces_without_torch(dist: Dist, home: Path) -> None:
    """`pip install 'vela2[otel]'`: the OTEL_* variables turn tracing on (the console exporter prints
    a span; the OTLP exporter imports), no torch."""
    venv = Venv(home, f"{dist.wheel}[otel]")
    venv.check_console_script()
    venv.check_no_worker_stack()
    code = ("from opentelemetry import trace\n"
            "from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter\n"
            "from vela2.wire import tracing\n"
            "assert tracing.configure('dist-check')\n"
            "with trace.get_tracer('dist-check').start_as_current_span('vela2-dist-span'):\n"
            "    pass\n")
    out = venv.ok("python", "-c", code, env={"OTEL_TRACES_EXPORTER": "console"})
    assert '"name": "vela2-dist-span"' in out, out


def test_the_worker_extra_runs_the_model_on_the_pinned_torch(dist: Dist, home: Path) -> None:
    """`pip install 'vela2[worker]' -c constraints.txt`: torch at constraints.txt's pin, the worker
    command and Celery app, and the model stack scoring a row (an untrained demo model)."""
    pinned = next(line.split("==")[1] for line in CONSTRAINTS.read_text().splitlines() if line.startswith("torch=="))
    venv = Venv(home, f"{dist.wheel}[worker]")
    venv.check_console_script()
    assert "--checkpoint" in venv.ok("vela2", "worker", "--help")
    code = ("import torch, worker.app\n"
            "from vela2.model.checkpoint import save\n"
            "from vela2.train.demo_model import untrained_demo_model\n"
            "save(untrained_demo_model(), 'ckpt')\n"
            "print(torch.__version__)\n")
    assert venv.ok("python", "-c", code).strip().split("+")[0] == pinned
    (home / "rows.jsonl").write_text(json.dumps({
        "id": "r1", "task": "choice:sentiment", "text": "What a lovely day.",
        "questions": [{"question": "Is it positive?", "options": ["yes", "no"]}]}) + "\n")
    answer = json.loads(venv.ok("vela2", "predict", "--checkpoint", "ckpt", "rows.jsonl"))
    assert answer["id"] == "r1" and answer["status"] == "ok", answer
