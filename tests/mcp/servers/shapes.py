"""A stdio MCP server (the official SDK's MCPServer) whose tools declare titles and hints
and answer with several kinds of content, for what /mcp/ shows and passes through.

snapshot: titled "Take a snapshot", read-only and closed-world by its hints; answers a
text block, a PNG image block and structured content.
tidy: titled through annotations.title only, openWorldHint false (a state change).
plain: declares nothing (MCP's default hints) and answers text only.
report: answers `size` characters as structured content, repeated as JSON text (FastMCP's
way with a dict).
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations

# A 1x1 transparent PNG.
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJ"
    "RU5ErkJggg=="
)
SHOT = {"width": 1, "height": 1, "label": "pixel"}

app = MCPServer("shapes")


@app.tool(
    title="Take a snapshot",
    description="A picture and what it shows.",
    annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
)
def snapshot(label: str = "pixel") -> CallToolResult:
    return CallToolResult(
        content=[
            TextContent(type="text", text=f"A 1x1 picture labelled {label}."),
            ImageContent(type="image", data=PIXEL, mime_type="image/png"),
        ],
        structured_content={**SHOT, "label": label},
    )


@app.tool(
    description="Tidy the workspace.",
    annotations=ToolAnnotations(title="Tidy up", destructive_hint=False, open_world_hint=False),
)
def tidy() -> str:
    return "tidied"


@app.tool(description="Nothing declared.", structured_output=False)
def plain() -> str:
    return "plain"


@app.tool(description="A report of `size` characters.")
def report(size: int) -> dict[str, str]:
    return {"data": "x" * size}


if __name__ == "__main__":
    app.run()
