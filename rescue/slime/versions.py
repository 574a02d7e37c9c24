"""The engines' current weight version, as slime's drain reads it.

Specification
-------------
Staleness is ``current version - oldest counted version of the group``. slime tells its
rollout function no version, so the drain asks every engine behind slime's router
(``GET /workers`` on the router, as slime's own ``abort`` does) and takes the highest
numeric answer. Two routes report it:

- ``/get_weight_version``: the route slime's ``SGLangEngine.get_weight_version`` calls.
  Upstream SGLang answers it with a 404 ("deprecated, use /model_info"); slime's SGLang
  patch (``docker/patch/*/sglang.patch``, ``http_server.py``) makes it answer again;
- ``/model_info``: upstream SGLang's route, whose ``weight_version`` field is the same
  server argument.

``EngineVersions`` remembers which route answered (``source``: ``engines
(/get_weight_version)``, ``engines (/model_info)``) and tries the other when it stops.
When neither answers (no router address, a route missing on every engine, a timeout),
the drain falls back on the highest version seen on any sample: a lower bound, so
staleness is then under-estimated, never over-estimated. ``probe`` says at start which
source is in use, and every step logs ``rollout/census/version_fallback`` (1 when the
step's version came from the fallback, else 0).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any

logger = logging.getLogger(__name__)

#: The engine routes that report the weight version, in the order they are tried.
ROUTES = ("/get_weight_version", "/model_info")
#: What ``source`` says when the engines do not answer.
FALLBACK = "samples (the highest version seen on a sample: a lower bound)"


class EngineVersions:
    """The highest weight version the engines behind slime's router report.

    Args:
        args: slime's arguments (``sglang_router_ip``, ``sglang_router_port``).
        timeout_s: per request (default 2 s).
    """

    def __init__(self, args: Any, timeout_s: float = 2.0) -> None:
        self.args = args
        self.timeout_s = timeout_s
        self.route: str | None = None  # the route that answered last
        self.last_error: str | None = None
        self._warned = False

    @property
    def source(self) -> str:
        return f"engines ({self.route})" if self.route else FALLBACK

    def __call__(self) -> int | None:
        """The version, or ``None`` (the fallback; warned once per stretch of failures)."""
        version = self._ask()
        if version is None and not self._warned:
            logger.warning(
                "rescue: cannot read the engines' weight version (%s); using %s",
                self.last_error,
                FALLBACK,
            )
            self._warned = True
        elif version is not None:
            self._warned = False
        return version

    def probe(self) -> str:
        """Ask once and log which source of versions is in use; that source."""
        self._ask()
        if self.route:
            logger.info("rescue: weight versions from the %s", self.source)
        else:
            logger.warning(
                "rescue: weight versions from %s, because the engines do not report theirs "
                "(%s); staleness is under-estimated (rollout/census/version_fallback = 1)",
                FALLBACK,
                self.last_error,
            )
        return self.source

    def _ask(self) -> int | None:
        ip = getattr(self.args, "sglang_router_ip", None)
        port = getattr(self.args, "sglang_router_port", None)
        if not ip or not port:
            self.route, self.last_error = None, "no --sglang-router-ip/--sglang-router-port"
            return None
        try:
            workers = _get_json(f"http://{ip}:{port}/workers", self.timeout_s)["workers"]
            urls = [w["url"].rstrip("/") for w in workers]
        except Exception as e:  # any failure of the router: the fallback
            self.route, self.last_error = None, f"router: {e!r}"
            return None
        routes = [self.route] if self.route else []
        routes += [r for r in ROUTES if r not in routes]
        for route in routes:
            try:
                reported = [
                    str(_get_json(url + route, self.timeout_s)["weight_version"]) for url in urls
                ]
            except Exception as e:
                self.last_error = f"{route}: {e!r}"
                continue
            self.route = route
            numeric = [int(v) for v in reported if v.strip().isdigit()]
            if not numeric:
                self.last_error = f"{route}: no numeric version in {reported}"
                return None
            return max(numeric)
        self.route = None
        return None


def engine_version(args: Any, timeout_s: float = 2.0) -> int | None:
    """The engines' highest numeric weight version, or ``None`` (module docstring)."""
    return EngineVersions(args, timeout_s)()


def _get_json(url: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())
