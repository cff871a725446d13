"""A dispatcher's channels to its peers are closed once unused for a while: a peer that restarts at a
new address (a rescheduled pod) leaves no channel behind for the life of the process."""

from __future__ import annotations

from dispatcher.cluster.peers import Peers
from tests.support.ports import free_port
from tests.support.wait import wait_for


async def test_a_channel_unused_past_the_idle_time_is_closed_and_one_in_use_is_kept() -> None:
    peers = Peers(idle_close_s=0.2)
    gone, live = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    peers.shard_service(gone)
    try:

        async def only_the_used_one_is_left() -> bool:
            peers.shard_service(live)  # a peer still handed jobs to
            return peers.open_addresses() == [live]

        await wait_for(only_the_used_one_is_left, timeout=5, interval=0.05, message="the idle channel stayed")
    finally:
        await peers.close()
