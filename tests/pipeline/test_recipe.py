"""`effective_recipe`: the one rule for the recipe a request precompiles under."""

from __future__ import annotations

import pytest

from pipeline.precompile.recipe import Recipe, effective_recipe
from tests.pipeline.test_parity_recipe import upstream_files

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


def test_flags_over_settings_then_persona_toml():
    settings = Recipe(bbox_shift=3, stride=2)
    options = {"bbox_shift": 7, "face": "0.3,0.4"}
    r = effective_recipe(settings, options, flags={"stride": 5, "proxy": None})
    assert (r.stride, r.proxy) == (5, Recipe().proxy)  # None: not given
    assert (r.bbox_shift, r.face) == (7, "0.3,0.4")  # persona.toml's shift beats the settings'


def test_a_bbox_shift_flag_overrides_only_the_shift():
    """--bbox-shift used to skip persona.toml whole, dropping its face hint."""
    options = {"bbox_shift": 7, "face": "central"}
    r = effective_recipe(Recipe(), options, flags={"bbox_shift": -2})
    assert (r.bbox_shift, r.face) == (-2, "central")


def test_backend_implies_upstreams_recipe_for_fields_left_at_default(tmp_path):
    models = upstream_files(tmp_path, "v1.5")
    r = effective_recipe(Recipe(models_dir=models), {}, "musetalk", {"detector": "dlib"})
    assert (r.detector, r.landmarks, r.mask, r.vae) == ("dlib", "dwpose", "bisenet", "sd-vae")
    assert effective_recipe(Recipe(), {}, "warp") == Recipe()


def test_bad_values_name_the_field_and_the_file():
    with pytest.raises(ValueError, match="stride=0"):
        effective_recipe(Recipe(), flags={"stride": 0})
    with pytest.raises(ValueError, match="ruby/persona.toml: bbox_shift='up'"):
        effective_recipe(Recipe(), {"bbox_shift": "up"}, source="ruby/persona.toml")
