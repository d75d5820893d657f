"""The settings remember what was set, even to a default value, and the recipe rule keeps
it: the default landmarks set by HOTPLATE_LANDMARKS (or hotplate.toml) with backend
musetalk stay (they were replaced by DWPose because they equal the default, then DWPose's
weights were missing)."""

import pytest

from hotplate.cluster.serve import settings_env
from hotplate.settings import load_settings
from pipeline.precompile.recipe import Recipe, effective_recipe
from tests.pipeline.parity_fixtures import save_upstream_models

DEFAULT = Recipe().landmarks  # set explicitly below: a choice, though equal to the default


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_upstream_models(tmp_path_factory.mktemp("models"))


@pytest.fixture
def clean(monkeypatch, tmp_path):
    import os

    for name in list(os.environ):
        if name.startswith("HOTPLATE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no hotplate.toml of the developer's
    return monkeypatch


@pytest.mark.parametrize("where", ["env", "file"])
def test_a_setting_equal_to_its_default_is_kept_against_the_backend(clean, tmp_path, models, where):
    config = None
    if where == "env":
        clean.setenv("HOTPLATE_LANDMARKS", DEFAULT)
    else:
        config = tmp_path / "hotplate.toml"
        config.write_text(f'[recipe]\nlandmarks = "{DEFAULT}"\n')
    settings = load_settings(config, models=models, cache=tmp_path / "cache")
    assert "landmarks" in settings.recipe.explicit and "models" in settings.explicit
    recipe = effective_recipe(settings.recipe, backend="musetalk")
    assert recipe.landmarks == DEFAULT  # kept: the user's choice
    assert recipe.detector == "s3fd" and recipe.mask == "bisenet"  # not set: implied
    assert recipe.vae == "sd-vae"


def test_ray_replicas_get_what_was_set_and_nothing_else(clean, tmp_path):
    """The replicas load their settings from HOTPLATE_* variables: a recipe field the
    driver left unset must stay unset there, or musetalk's implied recipe would no longer
    apply to it; one the driver set must stay set."""
    clean.setenv("HOTPLATE_LANDMARKS", DEFAULT)
    env = settings_env(load_settings(None, cache=tmp_path / "cache"))
    assert env["HOTPLATE_LANDMARKS"] == DEFAULT
    assert "HOTPLATE_DETECTOR" not in env and "HOTPLATE_MASK" not in env
    for name, value in env.items():
        clean.setenv(name, value)
    replica = load_settings(None)
    assert replica.recipe == load_settings(None).recipe
    assert replica.recipe.explicit == {"landmarks"}
