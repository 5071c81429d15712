"""Run the memest service (FastAPI + uvicorn): API, dashboard and /metrics.

  memest serve --demo                    demo: real H200 starts and published figures, SQLite ./memest.db, 127.0.0.1:8000
  memest serve --database-url postgresql+psycopg://memest@db:5432/memest --host 0.0.0.0

Settings also come from MEMEST_* environment variables (MEMEST_DATABASE_URL, MEMEST_WRITE_TOKEN,
MEMEST_READ_TOKEN, MEMEST_MAX_REPORT_BYTES); options given here win. Without a write token the
server makes one up and prints it, so writes always need a bearer token; with --write-token-file
(MEMEST_WRITE_TOKEN_FILE, set in the container image) it is made once, kept in that file and read
back on every later start, never printed. Behind a TLS proxy, --forwarded-allow-ips names the
proxies whose X-Forwarded-* headers are trusted.

Every read from a client is bounded: a request head must arrive whole within --header-timeout
seconds (else the connection is closed) and within --max-header-bytes (else 400), a body within
30 s (else 408); idle keep-alive connections close after --keep-alive-timeout seconds, and past
--max-connections open connections a request is answered 503.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memest._version import install_hint
from memest.errors import CommandError

if TYPE_CHECKING:
    from fastapi import FastAPI


class ServeCommand:
    name = "serve"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
        parser.add_argument("--port", type=_port, default=8000, help="port (default 8000)")
        parser.add_argument(
            "--database-url",
            help="SQLAlchemy URL (default MEMEST_DATABASE_URL or sqlite:///./memest.db)",
        )
        parser.add_argument(
            "--demo",
            action="store_true",
            help="load the demo at startup: six real H200 starts (dense, EAGLE3, MoE, MLA, vllm serve) and published GB200 figures from a public write-up",
        )
        parser.add_argument(
            "--exit-after-load",
            action="store_true",
            help="migrate the database (and load the demo), print what is stored, then exit",
        )
        parser.add_argument("--log-level", default="warning", help="uvicorn log level")
        parser.add_argument(
            "--write-token-file",
            default=os.environ.get("MEMEST_WRITE_TOKEN_FILE") or None,
            metavar="PATH",
            help="without MEMEST_WRITE_TOKEN: read the write token from PATH, or make one and "
            "save it there (mode 0600) (default MEMEST_WRITE_TOKEN_FILE)",
        )
        parser.add_argument(
            "--forwarded-allow-ips",
            default=None,
            metavar="IPS",
            help="comma-separated proxy addresses or networks (or '*') whose "
            "X-Forwarded-For/-Proto headers are trusted, e.g. a TLS-terminating ingress "
            "(default MEMEST_FORWARDED_ALLOW_IPS, or none: the client is the peer address)",
        )

        limits = parser.add_argument_group("read limits (each also MEMEST_<NAME>; see README)")
        for option, field, metavar, text in _LIMITS:
            limits.add_argument(
                option,
                dest=field,
                default=None,
                metavar=metavar,
                help=f"{text} (default MEMEST_{field.upper()} or {_default(field)})",
            )

    def run(self, args: argparse.Namespace) -> int:
        try:
            import uvicorn

            from memest.service import create_app
            from memest.service.config import Settings
            from memest.service.server import uvicorn_config
        except ImportError as exc:
            raise CommandError(
                f"the service needs its extra: {install_hint('service')} ({exc.name} missing)"
            ) from None
        overrides: dict[str, object] = {}
        if args.database_url:
            overrides["database_url"] = args.database_url
        if args.demo:
            overrides["demo"] = True
        if args.forwarded_allow_ips is not None:
            overrides["forwarded_allow_ips"] = args.forwarded_allow_ips
        for _, field, _, _ in _LIMITS:
            if getattr(args, field) is not None:
                overrides[field] = getattr(args, field)
        settings = _settings(Settings, overrides)
        generated = token_note = None
        if settings.write_token is None:
            generated, token_note = _write_token(args.write_token_file)
            settings = settings.model_copy(update={"write_token": generated})
        app = _app(create_app, settings)
        if args.exit_after_load:
            return _load_only(app)
        _check_listen(args.host, args.port)
        url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}/"
        print(f"memest service: {url}  (API docs {url}docs, metrics {url}metrics)", flush=True)
        print(f"database: {_safe_url(settings.database_url)}", flush=True)
        if settings.demo:
            print(
                "demo: six real H200 starts and published GB200 figures from a public write-up",
                flush=True,
            )
        if token_note is not None:
            print(token_note, file=sys.stderr, flush=True)
        config = uvicorn_config(
            app,
            settings,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
        )
        uvicorn.Server(config).run()
        return 0


#: The server's read limits: option, Settings field, metavar, help.
_LIMITS = (
    ("--header-timeout", "header_timeout_s", "S", "seconds to send a whole request head"),
    ("--max-header-bytes", "max_header_bytes", "N", "largest request head, in bytes"),
    ("--keep-alive-timeout", "keep_alive_timeout_s", "S", "seconds an idle connection is kept"),
    ("--max-connections", "max_connections", "N", "open connections before 503"),
    (
        "--max-connections-per-client",
        "max_connections_per_client",
        "N",
        "open connections of one client address before 503",
    ),
    ("--backlog", "backlog", "N", "connections the kernel queues before accept"),
)


def _default(field: str) -> object:
    try:
        from memest.service.config import Settings
    except ImportError:  # the service extra is missing: run() says so
        return "see README"
    return Settings.model_fields[field].default


def _settings(settings_class: Any, overrides: dict[str, object]) -> Any:
    """The service settings; a value pydantic refuses (from an option or MEMEST_*) is one line
    naming both spellings of the setting."""
    from pydantic import ValidationError

    from memest.errors import first_error

    try:
        return settings_class(**overrides)
    except ValidationError as exc:
        field, message, _ = first_error(exc)
        option = next((o for o, f, _, _ in _LIMITS if f == field), None)
        where = f"MEMEST_{field.upper()}" + (f" / {option}" if option else "")
        raise CommandError(f"{where}: {message}") from None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 1-65535")
    return port


def _app(create_app: Callable[[Any], FastAPI], settings: Any) -> FastAPI:
    """The service app; a database URL SQLAlchemy cannot use is one line, not a traceback."""
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    try:
        return create_app(settings)
    except ArgumentError as exc:  # unknown dialect or driver, malformed URL
        raise CommandError(
            f"--database-url {_shown_url(settings.database_url)}: {exc} "
            "(expected e.g. sqlite:///./memest.db or postgresql+psycopg://USER@HOST/DB)"
        ) from None
    except (SQLAlchemyError, ImportError) as exc:
        raise CommandError(
            f"--database-url {_shown_url(settings.database_url)}: {type(exc).__name__}: {exc}"
        ) from None


def _shown_url(url: str) -> str:
    try:
        return _safe_url(url)
    except Exception:  # an unparsable URL: show its scheme only (it may hold a password)
        return url.split("://", 1)[0] + "://..."


def _check_listen(host: str, port: int) -> None:
    """Refuse, before the banner, a host/port the server could not listen on (in use, denied)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise CommandError(f"--host {host}: cannot resolve ({exc})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise CommandError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} (try another --port)"
            ) from None


def _write_token(path: str | None) -> tuple[str, str | None]:
    """The write token when MEMEST_WRITE_TOKEN is unset, and the line to print about it (None:
    nothing to say). Without a token file the token is new and printed, as the only way to learn
    it; with one it is read back, or made and saved once, so it survives restarts and stays out
    of the logs."""
    if path is None:
        token = new_write_token()
        return token, f"write token (MEMEST_WRITE_TOKEN was unset): {token}"
    file = Path(path)
    try:
        if file.is_file():
            token = file.read_text().strip()
            if not token:
                raise CommandError(f"--write-token-file {path}: the file is empty")
            return token, None
        token = new_write_token()
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
    except OSError as exc:
        raise CommandError(f"--write-token-file {path}: {exc.strerror or exc}") from None
    return token, f"write token (MEMEST_WRITE_TOKEN was unset): made and saved to {path}"


def new_write_token() -> str:
    # Hex, so the token never starts with "-": `--token <value>` would read such a value as an option.
    return secrets.token_hex(20)


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _load_only(app: FastAPI) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from memest.service import db, store
    from memest.service.app import load_demo

    try:
        db.upgrade(app.state.engine)
    except SQLAlchemyError as exc:  # unreachable server, refused login, missing database
        url = _shown_url(app.state.settings.database_url)
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise CommandError(f"--database-url {url}: {type(exc).__name__}: {reason}") from None
    if app.state.settings.demo:
        load_demo(app)
    with app.state.sessionmaker() as session:
        models, _ = store.list_models(session)
    app.state.engine.dispose()
    for m in models:
        print(f"{m.model}: {m.runs} runs ({', '.join(m.builds)})")
    print(f"{len(models)} models stored")
    return 0


COMMAND = ServeCommand()
