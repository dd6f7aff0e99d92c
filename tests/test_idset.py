"""The pinned set of a bulk preview as text (#37): what encode writes, decode reads back exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synthwatch.review import idset


@pytest.mark.parametrize("ids, text", [([], ""), ([7], "7"), ([1, 2, 3], "1-3"), ([3, 1, 2, 9, 11, 12], "1-3,9,11-12"),
                                       ([5, 5, 6], "5-6")])
def test_named_sets(ids: list[int], text: str) -> None:
    assert idset.encode(ids) == text
    assert idset.decode(text) == sorted(set(ids))


@pytest.mark.parametrize("raw", ["x", "1-", "-3", "5-3", "3,2", "2,2", "0", "1-3,3", "1.5", "1;2", "²", "1-²"])
def test_anything_else_is_refused_with_what_is_wrong(raw: str) -> None:
    with pytest.raises(idset.IdSetError, match="^ids: "):
        idset.decode(raw)


def test_a_set_too_big_is_refused_not_cut() -> None:
    with pytest.raises(idset.IdSetError, match="more than"):
        idset.decode(f"1-{idset.MAX_IDS + 1}")


@given(st.sets(st.integers(min_value=1, max_value=10**12)))
def test_round_trip(ids: set[int]) -> None:
    assert idset.decode(idset.encode(ids)) == sorted(ids)


@given(st.text(max_size=30))
def test_any_text_is_ids_or_a_refusal(raw: str) -> None:
    try:
        ids = idset.decode(raw)
    except idset.IdSetError:
        return
    assert ids == sorted(set(ids)) and all(i >= 1 for i in ids)
