"""The asyncio client: the same, with a callback answering the questions."""

import asyncio

from roost.asyncio import Client, Message


async def main() -> None:
    async with Client() as c:

        async def answer(q: Message) -> None:
            await q.respond(b"tea time")

        async with c.subscribe("greetings") as sub, c.subscribe("time", callback=answer):
            for i in range(3):
                await c.publish("greetings", f"hello {i}")
            async for msg in sub:
                print(msg.topic, msg.payload.decode())
                if msg.sequence == 3:
                    break
            print((await c.request("time", "what time is it?")).payload.decode())


asyncio.run(main())
