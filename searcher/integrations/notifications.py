"""Webhook notifications of a search's events: what is posted, and posting it with retries.

A notification is a JSON body: the experiment (id and name), the event (``completed``,
``error``, ``paused``, ``trial_failed``), the experiment's state, its trial counts, the
best value of the searcher metric and a one-line reason. Slack's incoming webhooks
(``https://hooks.slack.com/...``) take ``{"text": ...}`` instead: the same facts as one
message. Nothing in either names the database (its URL may hold a password).

:class:`Poster` delivers them from a thread of its own: a URL that is down or answers
an error is retried with exponential backoff, a few times, and its failure logged once
per URL, so a webhook never slows or fails the search.

Example:
    >>> from trials.config import NotificationConfig
    >>> body = notification_body(
    ...     experiment_id=3, name="digits", event="completed", state="COMPLETED",
    ...     counts={"total": 4, "completed": 4}, metric="val_loss", best_value=0.25,
    ...     reason="all 4 trials ran",
    ... )
    >>> body["experiment"], body["best_value"]
    ({'id': 3, 'name': 'digits'}, 0.25)
    >>> slack = NotificationConfig(url="https://hooks.slack.com/services/T/B/x")
    >>> payload_for(slack, body)["text"]
    'slotsweep experiment 3 (digits) completed: COMPLETED; trials: total 4, completed 4; best val_loss 0.25; all 4 trials ran'
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from trials.config import NotificationConfig

_log = logging.getLogger(__name__)

#: Tries per notification, and the first wait between them (doubled each time).
ATTEMPTS = 4
FIRST_BACKOFF_S = 0.5
#: Seconds one request may take before it counts as failed.
REQUEST_TIMEOUT_S = 5.0
# A reason longer than this is cut: a notification is a line, the details are in slotsweep.
MAX_REASON_CHARS = 300


def one_line(text: str) -> str:
    """``text``'s first line, cut to :data:`MAX_REASON_CHARS`.

    Example:
        >>> one_line("RuntimeError: boom\\nTraceback ...")
        'RuntimeError: boom'
    """
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= MAX_REASON_CHARS else first[: MAX_REASON_CHARS - 1] + "…"


def notification_body(
    *,
    experiment_id: int,
    name: str,
    event: str,
    state: str,
    counts: dict[str, int],
    metric: str,
    best_value: float | None,
    reason: str,
    trial: str | None = None,
) -> dict[str, Any]:
    """The JSON body of one notification (see the module doc)."""
    body: dict[str, Any] = {
        "experiment": {"id": experiment_id, "name": name},
        "event": event,
        "state": state,
        "counts": counts,
        "metric": metric,
        "best_value": best_value,
        "reason": one_line(reason),
    }
    if trial is not None:
        body["trial"] = trial
    return body


def payload_for(target: NotificationConfig, body: dict[str, Any]) -> dict[str, Any]:
    """What is posted to ``target``: ``body``, or Slack's ``{"text": ...}`` for a Slack URL."""
    if not target.is_slack:
        return body
    experiment = body["experiment"]
    counts = ", ".join(f"{k} {v}" for k, v in body["counts"].items() if v)
    parts = [
        f"slotsweep experiment {experiment['id']} ({experiment['name']}) {body['event']}"
        + (f" (trial {body['trial']})" if "trial" in body else "")
        + f": {body['state']}",
        f"trials: {counts or 'none'}",
    ]
    if body["best_value"] is not None:
        parts.append(f"best {body['metric']} {body['best_value']:g}")
    if body["reason"]:
        parts.append(body["reason"])
    return {"text": "; ".join(parts)}


@dataclass(frozen=True)
class _Delivery:
    target: NotificationConfig
    payload: dict[str, Any]


class Poster:
    """Posts notifications from a background thread, with retries; never blocks its caller.

    :meth:`send` queues; :meth:`close` waits at most its ``timeout`` for what is queued
    (a search that ends does not wait longer on a webhook that is down).
    """

    def __init__(self, *, attempts: int = ATTEMPTS, first_backoff_s: float = FIRST_BACKOFF_S):
        self._attempts = attempts
        self._first_backoff_s = first_backoff_s
        self._queue: queue.Queue[_Delivery | None] = queue.Queue()
        self._failing: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="slotsweep-notify", daemon=True)
        self._thread.start()

    def send(self, target: NotificationConfig, body: dict[str, Any]) -> None:
        """Queue ``body`` for ``target`` (in its format); returns at once."""
        self._queue.put(_Delivery(target, payload_for(target, body)))

    def close(self, timeout: float) -> bool:
        """Stop after what is queued, waiting at most ``timeout`` s; whether all was sent."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            delivery = self._queue.get()
            if delivery is None:
                return
            self._deliver(delivery)

    def _deliver(self, delivery: _Delivery) -> None:
        data = json.dumps(delivery.payload).encode()
        backoff = self._first_backoff_s
        host = delivery.target.url.split("/")[2]  # never the path: a token may be in it
        for attempt in range(1, self._attempts + 1):
            try:
                request = urllib.request.Request(
                    delivery.target.url,
                    data=data,
                    headers={"Content-Type": "application/json", "User-Agent": "slotsweep"},
                    method="POST",
                )
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                    response.read()
            except (urllib.error.URLError, OSError, ValueError) as exc:
                if attempt == self._attempts:
                    if host not in self._failing:
                        self._failing.add(host)
                        _log.warning(
                            "notification to %s failed after %d tries (%s); later ones to it "
                            "are tried too, and logged only once they succeed",
                            host,
                            attempt,
                            _reason(exc),
                        )
                    return
                time.sleep(backoff)
                backoff *= 2
                continue
            if host in self._failing:
                self._failing.discard(host)
                _log.warning("notifications to %s are delivered again", host)
            return


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc)
