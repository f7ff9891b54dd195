"""Streaming parsers that split model output into content, tool calls and reasoning."""
