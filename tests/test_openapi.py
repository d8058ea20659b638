"""The OpenAPI document is valid and complete; the docs page loads nothing from a CDN."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from django.core.management import call_command
from django.test import Client
from openapi_spec_validator import validate

pytestmark = pytest.mark.django_db

DOCUMENTED_PATHS = {
    "/api/v1/tools/",
    "/api/v1/invocations/",
    "/api/v1/invocations/{invocation_id}/",
}


@pytest.fixture
def schema_json() -> dict:
    response = Client().get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    return json.loads(response.content)


def test_the_schema_is_a_valid_openapi_3_document(schema_json):
    assert schema_json["openapi"].startswith("3.")
    validate(schema_json)


def test_the_yaml_schema_is_the_default_and_is_valid_too(schema_json):
    response = Client().get("/api/v1/schema/")
    assert response.status_code == 200
    document = yaml.safe_load(response.content)
    validate(document)
    assert document["paths"].keys() == schema_json["paths"].keys()


def test_the_schema_is_served_without_authentication():
    assert Client().get("/api/v1/schema/").status_code == 200


def test_the_schema_documents_the_public_endpoints(schema_json):
    paths = schema_json["paths"]
    assert set(paths) >= DOCUMENTED_PATHS
    assert "get" in paths["/api/v1/tools/"]
    assert {"get", "post"} <= set(paths["/api/v1/invocations/"])
    assert "get" in paths["/api/v1/invocations/{invocation_id}/"]


def test_the_catalog_operation_documents_its_format_parameter(schema_json):
    parameters = schema_json["paths"]["/api/v1/tools/"]["get"]["parameters"]
    formats = [p for p in parameters if p["name"] == "format"]
    assert len(formats) == 1
    assert set(formats[0]["schema"]["enum"]) == {"toolhub", "openai", "anthropic"}


def test_the_invoke_operation_documents_its_body_and_responses(schema_json):
    post = schema_json["paths"]["/api/v1/invocations/"]["post"]
    assert "application/json" in post["requestBody"]["content"]
    assert {"200", "202", "400"} <= set(post["responses"])


def test_the_schema_declares_bearer_api_key_authentication(schema_json):
    schemes = schema_json.get("components", {}).get("securitySchemes", {})
    bearer = [
        name
        for name, s in schemes.items()
        if s.get("type") == "http" and s.get("scheme") == "bearer"
    ]
    assert bearer, schemes
    security = schema_json["paths"]["/api/v1/tools/"]["get"]["security"]
    assert any(bearer[0] in requirement for requirement in security)


def test_the_docs_page_renders_swagger_ui_pointing_at_the_schema():
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "SwaggerUIBundle" in html
    assert '"/api/v1/schema/"' in html


def test_the_docs_page_loads_its_assets_locally_never_from_a_cdn():
    client = Client()
    html = client.get("/api/docs/").content.decode()
    assert not re.search(r"https?://", html), re.findall(r"https?://\S+", html)
    assert not re.search(r"""(src|href)=["']//""", html)

    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert any(asset.endswith("swagger-ui-bundle.js") for asset in assets), assets
    for asset in assets:
        assert asset.startswith("/static/drf_spectacular_sidecar/"), asset
        assert client.get(asset).status_code == 200, asset


def test_schema_generation_emits_no_warning(tmp_path):
    """An undocumented authenticator or an unresolvable view shows up as a warning."""
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    assert yaml.safe_load(target.read_text())["paths"].keys() >= DOCUMENTED_PATHS
