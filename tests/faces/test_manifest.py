"""The test faces load from their packages, and a variant's carried points are where the
referee finds the face in it (so judging a variant against them is fair)."""

from __future__ import annotations

import numpy as np
import pytest

from testkit import faces
from testkit.referee import lip_error, point_errors, referee_points


def test_every_source_is_listed_with_its_licence_and_loads():
    names = [s.name for s in faces.sources()]
    assert len(names) == len(set(names)) >= 8
    for src in faces.sources():
        assert src.licence and src.origin and src.package, src.name
        for label, image in faces.source_images(src.name):
            assert image.ndim == 3 and image.shape[2] == 3 and image.dtype == np.uint8, label


@pytest.mark.quick  # the quick tier (tests/quick_tier.py); the test above reads a Debian file
@pytest.mark.parametrize("variant", ["upright", "roll+15", "small", "large", "warm"])
def test_carried_points_agree_with_the_referee_on_the_variant(variant):
    """dlib run afresh on the variant lands where the transform carried its points: the
    map (roll, scale, canvas) is right, so a landmarker judged against it is judged fairly."""
    checked = 0
    for s in faces.samples(("astronaut", "grace_hopper", "takeo"), (variant,)):
        h, w = s.image.shape[:2]
        centre = s.truth.mean(0) / [w, h]
        found = referee_points(s.image, tuple(centre))
        assert found is not None, s.name
        assert np.median(point_errors(found, s.truth)) < 0.05, s.name
        assert lip_error(found, s.truth) < 0.05, s.name
        checked += 1
    assert checked == 3


@pytest.mark.quick
def test_variants_have_the_face_size_and_roll_they_name():
    for s in faces.samples(("astronaut",)):
        height = s.truth[:, 1].max() - s.truth[:, 1].min()
        roll = dict((v[0], v[1]) for v in faces.VARIANTS)[s.variant]
        eyes = s.truth[45] - s.truth[36]
        if roll == 0:
            assert height == pytest.approx(s.face_height, rel=0.01), s.name
        angle = np.degrees(np.arctan2(-eyes[1], eyes[0]))  # image y points down
        upright = faces._truth("astronaut")[0][2]
        e0 = upright[45] - upright[36]
        assert angle - np.degrees(np.arctan2(-e0[1], e0[0])) == pytest.approx(roll, abs=0.5)
