"""What `--backend musetalk` implies, per UNet version found in the models dir."""

from __future__ import annotations

import json

import pytest

from pipeline.precompile.plan import plan
from pipeline.precompile.recipe import Recipe, describe, for_backend

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


def upstream_files(root, version):
    folder, weights = (
        ("musetalkV15", "unet.pth") if version == "v1.5" else ("musetalk", "pytorch_model.bin")
    )
    (root / folder).mkdir(parents=True)
    (root / folder / "musetalk.json").write_text(json.dumps({"in_channels": 8}))
    (root / folder / weights).write_bytes(b"x")
    (root / "sd-vae").mkdir()
    (root / "sd-vae" / "config.json").write_text("{}")
    (root / "sd-vae" / "diffusion_pytorch_model.bin").write_bytes(b"x")
    return root


def test_v15_folder_implies_upstreams_v15_recipe(tmp_path):
    models = upstream_files(tmp_path, "v1.5")
    r = for_backend(Recipe(models_dir=models, bbox_shift=0), "musetalk")
    assert (r.detector, r.landmarks, r.mask, r.parsing_mode) == ("s3fd", "dwpose", "bisenet", "jaw")
    assert (r.crop_rules, r.vae, r.bbox_shift) == ("v1.5", "sd-vae", 0)
    # a persona's shift cannot split v1.5's key: upstream forces 0
    assert r.for_persona({"bbox_shift": 9}).bbox_shift == 0
    assert "mask bisenet (jaw), crops v1.5 (bbox_shift 0), vae sd-vae" in describe(r)


def test_v10_folder_parses_raw_and_keeps_the_shift(tmp_path):
    models = upstream_files(tmp_path, "v1.0")
    r = for_backend(Recipe(models_dir=models, bbox_shift=6), "musetalk")
    assert (r.parsing_mode, r.crop_rules, r.bbox_shift) == ("raw", "v1.0", 6)
    assert r.for_persona({"bbox_shift": -3}).bbox_shift == -3


def test_flags_and_settings_override_each_part(tmp_path):
    models = upstream_files(tmp_path, "v1.5")
    configured = Recipe(models_dir=models, landmarks="fan", vae="sd-vae-ft-mse")
    r = for_backend(configured, "musetalk", explicit=frozenset({"detector", "mask"}))
    defaults = Recipe()
    assert (r.detector, r.mask) == (defaults.detector, defaults.mask)  # flags given, as defaults
    assert (r.landmarks, r.vae) == ("fan", "sd-vae-ft-mse")  # off their defaults: kept
    assert (r.parsing_mode, r.crop_rules) == ("jaw", "v1.5")
    assert for_backend(configured, "warp") is configured


def test_new_fields_leave_existing_keys_alone():
    before = plan("d" * 32, Recipe())
    assert plan("d" * 32, Recipe(parsing_mode="raw")) == before  # landmark masks: unread
    assert plan("d" * 32, Recipe(crop_rules="v1.0")).stages["crops"] != before.stages["crops"]
