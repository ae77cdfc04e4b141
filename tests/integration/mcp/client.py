"""A real MCP client (the PyPI package `mcp`) for the MCP test: connects to ragstream over streamable
HTTP or stdio, lists the tools, makes the calls it is given and prints one JSON document with what
it saw. Usage:

    client.py http URL TOKEN CALLS_JSON
    client.py stdio CALLS_JSON COMMAND [ARG ...]

CALLS_JSON is a list of [label, tool, arguments]. MCP_CLIENT_MODE=legacy makes the client use the
initialize handshake of the protocol's earlier revisions instead of the newest one. A call whose arguments hold "$chunk" gets the
first chunk id returned by an earlier call.
"""

import asyncio
import json
import os
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def substitute(value, found):
    """`value` with "$chunk" (the first chunk id a call returned) and "$cursor" (the latest
    `next_cursor`) replaced by what was found."""
    if isinstance(value, str) and value in found:
        return found[value]
    if isinstance(value, dict):
        return {k: substitute(v, found) for k, v in value.items()}
    return value


async def exercise(server, calls):
    async with Client(server, mode=os.environ.get("MCP_CLIENT_MODE", "auto")) as client:
        tools = await client.list_tools()
        seen = {
            "protocol": client.protocol_version,
            "server": client.server_info.name if client.server_info else None,
            "tools": {t.name: {"description": t.description, "input_schema": t.input_schema} for t in tools.tools},
            "calls": {},
        }
        found = {}
        for label, name, arguments in calls:
            result = await client.call_tool(name, substitute(arguments, found))
            structured = result.structured_content
            if "$chunk" not in found and structured and structured.get("items"):
                found["$chunk"] = structured["items"][0]["chunk_id"]
            if structured and structured.get("next_cursor"):
                found["$cursor"] = structured["next_cursor"]
            seen["calls"][label] = {
                "is_error": bool(result.is_error),
                "text": "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text"),
                "structured": structured,
            }
        return seen


def main():
    transport = sys.argv[1]
    if transport == "http":
        url, token, calls = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        server = streamable_http_client(url, http_client=http)
    else:
        calls = json.loads(sys.argv[2])
        # The server inherits this environment (the model directory, the log filter).
        server = StdioServerParameters(command=sys.argv[3], args=sys.argv[4:], env=dict(os.environ))
    print(json.dumps(asyncio.run(exercise(server, calls))))


if __name__ == "__main__":
    main()
