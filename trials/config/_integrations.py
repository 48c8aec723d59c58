"""Where a search reports beyond its own database: MLflow, and webhooks on its events.

``integrations: {mlflow: {...}}`` and ``notifications: [...]`` of the experiment config;
the cluster file takes the same ``notifications`` list for every search on the cluster.
Both only name where to send: the driver reads what to send from the database, so a
URL here never reaches a rank. A URL with a user name or password in it is refused
(it would be stored with the experiment and shown by ``describe``); a webhook's secret
token belongs in its path, as Slack's incoming webhooks put it.

Example:
    >>> NotificationConfig(url="https://hooks.example.com/x", on=["completed"]).on
    ['completed']
    >>> MlflowConfig(tracking_uri="http://127.0.0.1:5000").experiment_name is None
    True
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from trials.config._validation import SECRET_INPUT_ERROR, ConfigModel

#: The events a notification may be sent on: the search's end states and a failed trial.
NotificationEvent = Literal["completed", "error", "paused", "trial_failed"]
NOTIFICATION_EVENTS: tuple[str, ...] = ("completed", "error", "paused", "trial_failed")
# MLflow's stores besides a server: a local folder or a database file it opens itself.
_MLFLOW_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "databricks")


def _no_credentials(url: str, instead: str) -> None:
    """Refuse a URL carrying ``user:password@`` (it would be stored with the experiment)."""
    if "@" in urlsplit(url).netloc:
        # Not repeated in the message: the URL holds the credential.
        raise PydanticCustomError(
            SECRET_INPUT_ERROR, f"credentials in the URL are refused: {instead}"
        )


class MlflowConfig(ConfigModel):
    """An MLflow tracking server (or store) that the driver logs every trial to."""

    tracking_uri: str = Field(min_length=1, max_length=2048)
    #: The MLflow experiment the search's runs go in (default: the slotsweep experiment's name).
    experiment_name: str | None = Field(default=None, min_length=1, max_length=500)

    @field_validator("tracking_uri")
    @classmethod
    def _a_tracking_uri(cls, uri: str) -> str:
        _no_credentials(
            uri,
            "give them in the environment (MLflow reads MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD)",
        )
        scheme = urlsplit(uri).scheme
        if scheme not in _MLFLOW_SCHEMES:
            raise ValueError(
                f"must be a URI with one of the schemes {', '.join(_MLFLOW_SCHEMES)} "
                "(e.g. http://mlflow.example.com:5000)"
            )
        return uri


class IntegrationsConfig(ConfigModel):
    """Tools the search is logged to besides slotsweep's database (each optional)."""

    mlflow: MlflowConfig | None = None


class NotificationConfig(ConfigModel):
    """A webhook posted to on some of the search's events (Slack's format for Slack's URLs)."""

    url: str = Field(min_length=1, max_length=2048)
    on: list[NotificationEvent] = Field(
        default_factory=lambda: list[NotificationEvent](["completed", "error"]),
        min_length=1,
        max_length=len(NOTIFICATION_EVENTS),
    )

    @field_validator("url")
    @classmethod
    def _a_web_url(cls, url: str) -> str:
        _no_credentials(url, "a webhook's secret token belongs in its path")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        return url

    @property
    def is_slack(self) -> bool:
        """Whether the URL is a Slack incoming webhook (which takes ``{"text": ...}``).

        Example:
            >>> NotificationConfig(url="https://hooks.slack.com/services/T/B/x").is_slack
            True
        """
        return urlsplit(self.url).hostname == "hooks.slack.com"
