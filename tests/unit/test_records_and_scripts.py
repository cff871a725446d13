from __future__ import annotations

import re
from importlib import resources

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.queue.ids import _encode, ids_from, new_job_id, time_of
from dispatcher.queue.records import JobRecord
from dispatcher.queue.scripting import LUA_CODE_TABLES, SCRIPT_NAMES, script_source
from dispatcher.queue.states import DeadReason, JobState, Priority


@given(
    st.text(min_size=1, max_size=50),
    st.sampled_from(list(Priority)),
    st.sampled_from(list(JobState)),
    st.integers(0, 2**52),
    st.integers(1, 1000),
    st.integers(0, 1000),
    st.text(max_size=20),
    st.booleans(),
)
def test_record_round_trips(job_type, prio, state, run_at, max_attempts, attempts, key, cancel):
    record = JobRecord(
        job_type,
        prio,
        state,
        run_at,
        run_at,
        max_attempts,
        1000,
        attempts=attempts,
        idempotency_key=key,
        cancel_requested=cancel,
        token="3:17" if attempts else "",
    )
    assert JobRecord.unpack(record.pack()) == record


def test_every_script_loads_with_its_includes_inlined():
    for name in SCRIPT_NAMES:
        source = script_source(name)
        assert "@include" not in source
        assert source.lstrip().startswith("--[[")  # the KEYS/ARGV/return-code header
    assert "local function set_state" in script_source("ack")
    assert "local function retry_or_dead" in script_source("retry")


def test_job_ids_are_unique_and_time_ordered():
    ids = [new_job_id() for _ in range(2000)]
    assert len(set(ids)) == 2000 and all(len(i) == 26 for i in ids)
    assert ids[0][:10] <= ids[-1][:10]


@given(st.integers(0, 2**48 - 1), st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=5))
def test_a_batch_of_ids_spells_each_ones_time_and_80_random_bits(millis: int, chunks: list[bytes]):
    """Each id of a batch is the ULID of its millisecond and of the low 5 bits of its 16 bytes."""
    ids = ids_from(millis, b"".join(chunks))
    for job_id, chunk in zip(ids, chunks, strict=True):
        bits = 0
        for byte in chunk:
            bits = bits << 5 | byte & 31
        assert job_id == _encode(millis << 80 | bits)
        assert time_of(job_id) == millis


def _code_of(source: str) -> list[tuple[int, str]]:
    """The numbered lines of a Lua source without its comments (block comments and `--` tails)."""
    source = re.sub(r"--\[\[.*?\]\]", lambda m: "\n" * m.group(0).count("\n"), source, flags=re.S)
    lines = []
    for n, line in enumerate(source.splitlines(), 1):
        code = re.sub(r"--.*$", "", line).strip()
        if code:
            lines.append((n, code))
    return lines


def _script_files() -> list[tuple[str, str]]:
    root = resources.files("dispatcher.queue") / "scripts"
    files = [(f"{name}.lua", (root / f"{name}.lua").read_text()) for name in SCRIPT_NAMES]
    includes = [p for p in (root / "includes").iterdir() if p.name.endswith(".lua")]
    files += [(f"includes/{p.name}", p.read_text()) for p in includes]
    return files


_NAMED_VALUES = {*(str(s) for s in JobState), *(str(r) for r in DeadReason)}
_CODE_TABLES = ("STATE", "REASON", *LUA_CODE_TABLES)


def test_the_scripts_name_every_state_and_result_code_from_the_generated_include():
    """States, dead-letter reasons and result codes come from the enums of dispatcher/queue/states.py
    through the generated `codes` include: a literal written in a script instead would not follow a
    change of the enum, and Python and Lua would disagree."""
    found = []
    for path, text in _script_files():
        for n, code in _code_of(text):
            where = f"{path}:{n}: {code}"
            for literal in re.findall(r"'([^']*)'|\"([^\"]*)\"", code):
                if set(literal) & _NAMED_VALUES:
                    found.append(f"{where} (a state or reason as a string)")
            if re.search(r"\b(" + "|".join(_NAMED_VALUES) + r")\s*=\s*true\b", code):
                found.append(f"{where} (a set of states written out)")
            if re.search(r"\breturn\s*\{?\s*-?\d", code):
                found.append(f"{where} (a bare number as the reply or its code)")
            if re.search(r"\bout\[[^\]]*\]\s*=\s*-?\d+\s*(;|$)", code) and not re.search(
                r"\b(" + "|".join(_CODE_TABLES) + r")\.[A-Z_]+", code
            ):
                found.append(f"{where} (a bare number as a result code)")
    assert not found, "\n".join(found)


def test_the_generated_include_spells_every_enum_member():
    source = script_source("cancel")
    assert "@include" not in source
    for member in JobState:
        assert f"{member.name} = '{member.value}'" in source
    for name, enum in LUA_CODE_TABLES.items():
        for member in enum:
            assert f"{member.name} = {int(member)}" in source, (name, member)
