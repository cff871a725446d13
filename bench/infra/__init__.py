"""What the harness runs the systems on: Redis, PostgreSQL, dispatchers, peers' environments."""
