"""Which rollout engines answer: what the watchdog's stop line names when groups stop coming.

An agent's failing model call shows only its own endpoint (Miles' session server); behind it
are Miles' router and the SGLang engines, and an engine that died (killed, its connections
reset) leaves every trial failing the same way. When the watchdog stops the run, the Miles
buffer adds to its line the engines that do not answer (``diagnosis``):

- ``engine_urls(args)``: the run's engines: the external ones Miles was given
  (``--rollout-external-engine-addrs``), else those its router lists (``GET /list_workers``
  at ``--sglang-router-ip``/``--sglang-router-port``: ``{"urls": [...]}`` from Miles' router
  and PyPI sglang-router alike);
- ``unanswered(urls, timeout)``: each engine whose ``GET /health`` fails within ``timeout``
  seconds, with why (connection refused or reset, a timeout, an HTTP status);
- ``diagnosis(args)``: ``"rollout engines not answering: URL (why), ..."``, ``"every rollout
  engine answers its health check (N)"``, or None when the engines cannot be told.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: Seconds a health check may take.
TIMEOUT_S = 5.0


def _get(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def engine_urls(args: Any, timeout: float = TIMEOUT_S) -> list[str]:
    """The run's engine URLs (module docstring); empty when they cannot be told."""
    external = getattr(args, "rollout_external_engine_addrs", None) or []
    if external:
        return [a if "://" in a else f"http://{a}" for a in external]
    ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    if not ip or not port:
        return []
    try:
        listed = _get(f"http://{ip}:{port}/list_workers", timeout)
    except (OSError, ValueError):
        return []
    urls = listed.get("urls") if isinstance(listed, dict) else None
    return [str(u) for u in urls or []]


def _why(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    reason = getattr(e, "reason", e)
    return str(getattr(reason, "strerror", None) or reason or type(e).__name__)


def _check(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout):
            return None
    except (OSError, ValueError) as e:
        return _why(e)


def unanswered(urls: Iterable[str], timeout: float = TIMEOUT_S) -> list[tuple[str, str]]:
    """``(url, why)`` for each engine whose health check fails (all asked at once, so the
    answer takes ``timeout`` at most)."""
    urls = list(urls)
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(urls)))) as pool:
        whys = list(pool.map(lambda u: _check(u, timeout), urls))
    return [(u, why) for u, why in zip(urls, whys, strict=True) if why is not None]


def diagnosis(args: Any, timeout: float = TIMEOUT_S) -> str | None:
    """One line for the watchdog (module docstring)."""
    urls = engine_urls(args, timeout)
    if not urls:
        return None
    failing = unanswered(urls, timeout)
    if not failing:
        return f"every rollout engine answers its health check ({len(urls)})"
    said = ", ".join(f"{url} ({why})" for url, why in failing)
    return f"rollout engines not answering ({len(failing)} of {len(urls)}): {said}"
