"""``GET /openapi.json``: a valid OpenAPI 3.1 document derived from the pydantic models, which
describes what the live server actually accepts and answers.

The document must pass Schemathesis's validation against the OpenAPI meta-schema, list every
route, take its request-body schemas from the request models (every ``$ref`` resolved in
``components``), and document the error shape that real 4xx answers have.
"""

from __future__ import annotations

import copy
import json

import pytest
import requests
import schemathesis
from pydantic.json_schema import models_json_schema

from live_server import MODEL, LiveServer, make_server
from spectest.http_errors import ErrorResponse
from spectest.server.openapi import REF, openapi_document
from spectest.server.schemas import ChatCompletionRequest, CompletionRequest, SpeculationUpdate

ROUTES = {"/v1/completions": {"post"}, "/v1/chat/completions": {"post"}, "/v1/models": {"get"},
          "/health": {"get"}, "/metrics": {"get"}, "/openapi.json": {"get"},
          "/admin/speculation": {"get", "post"}}
KEY = "sk-openapi-test"


@pytest.fixture(scope="module")
def live(pair):
    with LiveServer(make_server(pair, max_model_len=128)) as live:
        yield live


@pytest.fixture(scope="module")
def doc(live) -> dict:
    resp = live.get("/openapi.json")
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith(
        "application/json")
    return resp.json()


def refs(node):
    if isinstance(node, dict):
        if "$ref" in node:
            yield node["$ref"]
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def test_document_is_valid_openapi_3_1(live, doc):
    assert doc["openapi"].startswith("3.1")
    schema = schemathesis.openapi.from_url(live.url + "/openapi.json")
    schema.validate()  # against the OpenAPI 3.1 meta-schema; raises if the document is invalid
    labels = {op.ok().label for op in schema.get_all_operations()}
    assert {"POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models",
            "GET /health", "GET /metrics", "GET /admin/speculation",
            "POST /admin/speculation"} <= labels


def test_every_route_is_documented_and_every_ref_resolves(doc):
    assert {path: set(ops) for path, ops in doc["paths"].items()} == ROUTES
    components = doc["components"]["schemas"]
    found = list(refs(doc))
    assert found and "$defs" not in json.dumps(doc)
    for ref in found:
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in components


def test_request_bodies_are_the_pydantic_models(doc):
    _, top = models_json_schema([(CompletionRequest, "validation"),
                                 (ChatCompletionRequest, "validation")], ref_template=REF)
    components = doc["components"]["schemas"]
    for model, path in ((CompletionRequest, "/v1/completions"),
                        (ChatCompletionRequest, "/v1/chat/completions")):
        body = doc["paths"][path]["post"]["requestBody"]
        assert body["required"] is True
        assert body["content"]["application/json"]["schema"] == \
            {"$ref": REF.format(model=model.__name__)}
        published = copy.deepcopy(components[model.__name__])
        derived = top["$defs"][model.__name__]
        assert published["additionalProperties"] is False
        assert set(published["properties"]) == set(model.model_fields)
        # the one fact of the running server on top of the model: the served model id
        assert published["properties"]["model"].pop("enum") == [MODEL]
        published["properties"]["model"].pop("description")
        if model is CompletionRequest:  # and the vocabulary's token-id range
            ids = published["properties"]["prompt"]["oneOf"][1]["items"]
            assert ids.pop("minimum") == 0 and ids.pop("maximum") > 255
        assert published == derived
    for name in ("ChatMessage", "TextPart", "StreamOptions"):
        assert components[name] == top["$defs"][name]


def test_errors_are_documented_and_real_ones_match(live, doc):
    error_ref = {"$ref": REF.format(model="ErrorResponse")}
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = doc["paths"][path]["post"]["responses"]
        assert {"200", "400", "401", "404", "413", "429", "503"} <= set(responses)
        for status, resp in responses.items():
            if status != "200":
                assert resp["content"]["application/json"]["schema"] == error_ref
    derived = ErrorResponse.model_json_schema(ref_template=REF, mode="serialization")
    assert doc["components"]["schemas"]["ErrorResponse"] == \
        {k: v for k, v in derived.items() if k != "$defs"}
    assert doc["components"]["schemas"]["ErrorDetail"]["required"] == \
        ["message", "type", "param", "code"]
    validator = schemathesis.openapi.from_dict(doc)  # the published shape, checked on real 4xx
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": "\udcff"}),
                       ("/v1/chat/completions", {"model": "nope", "messages": []})):
        resp = requests.post(live.url + path, data=json.dumps(body), timeout=30,
                             headers={"Content-Type": "application/json"})
        assert resp.status_code in (400, 404)
        case = validator[path]["POST"].Case(body=body)
        case.validate_response(resp, checks=[schemathesis.checks.status_code_conformance,
                                             schemathesis.checks.response_schema_conformance])


def test_with_an_api_key_the_document_needs_it_and_says_so(pair):
    with LiveServer(make_server(pair, api_key=KEY, max_model_len=128)) as keyed:
        assert keyed.get("/openapi.json").status_code == 401
        doc = keyed.get("/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http",
                                                               "scheme": "bearer"}}
    assert doc["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/health"]["get"]
    assert doc["paths"]["/admin/speculation"]["post"]["security"] == []  # loopback, no key
    assert "403" in doc["paths"]["/admin/speculation"]["post"]["responses"]


def test_the_admin_route_documents_its_body_bound_and_key(live, doc):
    """The body is the pydantic model plus the server's K limit; an admin key is its own
    security scheme, and real 400s match the published error shape."""
    published = copy.deepcopy(doc["components"]["schemas"]["SpeculationUpdate"])
    assert published["additionalProperties"] is False and published["minProperties"] == 1
    assert published["properties"]["k"].pop("maximum") == live.get(
        "/admin/speculation").json()["k_limit"]
    derived = SpeculationUpdate.model_json_schema(ref_template=REF)
    derived["properties"]["k"].pop("maximum")
    assert published == derived
    validator = schemathesis.openapi.from_dict(doc)
    checks = [schemathesis.checks.status_code_conformance,
              schemathesis.checks.response_schema_conformance]
    for body, status in (({"k": 99}, 400), ({"k_policy": "goodput"}, 400), ({}, 400),
                         ({"enabled": True}, 200)):
        resp = requests.post(live.url + "/admin/speculation", json=body, timeout=30)
        assert resp.status_code == status
        case = validator["/admin/speculation"]["POST"].Case(body=body)
        case.validate_response(resp, checks=checks)
    resp = requests.get(live.url + "/admin/speculation", timeout=30)
    validator["/admin/speculation"]["GET"].Case().validate_response(resp, checks=checks)
    keyed = openapi_document("m", 1000, admin_key=True, k_limit=6)
    assert keyed["components"]["securitySchemes"] == {"adminBearer": {
        "type": "http", "scheme": "bearer",
        "description": "the admin key (--admin-key), not the API key"}}
    admin = keyed["paths"]["/admin/speculation"]
    assert admin["get"]["security"] == [{"adminBearer": []}] and "401" in admin["get"]["responses"]
    assert keyed["components"]["schemas"]["SpeculationUpdate"]["properties"]["k"]["maximum"] == 6


def test_document_is_built_from_the_models_alone():
    """No server needed: the same document for the same facts, JSON-serializable."""
    one = openapi_document("m", 1000)
    assert one == openapi_document("m", 1000)
    assert json.loads(json.dumps(one)) == one
    assert one["components"]["schemas"]["CompletionRequest"]["properties"]["model"]["enum"] \
        == ["m"]
