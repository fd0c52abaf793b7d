"""The server's OpenAPI 3.1 document (``GET /openapi.json``), derived from the pydantic models.

Owns: the response models (what ``server.responses`` writes, as pydantic models, so the
published response schemas come from the same place as the request ones) and
:func:`openapi_document`, which puts the JSON schemas of the request models
(``server.schemas``), of these response models and of the error body (``spectest.http_errors``) into
``components/schemas`` — every ``$ref`` resolved there — and lists the routes with their
request bodies, responses and error statuses. Two facts of the running server go in on top:
``model`` takes only the served model id (any other gets a 404), and token ids in a
``prompt`` lie in the vocabulary (any other gets a 400). The admin route
(``/admin/speculation``) is listed with its own access rule: loopback peers only (403), or its
own key (401) when the server has one, and the largest K the server reserves room for.

Does not know: aiohttp or the engine; the app passes the served model id, whether an API key
and an admin key are required, and the K limit.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from spectest.http_errors import ErrorResponse
from spectest.server.schemas import ChatCompletionRequest, CompletionRequest, SpeculationUpdate

REF = "#/components/schemas/{model}"
FinishReason = Literal["stop", "length"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SpecStats(BaseModel):
    """spectest's per-response speculation figures (``spec``)."""
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    mean_accepted_length: float | None
    acceptance_rate: float | None
    accepted_per_position: list[int]
    speculative: bool
    drafter: str


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    spec: SpecStats | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    spec: SpecStats | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int
    drafter: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "draining"]


class SpeculationSettingsBody(BaseModel):
    enabled: bool
    k: int
    k_policy: str


class SpeculationChangeBody(BaseModel):
    """One change of the speculation settings and when the engine applied it."""
    old: SpeculationSettingsBody
    new: SpeculationSettingsBody
    requested_at: float  # unix seconds
    effective: Literal["applied", "at next round", "unchanged"]
    effective_at: float | None  # unix seconds of the round boundary it took effect at
    effective_after_s: float | None
    round: int | None  # the first engine round that ran with ``new``


class SpeculationState(BaseModel):
    """``/admin/speculation``: the settings rounds run with, and the latest change (GET: the
    last one applied; POST: the one this request made)."""
    enabled: bool
    k: int
    k_policy: str
    k_limit: int  # the largest K this server reserves KV room for
    drafter: str
    switches: int  # applied changes since start-up
    pending: SpeculationSettingsBody | None
    change: SpeculationChangeBody | None


REQUESTS = (CompletionRequest, ChatCompletionRequest, SpeculationUpdate)
RESPONSES = (CompletionResponse, ChatCompletionResponse, ModelList, Health, SpeculationState,
             ErrorResponse)
# error statuses of the authenticated /v1 routes: (status, when)
ERRORS = {"400": "invalid request (body not JSON, a field invalid, context too long)",
          "401": "missing or wrong API key", "404": "unknown model",
          "413": "body larger than 4 MiB", "429": "over capacity (see Retry-After)",
          "503": "shutting down, or the engine stopped"}
SSE = {"schema": {  # Open API 3.1: the schema of one event
    "type": "object", "required": ["data"], "properties": {"data": {"type": "string"}},
    "description": "One server-sent event: `data` is a chunk as JSON (a completion or a "
                   "`chat.completion.chunk` whose choices carry the new text, the last one "
                   "`finish_reason`, `spec` and, with `stream_options.include_usage`, `usage`), "
                   "an `{\"error\": {...}}` object if the engine fails mid-stream, and last "
                   "`[DONE]`."}}


def _json(ref: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": ref}}}


def openapi_document(model_name: str, vocab_size: int, api_key: bool = False,
                     version: str = "0.1.0", admin_key: bool = False, k_limit: int = 8) -> dict:
    """The OpenAPI 3.1 document of a server serving ``model_name`` (``vocab_size`` ids)."""
    refs, top = models_json_schema([(m, "validation") for m in REQUESTS]
                                   + [(m, "serialization") for m in RESPONSES],
                                   ref_template=REF)
    components = top["$defs"]
    for model in (CompletionRequest, ChatCompletionRequest):
        prop = components[model.__name__]["properties"]["model"]
        prop["enum"] = [model_name]
        prop["description"] = "the served model's id (GET /v1/models)"
    for member in components[CompletionRequest.__name__]["properties"]["prompt"]["oneOf"]:
        if member.get("items", {}).get("type") == "integer":  # the token-id array
            member["items"].update(minimum=0, maximum=vocab_size - 1)
    components[SpeculationUpdate.__name__]["properties"]["k"]["maximum"] = k_limit
    ref = {m: refs[(m, "validation" if m in REQUESTS else "serialization")]
           for m in REQUESTS + RESPONSES}
    errors = {status: _json(ref[ErrorResponse], why) for status, why in ERRORS.items()}
    errors["429"]["headers"] = {"Retry-After": {"description": "seconds to wait",
                                                "schema": {"type": "integer"}}}
    secured = [{"bearer": []}] if api_key else []

    def generate(request: type[BaseModel], response: type[BaseModel], operation: str,
                 summary: str) -> dict:
        ok = _json(ref[response], "the completion (stream: false), or its chunks as server-"
                   "sent events (stream: true)")
        ok["content"]["text/event-stream"] = SSE
        return {"post": {"summary": summary, "operationId": operation, "security": secured,
                         "requestBody": {"required": True, "content": {
                             "application/json": {"schema": ref[request]}}},
                         "responses": {"200": ok, **errors}}}

    paths = {
        "/v1/completions": generate(CompletionRequest, CompletionResponse,
                                    "createCompletion", "text completion"),
        "/v1/chat/completions": generate(ChatCompletionRequest, ChatCompletionResponse,
                                         "createChatCompletion", "chat completion"),
        "/v1/models": {"get": {"summary": "the served model", "operationId": "listModels",
                               "security": secured,
                               "responses": {"200": _json(ref[ModelList], "the served model"),
                                             "401": errors["401"]}}},
        "/health": {"get": {"summary": "liveness", "operationId": "health", "responses": {
            "200": _json(ref[Health], "serving"),
            "503": _json(ref[Health], "draining before shutdown")}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "operationId": "metrics",
                             "responses": {"200": {
                                 "description": "Prometheus text format 0.0.4",
                                 "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/admin/speculation": _admin(ref, admin_key),
        "/openapi.json": {"get": {"summary": "this document", "operationId": "openapi",
                                  "security": secured, "responses": {
                                      "200": {"description": "OpenAPI 3.1",
                                              "content": {"application/json": {
                                                  "schema": {"type": "object"}}}},
                                      "401": errors["401"]}}},
    }
    doc = {"openapi": "3.1.0",
           "info": {"title": "spectest serve", "version": version,
                    "description": "OpenAI-compatible completions and chat completions from "
                                   "spectest's speculative engine, with spectest's extensions "
                                   "(speculative, top_k, ignore_eos) and a `spec` object in "
                                   "every response."},
           "paths": paths, "components": {"schemas": components}}
    schemes = {}
    if api_key:
        schemes["bearer"] = {"type": "http", "scheme": "bearer"}
    if admin_key:
        schemes["adminBearer"] = {"type": "http", "scheme": "bearer",
                                  "description": "the admin key (--admin-key), not the API key"}
    if schemes:
        doc["components"]["securitySchemes"] = schemes
    return doc


def _admin(ref: dict, admin_key: bool) -> dict:
    """``GET`` / ``POST /admin/speculation``: loopback-only without an admin key (403 for any
    other peer), the admin key from anywhere with one (401 without it)."""
    state = _json(ref[SpeculationState], "the speculation settings")
    if admin_key:
        denied = {"401": _json(ref[ErrorResponse],
                               "missing or wrong admin key (Authorization: Bearer <admin key>)")}
        secured = [{"adminBearer": []}]
    else:
        denied = {"403": _json(ref[ErrorResponse],
                               "the peer is not a loopback address (start the server with "
                               "--admin-key to allow others)")}
        secured = []
    summary = "speculation switched on/off, K and the K policy, changed at runtime"
    return {
        "get": {"summary": "the current speculation settings",
                "operationId": "getSpeculation", "security": secured,
                "responses": {"200": state, **denied}},
        "post": {"summary": summary, "operationId": "setSpeculation", "security": secured,
                 "description": "Takes effect at the engine's next round boundary; in-flight "
                                "requests finish normally under the new settings. The answer "
                                "says when it took effect (or `at next round`).",
                 "requestBody": {"required": True, "content": {
                     "application/json": {"schema": ref[SpeculationUpdate]}}},
                 "responses": {"200": _json(ref[SpeculationState], "the settings after the "
                                            "change, and the change"),
                               "400": _json(ref[ErrorResponse], "invalid body, K above the limit, "
                                            "or a policy this server cannot build"),
                               **denied}},
    }
