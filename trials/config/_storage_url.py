"""Whether a ``checkpoint_storage.path`` is a URL, and whether it is a usable one.

Example:
    >>> is_url("s3://bucket/ckpt"), is_url("/shared/ckpt")
    (True, False)
"""

from __future__ import annotations

import re

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_url(path: str) -> bool:
    """Whether ``path`` is a URL (``protocol://...``) rather than a file system path."""
    return _URL.match(path) is not None


def url_problem(path: str) -> str | None:
    """Why ``path`` cannot be a ``checkpoint_storage.path`` URL; ``None`` if it can.

    Credentials in the URL are refused (they would be stored with the experiment); the
    protocol must be one fsspec knows.

    Example:
        >>> url_problem("s3://key:secret@bucket/x")
        'credentials in the URL are refused: set them in the environment or the provider config'
        >>> url_problem("nosuch://bucket")
        "fsspec knows no protocol 'nosuch'"
    """
    match = _URL.match(path)
    if match is None:
        return None
    import fsspec

    if "@" in path[match.end() :].split("/", 1)[0]:
        return (
            "credentials in the URL are refused: set them in the environment or the "
            "provider config"
        )
    protocol = match.group(1)
    if protocol not in fsspec.available_protocols():
        return f"fsspec knows no protocol {protocol!r}"
    return None
