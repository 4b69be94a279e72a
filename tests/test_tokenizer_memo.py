"""The suite's tokenizer memo (tests/tokenizer_memo.py): one real load per path and contents, a copy for each
caller, a changed file loaded again, and at most KEPT kept."""

from __future__ import annotations

import os

from tests import tokenizer_memo


def test_each_file_loads_once_each_caller_gets_its_own_copy_and_a_changed_file_loads_again(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tokenizer_memo, "_LOADED", type(tokenizer_memo._LOADED)())
    monkeypatch.setattr(tokenizer_memo, "KEPT", 2)
    loads: list[str] = []

    def load_tokenizer(path):
        loads.append(str(path))
        return {"vocab": [1, 2, 3]}

    load = tokenizer_memo.remembering(load_tokenizer)
    assert tokenizer_memo.remembering(load) is load  # installed twice: wrapped once
    first = tmp_path / "a.gguf"
    first.write_bytes(b"one")
    one, two = load(first), load(first)
    assert one == two and one is not two and loads == [str(first)]
    one["vocab"].append(4)  # a caller changing its copy changes no other
    assert load(first) == {"vocab": [1, 2, 3]}
    first.write_bytes(b"other")
    os.utime(first, ns=(1, 1))
    load(first)
    assert loads == [str(first)] * 2
    for name in ("b.gguf", "c.gguf"):
        (tmp_path / name).write_bytes(b"x")
        load(tmp_path / name)
    assert len(tokenizer_memo._LOADED) == 2  # the least recently used went
