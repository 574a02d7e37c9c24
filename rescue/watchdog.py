"""The run's watchdog: a systematic fault stops the run loudly instead of starving it.

A fault that hits every trial (the Docker socket missing in the rollout process, a broken
grader, an engine that is down) makes every group a no-result. The buffer drops such groups
(``rescue.census.no_result``), so nothing is trained, nothing reaches the dashboard, and the
fully-async loop only warns that no group completed, forever. The watchdog turns that into
a stop with one line that says why.

Specification
-------------
The adapter reports every group that finished generating: ``observe(reason, error)``, with
``reason`` the group's no-result reason (``None`` when the group has a result) and
``error`` the text of its first fault (or ``None``). The consumer that waits for groups
calls ``check_idle()`` while it waits (``seconds_to_idle()`` says how long it may wait
before the next check is due). The watchdog trips when either holds:

- **no-result fraction**: at least ``window`` groups were observed and, of the last
  ``window``, more than ``max_no_result`` (a fraction) had no result;
- **idle**: no group was observed for ``idle_s`` seconds (counted from the last observed
  group, or from construction before the first).

Tripping calls ``flush(line)`` first (the adapter writes the census of what happened to
the dashboard there), then raises ``WatchdogStop(line)``. The line names the trigger, the
dominant no-result reason among the last ``window`` groups (with its count) and the last
``errors_kept`` distinct errors, each on one line, clipped; before the errors, what the
adapter's ``diagnose()`` finds when it is given one (the Miles buffer names the rollout
engines that do not answer: an agent's error shows only its own endpoint, the session
server); a ``diagnose`` that finds nothing adds nothing, one that raises says so. A flush that raises is noted in
the line; the stop is raised all the same. After a trip every ``observe`` and
``check_idle`` raises the same ``WatchdogStop``: the run does not go on.

Settings (``WatchdogSettings.from_env``; the launchers set them in the run's environment):

``RESCUE_WATCHDOG_WINDOW``         ``window``, default 64 groups; 0 turns the fraction check off.
``RESCUE_WATCHDOG_MAX_NO_RESULT``  ``max_no_result``, default 0.5, a fraction in [0, 1].
``RESCUE_WATCHDOG_IDLE_S``         ``idle_s``, default 10800 s; 0 turns the idle check off.

The module is framework-free: the Miles buffer (``rescue.miles.buffer``) and the slime
drain call the same code, each with its own ``flush``.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rescue import flags
from rescue.errors import InputError

ENV_WINDOW = "RESCUE_WATCHDOG_WINDOW"
ENV_MAX_NO_RESULT = "RESCUE_WATCHDOG_MAX_NO_RESULT"
ENV_IDLE_S = "RESCUE_WATCHDOG_IDLE_S"
#: Characters of one error kept in the stop line, and of the adapter's diagnosis.
ERROR_CHARS = 200
DIAGNOSIS_CHARS = 600


def _typed(kind: type, var: str) -> Callable[[str], float]:
    """``kind(text)``, refused as ``VAR='text' is not a number (int)``."""

    def convert(text: str) -> float:
        try:
            return kind(text)
        except ValueError:
            raise InputError(f"{var}={text!r} is not a number ({kind.__name__})") from None

    return convert


#: The watchdog's settings (``WatchdogSettings`` checks their ranges).
WINDOW = flags.setting(ENV_WINDOW, 64, _typed(int, ENV_WINDOW), "an integer >= 0 (0: off)")
MAX_NO_RESULT = flags.setting(
    ENV_MAX_NO_RESULT, 0.5, _typed(float, ENV_MAX_NO_RESULT), "a fraction in [0, 1]"
)
IDLE_S = flags.setting(ENV_IDLE_S, 10800.0, _typed(float, ENV_IDLE_S), "seconds >= 0 (0: off)")


@dataclass(frozen=True)
class WatchdogSettings:
    """When the watchdog stops a run (module docstring).

    Args:
        window: groups the no-result fraction is taken over (``RESCUE_WATCHDOG_WINDOW``,
            default 64); 0 turns the fraction check off.
        max_no_result: the fraction of the last ``window`` groups without a result above
            which the run stops (``RESCUE_WATCHDOG_MAX_NO_RESULT``, default 0.5), in [0, 1].
        idle_s: seconds without a finished group after which the run stops
            (``RESCUE_WATCHDOG_IDLE_S``, default 10800: twice the SWE agent's default trial
            timeout); 0 turns the idle check off.
        errors_kept: distinct errors named in the stop line (default 3).
    """

    window: int = WINDOW.default
    max_no_result: float = MAX_NO_RESULT.default
    idle_s: float = IDLE_S.default
    errors_kept: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise InputError(f"{ENV_WINDOW}={self.window!r}; allowed: an integer >= 0 (0: off)")
        if not 0.0 <= self.max_no_result <= 1.0:
            raise InputError(
                f"{ENV_MAX_NO_RESULT}={self.max_no_result!r}; allowed: a fraction in [0, 1]"
            )
        if not self.idle_s >= 0:
            raise InputError(f"{ENV_IDLE_S}={self.idle_s!r}; allowed: seconds >= 0 (0: off)")
        if self.errors_kept < 1:
            raise InputError(f"watchdog errors_kept={self.errors_kept!r}; allowed: >= 1")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WatchdogSettings:
        """Settings from ``RESCUE_WATCHDOG_*`` (unset or empty: the defaults)."""
        return cls(
            window=WINDOW.read(env), max_no_result=MAX_NO_RESULT.read(env), idle_s=IDLE_S.read(env)
        )

    def describe(self) -> str:
        """One line: what trips the watchdog."""
        fraction = (
            f"more than {self.max_no_result:g} of the last {self.window} groups without a result"
            if self.window
            else "no-result fraction off"
        )
        idle = f"no group for {self.idle_s:g} s" if self.idle_s else "idle check off"
        return f"{fraction}; {idle}"


class WatchdogStop(RuntimeError):
    """The run stops: ``line`` says why (the trigger, the dominant reason, the last errors)."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


class Watchdog:
    """The watchdog of one run (module docstring).

    Args:
        settings: when to stop (default ``WatchdogSettings()``).
        flush: called with the stop line before ``WatchdogStop`` is raised (default none);
            the adapter logs the census there.
        clock: seconds, monotonic (default ``time.monotonic``).
        diagnose: called when the watchdog trips, its text (if any) added to the line
            (default none).
    """

    def __init__(
        self,
        settings: WatchdogSettings | None = None,
        *,
        flush: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        diagnose: Callable[[], str | None] | None = None,
    ) -> None:
        self.settings = settings or WatchdogSettings()
        self._flush = flush
        self._diagnose = diagnose
        self._clock = clock
        self._last_group = clock()
        self._recent: deque[str | None] = deque(maxlen=max(self.settings.window, 1))
        self._errors: deque[str] = deque(maxlen=self.settings.errors_kept)
        self.groups = 0
        self.no_result_groups = 0
        self.stopped: WatchdogStop | None = None

    def observe(self, reason: str | None, error: str | None = None) -> None:
        """One group finished: ``reason`` its no-result reason, ``None`` when it has a result.

        Raises ``WatchdogStop`` when this group makes the no-result fraction trip, or when
        the watchdog already stopped.
        """
        self._raise_if_stopped()
        self._last_group = self._clock()
        self.groups += 1
        self._recent.append(reason)
        if reason is not None:
            self.no_result_groups += 1
            text = f"{reason}: {_one_line(error)}" if error else reason
            if text in self._errors:
                self._errors.remove(text)
            self._errors.append(text)
        window = self.settings.window
        if not window or len(self._recent) < window:
            return
        failed = sum(r is not None for r in self._recent)
        if failed > self.settings.max_no_result * window:
            self._trip(
                f"{failed} of the last {window} groups had no result "
                f"(more than {self.settings.max_no_result:g}, {ENV_MAX_NO_RESULT})"
            )

    def seconds_to_idle(self) -> float | None:
        """Seconds until the idle check trips if no group finishes (``None``: check off)."""
        if not self.settings.idle_s:
            return None
        return max(0.0, self._last_group + self.settings.idle_s - self._clock())

    def check_idle(self) -> None:
        """Raise ``WatchdogStop`` when no group finished for ``idle_s`` seconds."""
        self._raise_if_stopped()
        left = self.seconds_to_idle()
        if left is not None and left <= 0:
            waited = self._clock() - self._last_group
            self._trip(
                f"no group finished for {waited:.0f} s ({ENV_IDLE_S}={self.settings.idle_s:g}; "
                f"{self.groups} groups finished before, {self.no_result_groups} without a result)"
            )

    def _trip(self, trigger: str) -> None:
        line = f"rescue watchdog: stopping the run: {trigger}; {self._diagnosis()}"
        if self._flush is not None:
            try:
                self._flush(line)
            except Exception as e:  # the stop matters more than the flush
                line += f"; the census flush failed ({type(e).__name__}: {_one_line(str(e))})"
            else:
                line += "; census flushed"
        self.stopped = WatchdogStop(line)
        raise self.stopped

    def _diagnosis(self) -> str:
        reasons = Counter(r for r in self._recent if r is not None)
        if reasons:
            reason, count = reasons.most_common(1)[0]
            dominant = f"dominant reason {reason} ({count} of {len(self._recent)} groups)"
        else:
            dominant = "no group without a result among the last ones"
        errors = " | ".join(self._errors) if self._errors else "none"
        found = None
        if self._diagnose is not None:
            try:
                found = self._diagnose()
            except Exception as e:  # a diagnosis never keeps the run from stopping
                found = f"(the diagnosis failed: {type(e).__name__})"
        if found:
            dominant += f"; {' '.join(str(found).split())[:DIAGNOSIS_CHARS]}"
        return f"{dominant}; last errors: {errors}"

    def _raise_if_stopped(self) -> None:
        if self.stopped is not None:
            raise self.stopped


def _one_line(text: str | None) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= ERROR_CHARS else flat[: ERROR_CHARS - 1] + "…"
