"""A database URL's passwords never reach the log, an error message or ``check-config``:
:func:`luftpause.config.without_password` hides each place libpq takes one from (PostgreSQL's
documentation, "Connection URIs": the ``user:password@`` part and any connection keyword as a query
parameter, ``password`` and ``sslpassword`` among them)."""

from __future__ import annotations

import pytest

from luftpause.config import without_password


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:secret@db:5432/runs", "postgresql://u:***@db:5432/runs"),
        ("postgresql://u:s%40cr%3Aet@db/runs", "postgresql://u:***@db/runs"),
        # found by review: a password as a query parameter came back whole
        ("postgresql://u@db/runs?password=secret", "postgresql://u@db/runs?password=***"),
        ("postgresql://db/runs?user=u&password=secret", "postgresql://db/runs?user=u&password=***"),
        (
            "postgresql://u:one@db/runs?sslmode=require&sslpassword=two",
            "postgresql://u:***@db/runs?sslmode=require&sslpassword=***",
        ),
        (
            "postgresql:///runs?host=%2Fvar%2Frun&password=secret",
            "postgresql:///runs?host=%2Fvar%2Frun&password=***",
        ),
        ("postgresql://u@db/runs", "postgresql://u@db/runs"),
        ("file", "file"),
    ],
)
def test_every_password_of_a_database_url_is_hidden(url: str, shown: str) -> None:
    assert without_password(url) == shown
    assert "secret" not in without_password(url) and "one" not in without_password(url).split("@")[0]
