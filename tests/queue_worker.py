"""A queue-group subscriber process for tests/test_cluster.py: prints each payload on its own line
(flushed), and with ``--pause-after N`` stops taking messages after N, makes sure its
acknowledgements have left, says ``paused`` on stderr and waits to be killed."""

from __future__ import annotations

import argparse
import sys

import trio

from roost.client import Client


async def main(args: argparse.Namespace) -> None:
    async with Client(args.node) as c, c.subscribe(args.topic, queue=args.queue) as sub:
        print("subscribed", file=sys.stderr, flush=True)
        n = 0
        async for msg in sub:
            sys.stdout.write(msg.payload.decode() + "\n")
            sys.stdout.flush()
            n += 1
            if n == args.pause_after:
                assert await c.flush(10)
                print("paused", file=sys.stderr, flush=True)
                await trio.sleep_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("node")
    ap.add_argument("topic")
    ap.add_argument("queue")
    ap.add_argument("--pause-after", type=int, default=0)
    trio.run(main, ap.parse_args())
