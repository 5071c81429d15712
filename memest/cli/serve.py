"""Run the memest service (FastAPI + uvicorn): API, dashboard and /metrics.

  memest serve --demo                    published demo reports, SQLite ./memest.db, 127.0.0.1:8000
  memest serve --database-url postgresql+psycopg://memest@db:5432/memest --host 0.0.0.0

Settings also come from MEMEST_* environment variables (MEMEST_DATABASE_URL, MEMEST_WRITE_TOKEN,
MEMEST_READ_TOKEN, MEMEST_MAX_REPORT_BYTES); options given here win. Without a write token the
server makes one up and prints it, so writes always need a bearer token.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from typing import TYPE_CHECKING

from memest.errors import CommandError

if TYPE_CHECKING:
    from fastapi import FastAPI


class ServeCommand:
    name = "serve"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
        parser.add_argument(
            "--database-url",
            help="SQLAlchemy URL (default MEMEST_DATABASE_URL or sqlite:///./memest.db)",
        )
        parser.add_argument(
            "--demo", action="store_true", help="load the published demo reports at startup"
        )
        parser.add_argument(
            "--exit-after-load",
            action="store_true",
            help="migrate the database (and load the demo), print what is stored, then exit",
        )
        parser.add_argument("--log-level", default="warning", help="uvicorn log level")

    def run(self, args: argparse.Namespace) -> int:
        try:
            import uvicorn

            from memest.service import create_app
            from memest.service.config import Settings
        except ImportError as exc:
            raise CommandError(
                f"the service needs its extra: pip install 'memest[service]' ({exc.name} missing)"
            ) from None
        overrides: dict[str, object] = {}
        if args.database_url:
            overrides["database_url"] = args.database_url
        if args.demo:
            overrides["demo"] = True
        settings = Settings(**overrides)  # type: ignore[arg-type]
        generated = None
        if settings.write_token is None:
            generated = new_write_token()
            settings = settings.model_copy(update={"write_token": generated})
        app = create_app(settings)
        if args.exit_after_load:
            return _load_only(app)
        url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}/"
        print(f"memest service: {url}  (API docs {url}docs, metrics {url}metrics)", flush=True)
        print(f"database: {_safe_url(settings.database_url)}", flush=True)
        if settings.demo:
            print("demo: published GB200 figures from the seed (source=published)", flush=True)
        if generated is not None:
            print(
                f"write token (MEMEST_WRITE_TOKEN was unset): {generated}",
                file=sys.stderr,
                flush=True,
            )
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
        return 0


def new_write_token() -> str:
    # Hex, so the token never starts with "-": `--token <value>` would read such a value as an option.
    return secrets.token_hex(20)


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _load_only(app: FastAPI) -> int:
    from memest.service import db, store
    from memest.service.app import load_demo

    db.upgrade(app.state.engine)
    if app.state.settings.demo:
        load_demo(app)
    with app.state.sessionmaker() as session:
        models = store.list_models(session)
    app.state.engine.dispose()
    for m in models:
        print(f"{m.model}: {m.runs} runs ({', '.join(m.builds)})")
    print(f"{len(models)} models stored")
    return 0


COMMAND = ServeCommand()
