"""Turning results.json into a Markdown table and PNG plots."""
