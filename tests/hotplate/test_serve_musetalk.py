"""`POST /v1/lip-sync` with backend=musetalk on an upstream-layout `models/` folder (tiny
random weights): the service chooses the recipe by the same rule as `hotplate render`, so
it finds upstream's `sd-vae/` instead of asking for `sd-vae-ft-mse/` and answering 503.

The detector is dlib's and the landmarks the default ones, set in the settings
(HOTPLATE_*): random S3FD weights find no face, and the folder has no DWPose weights. The
landmarks are the default value, set explicitly: musetalk's DWPose must not replace them
(it did, then 503 for weights nobody asked for). Everything else is what musetalk implies (BiSeNet, v1.5
crops, sd-vae/).
"""

import pytest

from pipeline.precompile.recipe import Recipe
from testkit.serve_helpers import Server, make_world, mp4_facts, post_render, speech
from tests.pipeline.parity_fixtures import save_upstream_models

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("serve-musetalk"), n_frames=6)
    speech(root / "one.wav", 1.0)
    save_upstream_models(root / "models")
    return root


def test_lip_sync_with_musetalk_on_an_upstream_models_folder(world, tmp_path):
    env = {"HOTPLATE_DETECTOR": "dlib", "HOTPLATE_LANDMARKS": Recipe().landmarks}
    env["HOTPLATE_MODELS"] = str(world / "models")
    with Server(world, "--workers", "1", env=env) as srv, srv.client() as client:
        response = post_render(client, "/v1/lip-sync", world / "one.wav", backend="musetalk")
        assert response.status_code == 200, response.text
        assert response.headers["x-hotplate-cache"] == "jit"
        facts = mp4_facts(response.content, tmp_path / "mt.mp4")
        assert facts["video"] == "h264" and facts["audio"] == "aac"
        assert abs(facts["seconds"] - 1.0) <= 0.05
