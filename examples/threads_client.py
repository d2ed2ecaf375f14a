"""The blocking client for plain threads: calls wait (for `timeout` at most); callbacks run in a worker thread."""

from roost.sync import Client

with Client(timeout=10) as c:
    with c.subscribe("greetings") as sub, c.subscribe("time", callback=lambda q: q.respond(b"tea time")):
        for i in range(3):
            c.publish("greetings", f"hello {i}")
        for msg in sub:
            print(msg.topic, msg.payload.decode())
            if msg.sequence == 3:
                break
        print(c.request("time", "what time is it?").payload.decode())
