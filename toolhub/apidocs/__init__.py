"""The API documents: what /api/schema/, /api/docs/ and /api/docs/websockets/ say.

- `openapi`: what the OpenAPI document says beyond each view's `extend_schema` (the error
  answers, `X-Toolhub-Tenant`, descriptions), as drf-spectacular's schema class and hook.
- `openapi_examples`: examples for the document, copied from real answers.
- `websocket_docs`: docs/asyncapi.yaml, served as it is and rendered as a page.

The API views import `openapi_examples`; settings name `openapi` by its dotted path. Only
views and the URLconf import this package: models, the runner and tool modules never do.
"""
