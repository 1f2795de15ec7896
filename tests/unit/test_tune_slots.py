"""tune/slots: the queue that feeds a sweep's trials to free nodes or GPUs over SSH."""

from __future__ import annotations

import threading
import time

import pytest

from provision.tune.slots import NoSlotsLeft, Slot, SlotQueue, node_slots


def test_slots_are_one_per_gpu_or_per_node_and_spread_over_nodes_first():
    gpus = {"node1": 2, "node2": 2, "cpu1": 0}
    assert [str(s) for s in node_slots(gpus, per_gpu=True)] == [
        "node1:gpu0",
        "node2:gpu0",
        "cpu1",
        "node1:gpu1",
        "node2:gpu1",
    ]
    assert node_slots(gpus, per_gpu=False) == [Slot("node1"), Slot("node2"), Slot("cpu1")]


def test_no_more_than_parallel_trials_hold_a_slot_at_once():
    queue = SlotQueue(node_slots({f"n{i}": 0 for i in range(4)}, per_gpu=False), parallel=2, retries=0)
    most, lock = [0], threading.Lock()

    def trial(number: int) -> None:
        slot = queue.take(number, timeout_s=10)
        assert slot is not None
        with lock:
            most[0] = max(most[0], queue.busy())
        time.sleep(0.02)
        queue.give_back(slot, number)

    threads = [threading.Thread(target=trial, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert most[0] == 2
    assert queue.busy() == 0


def test_a_trial_waits_for_a_free_slot_and_gives_up_at_its_timeout():
    queue = SlotQueue([Slot("n1")], parallel=4, retries=0)
    held = queue.take(0)
    started = time.monotonic()
    assert queue.take(1, timeout_s=0.2) is None
    assert time.monotonic() - started >= 0.2
    threading.Timer(0.1, queue.give_back, args=(held, 0)).start()
    assert queue.take(1, timeout_s=10) == Slot("n1")  # woken by the give-back, not the timeout


def test_a_failed_trial_is_retried_on_another_slot_a_bounded_number_of_times():
    queue = SlotQueue([Slot("n1"), Slot("n2"), Slot("n3")], parallel=3, retries=2)
    first = queue.take(7)
    queue.give_back(first, 7, failed=True)
    assert queue.may_retry(7)
    second = queue.take(7)
    assert second != first
    queue.give_back(second, 7, failed=True)
    third = queue.take(7)
    assert third not in (first, second)
    queue.give_back(third, 7, failed=True)
    assert not queue.may_retry(7)  # three failures: the first try and both retries
    assert queue.may_retry(8)  # another trial's tries are its own


def test_a_retried_trial_waits_for_a_busy_slot_it_has_not_failed_on_rather_than_reuse_its_bad_one():
    queue = SlotQueue([Slot("good"), Slot("bad")], parallel=2, retries=3)
    good = queue.take(1)  # another trial holds the good slot
    bad = queue.take(2)
    queue.give_back(bad, 2, failed=True)
    assert queue.take(2, timeout_s=0.1) is None  # only the slot it failed on is free
    queue.give_back(good, 1)
    assert queue.take(2, timeout_s=1) == Slot("good")


def test_a_trial_that_failed_everywhere_still_gets_a_slot():
    queue = SlotQueue([Slot("only")], parallel=1, retries=3)
    queue.give_back(queue.take(5), 5, failed=True)
    assert queue.take(5, timeout_s=1) == Slot("only")


def test_a_lost_node_takes_all_its_slots_out_and_an_empty_queue_says_so():
    queue = SlotQueue(node_slots({"n1": 2, "n2": 1}, per_gpu=True), parallel=3, retries=5)
    a = queue.take(1)  # n1:gpu0
    b = queue.take(2)  # n2:gpu0
    c = queue.take(3)  # n1:gpu1
    assert {a.node, b.node, c.node} == {"n1", "n2"}
    queue.give_back(a, 1, node_lost=True)
    queue.give_back(c, 3)  # finished on the lost node: not handed out again
    assert queue.lost_nodes() == {"n1"}
    assert queue.take(1, timeout_s=0.1) is None  # n2's only slot is busy
    queue.give_back(b, 2, node_lost=True)
    with pytest.raises(NoSlotsLeft):
        queue.take(1, timeout_s=5)


def test_a_waiting_trial_is_told_when_the_last_node_is_lost():
    queue = SlotQueue([Slot("n1")], parallel=1, retries=1)
    held = queue.take(1)
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(queue.take(2))
        except NoSlotsLeft as e:
            outcome.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)
    queue.give_back(held, 1, node_lost=True)
    waiter.join(5)
    assert len(outcome) == 1
    assert isinstance(outcome[0], NoSlotsLeft)


def test_a_queue_needs_slots_and_a_positive_parallel():
    with pytest.raises(ValueError, match="at least one slot"):
        SlotQueue([], parallel=1, retries=0)
    with pytest.raises(ValueError, match="parallel must be 1 or more"):
        SlotQueue([Slot("n1")], parallel=0, retries=0)
