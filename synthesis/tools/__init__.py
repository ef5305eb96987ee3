"""Tool docs to unified servers (ASTRA §2.1.1): schema normalisation, quality gates, the MCP client."""
