"""Waiting for dispatcher processes to share out the shards."""

from __future__ import annotations

from worker_sdk import Client, ShardMap


def settled_view(target: str, members: int) -> ShardMap | None:
    """The shard map once exactly ``members`` members are alive and own every shard; None before,
    and while ``target`` does not answer."""
    try:
        with Client(target, timeout=5) as client:
            view = client.shard_map()
    except Exception:
        return None
    alive = {m.id for m in view.members if m.alive}
    return view if len(alive) == members and all(s.owner in alive for s in view.shards) else None
