"""The envelope: Dynamo's field names, schema version 1, optional fields left out."""

from __future__ import annotations

import msgpack
import pytest

from shadow_proxy.records import envelope as records
from shadow_proxy.records import wire


def envelope(**overrides):
    fields = {
        "tap": "replay",
        "seq": 0,
        "request_id": "req-1",
        "origin": "chat",
        "filters": ["strip-worker-pins"],
        "arrival_unix_ns": 1_700_000_000_000_000_000,
        "sample_rate": 0.5,
        "request": {"model": "m", "token_ids": [1, 2]},
        "response": None,
    }
    fields.update(overrides)
    return records.build_envelope(**fields)


class TestBuildEnvelope:
    """build_envelope gives the SPEC fields in Dynamo's order."""

    def test_request_only(self):
        built = envelope()
        assert list(built) == [
            "schema_version",
            "tap",
            "seq",
            "request_id",
            "origin",
            "filters",
            "arrival_unix_ns",
            "sample_rate",
            "request",
        ]
        assert built["schema_version"] == 1
        assert "response" not in built
        assert records.missing_fields(built) == []

    def test_joined(self):
        response = {"outcome": "complete", "output_tokens": 3, "end_offset_ns": 5}
        built = envelope(response=response)
        assert built["response"] is response

    def test_empty_filters_are_still_sent(self):
        """Dynamo's reader requires 'filters'; an empty list is not nil."""
        assert envelope(filters=[])["filters"] == []

    def test_encodes_as_maps_with_string_keys(self):
        data = wire.encode_envelope(envelope())
        decoded = msgpack.unpackb(data, raw=False, strict_map_key=True)
        assert isinstance(decoded, dict)
        assert isinstance(decoded["request"], dict)
        assert None not in decoded.values()

    @pytest.mark.parametrize(
        ("field", "value"), [("origin", "embeddings"), ("sample_rate", 1.5), ("sample_rate", -0.1)]
    )
    def test_invalid(self, field, value):
        with pytest.raises(ValueError, match=field):
            envelope(**{field: value})

    def test_missing_fields(self):
        built = envelope()
        del built["seq"], built["request"]
        assert records.missing_fields(built) == ["seq", "request"]
