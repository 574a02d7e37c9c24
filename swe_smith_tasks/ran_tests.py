"""Did the agent run the repository's tests, and after its last edit? Read from a trajectory.

Specification (the rule, applied to a mini-swe-agent trajectory's messages)
---------------------------------------------------------------------------
Only the actions before the final exit message count, in order (step, action, segment).

1. Each action's ``command`` is split on ``&&``, ``||``, ``;``, ``|``, ``&`` and newlines
   outside quotes; ``bash -c '…'`` / ``sh -c`` bodies are split too. A heredoc body is
   the program of the command it feeds: fed to ``python``/``perl``/``ruby``/``node`` it
   becomes that interpreter's ``-c`` program (``python3 - <<'PY' … PY``), fed to
   ``bash``/``sh`` its lines are segments; fed to anything else (``cat > f <<EOF``) it is
   data and dropped, and the rest of the line (redirections) stays.
2. Each segment loses leading ``VAR=val``, ``env``, ``time``, ``timeout [-s SIG] N``,
   ``nohup``, ``sudo``, ``(``, and runner wrappers (``coverage run``, ``uv run``,
   ``poetry run``). ``cd``, ``source`` and ``conda activate`` are segments of their own.
3. A segment is a **test invocation** when it *starts with* a runner (``RUNNER``):
   ``pytest``/``py.test``, ``python -m pytest|unittest|nose|nose2|tox|nox`` (also after
   ``coverage run``),
   ``python manage.py test``/``setup.py test``/``runtests.py``, ``python`` on a
   ``test*/…`` path or a ``test_*.py``/``*_test.py`` file, ``tox``, ``nox``,
   ``make test|check``, ``go test``, ``cargo test``, ``npm|yarn|pnpm [run] test``,
   ``jest``, ``mocha``, ``vitest``, ``mvn … test``, ``gradle … test``, ``ctest``,
   ``rspec``, ``phpunit``; or with the profile's test command (``test_cmd``). Anchoring at
   the start excludes ``grep pytest``, ``pip install pytest``, ``cat tests/x.py``.
4. **Evidence.** The action's observation (paired by ``tool_call_id``, else by order)
   must show a test report (``EVIDENCE``). An invocation without it is an attempt; one
   whose command timed out (``TimeoutExpired``) is ``attempted_timeout``; one sharing a
   step with the submission has no observation: attempted, unevidenced.
5. An **edit** is a segment that changes a file: ``sed`` with ``-i`` anywhere among its
   options (``sed -e … -i f``, ``sed -i.bak``), ``perl -i``, ``tee``, ``patch``,
   ``git apply|checkout|restore|stash|reset|mv|rm|am``, ``mv``/``cp``/``rm``/``touch``, a
   ``>``/``>>`` redirection, or an inline Python program (``-c`` or a heredoc) that
   writes, moves or removes a file; writes to ``*.diff``/``*.patch``, logs and outputs
   (``*.txt``, ``*.log``, ``*.out``: ``pytest | tee log.txt``), ``/dev/null``, ``/tmp``,
   caches and ``repro*`` scripts do not count (they are the submission and scratch work).

Emitted: ``ran_repo_tests`` (any evidenced run), ``ran_tests_after_last_edit`` (an
evidenced run after the last edit; any evidenced run when nothing was edited),
``n_test_runs`` (evidenced runs), ``n_test_attempts``, ``attempted_timeout``,
``targeted`` (a test command names a FAIL_TO_PASS / PASS_TO_PASS file), ``ran_repro``
(``python repro*.py`` ran).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

_PY = r"python(?:\d(?:\.\d+)?)?"
#: A segment starting with one of these is a test invocation.
RUNNER = re.compile(
    r"^(?:"
    r"py\.?test\b"
    rf"|(?:{_PY}\s+(?:-\S+\s+)*)?-m\s+(?:pytest|unittest|nose2?|tox|nox)\b"
    rf"|{_PY}\s+(?:-\S+\s+)*(?:\S*/)?(?:manage\.py\s+test|setup\.py\s+test|runtests\.py)\b"
    rf"|{_PY}\s+(?:-\S+\s+)*(?:\S*/)?(?:tests?/\S+|test_\S+\.py|\S+_test\.py)\b"
    r"|tox\b|nox\b|make\s+(?:\S+\s+)*(?:test|check)\b|go\s+test\b|cargo\s+test\b"
    r"|(?:npm|yarn|pnpm)\s+(?:run\s+)?test\b|npx\s+(?:jest|mocha|vitest)\b|jest\b|mocha\b|vitest\b"
    r"|mvn\b.*\btest\b|(?:\./)?gradlew?\b.*\btest\b|ctest\b|rspec\b|(?:\S*/)?phpunit\b"
    r")"
)
#: An observation showing that tests ran and reported.
EVIDENCE = re.compile(
    r"\d+ (?:passed|failed|errors?)\b|collected \d+ items?|Ran \d+ tests?"
    r"|^(?:ok|FAIL|---\s+(?:PASS|FAIL):)\s+\S+|test result:|Tests run: \d+",
    re.MULTILINE,
)
_REPRO = re.compile(rf"^{_PY}\s+(?:\S*/)?repro\S*\.py\b")
_PREFIX = re.compile(
    r"^(?:\(\s*|[A-Za-z_][A-Za-z0-9_]*=\S*\s+|env\s+|time\s+|nohup\s+|sudo\s+"
    r"|timeout\s+(?:-\S+\s+(?:\S+\s+)?)*\d+[smhd]?\s+|coverage\s+run\s+|uv\s+run\s+|poetry\s+run\s+)"
)
_EDIT_CMD = re.compile(
    r"^(?:perl\s+(?:-\S+\s+)*-\S*i|tee\b|patch\b|mv\b|cp\b|rm\b|touch\b"
    r"|git\s+(?:apply|checkout|restore|stash|reset|mv|rm|am)\b)"
)
_SED_IN_PLACE = re.compile(r"^(?:-[a-zA-Z]*i\S*|--in-place\S*)$")
_REDIRECT = re.compile(r"(?<![0-9<&])>>?\s*([^\s;&|>]+)")
_SCRATCH = re.compile(
    r"^(?:/dev/null|/tmp/\S*|&\d|\S*\.(?:diff|patch|txt|log|out)|\S*repro\S*"
    r"|\S*(?:__pycache__|\.pytest_cache)\S*)$"
)
_PY_WRITES = re.compile(
    r"(?<!stdout)(?<!stderr)\.write(?:_text|_bytes)?\(|\bopen\([^),]*,\s*(?:mode\s*=\s*)?['\"]+[wax]"
    r"|\.open\(\s*['\"]+[wax]|\.(?:unlink|rename|rmdir)\("
    r"|os\.(?:remove|unlink|rename|replace)\(|shutil\.(?:copy\w*|move|rmtree)\("
)
_HEREDOC = re.compile(
    r"<<-?[ \t]*(['\"]?)(\w+)\1([^\n]*)\n(.*?)\n[ \t]*\2[ \t]*(?:\n|$)", re.DOTALL
)
_BODY = "\x00"  # marks where a heredoc body was lifted out: \x00<index>\x00
_INTERPRETER = re.compile(r"^(?:python(?:\d(?:\.\d+)?)?|perl|ruby|node)\b")


@dataclass(frozen=True)
class RanTests:
    """What a trajectory says about test runs (fields as in the module docstring)."""

    ran_repo_tests: bool = False
    ran_tests_after_last_edit: bool = False
    n_test_runs: int = 0
    n_test_attempts: int = 0
    attempted_timeout: bool = False
    targeted: bool = False
    ran_repro: bool = False

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (what the agent returns)."""
        return asdict(self)


def split_segments(command: str) -> list[str]:
    """Shell segments of a command (rule steps 1-2), prefixes stripped, empty ones dropped."""
    bodies: list[str] = []

    def lift(m: re.Match[str]) -> str:
        bodies.append(m.group(4))
        return f" {_BODY}{len(bodies) - 1}{_BODY} {m.group(3)}\n"

    segments: list[str] = []
    for raw in _split_outside_quotes(_HEREDOC.sub(lift, command)):
        seg = _strip_prefixes(raw.strip())
        if _BODY in seg:
            found = re.search(rf"{_BODY}(\d+){_BODY}", seg)
            body = bodies[int(found.group(1))] if found else ""
            seg = re.sub(rf"\s*{_BODY}\d+{_BODY}", "", seg).strip()
            if re.match(r"^(?:ba)?sh\b", seg):
                segments += split_segments(body)
                continue
            if interpreter := _INTERPRETER.match(seg):
                seg = f"{interpreter.group(0)} -c {shlex.quote(body)}"
        inner = re.match(r"^(?:ba)?sh\s+(?:-\S+\s+)*-c\s+(.+)$", seg, re.DOTALL)
        if inner:
            try:
                body = shlex.split(inner.group(1))[0]
            except (ValueError, IndexError):
                body = ""
            segments += split_segments(body)
        elif seg:
            segments.append(seg)
    return segments


def is_test_invocation(segment: str, test_cmds: Sequence[str] = ()) -> bool:
    """Whether a (prefix-stripped) segment starts with a test runner or a profile test command."""
    return bool(RUNNER.match(segment)) or any(segment.startswith(c) for c in test_cmds if c)


def is_edit(segment: str) -> bool:
    """Whether a segment changes a repository file (rule step 5)."""
    if re.match(r"^sed\b", segment):
        words = _words(segment)
        if any(_SED_IN_PLACE.match(w) for w in words[1:]):
            return not all(_SCRATCH.match(p) for p in words[-1:])
    elif _EDIT_CMD.match(segment):
        paths = [a for a in _words(segment)[1:] if not a.startswith("-")]
        if re.match(r"^(?:mv|cp)\b", segment):
            paths = paths[-1:]
        return not (paths and all(_SCRATCH.match(p) for p in paths))
    targets = _REDIRECT.findall(_mask_quoted(segment))
    if any(not _SCRATCH.match(t) for t in targets):
        return True
    return bool(re.match(rf"^{_PY}\b", segment)) and bool(_PY_WRITES.search(segment))


def runner_prefixes(test_cmd: str | None) -> list[str]:
    """The runner part of a profile test command (``source``/``conda`` segments dropped)."""
    if not test_cmd:
        return []
    for seg in split_segments(test_cmd):
        if not re.match(r"^(?:source|\.|conda|cd|export)\b", seg):
            return [" ".join(seg.split()[:3])]
    return []


def read_test_runs(
    messages: Sequence[Mapping[str, Any]],
    *,
    test_cmd: str | None = None,
    test_files: Iterable[str] = (),
) -> RanTests:
    """Apply the rule to a trajectory's messages; ``test_files`` are F2P/P2P names or paths."""
    prefixes = runner_prefixes(test_cmd)
    files = {name.split("::", 1)[0] for name in test_files if name}
    last_edit: tuple[int, int, int] | None = None
    runs: list[tuple[int, int, int]] = []
    attempts = 0
    timeout = targeted = repro = False
    for step, message in enumerate(messages):
        if message.get("role") == "exit":
            break
        if message.get("role") != "assistant":
            continue
        actions = (message.get("extra") or {}).get("actions") or []
        outputs = _observations_after(messages, step)
        by_call_id = {m["tool_call_id"]: m for m in outputs if m.get("tool_call_id")}
        in_order = [m for m in outputs if not m.get("tool_call_id")]
        for index, action in enumerate(actions):
            if action.get("tool_call_id"):
                obs = by_call_id.get(action["tool_call_id"])
            else:
                obs = in_order[index] if index < len(in_order) else None
            for seg_index, seg in enumerate(split_segments(str(action.get("command", "")))):
                position = (step, index, seg_index)
                if is_edit(seg):
                    last_edit = position
                repro = repro or bool(_REPRO.match(seg))
                if not is_test_invocation(seg, prefixes):
                    continue
                attempts += 1
                targeted = targeted or any(f in seg for f in files)
                extra = (obs or {}).get("extra") or {}
                if extra.get("exception_type") == "TimeoutExpired":
                    timeout = True
                elif EVIDENCE.search(str(extra.get("raw_output", (obs or {}).get("content", "")))):
                    runs.append(position)
    return RanTests(
        ran_repo_tests=bool(runs),
        ran_tests_after_last_edit=bool(runs) and (last_edit is None or runs[-1] > last_edit),
        n_test_runs=len(runs),
        n_test_attempts=attempts,
        attempted_timeout=timeout,
        targeted=targeted,
        ran_repro=repro,
    )


def _observations_after(
    messages: Sequence[Mapping[str, Any]], step: int
) -> list[Mapping[str, Any]]:
    """The observations of the actions of the assistant message at ``step``."""
    found = []
    for message in messages[step + 1 :]:
        if message.get("role") in ("assistant", "exit"):
            break
        if "raw_output" in (message.get("extra") or {}):
            found.append(message)
    return found


def _split_outside_quotes(command: str) -> list[str]:
    parts, current, quote, i = [], [], "", 0
    while i < len(command):
        ch = command[i]
        if quote:
            current.append(ch)
            if ch == quote:
                quote = ""
            elif ch == "\\" and quote == '"' and i + 1 < len(command):
                current.append(command[i + 1])
                i += 1
        elif ch in "'\"":
            quote = ch
            current.append(ch)
        elif ch == "\\" and i + 1 < len(command):
            current.append(command[i : i + 2])
            i += 1
        elif ch in ";|&\n" and not (ch == "&" and (command[i - 1 : i] in "<>" and i > 0)):
            if ch == "&" and command[i + 1 : i + 2] == ">":
                current.append(ch)
            else:
                parts.append("".join(current))
                current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def _strip_prefixes(segment: str) -> str:
    while True:
        stripped = _PREFIX.sub("", segment, count=1)
        if stripped == segment:
            return segment.rstrip(") ")
        segment = stripped


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment)
    except ValueError:
        return segment.split()


def _mask_quoted(segment: str) -> str:
    return re.sub(r"'[^']*'|\"(?:\\.|[^\"\\])*\"", "''", segment)
