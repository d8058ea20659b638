"""What every app's views, consumers, forms and admin share at the edge.

- `api`: the error body, the caller of a request (`CallerView`), pydantic at the edge
  (`parse_body`), cursor pages (`NewestFirst`), JSON 404 and 500.
- `json_input`: the one reader of JSON from outside, with depth and size limits;
  `parsers`: DRF's JSON parser reading with it.
- `ws_auth`: who may open a WebSocket (API key, access token, stream ticket; Host, Origin).
- `paging`: admin changelists that never count a whole table.
- `outage`: during a database outage, every request answers 503 with Retry-After.

`json_input` and `parsers` import nothing from `apps` (DRF loads the parsers while loading
`APIView`, before the apps are ready). Models, the runner and tool modules import nothing
here but `json_input`.
"""
