"""The trio client: subscribe, publish, and ask a question (ROOST_NODES names the node)."""

import trio

from roost import Client


async def main() -> None:
    async with Client() as c, c.subscribe("greetings") as sub, trio.open_nursery() as nursery:

        async def answer() -> None:
            async with c.subscribe("time") as questions:
                async for q in questions:
                    await q.respond(b"tea time")

        nursery.start_soon(answer)
        for i in range(3):
            await c.publish("greetings", f"hello {i}")
        async for msg in sub:
            print(msg.topic, msg.payload.decode())
            if msg.sequence == 3:
                break
        print((await c.request("time", "what time is it?")).payload.decode())
        nursery.cancel_scope.cancel()


trio.run(main)
