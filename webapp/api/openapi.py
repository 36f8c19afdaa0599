"""The OpenAPI 3 description of ``/api/v1/``, written next to the views it describes (served at
``/api/v1/openapi.json``). ``tests/webapp/test_api.py`` checks that every API route is described and
that every described path is routed, so the two cannot drift apart silently."""

from __future__ import annotations

from typing import Any

from webapp.api import extensions

VERSION = "1.0.0"

# ref, json_response, ERRORS, id_param, query_param: the building blocks of every path, also for the
# apps that register endpoints of their own (``webapp.api.extensions``).


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_response(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {
    "400": json_response(ref("Error"), "invalid input; `field` names it"),
    "401": json_response(ref("Error"), "no, unknown or revoked token"),
    "403": json_response(ref("Error"), "not a researcher, not the run's creator, or CSRF failure (session)"),
    "404": json_response(ref("Error"), "no such run or campaign"),
}
_WRITE_ERRORS = {
    **ERRORS,
    "409": json_response(ref("Error"), "the run is in the wrong state for this request"),
    "413": json_response(ref("Error"), "body or batch over the limits"),
    "415": json_response(ref("Error"), "body is not application/json"),
    "429": json_response(ref("Error"), "rate limit; see Retry-After"),
}


def id_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "integer"}}


def query_param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


EVENT = {
    "type": "object",
    "required": ["type"],
    "description": "One engine event (the EventSink protocol). `time` (ISO 8601) is when it happened.",
    "properties": {
        "type": {
            "type": "string",
            "enum": [
                "run_started",
                "progress",
                "metrics",
                "samples",
                "checkpoint",
                "log",
                "finished",
                "failed",
            ],
        },
        "time": {"type": "string", "format": "date-time"},
        "step": {"type": "integer", "description": "metrics, samples, checkpoint"},
        "values": {
            "type": "object",
            "additionalProperties": {"type": ["number", "null"]},
            "description": "metrics",
        },
        "split": {"type": "string", "description": "samples"},
        "rows": {"type": "array", "items": {"type": "object"}, "description": "samples"},
        "path": {"type": "string", "description": "checkpoint (on the client's machine)"},
        "message": {"type": "string", "description": "log"},
        "key": {"type": "string", "description": "log: a key makes the line idempotent"},
        "iteration": {"type": "integer"},
        "total": {"type": "integer"},
        "eta_seconds": {"type": ["number", "null"]},
        "phase": {"type": "string"},
        "config": {"type": "object", "description": "run_started"},
        "run_dir": {"type": "string", "description": "run_started"},
        "summary": {"type": "object", "description": "finished"},
        "error": {"type": "string", "description": "failed"},
        "traceback": {"type": "string", "description": "failed"},
    },
}


def schema() -> dict[str, Any]:
    """The OpenAPI document (a fresh dict each call), with the endpoints other apps registered
    (``webapp.api.extensions``: the annotation app's campaigns).

    Long because: it is one literal document, read top to bottom like the spec it emits; cutting it
    into functions would only scatter the paths a reader compares with docs/api.md."""
    bearer = [{"token": []}, {"session": []}]
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "GRUE Studio API",
            "version": VERSION,
            "description": "Runs from anywhere, metrics, campaigns. See docs/api.md.",
        },
        "servers": [{"url": "/api/v1"}],
        "security": bearer,
        "components": {
            "securitySchemes": {
                "token": {"type": "http", "scheme": "bearer", "description": "a token from /settings/tokens/"},
                "session": {"type": "apiKey", "in": "cookie", "name": "sessionid", "description": "browser session; writes need X-CSRFToken"},
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": {"type": "string"}, "field": {"type": "string"},
                                   "errors": {"type": "array", "items": {"type": "object"}}},
                },
                "Run": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"}, "name": {"type": "string"}, "status": {"type": "string"},
                        "project": {"type": ["string", "null"]}, "algorithm": {"type": "string"},
                        "task": {"type": "string"}, "model": {"type": "string"},
                        "tags": {"type": "array", "items": {"type": "string"}}, "remote": {"type": "boolean"},
                        "progress": {"type": "number"}, "current_iter": {"type": ["integer", "null"]},
                        "total_iters": {"type": ["integer", "null"]}, "last_metrics": {"type": "object"},
                        "config": {"type": "object"}, "summary": {"type": "object"}, "url": {"type": "string"},
                    },
                },
                "Event": EVENT,
            },
        },
        "paths": {
            "/openapi.json": {"get": {"summary": "this document", "responses": {"200": json_response({"type": "object"})}}},
            "/runs": {
                "get": {
                    "summary": "list runs, newest first",
                    "parameters": [
                        query_param("status", {"type": "string"}, "only runs in this state"),
                        query_param("task", {"type": "string"}, "task id"),
                        query_param("algorithm", {"type": "string"}, "algorithm id"),
                        query_param("project", {"type": "string"}, "project name"),
                        query_param("tag", {"type": "string"}, "runs with this tag"),
                        query_param("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "page size (100)"),
                        query_param("offset", {"type": "integer", "minimum": 0}, "skip this many"),
                    ],
                    "responses": {"200": json_response({"type": "object", "properties": {
                        "count": {"type": "integer"}, "runs": {"type": "array", "items": ref("Run")}}}), **ERRORS},
                },
                "post": {
                    "summary": "create a run: a draft to stream into (default) or, with launch, queued on the workers",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["config"],
                        "properties": {"config": {"type": "object"}, "name": {"type": "string"},
                                       "project": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
                                       "notes": {"type": "string"}, "launch": {"type": "boolean", "default": False}}}}}},
                    "responses": {"201": json_response(ref("Run"), "created"), **_WRITE_ERRORS},
                },
            },
            "/runs/{run_id}": {
                "get": {"summary": "one run with its config and summary", "parameters": [id_param("run_id")],
                        "responses": {"200": json_response(ref("Run")), **ERRORS}},
            },
            "/runs/{run_id}/events": {
                "post": {
                    "summary": "append a batch of events to a remote run (idempotent per batch_id)",
                    "parameters": [id_param("run_id")],
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["batch_id", "events"],
                        "properties": {"batch_id": {"type": "string", "maxLength": 64},
                                       "events": {"type": "array", "maxItems": 5000, "items": ref("Event")}}}}}},
                    "responses": {"200": json_response({"type": "object", "properties": {
                        "duplicate": {"type": "boolean"}, "events": {"type": "integer"},
                        "points": {"type": "integer"}}}), **_WRITE_ERRORS},
                },
            },
            "/runs/{run_id}/status": {
                "post": {
                    "summary": "start (draft → running) or end a remote run",
                    "parameters": [id_param("run_id")],
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["status"],
                        "properties": {"status": {"type": "string", "enum": ["running", "succeeded", "failed", "cancelled"]},
                                       "host": {"type": "string"}, "error": {"type": "string"},
                                       "traceback": {"type": "string"}, "summary": {"type": "object"}}}}}},
                    "responses": {"200": json_response(ref("Run")), **_WRITE_ERRORS},
                },
            },
            "/runs/{run_id}/metrics": {
                "get": {
                    "summary": "every metric point of a run, per key in step order",
                    "parameters": [id_param("run_id"), query_param("keys", {"type": "string"}, "comma-separated keys")],
                    "responses": {"200": json_response({"type": "object", "properties": {"series": {
                        "type": "object", "additionalProperties": {"type": "object", "properties": {
                            "steps": {"type": "array", "items": {"type": "integer"}},
                            "values": {"type": "array", "items": {"type": ["number", "null"]}},
                            "times": {"type": "array", "items": {"type": "string"}}}}}}}), **ERRORS},
                },
            },
        },
    }  # fmt: skip
    doc["components"]["schemas"].update(extensions.openapi_schemas())
    doc["paths"].update(extensions.openapi_paths())
    return doc
