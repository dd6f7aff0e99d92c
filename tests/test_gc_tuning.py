"""The worker's collector tuning is process-wide, nests, and is undone by the last worker to end."""

from __future__ import annotations

import gc

from synthwatch.workers.gc_tuning import GEN0_THRESHOLD, tuned_for_worker


def test_nested_tuning_is_undone_by_the_last_user() -> None:
    before = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    with tuned_for_worker():
        assert gc.get_threshold()[0] == GEN0_THRESHOLD
        assert gc.get_freeze_count() > frozen_before  # what existed at the start is out of the collector's walk
        with tuned_for_worker():
            assert gc.get_threshold()[0] == GEN0_THRESHOLD
        assert gc.get_threshold()[0] == GEN0_THRESHOLD  # the outer worker still runs
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen_before


def test_cycles_made_while_tuned_are_still_collected() -> None:
    import weakref

    class Node:
        pass

    with tuned_for_worker():
        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        ref = weakref.ref(a)
        del a, b
        gc.collect()
        assert ref() is None
