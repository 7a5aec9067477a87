"""What agents consume: tool definitions in their formats and the discovery meta-tool."""
