"""Bundled samples: tool docs and small MCP servers used by the demo and tests."""
