"""`vela2` subcommands run as processes: a command whose extra is not installed says which, in one line."""

from __future__ import annotations

import pytest


@pytest.mark.integration  # python subprocesses
@pytest.mark.parametrize(("blocked", "argv", "extra"), [
    ("torch", ["predict", "--checkpoint", "nowhere", "-"], "model"),
    ("torch", ["init-demo", "somewhere"], "model"),
    ("fastapi", ["http", "--no-auth"], "producer"),
    ("celery", ["worker", "--checkpoint", "nowhere"], "worker"),
])
def test_a_command_missing_an_extra_says_which_in_one_line(tmp_path, blocked, argv, extra):
    """A producer-only install runs `vela2 predict`: one line naming the extra, exit 2, no traceback."""
    import subprocess
    import sys

    code = (f"import sys; sys.modules[{blocked!r}] = None\n"  # import of it now fails as if not installed
            f"from vela2.cli import main; sys.exit(main({argv!r}))")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip() == (f"vela2 {argv[0]}: needs the {extra!r} extra, which is not installed "
                                  f"(no module {blocked!r}): pip install -e '.[{extra}]' -c constraints.txt "
                                  f"in a checkout, or 'dist/<wheel>[{extra}]'")
