"""Server-side login sessions: the /login form's cookie names a row of the ``sessions`` table.

The cookie holds a random id (``secrets``); the database keeps only its SHA-256 (a 256-bit random
id needs no slow hash), a tag of the token that opened it and its expiry. Whether a cookie is
good is a database read, so every replica on one database agrees, and /logout (deleting the row)
revokes the cookie at once everywhere.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable

from pydantic import SecretStr
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from memest.service.db import write_session
from memest.service.models import LoginSession

#: Cookie that the login form sets, so that a browser can read the dashboard when reads need a
#: token (a browser cannot send a bearer header on its own).
SESSION_COOKIE = "memest_session"
#: Session lifetime, in seconds (the cookie's Max-Age and the row's expiry).
SESSION_MAX_AGE_S = 12 * 3600
#: Longest cookie value looked up; ours are 43 characters (token_urlsafe(32)).
_MAX_ID_CHARS = 128


def token_tag(token: SecretStr) -> str:
    """A tag of ``token`` stored with each session (an HMAC keyed by it, so it never reveals the
    token): a session is good only while the token that opened it is still configured."""
    key = token.get_secret_value().encode()
    return hmac.new(key, b"memest dashboard session", hashlib.sha256).hexdigest()


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class SessionStore:
    """Create, check and revoke login sessions in the app's database."""

    def __init__(
        self, factory: sessionmaker[Session], clock: Callable[[], float] = time.time
    ) -> None:
        self._factory = factory
        self._clock = clock

    def create(self, token: SecretStr) -> str:
        """A new session opened with ``token``; returns its id (the cookie value). Expired rows
        are pruned on the way, so the table holds only live sessions and recent leftovers."""
        now = int(self._clock())
        session_id = secrets.token_urlsafe(32)
        with write_session(self._factory) as db:
            db.execute(delete(LoginSession).where(LoginSession.expires_at_s <= now))
            db.add(
                LoginSession(
                    id_sha256=_digest(session_id),
                    token_tag=token_tag(token),
                    created_at_s=now,
                    expires_at_s=now + SESSION_MAX_AGE_S,
                )
            )
        return session_id

    def valid(self, session_id: str, tokens: Iterable[SecretStr | None]) -> bool:
        """Whether ``session_id`` names a live session opened with one of ``tokens``; an expired
        one is deleted as it is refused."""
        if not session_id or len(session_id) > _MAX_ID_CHARS:
            return False
        digest = _digest(session_id)
        with self._factory() as db:
            row = db.get(LoginSession, digest)
        if row is None:
            return False
        if row.expires_at_s <= int(self._clock()):
            self.revoke(session_id)
            return False
        return any(t is not None and token_tag(t) == row.token_tag for t in tokens)

    def revoke(self, session_id: str) -> bool:
        """Delete the session ``session_id``; whether there was one."""
        if not session_id or len(session_id) > _MAX_ID_CHARS:
            return False
        with write_session(self._factory) as db:
            result = db.execute(
                delete(LoginSession).where(LoginSession.id_sha256 == _digest(session_id))
            )
        return bool(getattr(result, "rowcount", 0))
