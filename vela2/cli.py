"""The `vela2` command line: thin, each subcommand calls into the packages.

The model library's own subcommands (init-demo, predict, calibrate, eval, train, import) are defined here; the packages
built on it register theirs as entry points of group `vela2.commands` (pyproject.toml), so this
module imports neither the worker nor the producer.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import re
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from vela2.config import DEFAULT_MAX_BATCH_TOKENS, PRECISIONS, default_precision, install_hint
from vela2.errors import InvalidRequest, Vela2Error

PLUGIN_GROUP = "vela2.commands"


SECRET_DEST = re.compile(r"secret|password|token|api_key", re.I)  # options whose default --help never shows


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that names each option's default (argparse's "(default: X)"), except where there is none
    to tell (None, False), the help states it already, or it is a secret; a URL's password is masked
    (a default may come from the environment)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not text or action.default in (None, False, argparse.SUPPRESS) or "%(default)" in text
                or SECRET_DEST.search(action.dest)):
            return text
        if isinstance(action.default, str) and "://" in action.default:
            from vela2.wire.urls import mask_url

            return f"{text} (default: {mask_url(action.default).replace('%', '%%')})"
        return super()._get_help_string(action) or text


class Parser(argparse.ArgumentParser):
    """The argument parser of every `vela2` command (the packages' too): defaults in `--help` (an
    option given no help still lists its default); its subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.help is None and action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            action.help = "default: %(default)s"
        return action
# The extra (pyproject.toml) that installs each optional top-level module: a command that misses one
# says which extra to install, in one line, instead of a traceback.
EXTRA_OF_MODULE = {
    **dict.fromkeys(("torch", "transformers", "tokenizers", "safetensors"), "model"),
    **dict.fromkeys(("celery", "billiard", "prometheus_client"), "worker"),
    **dict.fromkeys(("kombu", "amqp"), "amqp"),  # a producer's amqp:// broker (the worker's commands: below)
    **dict.fromkeys(("fastapi", "uvicorn", "starlette", "httpx"), "producer"),
    **dict.fromkeys(("fakeredis", "lupa"), "testing"),
    "opentelemetry": "otel",
}
# Commands that need a whole extra: a module missing there names the command's extra, since the
# module's own (torch: model; kombu: amqp) would not be enough to run it.
EXTRA_OF_COMMAND = dict.fromkeys(("worker", "demo", "parity"), "worker")


def missing_extra(e: ImportError, command: str | None = None) -> str | None:
    """The one line for `command` when it cannot import an optional module, or None when the module
    is no extra's (a real bug: its traceback is kept)."""
    module = (e.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    if extra is None:
        return None
    extra = EXTRA_OF_COMMAND.get(command or "", extra)
    return f"needs the {extra!r} extra, which is not installed (no module {module!r}): {install_hint(extra)}"


def _load(checkpoint: str, device: str, precision: str, batch_invariant: bool = False):
    from vela2.model.checkpoint import load, serving_dtype

    model = load(checkpoint, device=device, dtype=serving_dtype(precision))
    if batch_invariant:  # every call on it then runs in that mode (vela2.model.invariant)
        model.use_batch_invariant()
    return model


def read_jsonl(path: str) -> list[tuple[Any, Vela2Error | None]]:
    """Lines of a JSONL file (`-` = stdin), each decoded or paired with the error that names it
    (blank lines too, so that output lines stay 1:1 with input lines). The file is read as bytes and
    each line decoded on its own, as backfill and bulk jobs do (`decode_json`): a byte that is not
    UTF-8, or JSON nested deeper than 64 levels, fails its own line, not the whole file."""
    from vela2.wire.messages import decode_json

    out: list[tuple[Any, Vela2Error | None]] = []
    with contextlib.ExitStack() as stack:
        # sys.stdin.buffer: the bytes; a text stream without one (a test's StringIO) yields str lines
        fh = getattr(sys.stdin, "buffer", sys.stdin) if path == "-" else stack.enter_context(open(path, "rb"))
        for n, line in enumerate(fh, 1):
            if not line.strip():
                out.append(({"id": f"line-{n}"}, InvalidRequest(f"line {n} is empty")))
                continue
            try:
                out.append((decode_json(line, f"line {n}"), None))
            except InvalidRequest as e:  # not JSON, not UTF-8, nested too deeply (RecursionError before)
                out.append(({"id": f"line-{n}"}, e))
    return out


def cmd_init_demo(args: argparse.Namespace) -> int:
    """`vela2 init-demo DIR`: train and write the demo checkpoint."""
    from vela2.train.demo_model import init_demo

    path = init_demo(args.dir)
    print(f"demo checkpoint written to {path} (what it knows: {Path(path) / 'description.txt'}; "
          f"its scores on held-out phrasings and formats: {Path(path) / 'held-out.json'})")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """`vela2 predict`: score a JSONL file of rows and SystemOne requests, one result line per input line."""
    from vela2.api.schemas import error_result
    from vela2.scoring.systemone import predict_mixed

    precision = args.precision or default_precision(args.device)  # the worker's default: bf16 on CUDA, else fp32
    model = _load(args.checkpoint, args.device, precision, args.batch_invariant)
    lines = read_jsonl(args.input)
    # --units: rows and SystemOne requests both take a top-level `units`
    objs = [dict(obj, units=True) if args.units and isinstance(obj, dict) else obj for obj, err in lines if err is None]
    answers = iter(predict_mixed(model, objs, precision=precision, max_batch_tokens=args.max_batch_tokens))
    n_err = 0
    with contextlib.ExitStack() as stack:
        out = sys.stdout if args.out in (None, "-") else stack.enter_context(open(args.out, "w", encoding="utf-8"))
        for obj, err in lines:
            result = error_result(obj["id"], None, err).to_json_dict() if err else next(answers)
            n_err += result.get("status") == "error"
            out.write(json.dumps(result, ensure_ascii=False) + "\n")
    print(f"{len(lines)} lines, {n_err} errors", file=sys.stderr)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """`vela2 calibrate`: fit calibration.json from labelled rows (vela2.train.calibrate)."""
    from vela2.train.calibrate import calibrate_command

    return calibrate_command(args.checkpoint, args.dev, out=args.out, report_path=args.report,
                             device=args.device, precision=args.precision or default_precision(args.device),
                             batch_invariant=args.batch_invariant)


def cmd_eval(args: argparse.Namespace) -> int:
    """`vela2 eval`: per task metrics of a checkpoint on labelled rows (vela2.train.evaluate)."""
    from vela2.train.evaluate import eval_command

    return eval_command(args.checkpoint, args.rows, json_path=args.json, device=args.device,
                        precision=args.precision or default_precision(args.device),
                        max_batch_tokens=args.max_batch_tokens, batch_invariant=args.batch_invariant)


def cmd_train(args: argparse.Namespace) -> int:
    """`vela2 train`: train a checkpoint on labelled rows (vela2.train.training)."""
    from vela2.train.training import TrainOptions, train_command

    given = {k: getattr(args, k) for k in ("epochs", "lr", "max_batch_tokens", "seed", "span_pos_weight",
                                           "lr_schedule")}
    options = TrainOptions(full=args.full, precision=args.precision or default_precision(args.device),
                           save_every=args.save_every, **{k: v for k, v in given.items() if v is not None})
    return train_command(args.checkpoint, args.train, args.out, dev_path=args.dev, options=options,
                         device=args.device, resume=args.resume, batch_invariant=args.batch_invariant)


def cmd_import(args: argparse.Namespace) -> int:
    """`vela2 import`: make a checkpoint of a transformers directory (vela2.train.importing)."""
    from vela2.train.importing import import_command

    return import_command(args.hf_dir, args.out, name=args.name, window=args.window)


def cmd_manifest(args: argparse.Namespace) -> int:
    """`vela2 manifest`: write a checkpoint's manifest.json, or check every byte against it."""
    from vela2.model import manifest

    path = Path(args.checkpoint)
    if not (path / "config.json").is_file():
        print(f"vela2 manifest: {path} is not a Vela 2 checkpoint (no config.json)", file=sys.stderr)
        return 2
    if not args.check:
        written = manifest.write(path)
        print(f"wrote {path / manifest.MANIFEST}: digest {written['digest']}, {len(written['files'])} files")
        return 0
    recorded = manifest.read(path)
    if recorded is None:
        print(f"vela2 manifest: {path} has no {manifest.MANIFEST}; write one with `vela2 manifest {path}`",
              file=sys.stderr)
        return 1
    problem = manifest.cheap_check(path, recorded) or manifest.verify(path, recorded)
    if problem:
        print(f"{path}: DIFFERS from its manifest: {problem}")
        return 1
    print(f"{path}: every byte agrees with its manifest (digest {recorded['digest']})")
    return 0


def _add_manifest(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("manifest", help="write a checkpoint's manifest.json (its identity, so a worker starts "
                                        "without hashing the weights), or --check every byte against it")
    s.add_argument("checkpoint")
    s.add_argument("--check", action="store_true",
                   help="hash every file and compare with the manifest (exit 1 if any differs)")
    s.set_defaults(func=cmd_manifest)


def build_parser() -> argparse.ArgumentParser:
    """The `vela2` parser: the model library's subcommands, then one stub per plugin (it parses its own
    options, so the stub only lists it in `vela2 --help`)."""
    from vela2 import __version__

    p = Parser(prog="vela2", description="Vela 2 streaming scorer")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub: Any = p.add_subparsers(dest="command", required=True)  # its parsers are Parsers
    for add in (_add_init_demo, _add_predict, _add_calibrate, _add_eval, _add_train, _add_import, _add_manifest):
        add(sub)
    for name, ep in sorted(plugins().items()):
        sub.add_parser(name, help=_first_line(ep), add_help=False)
    return p


def _add_precision(s: argparse.ArgumentParser, on_cuda: str = "bf16") -> None:
    s.add_argument("--precision", choices=PRECISIONS, default=None,
                   help=f"default as the worker's: {on_cuda} on CUDA, fp32 elsewhere")


def _add_batch_invariant(s: argparse.ArgumentParser) -> None:
    s.add_argument("--batch-invariant", action="store_true",
                   help="every answer the same bits whatever it is batched with (as the worker's --batch-invariant 1)")


def _add_init_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("init-demo", help="write the deterministic demo checkpoint")
    s.add_argument("dir")
    s.set_defaults(func=cmd_init_demo)


def _add_predict(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("predict", help="score a JSONL file of rows / SystemOne requests, no queue")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("input", help="JSONL file, '-' for stdin")
    s.add_argument("--out", help="output JSONL (default stdout)")
    _add_precision(s)
    s.add_argument("--device", default="cpu")
    s.add_argument("--units", action="store_true", help="span answers carry every word's units")
    s.add_argument("--max-batch-tokens", type=int, default=DEFAULT_MAX_BATCH_TOKENS)
    _add_batch_invariant(s)
    s.set_defaults(func=cmd_predict)


def _add_calibrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("calibrate", help="fit calibration.json from labelled rows")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("dev", help="labelled JSONL (rows with 'gold')")
    s.add_argument("--out", help="write calibration here instead of into the checkpoint")
    s.add_argument("--report", help="write the before/after report as JSON")
    s.add_argument("--device", default="cpu")
    _add_precision(s)
    _add_batch_invariant(s)
    s.set_defaults(func=cmd_calibrate)


def _add_eval(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("eval", help="per task accuracy / F1 / NLL / ECE of a checkpoint on labelled rows")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("rows", help="labelled JSONL (rows with 'gold', as for calibrate)")
    s.add_argument("--json", help="write the report as JSON here")
    s.add_argument("--device", default="cpu")
    _add_precision(s)
    s.add_argument("--max-batch-tokens", type=int, default=DEFAULT_MAX_BATCH_TOKENS)
    _add_batch_invariant(s)
    s.set_defaults(func=cmd_eval)


def _add_train(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("train", help="train the heads (or all) of a checkpoint on labelled rows")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("train", help="labelled JSONL (rows with 'gold', as for calibrate)")
    s.add_argument("--dev", help="labelled JSONL the calibration is fitted on at the end")
    s.add_argument("--out", required=True, help="directory of the trained checkpoint")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--heads-only", dest="full", action="store_false", help="train the heads only (default)")
    mode.add_argument("--full", dest="full", action="store_true", help="train the backbone too")
    # None: TrainOptions' default (vela2.train.training), so that --help does not import torch
    s.add_argument("--epochs", type=int, default=None, help="passes over TRAIN (default 3)")
    s.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default 1e-3)")
    s.add_argument("--lr-schedule", choices=("constant", "linear"), default=None,
                   help="constant (default), or linear: warm-up over the first 5%% of steps, then decay to 0")
    s.add_argument("--max-batch-tokens", type=int, default=None,
                   help="padded tokens per step: longest sequence x sequences (default 4096)")
    s.add_argument("--device", default="cpu")
    _add_precision(s, on_cuda="bf16 (autocast)")
    s.add_argument("--seed", type=int, default=None, help="batch order and head initialisation (default 0)")
    s.add_argument("--save-every", type=int, default=0, help="write OUT/train-state.pt every N steps (0: never)")
    s.add_argument("--resume", action="store_true", help="continue from OUT/train-state.pt")
    s.add_argument("--span-pos-weight", type=float, default=None,
                   help="weight of positive word x label units in the span loss (default 5)")
    _add_batch_invariant(s)
    s.set_defaults(func=cmd_train, full=False)


def _add_import(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("import", help="make a Vela 2 checkpoint of a local transformers decoder directory")
    s.add_argument("hf_dir", help="directory with config.json, *.safetensors and tokenizer.json")
    s.add_argument("out")
    s.add_argument("--name", help="model name (default: the directory's name)")
    s.add_argument("--window", type=int, default=None,
                   help="max_window_tokens (default: min(2048, the model's max_position_embeddings))")
    s.set_defaults(func=cmd_import)


def plugins() -> dict[str, Any]:
    """The subcommands other packages register (entry points of group `vela2.commands`: the worker,
    the producer's backfill and http, the stack's demo and parity); each names a `main(argv)`."""
    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def _first_line(ep: Any) -> str:
    try:
        doc = inspect.getdoc(ep.load()) or ""
    except ImportError as e:  # a package registered but not importable here: say so in --help
        return f"(unavailable: {missing_extra(e, ep.name) or e})"
    return doc.strip().splitlines()[0] if doc.strip() else ""


def main(argv: list[str] | None = None) -> int:
    """The `vela2` command: a plugin's subcommand runs its own `main(argv)`, the library's are parsed
    here; a Vela2Error, a missing file or a missing extra is one line on stderr and exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    found = plugins()
    if argv and argv[0] in found:
        # a plugin parses its own options (`vela2 worker --help`); errors are reported as ours
        name = argv[0]
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            return int(found[name].load()(argv[1:]) or 0)
        except Vela2Error as e:
            print(f"vela2 {name}: {e}", file=sys.stderr)
            return 2
        except ImportError as e:
            if (line := missing_extra(e, name)) is None:
                raise
            print(f"vela2 {name}: {line}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except Vela2Error as e:
        print(f"vela2 {args.command}: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, PermissionError) as e:  # "[Errno 13] Permission denied: 'path'"
        print(f"vela2 {args.command}: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        if (line := missing_extra(e, args.command)) is None:
            raise
        print(f"vela2 {args.command}: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
