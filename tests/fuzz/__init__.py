"""Structure-aware fuzzing of the sans-IO cores: no sockets, so a few thousand mutated frames a
second on one core (docs/security.md, "Fuzzing"; run by tests/test_fuzz.py and scripts/fuzz.py).

Why structure-aware. Random bytes almost never get past a node's first checks (a msgpack array,
the version, the frame type, the cookie's HMAC), so they never reach the state behind them. The
bug that started this (ddc9aa4: a PUB at first_seq 2**64 - 2, then one at 1 from the same
producer, moved two counters out of msgpack's range and the next STATUS killed the node) needed a
valid cookie, one extreme integer in one field, and a second valid frame after it. So each frame
here starts as a valid frame of its type, built by the real encoders from the state of the client
or peer that sends it (its cookie, its next sequence, the stream it acknowledges), and then one
thing in it changes.

How a frame is mutated (mutate.py). Hypothesis draws a *plan* per frame, five bytes read as
three numbers: which source and template, which mutation, which place, which value, what follows.
The frame's msgpack is decoded to its tree and one node of it is replaced (by an extreme value:
0, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, NaN, huge and odd strings and bytes, nested
arrays, wrong types; half the time one of the type it replaces), deleted, inserted before,
wrapped, copied from elsewhere in the frame, or nudged by one (2**63 - 1 + 1); or the encoded
bytes themselves are overwritten, cut, grown or flipped. A text line is mutated by its tokens and
separators; a config document on its TOML tree or its text. The mutator is not ours to tune:
hypothesis chooses, remembers nothing between runs (``database=None``), and shrinks a failure to
the shortest plans that still fail.

Why plans and not a RuleBasedStateMachine. Stateful testing would draw a rule and its arguments
per step: measured, about 130 us per step against 40 us for a plan drawn as one five-byte choice
(three integers drawn apart cost 107 us), and the campaign in ``make test`` must feed 200,000
mutated frames in well under a minute of CPU. A plan list gives the same sequences (several
clients, peers, time passing, legitimate traffic between the mutated frames); the rigs check the
invariants after every step themselves and keep the last steps, printed with a failure.

A sequence. One hypothesis example is a rig (a core and its clients or peers, fresh) and 100-300
plans. Every client says HELLO first and takes its cookie, so that mutated frames get past the
cookie check; after a mutated frame may come one or two legitimate frames (in the same batch or
not) or time passing (0 to 30 s: retransmissions, leases, time-outs, expiries).

The targets (a module each):

- target_node.py: the broker core, every client frame and text line, four configurations;
- target_member.py: a cluster member (replicated, and partitioned with durable logs), peer frames
  after real handshakes, the handshake frames it reads before a peer authenticated (HELLO and
  AUTH on links a peer dials, CHALLENGE and REFUSED on links it dials), and client datagrams;
- target_config.py: the node and cluster config loaders, mutated TOML documents (templates that
  set every setting of both tables among them);
- target_client.py: the client's router and sessions, every frame a node sends.

What counts. A frame counts as mutated (``Tally.mutated``, what the acceptance counts) only if its
bytes differ from its template's and the core's entry point that decodes it took it: an
``as-is`` plan, a mutation that gave the same bytes back (a copy onto itself, a tree msgpack
cannot pack), a datagram the client drops before its decoder (from an address it does not know),
or a handshake frame whose link was gone is fed, or not, as a legitimate frame.

The invariants (checks.py and each target's docstring): nothing escapes a core's entry points;
every counter stays in 0..2**63-1; STATUS encodes without its fallback; everything a core sends
decodes with the real decoders (client frames, peer frames, replicated entries); a datagram the
node must refuse, as the rig judges it (the cookies the node gave each address, the text
networks of its config, the decoders' refusals: not the node's own cookie check), changes
nothing (index, records, producers' sequences, mailboxes, the published and delivered counters)
and is answered at its source only; the broker core's index, registers, admission counts,
mailboxes and digest agree with each other; and at the end a legitimate client is served (a
fresh subscriber gets a fresh publisher's message; for the client target, through its router),
and once every client went silent nothing of theirs is held.

Seeds. ``make test`` runs each target under a fixed seed of its own (the same examples every run);
scripts/fuzz.py draws fresh ones and prints the command that replays a failing round. A seed
fixes the frames whatever else the process imported (``campaign.no_local_constants``), so a
failure seen under pytest-xdist fails the same way when its test runs alone, and a round of
scripts/fuzz.py the same way under ``--replay``.
"""
