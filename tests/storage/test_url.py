"""Database URLs printed safely: every password masked, wherever the URL carries it."""

from __future__ import annotations

import pytest

from storage import redact_url
from storage._url import redact_secrets, url_secrets


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h/db?password=x", "postgresql://u@h/db?password=***"),
        ("postgresql://u@h/db?sslpassword=x", "postgresql://u@h/db?sslpassword=***"),
        # Key names are matched in any case; the other parameters stay readable.
        (
            "postgresql+psycopg://u@h:5432/db?sslmode=require&PASSWORD=x&application_name=a%20b",
            "postgresql+psycopg://u@h:5432/db?PASSWORD=***&application_name=a+b&sslmode=require",
        ),
        # A password before the @ and others in the query string, a repeated key.
        (
            "postgresql://u:p1@h/db?password=p2&password=p3",
            "postgresql://u:***@h/db?password=***&password=***",
        ),
        ("mysql://u@h/db?passwd=x&client_secret=y", "mysql://u@h/db?client_secret=***&passwd=***"),
        ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
        ("sqlite:///x.db?mode=ro&uri=true", "sqlite:///x.db?mode=ro&uri=true"),
    ],
)
def test_redact_url_masks_passwords_in_userinfo_and_query(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redacted_url_names_no_secret_in_any_encoding() -> None:
    url = "postgresql://me:p%40ss%2Fw0rd@db/x?sslpassword=k%20ey&sslmode=require"
    hidden = redact_url(url)
    for fragment in ("p@ss/w0rd", "p%40ss%2Fw0rd", "k ey", "k+ey", "k%20ey"):
        assert fragment not in hidden, hidden
    assert hidden.startswith("postgresql://me:***@db/x?")
    assert "sslmode=require" in hidden


def test_unparsable_url_is_never_echoed() -> None:
    assert redact_url("postgresql://u:pw@h:notaport/db") == "<unparsable database URL>"
    assert url_secrets("postgresql://u:pw@h:notaport/db") == []


def test_url_secrets_lists_every_password_longest_first() -> None:
    url = "postgresql://me:pw@db/x?password=query-pw&sslpassword=key-pw&sslmode=require"
    assert url_secrets(url) == ["query-pw", "key-pw", "pw"]
    assert url_secrets("postgresql://me@db/x?sslmode=require") == []
    assert url_secrets("sqlite:///x.db") == []


def test_redact_secrets_masks_what_a_driver_echoes() -> None:
    url = "postgresql://me:p%40ss@db/x?sslpassword=k%20ey"
    message = "invalid dsn: user=me password=p@ss sslpassword='k ey' (from p%40ss, k+ey)"
    masked = redact_secrets(message, url)
    assert masked == "invalid dsn: user=me password=*** sslpassword='***' (from ***, ***)"
    # A URL without secrets changes nothing.
    assert redact_secrets(message, "sqlite:///x.db") == message
