import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.render.schedule import frame_index, schedule

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

CASES = [
    (1, "pingpong", [0] * 10),
    (1, "cycle", [0] * 10),
    (2, "pingpong", [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]),
    (2, "cycle", [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]),
    (4, "pingpong", [0, 1, 2, 3, 2, 1, 0, 1, 2, 3]),
    (4, "cycle", [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]),
    (3, "pingpong", [0, 1, 2, 1, 0, 1, 2, 1, 0, 1]),
]


@pytest.mark.parametrize(("n", "mode", "expected"), CASES)
def test_hand_checked(n, mode, expected):
    assert schedule(10, n, mode).tolist() == expected
    assert [frame_index(t, n, mode) for t in range(10)] == expected


def test_default_is_pingpong_and_empty_schedule():
    assert frame_index(5, 4) == 1
    assert schedule(0, 4).shape == (0,)


@given(st.integers(0, 500), st.integers(1, 40), st.sampled_from(["pingpong", "cycle"]))
def test_schedule_matches_frame_index(t, n, mode):
    s = schedule(t + 1, n, mode)
    assert s[t] == frame_index(t, n, mode)
    assert 0 <= s.min() and s.max() < n
    # Neighbouring output frames never jump by more than one stored frame in ping-pong.
    if mode == "pingpong":
        assert np.abs(np.diff(s)).max(initial=0) <= 1


@pytest.mark.parametrize(("n", "mode"), [(0, "pingpong"), (3, "bounce")])
def test_bad_arguments(n, mode):
    with pytest.raises(ValueError, match="n=0|bounce"):
        schedule(5, n, mode)
    with pytest.raises(ValueError, match="n=0|bounce"):
        frame_index(5, n, mode)
