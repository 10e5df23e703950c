"""A small MCP server for examples and the README (extra ``[mcp]``; specs/runtime.md RT28):
``python -m machine.runtime.mcp_example`` serves its tools over standard input and output.

It is written with the official SDK, as any MCP server an agent uses would be; its one tool
answers from a fixed table, so an example that uses it runs the same everywhere.
"""

from __future__ import annotations

from typing import Final

from mcp.server.mcpserver import MCPServer

#: What `forecast` says, by city (anything else: unknown).
FORECASTS: Final = {"lyon": "sunny, 21 °C", "oslo": "snow, -4 °C", "lima": "cloudy, 18 °C"}

server = MCPServer("turnstile-example")


@server.tool()
def forecast(city: str) -> str:
    """Tomorrow's weather in a city."""
    return f"{city}: {FORECASTS.get(city.lower(), 'no forecast for this city')}"


if __name__ == "__main__":
    server.run("stdio")
