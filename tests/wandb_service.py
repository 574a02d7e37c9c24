"""A stand-in for the wandb service behind ``wandb.Api``, answering recorded responses.

``wandb.Api`` (wandb 0.31) sends every request through wandb-core's service connection
(``wandb.sdk.lib.service.service_connection.ServiceConnection.api_request``): an
``ApiRequest`` protobuf in, an ``ApiResponse`` out, and an ``api_error_response`` raised as
``WandbApiFailedError`` by that method. ``RecordedService`` replaces only the service
process: its ``api_request`` *is* wandb's own method (so an error response fails exactly as
the real one does), and the answers are what the server sends, in its shapes:

- ``auth_request`` (``wandb.Api()`` verifies the key) and GraphQL ``GetDefaultEntity``
  (``api.runs`` asks it): the viewer's entity;
- GraphQL ``Runs`` (``api.runs``): a page of run nodes (``RunFragment``), ``project: null``
  for a project that does not exist (the server's answer; wandb's ``Runs`` raises
  ``ValueError("Could not find project ...")``);
- GraphQL ``RunHistoryKeys`` (``Run.lastHistoryStep``): the run's ``historyKeys``;
- GraphQL ``UpsertView2`` (``wandb_workspaces``' ``Workspace.save``): the saved view's id
  and name (its variables kept in ``saved_views``);
- ``read_run_history_request``: a scan's init, then its pages of ``HistoryRow``s, each item
  a key and its JSON (a non-finite number written ``"NaN"`` as wandb writes it).

A project is recorded with ``record_offline(folders)`` from offline runs (the same runs the
offline reader reads), or written by hand; ``fail`` makes a request kind answer an error
(``http_status`` 429 for a rate limit, 0 for no response). ``requests`` counts what was asked.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("wandb")

from wandb.proto import wandb_api_pb2 as pb
from wandb.sdk.lib.service.service_connection import ServiceConnection

#: The GraphQL operations answered, by a piece of their text.
_QUERIES = {
    "Runs": "query Runs(",
    "RunHistoryKeys": "query RunHistoryKeys",
    "Viewer": "viewer {",
    "UpsertView2": "mutation UpsertView2",
}


@dataclass
class RecordedRun:
    """A run as the server holds it: its node's fields and its history rows."""

    run_id: str
    display_name: str
    group: str | None
    tags: list[str]
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    state: str = "finished"

    def node(self) -> dict[str, Any]:
        """The run as ``RunFragment`` sends it (config and summary as JSON strings)."""
        return {
            "id": f"UnVuOnYx{self.run_id}",
            "projectId": 1,
            "name": self.run_id,
            "displayName": self.display_name,
            "group": self.group,
            "tags": self.tags,
            "state": self.state,
            "config": json.dumps({k: {"value": v, "desc": None} for k, v in self.config.items()}),
            "summaryMetrics": json.dumps({}),
            "systemMetrics": json.dumps({}),
            "historyLineCount": len(self.rows),
            "historyKeys": {"lastStep": self.last_step},
            "sweepName": None,
            "jobType": None,
            "commit": None,
            "readOnly": False,
            "createdAt": "2026-12-01T00:00:00",
            "heartbeatAt": "2026-12-01T01:00:00",
            "description": None,
            "notes": None,
            "user": {"name": "tester", "username": "tester"},
        }

    @property
    def last_step(self) -> int:
        return max((int(r["_step"]) for r in self.rows), default=-1)


@dataclass
class RecordedService:
    """wandb's service connection with recorded answers (module docstring)."""

    runs: list[RecordedRun] = field(default_factory=list)
    project_exists: bool = True
    failures: dict[str, pb.ApiErrorResponse] = field(default_factory=dict)
    requests: Counter = field(default_factory=Counter)
    saved_views: list[dict[str, Any]] = field(default_factory=list)
    scanned_steps: list[int] = field(default_factory=list)
    _scans: dict[int, str] = field(default_factory=dict)

    # wandb's own method: an api_error_response becomes WandbApiFailedError as in the service.
    api_request = ServiceConnection.api_request

    def fail(self, kind: str, message: str, http_status: int) -> None:
        """Answer every later request of ``kind`` (``auth``, ``Runs``, ``RunHistoryKeys``,
        ``history``) with an error, as the service does."""
        self.failures[kind] = pb.ApiErrorResponse(message=message, http_status=http_status)

    # -- what wandb's ServiceApi calls on the connection
    def api_init_request(self, settings: Any) -> Any:
        return (
            pb.ApiInitResponse(api_id="recorded")
            if hasattr(pb, "ApiInitResponse")
            else (type("Init", (), {"api_id": "recorded"})())
        )

    def finalize(self, obj: Any, request: Any) -> Any:
        return lambda: None

    # -- what ServiceConnection.api_request calls
    @property
    def _asyncer(self) -> Any:
        return type("Sync", (), {"run": staticmethod(lambda fn: fn())})()

    def api_request_async(self, request: pb.ApiRequest) -> Any:
        response = self._answer(request)
        return type("Handle", (), {"wait_or": lambda _self, timeout=None: response})()

    def _answer(self, request: pb.ApiRequest) -> pb.ApiResponse:
        kind = request.WhichOneof("request")
        if kind == "auth_request":
            return self._or_fail("auth", self._auth)
        if kind == "graphql_request":
            query = request.graphql_request.query
            variables = json.loads(request.graphql_request.variables_json or "{}")
            name = next((n for n, marker in _QUERIES.items() if marker in query), None)
            if name is None:
                raise AssertionError(f"no recorded answer to {query[:200]}")
            return self._or_fail(name, lambda: self._graphql(name, variables))
        if kind == "read_run_history_request":
            return self._or_fail("history", lambda: self._history(request.read_run_history_request))
        raise AssertionError(f"no recorded answer to a {kind}")

    def _or_fail(self, kind: str, answer: Any) -> pb.ApiResponse:
        self.requests[kind] += 1
        if kind in self.failures:
            return pb.ApiResponse(api_error_response=self.failures[kind])
        return answer()

    def _auth(self) -> pb.ApiResponse:
        response = pb.ApiResponse()
        response.auth_response.authenticate_response.default_entity = "lab"
        response.auth_response.authenticate_response.username = "tester"
        return response

    def _graphql(self, name: str, variables: dict[str, Any]) -> pb.ApiResponse:
        if name == "Viewer":
            data: dict[str, Any] = {"viewer": {"id": "VXNlcjox", "entity": "lab"}}
        elif name == "UpsertView2":
            self.saved_views.append(variables)
            view = {"id": f"VmlldzoxMjM{len(self.saved_views)}", "name": "nw-recorded1"}
            data = {"upsertView": {"view": view, "inserted": True}}
        elif not self.project_exists:
            data = {"project": None}
        elif name == "Runs":
            filters = json.loads(variables.get("filters") or "{}")
            runs = [r for r in self.runs if all(getattr(r, k) == v for k, v in filters.items())]
            edges = [{"node": r.node(), "cursor": str(i)} for i, r in enumerate(runs)]
            data = {
                "project": {
                    "internalId": "UHJvamVjdDox",
                    "runCount": len(runs),
                    "readOnly": False,
                    "runs": {"edges": edges, "pageInfo": {"endCursor": None, "hasNextPage": False}},
                }
            }
        else:
            run = self._run(variables["name"])
            data = {"project": {"run": {"historyKeys": {"lastStep": run.last_step}}}}
        response = pb.ApiResponse()
        response.graphql_response.data_json = json.dumps(data)
        return response

    def _run(self, run_id: str) -> RecordedRun:
        return next(r for r in self.runs if r.run_id == run_id)

    def _history(self, request: pb.ReadRunHistoryRequest) -> pb.ApiResponse:
        response = pb.ApiResponse()
        kind = request.WhichOneof("request")
        if kind == "scan_run_history_init":
            scan_id = len(self._scans) + 1
            self._scans[scan_id] = request.scan_run_history_init.run_id
            response.read_run_history_response.scan_run_history_init.request_id = scan_id
            return response
        scan = request.scan_run_history
        run = self._run(self._scans[scan.request_id])
        page = response.read_run_history_response.run_history
        for row in run.rows:
            if scan.min_step <= int(row["_step"]) < scan.max_step:
                self.scanned_steps.append(int(row["_step"]))
                item_row = page.history_rows.add()
                for k, v in row.items():
                    item_row.history_items.add(key=k, value_json=_json(v))
        return response

    def install(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        """Route ``wandb.Api`` here: a dummy key, no config of the machine read."""
        from wandb.sdk import wandb_setup

        monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
        monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.recorded.invalid")
        monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
        monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
        monkeypatch.setattr(wandb_setup.singleton(), "ensure_service", lambda: self)


def _json(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return json.dumps("NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity"))
    return json.dumps(v)


def record_offline(folders_by_run: list[list[Path]], *, state: str = "finished") -> RecordedService:
    """A project holding the runs of these offline folders (one list per run id), as the
    server would after ``wandb sync``: each row's ``_step`` renumbered from 0 in order (the
    server's steps of one run are one sequence, whatever process logged the row)."""
    from rescue.tracking.history import read_offline

    service = RecordedService()
    for folders in folders_by_run:
        log = read_offline(folders)
        rows = [{**r, "_step": i} for i, r in enumerate(log.rows)]
        service.runs.append(
            RecordedRun(log.run_id, log.name or log.run_id, log.group, log.tags,
                        {k: v for k, v in log.config.items() if k != "_wandb"}, rows, state)
        )  # fmt: skip
    return service
