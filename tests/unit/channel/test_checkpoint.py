"""The worker's checkpoint: survives a write cut short; a dead worker's loss, counted."""

from __future__ import annotations

from shadow_proxy.channel import checkpoint as cp


def state(**changes) -> cp.TapState:
    base = {
        "name": "kv",
        "publisher_id": 42,
        "next_seq": 10,
        "resolved": 9,
        "next_transport": 7,
        "heartbeats_sent": 3,
        "queued": 8,
        "published": 7,
        "publish_errors": 0,
        "dropped": {"full": 1, "handoff_full": 1},
        "skipped": {"sample": 2},
    }
    return cp.TapState(**{**base, **changes})


class TestFile:
    """The newest whole slot is read back; a torn one leaves the previous."""

    def test_round_trip_and_newest_wins(self, tmp_path):
        path = tmp_path / "checkpoint"
        file = cp.CheckpointFile(path, 1)
        for n in range(5):
            file.write(cp.Checkpoint(3, n, (state(next_seq=10 + n),)))
        got = cp.read_checkpoint(path)
        assert got == cp.Checkpoint(3, 4, (state(next_seq=14),))
        file.close()

    def test_torn_write_falls_back_to_the_other_slot(self, tmp_path):
        path = tmp_path / "checkpoint"
        slot = cp.CheckpointFile.size_for(1)
        file = cp.CheckpointFile(path, 1)
        file.write(cp.Checkpoint(1, 0, (state(next_seq=20),)))
        file.write(cp.Checkpoint(1, 0, (state(next_seq=21),)))
        file.close()
        data = bytearray(path.read_bytes())
        # The newest slot (written second) loses a byte of its body mid-write.
        newest = 0 if int.from_bytes(data[:8], "big") == 2 else slot
        data[newest + 20] ^= 0xFF
        path.write_bytes(bytes(data))
        assert cp.read_checkpoint(path).taps[0].next_seq == 20

    def test_progress_since_the_slot_is_read_with_it(self, tmp_path):
        """Sends noted after the last checkpoint write count as sent (and late as late):
        only what was never sent is unsent."""
        path = tmp_path / "checkpoint"
        file = cp.CheckpointFile(path, 2)
        file.write(cp.Checkpoint(1, 0, (state(), state(name="replay"))))
        file.progress(0, cp.Progress(published=9, publish_errors=0, late=1, next_transport=9))
        file.close()
        kv, replay = cp.read_checkpoint(path).taps
        assert (kv.published, kv.next_transport, kv.dropped["late"]) == (9, 9, 1)
        assert kv.unsent == 10 - 9 - 1 - 2
        assert replay == state(name="replay")  # no progress noted: as checkpointed

    def test_torn_progress_is_ignored(self, tmp_path):
        path = tmp_path / "checkpoint"
        file = cp.CheckpointFile(path, 1)
        file.write(cp.Checkpoint(1, 0, (state(),)))
        file.progress(0, cp.Progress(published=9, publish_errors=0, late=0, next_transport=9))
        file.close()
        data = bytearray(path.read_bytes())
        data[2 * cp.CheckpointFile.size_for(1) + 7] ^= 0xFF  # a store cut by the kill
        path.write_bytes(bytes(data))
        assert cp.read_checkpoint(path).taps[0].published == 7

    def test_missing_or_empty_file(self, tmp_path):
        assert cp.read_checkpoint(tmp_path / "none") is None
        (tmp_path / "empty").write_bytes(b"\0" * 8192)
        assert cp.read_checkpoint(tmp_path / "empty") is None


class TestFinalStates:
    """Every request the dead worker had, on every tap: one drop with its seq."""

    def test_unresolved_unsent_dead_and_lost(self):
        checkpoint = cp.Checkpoint(2, 5, (state(),))
        (final,) = cp.final_states(checkpoint, requests_sent=12, lost_total=7, dead_requests=4)
        tap = state()
        unsent = tap.next_seq - tap.published - tap.publish_errors - 2  # 2 dropped
        assert unsent == 1
        unresolved = 12 - tap.resolved
        assert final.dropped["worker_died"] == unsent + unresolved + 4
        assert final.dropped["handoff_full"] == 1 + (7 - 5)
        # Seqs: every loss after the checkpoint takes one.
        assert final.next_seq == tap.next_seq + unresolved + 4 + 2
        # The final state adds up: every seq below next_seq is accounted for.
        assert final.next_seq == final.published + final.publish_errors + sum(
            final.dropped.values()
        )
        assert final.published == tap.published and final.publisher_id == 42

    def test_nothing_lost(self):
        tap = state(next_seq=9, published=7, resolved=9)
        (final,) = cp.final_states(
            cp.Checkpoint(1, 0, (tap,)), requests_sent=9, lost_total=0, dead_requests=0
        )
        assert final.dropped == tap.dropped and final.next_seq == 9

    def test_counter_samples(self):
        samples = cp.counter_samples(state())
        assert ("shadow_tap_dropped_total", {"tap": "kv", "reason": "full"}, 1) in samples
        assert ("shadow_tap_skipped_total", {"tap": "kv", "reason": "sample"}, 2) in samples
        assert {name for name, _, _ in samples} == set(cp.COUNTER_SAMPLES)
