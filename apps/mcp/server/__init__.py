"""toolhub as an MCP server: `/mcp/` over the streamable HTTP transport.

`transport` speaks HTTP (POST, GET streams, the headers), `methods` answers the
JSON-RPC methods through the catalog and the runner, `tools` encodes the catalog
for MCP, `sessions` mints and checks session ids, and `notifications` tells open
streams that a tenant's catalog changed.
"""
