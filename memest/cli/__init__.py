"""memest's command line: ``memest <command> ...``.

Each command lives in its own module of this package and exposes ``COMMAND``, an object with
``name``, ``help`` (first line of its docstring is the --help text), ``add_arguments(parser)`` and
``run(args) -> int``. Commands are discovered, so a new module needs no edit here.

A ``MemestError`` (bad input, a refused file) is printed as one line on stderr and exits 2; no
traceback reaches the user. Input files are read through ``memest.files`` (regular files only,
bounded sizes).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol

from pydantic import ValidationError

from memest._version import __version__
from memest.errors import CommandError, ConfigError, DoesNotFitError, MemestError, first_error


class Command(Protocol):
    name: str
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _commands() -> list[Command]:
    found: list[Command] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        command = getattr(module, "COMMAND", None)
        if command is not None:
            found.append(command)
    return sorted(found, key=lambda c: c.name)


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors as one line (``memest CMD: error: ...``) and exit 2.

    Subcommand parsers are made by ``add_subparsers``, which uses this class too.
    """

    def error(self, message: str) -> NoReturn:
        if message.endswith("expected one argument"):  # e.g. --margin -5GiB: read as a flag
            message += "; a value starting with '-' is written --flag=VALUE"
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="memest",
        description=(
            "Where vLLM startup memory goes, and how much KV cache the GPU really holds: "
            "capture plans, allocator breakdowns, KV-budget estimates and a report service."
        ),
    )
    parser.add_argument("--version", action="version", version=f"memest {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in _commands():
        p = sub.add_parser(
            command.name,
            help=command.help.splitlines()[0],
            description=command.help,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(p)
        p.set_defaults(_command=command, _parser=p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run memest with ``argv`` (defaults to sys.argv[1:]); returns the exit code."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(list(argv) if argv is not None else None)
        if extra:  # named by the command's parser, so the line says which command refused it
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 on --help
        return int(exc.code or 0)
    command: Command | None = getattr(args, "_command", None)
    if command is None:
        parser.print_help()
        return 2
    try:
        return command.run(args)
    except BrokenPipeError:  # the reader went away (`memest plan --json | head`): stop quietly
        _silence_stdout()
        return 0
    except CommandError as exc:
        print(f"memest {command.name}: {exc}", file=sys.stderr)
        return exc.exit_code
    except DoesNotFitError as exc:  # a valid configuration that leaves no KV cache
        print(f"memest {command.name}: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"memest {command.name}: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except MemestError as exc:
        print(f"memest {command.name}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"memest {command.name}: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # a figure computed from absurd input is out of range
        print(f"memest {command.name}: {_first_error(exc)}", file=sys.stderr)
        return 2
    except (RecursionError, MemoryError) as exc:  # input shaped to exhaust the stack or memory
        print(
            f"memest {command.name}: input too deeply nested or too large ({exc!r:.80})",
            file=sys.stderr,
        )
        return 2


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush raises no second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout already closed or not a real file
        pass


def _first_error(exc: ValidationError) -> str:
    where, message, _ = first_error(exc)
    return f"input leads to an invalid {exc.title}.{where}: {message}"


def entry() -> None:
    sys.exit(main())
