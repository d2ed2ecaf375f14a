"""The metadata quorum's Raft state on real files (cluster/raftstore.py) and on the simulator's disk
(sim/raftdisk.py): round trips, votes kept, cuts and appends, snapshots, torn and garbled files,
the repair of a crash between a snapshot and the log's reset, the decoders on random bytes, and a
power loss in the simulator that drops exactly what was not synced."""

from __future__ import annotations

import contextlib
import random
import tempfile
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roost.cluster.raftstate import RaftPersist, Stored
from roost.cluster.raftstore import (
    LOG_DIR,
    MAX_INT,
    NEW_LOG_DIR,
    OLD_LOG_DIR,
    SNAPSHOT_FILE,
    STATE_FILE,
    RaftStore,
    RaftStoreError,
    decode_entry_untrusted,
    decode_snapshot_untrusted,
    decode_state_untrusted,
    encode_entry,
    encode_snapshot,
    encode_state,
)
from roost.node.segmentlog import Record, SegmentLog
from sim.raftdisk import RaftState, SimRaftDisk

EMPTY = Stored(0, None, 0, 0, None, [])
_tokens = iter(range(1, 1 << 30))


def persist(term: int = 1, vote: str | None = None, *, cut: int | None = None,
            entries: list[tuple[int, int, bytes]] | None = None,
            snapshot: tuple[int, int, bytes] | None = None) -> RaftPersist:  # fmt: skip
    return RaftPersist(next(_tokens), term, vote, cut, entries or [], snapshot)


def ents(first: int, terms: list[int]) -> list[tuple[int, int, bytes]]:
    return [(first + k, t, f"cmd{first + k}".encode()) for k, t in enumerate(terms)]


def stored_entries(first: int, terms: list[int]) -> list[tuple[int, bytes]]:
    return [(t, c) for _, t, c in ents(first, terms)]


class Member:
    """A member's store on ``d``, which a test can crash: ``crash`` abandons the store as it
    stands (never closed, as by a power loss right after its last persist returned) and opens a
    new one on the same files, returning what that one read back."""

    def __init__(self, d: Path, **kw: int) -> None:
        self.d, self.kw = d, kw
        self.store = RaftStore(d, **kw)
        self.got = self.store.open()

    def persist(self, a: RaftPersist) -> None:
        self.store.persist(a)

    def crash(self) -> Stored:
        self.store = RaftStore(self.d, **self.kw)
        self.got = self.store.open()
        return self.got


def log_bases(d: Path) -> list[int]:
    return sorted(int(p.stem) for p in (d / LOG_DIR).glob("*.log"))


# ---------------------------------------------------------------- round trips


def test_a_new_store_is_empty_and_made_on_open(tmp_path: Path) -> None:
    d = tmp_path / "data" / "quorum"
    m = Member(d)
    assert m.got == EMPTY
    assert d.is_dir() and not (d / STATE_FILE).exists() and not (d / SNAPSHOT_FILE).exists()
    m.store.close()
    assert m.crash() == EMPTY


def test_what_was_persisted_is_what_open_reads_back(tmp_path: Path) -> None:
    m = Member(tmp_path)
    m.persist(persist(1, "m1", entries=ents(1, [1, 1])))
    m.persist(persist(2, None, entries=ents(3, [2])))
    m.persist(persist(2, "m3"))
    want = Stored(2, "m3", 0, 0, None, stored_entries(1, [1, 1, 2]))
    assert m.crash() == want  # (not closed: a crash right after the last persist returned)
    m.store.close()
    assert m.crash() == want


def test_a_vote_is_never_forgotten_nor_changed_in_its_term(tmp_path: Path) -> None:
    m = Member(tmp_path)
    m.persist(persist(5, "m2"))
    assert m.crash()[:2] == (5, "m2")
    with pytest.raises(RaftStoreError, match=r"a vote for 'm3' in term 5, where 'm2' has it"):
        m.persist(persist(5, "m3"))
    with pytest.raises(RaftStoreError, match=r"a vote for None in term 5"):
        m.persist(persist(5, None))
    with pytest.raises(RaftStoreError, match=r"term 4, behind 5"):
        m.persist(persist(4, "m2"))
    assert m.crash()[:2] == (5, "m2")
    m.persist(persist(6, None))  # (a new term: no vote yet)
    m.persist(persist(6, "m3"))
    assert m.crash()[:2] == (6, "m3")


def test_a_cut_then_an_append_replaces_the_tail(tmp_path: Path) -> None:
    m = Member(tmp_path, segment_bytes=120)  # (a few entries a segment: cuts across segments)
    m.persist(persist(2, entries=ents(1, [1, 1, 1, 2, 2, 2, 2, 2])))
    m.persist(persist(3, cut=3, entries=ents(4, [3, 3])))
    assert m.crash().entries == stored_entries(1, [1, 1, 1, 3, 3])
    m.persist(persist(3, cut=1))
    assert m.crash().entries == stored_entries(1, [1])
    m.persist(persist(3, cut=0, entries=ents(1, [3])))
    assert m.crash().entries == stored_entries(1, [3])
    m.persist(persist(3, cut=9))  # (past the end: nothing to cut)
    assert m.crash().entries == stored_entries(1, [3])


def test_a_persist_that_breaks_the_rules_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    m = Member(tmp_path)
    m.persist(persist(2, "m1", entries=ents(1, [1, 2])))
    before = m.crash()
    bad = [
        (persist(2, "m1", entries=ents(4, [2])), "entry 4 where 3 is next"),
        (persist(2, "m1", entries=ents(3, [1])), "entry 3 of term 1 after one of term 2"),
        (persist(2, "m1", entries=[(3, 2, b"a"), (5, 2, b"b")]), "entry 5 where 4 is next"),
        (persist(3, "m1", cut=1, entries=ents(2, [0])), "entry 2 of term 0 after one of term 1"),
        (persist(-1, None), r"term -1 is not an integer"),
        (persist(2, "m1", entries=[(3, 2, "text")]), "a command that is not bytes"),  # type: ignore[list-item]
        (persist(3, "x" * 2000), "a vote that is not a member id"),
        (persist(3, None, snapshot=(0, 1, b"s")), "snapshot index 0"),
    ]
    for a, why in bad:
        with pytest.raises(RaftStoreError, match=why) as e:
            m.persist(a)
        assert str(tmp_path) in str(e.value)
        assert m.crash() == before
    m.persist(persist(2, "m1", snapshot=(2, 2, b"s")))
    with pytest.raises(RaftStoreError, match="a cut after 1, into the snapshot at 2"):
        m.persist(persist(2, "m1", cut=1))
    with pytest.raises(RaftStoreError, match="a snapshot at 1, behind the one held at 2"):
        m.persist(persist(2, "m1", snapshot=(1, 1, b"s")))


def test_a_command_over_the_limit_is_refused(tmp_path: Path) -> None:
    m = Member(tmp_path, max_command=100)
    m.persist(persist(1, entries=[(1, 1, b"x" * 100)]))
    with pytest.raises(RaftStoreError, match="at most 100"):
        m.persist(persist(1, entries=[(2, 1, b"x" * 101)]))
    assert m.crash().entries == [(1, b"x" * 100)]


# ---------------------------------------------------------------- snapshots


def test_a_snapshot_that_agrees_keeps_the_entries_above_it_and_drops_those_covered(tmp_path: Path) -> None:
    m = Member(tmp_path, segment_bytes=120)
    m.persist(persist(3, entries=ents(1, [1] * 10 + [2] * 10 + [3] * 5)))
    assert len(log_bases(tmp_path)) > 5
    m.persist(persist(3, snapshot=(15, 2, b"state at 15")))
    got = m.crash()
    assert got == Stored(3, None, 15, 2, b"state at 15", stored_entries(16, [2] * 5 + [3] * 5))
    assert log_bases(tmp_path)[0] == 16  # (the log rebuilt to begin right after it)
    assert len(log_bases(tmp_path)) < 5
    m.persist(persist(3, entries=ents(26, [3])))  # (appends go on after the kept ones)
    assert m.crash().entries == stored_entries(16, [2] * 5 + [3] * 6)


@pytest.mark.parametrize("case", ["other term", "past the end", "at the end"])
def test_a_snapshot_the_log_does_not_agree_with_or_reach_past_drops_the_whole_log(tmp_path: Path, case: str) -> None:
    m = Member(tmp_path, segment_bytes=120)
    m.persist(persist(3, entries=ents(1, [1] * 6 + [2] * 4)))
    index, term = {"other term": (8, 3), "past the end": (40, 3), "at the end": (10, 2)}[case]
    m.persist(persist(3, snapshot=(index, term, b"snap")))
    assert m.crash() == Stored(3, None, index, term, b"snap", [])
    m.persist(persist(4, entries=ents(index + 1, [4])))
    assert m.crash() == Stored(4, None, index, term, b"snap", [(4, f"cmd{index + 1}".encode())])


def test_a_snapshot_at_the_one_held_keeps_the_log(tmp_path: Path) -> None:
    m = Member(tmp_path)
    m.persist(persist(2, snapshot=(5, 2, b"a"), entries=ents(6, [2, 2])))
    m.persist(persist(2, snapshot=(5, 2, b"a again")))
    assert m.crash() == Stored(2, None, 5, 2, b"a again", stored_entries(6, [2, 2]))


# ---------------------------------------------------------------- crashes and damage


def test_a_torn_tail_of_the_entries_log_is_cut_at_open(tmp_path: Path) -> None:
    m = Member(tmp_path)
    m.persist(persist(1, entries=ents(1, [1, 1, 1])))
    m.store.close()
    (seg,) = (tmp_path / LOG_DIR).glob("*.log")
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x30garbage of a record half written")
    m = Member(tmp_path)
    got = m.got
    assert got.entries == stored_entries(1, [1, 1, 1])
    assert m.store.cut_bytes == 36
    m.persist(persist(1, entries=ents(4, [1])))  # (the log goes on where the good records end)
    assert m.crash().entries == stored_entries(1, [1, 1, 1, 1])


@pytest.mark.parametrize("name", [STATE_FILE, SNAPSHOT_FILE])
@pytest.mark.parametrize("damage", ["flip", "cut", "empty", "grown"])
def test_a_garbled_state_or_snapshot_file_refuses_the_open_naming_it(tmp_path: Path, name: str, damage: str) -> None:
    m = Member(tmp_path)
    m.persist(persist(7, "m2", snapshot=(3, 1, b"the state machine at 3")))
    m.store.close()
    path = tmp_path / name
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-3] ^= 0x10
    elif damage == "cut":
        data = data[:-1]
    elif damage == "empty":
        data = bytearray()
    else:
        data += b"\x00"
    path.write_bytes(bytes(data))
    with pytest.raises(RaftStoreError, match=f"{path}: damaged, refusing to start"):
        RaftStore(tmp_path).open()


def test_a_missing_state_or_snapshot_file_is_empty(tmp_path: Path) -> None:
    m = Member(tmp_path)
    m.persist(persist(7, "m2", snapshot=(3, 1, b"s"), entries=ents(4, [7])))
    m.store.close()
    (tmp_path / STATE_FILE).unlink()
    assert m.crash() == Stored(0, None, 3, 1, b"s", stored_entries(4, [7]))


def test_a_temporary_file_a_crash_left_is_ignored(tmp_path: Path) -> None:
    m = Member(tmp_path)
    m.persist(persist(7, "m2"))
    (tmp_path / f"{STATE_FILE}.tmp").write_bytes(b"half")
    assert m.crash()[:2] == (7, "m2")
    assert not (tmp_path / f"{STATE_FILE}.tmp").exists()


def _crash_after_the_snapshot_file(tmp_path: Path, index: int, term: int) -> None:
    """What a crash right after a snapshot's file was replaced leaves: the log not yet touched."""
    (tmp_path / SNAPSHOT_FILE).write_bytes(encode_snapshot(index, term, b"snap"))


@pytest.mark.parametrize(("index", "term", "want"), [
    (12, 3, []),  # the log does not reach past it
    (6, 5, []),  # it reaches past, but its entry at 6 is of another term
    (6, 2, stored_entries(7, [2, 2, 2, 2])),  # it agrees: the entries above stay
])  # fmt: skip
def test_a_crash_between_a_snapshot_install_and_the_log_cut_is_repaired(
    tmp_path: Path, index: int, term: int, want: list[tuple[int, bytes]]
) -> None:
    m = Member(tmp_path, segment_bytes=120)
    m.persist(persist(5, entries=ents(1, [1] * 5 + [2] * 5)))
    m.store.close()
    _crash_after_the_snapshot_file(tmp_path, index, term)
    m = Member(tmp_path, segment_bytes=120)
    got = m.got
    assert got == Stored(5, None, index, term, b"snap", want)
    assert m.store.dropped == {12: 0, 6: 4 - len(want)}[index]  # (entries 7..10 of another history)
    m.persist(persist(5, entries=ents(index + 1 + len(want), [5])))  # (appends follow on)
    assert m.crash().entries == [*want, (5, f"cmd{index + 1 + len(want)}".encode())]


def test_a_crash_while_the_log_is_rebuilt_leaves_the_old_log_or_the_new_one(tmp_path: Path) -> None:
    m = Member(tmp_path, segment_bytes=120)
    m.persist(persist(2, entries=ents(1, [1] * 5 + [2] * 5)))
    m.store.close()
    # a crash while the new log was being made: it is a leftover, the old log stands
    (tmp_path / NEW_LOG_DIR).mkdir()
    (tmp_path / NEW_LOG_DIR / f"{1:020d}.log").write_bytes(b"half a log")
    assert m.crash() == Stored(2, None, 0, 0, None, stored_entries(1, [1] * 5 + [2] * 5))
    assert not (tmp_path / NEW_LOG_DIR).exists()
    m.persist(persist(2, snapshot=(6, 2, b"s")))
    m.store.close()
    # a crash between the two renames: the old log renamed away, the new one complete beside it
    (tmp_path / LOG_DIR).rename(tmp_path / NEW_LOG_DIR)
    (tmp_path / OLD_LOG_DIR).mkdir()
    (tmp_path / OLD_LOG_DIR / f"{1:020d}.log").write_bytes(b"the old log")
    assert m.crash() == Stored(2, None, 6, 2, b"s", stored_entries(7, [2] * 4))
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOG_DIR, SNAPSHOT_FILE, STATE_FILE]
    # a crash before the old log was deleted: it is a leftover
    m.store.close()
    (tmp_path / OLD_LOG_DIR).mkdir()
    assert m.crash() == Stored(2, None, 6, 2, b"s", stored_entries(7, [2] * 4))
    assert not (tmp_path / OLD_LOG_DIR).exists()


def test_a_log_that_starts_after_the_snapshot_has_lost_entries_and_refuses(tmp_path: Path) -> None:
    m = Member(tmp_path)
    m.persist(persist(2, snapshot=(4, 1, b"s"), entries=ents(5, [2, 2, 2])))
    m.store.close()
    (tmp_path / SNAPSHOT_FILE).unlink()  # (entries 1..4 now nowhere)
    with pytest.raises(RaftStoreError, match=f"{tmp_path / LOG_DIR}: entries begin at 5, the snapshot ends at 0"):
        RaftStore(tmp_path).open()


@pytest.mark.parametrize(("body", "why"), [
    (b"\x93\x01\x02\x03", r"log: entry 2: not an entry"),  # (a good record of the log, not an entry)
    (encode_entry(1, b"x"), r"log: entry 2 of term 1 after one of term 2"),
])  # fmt: skip
def test_a_log_entry_that_cannot_be_refuses_the_open(tmp_path: Path, body: bytes, why: str) -> None:
    m = Member(tmp_path)
    m.persist(persist(2, entries=ents(1, [2])))
    m.store.close()
    log, _ = SegmentLog.open(tmp_path / LOG_DIR)
    log.append([Record(2, 0, body)])
    log.close()
    with pytest.raises(RaftStoreError, match=why):
        RaftStore(tmp_path).open()


def test_a_failed_write_names_the_file_and_stops_the_store(tmp_path: Path) -> None:
    m = Member(tmp_path)
    (tmp_path / f"{STATE_FILE}.tmp").mkdir()  # (the temporary file cannot be made)
    with pytest.raises(RaftStoreError, match=f"{tmp_path / STATE_FILE}.tmp"):
        m.persist(persist(3, "m1"))
    with pytest.raises(RaftStoreError, match="an earlier persist failed"):
        m.persist(persist(3, "m1"))
    m.store.close()


# ---------------------------------------------------------------- the decoders, on anything


def test_the_file_formats_are_as_documented() -> None:
    body = (5).to_bytes(8, "big") + b"\x01" + (2).to_bytes(2, "big") + b"m1"
    assert encode_state(5, "m1") == b"RQT1" + crc32c(body).to_bytes(4, "big") + body
    body = (3).to_bytes(8, "big") + (2).to_bytes(8, "big") + (2).to_bytes(8, "big") + b"xy"
    assert encode_snapshot(3, 2, b"xy") == b"RQS1" + crc32c(body).to_bytes(4, "big") + body
    assert decode_state_untrusted(encode_state(MAX_INT, None)) == (MAX_INT, None)
    assert decode_state_untrusted(encode_state(0, "é" * 10)) == (0, "é" * 10)
    assert decode_snapshot_untrusted(encode_snapshot(MAX_INT, MAX_INT, b"")) == (MAX_INT, MAX_INT, b"")
    assert decode_entry_untrusted(encode_entry(9, b"c")) == (9, b"c")


def sealed(magic: bytes, body: bytes) -> bytes:
    """A file with a good CRC around ``body``: what the range checks alone must refuse."""
    return magic + crc32c(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(("data", "why"), [
    (encode_state(1 << 63, None), "term 9223372036854775808 is not an integer"),
    (sealed(b"RQT1", (1).to_bytes(8, "big") + b"\x02\x00\x00"), "vote flag 2"),
    (sealed(b"RQT1", (1).to_bytes(8, "big") + b"\x01\x00\x03ab"), "a body of 13 bytes where 14 were due"),
    (sealed(b"RQT1", (1).to_bytes(8, "big") + b"\x01\x00\x02\xff\xfe"), "not UTF-8"),
    (sealed(b"RQT1", (1).to_bytes(8, "big") + b"\x00\x00\x01a"), "a vote of 1 bytes"),
    (sealed(b"RQT1", (1).to_bytes(8, "big") + b"\x01\xff\xff"), "a vote of 65535 bytes"),
    (sealed(b"RQS1", bytes.fromhex("0000000000000001" * 2 + "0000000000000005") + b"abc"),
     "data of 5 bytes announced, 3 present"),
    (sealed(b"RQS1", bytes(23)), "shorter than index, term and length"),
    (encode_snapshot(0, 1, b""), "snapshot index 0"),
    (encode_snapshot(1, 1 << 63, b""), "snapshot term"),
    (encode_entry(-1, b"c"), "entry term -1"),
    (encode_entry(1, "c"), "not an entry"),  # type: ignore[arg-type]
    (encode_entry(1, b"c") + b"\x00", "not an entry"),
])  # fmt: skip
def test_numbers_out_of_range_are_refused_even_with_a_good_crc(data: bytes, why: str) -> None:
    decode = {b"RQT1": decode_state_untrusted, b"RQS1": decode_snapshot_untrusted}.get(data[:4], decode_entry_untrusted)
    with pytest.raises(ValueError, match=why):
        decode(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.sampled_from([b"", b"RQT1", b"RQS1"]))
def test_the_decoders_on_random_bytes_raise_only_value_error(data: bytes, magic: bytes) -> None:
    for decode in (decode_state_untrusted, decode_snapshot_untrusted, decode_entry_untrusted):
        with contextlib.suppress(ValueError):  # (anything else fails the test)
            decode(magic + data)  # type: ignore[operator]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40), st.binary(min_size=24, max_size=24))
def test_bodies_behind_a_good_crc_decode_to_what_encodes_them_or_raise_value_error(tail: bytes, head: bytes) -> None:
    """Past the CRC only the range checks stand: a body they accept is one the encoder writes."""
    for magic, decode, encode in ((b"RQT1", decode_state_untrusted, encode_state),
                                  (b"RQS1", decode_snapshot_untrusted, encode_snapshot)):  # fmt: skip
        for body in (head + tail, head[:11] + tail, head[:8] + b"\x01" + len(tail).to_bytes(2, "big") + tail,
                     head[:16] + len(tail).to_bytes(8, "big") + tail):  # fmt: skip
            data = sealed(magic, body)
            try:
                got = decode(data)  # type: ignore[operator]
            except ValueError:
                continue
            assert encode(*got) == data  # type: ignore[operator]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, MAX_INT), st.one_of(st.none(), st.text(max_size=40)), st.binary(max_size=40),
       st.data())  # fmt: skip
def test_any_one_damaged_byte_of_a_state_or_snapshot_file_is_found(term: int, vote: str | None, blob: bytes,
                                                                   data: st.DataObject) -> None:  # fmt: skip
    state, snap = encode_state(term, vote), encode_snapshot(term or 1, term, blob)
    assert decode_state_untrusted(state) == (term, vote)
    assert decode_snapshot_untrusted(snap) == (term or 1, term, blob)
    for good, decode in ((state, decode_state_untrusted), (snap, decode_snapshot_untrusted)):
        at = data.draw(st.integers(0, len(good) - 1))
        flip = data.draw(st.integers(1, 255))
        bad = bytearray(good)
        bad[at] ^= flip
        with pytest.raises(ValueError):
            decode(bytes(bad))  # type: ignore[operator]


# ---------------------------------------------------------------- the real store and the sim's agree


def _random_persist(rng: random.Random, m: RaftState) -> RaftPersist:
    """A persist that keeps the rules, drawn from the state ``m`` holds."""
    snapshot = cut = None
    end, si, st_ = m.end, m.snapshot_index, m.snapshot_term
    if rng.random() < 0.2 and end - 1 >= max(1, si):
        index = rng.randint(max(1, si), end - 1 + rng.randint(0, 2))
        at = m.term_at(index)
        term = at if at is not None and rng.random() < 0.6 else max(st_, rng.randint(0, m.term))
        snapshot = (index, term, rng.randbytes(rng.randint(0, 20)))
        if m.term_at(index) != term:
            end, si, st_ = index + 1, index, term
        else:
            si, st_ = index, term
    if rng.random() < 0.3:
        cut = rng.randint(si, end + 1)
        end = min(end, cut + 1)
    prev = st_ if end - 1 == si else m.term_at(end - 1)
    assert prev is not None
    term = m.term + (rng.random() < 0.3)
    entries = []
    for k in range(rng.choice([0, 0, 1, 3, 8])):
        prev = rng.randint(prev, term)
        entries.append((end + k, prev, rng.randbytes(rng.randint(0, 30))))
    vote = m.vote if term == m.term and m.vote is not None else rng.choice([None, "m1", "m2"])
    return RaftPersist(next(_tokens), term, vote, cut, entries, snapshot)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 1 << 32))
def test_the_real_store_and_the_simulators_disk_read_back_the_same(seed: int) -> None:
    rng = random.Random(seed)
    model = RaftState()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        m = Member(d, segment_bytes=150)
        assert m.got == model.stored()
        for step in range(25):
            a = _random_persist(rng, model)
            m.persist(a)
            model.apply(a, "model")
            if step % 8 == 7:
                assert m.crash() == model.stored()
        m.store.close()
        assert m.crash() == model.stored()


# ---------------------------------------------------------------- the simulator's disk


def test_the_sim_disk_loses_exactly_the_unsynced_persists_on_a_crash() -> None:
    disk = SimRaftDisk(random.Random(1))
    assert disk.open("m1") == EMPTY
    a1 = RaftPersist(1, 1, "m1", None, ents(1, [1, 1]), None)
    a2 = RaftPersist(2, 2, "m2", None, ents(3, [2]), None)
    a3 = RaftPersist(3, 2, "m2", 1, ents(2, [2]), None)
    t1, t2, t3 = (disk.submit("m1", a, 10.0) for a in (a1, a2, a3))
    assert 10.0 < t1 < t2 < t3  # (one member's disk in order, each after a delay)
    disk.submit("m2", RaftPersist(1, 9, None, None, [], None), 10.0)  # (another member's disk is its own)
    assert disk.complete("m1", 1)
    assert disk.crash("m1") == [2, 3]
    assert not disk.complete("m1", 2)  # (dropped: the core must not hear of it)
    assert disk.open("m1") == Stored(1, "m1", 0, 0, None, stored_entries(1, [1, 1]))
    # after the crash, the next persist is checked against what survived (term 1, not 2)
    disk.submit("m1", RaftPersist(4, 1, "m1", None, ents(3, [1]), None), 20.0)
    assert disk.complete("m1", 4)
    assert disk.open("m1") == Stored(1, "m1", 0, 0, None, stored_entries(1, [1, 1, 1]))
    assert disk.complete("m2", 1)
    assert disk.open("m2")[:2] == (9, None)


def test_the_sim_disk_completes_in_order_and_refuses_what_the_real_store_refuses() -> None:
    disk = SimRaftDisk(random.Random(2))
    disk.submit("m1", RaftPersist(1, 1, "m1", None, ents(1, [1]), None), 0.0)
    disk.submit("m1", RaftPersist(2, 1, "m1", None, ents(2, [1]), None), 0.0)
    assert disk.complete("m1", 2)  # (the later one synced: so is every one before it)
    assert disk.open("m1").entries == stored_entries(1, [1, 1])
    with pytest.raises(RaftStoreError, match="sim disk of m1: persist 3 refused: a vote for 'm2' in term 1"):
        disk.submit("m1", RaftPersist(3, 1, "m2", None, [], None), 0.0)
    with pytest.raises(RaftStoreError, match="entry 5 where 3 is next"):
        disk.submit("m1", RaftPersist(4, 1, "m1", None, ents(5, [1]), None), 0.0)
    assert disk.crash("m1") == []
