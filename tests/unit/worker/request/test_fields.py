"""Typed reading of a request's JSON fields; reasons from a fixed vocabulary."""

from __future__ import annotations

import pytest

from shadow_proxy.worker.request.fields import NotMirrored


class TestNotMirroredReasons:
    """A reason outside the vocabulary cannot be built."""

    def test_reason_outside_the_vocabulary_is_refused(self):
        with pytest.raises(ValueError, match="reason"):
            NotMirrored("client said hello")
