"""Test helpers: real Redis and PostgreSQL servers, free ports, polling waits."""
