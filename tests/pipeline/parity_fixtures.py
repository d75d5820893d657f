"""Upstream MuseTalk's code and tiny random weights in upstream's own file layout.

The parity tests run upstream's functions (from the snapshot at
`<repo>/../shared/reference/musetalk`) beside hotplate's, on the same inputs and the
same weights. Upstream modules import a few packages that cannot be installed beside
this torch (torchvision) or that the functions under test never call (librosa, only
for reading files): `import_upstream` puts small stand-ins for exactly those into
sys.modules first (see docs/notebook/install.md, "Parity with upstream MuseTalk").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def reference_dir() -> Path | None:
    """The shared reference folder: $HOTPLATE_REFERENCE, else `shared/reference` beside
    the checkout (for a git worktree: beside the main checkout)."""
    if os.environ.get("HOTPLATE_REFERENCE"):
        return Path(os.environ["HOTPLATE_REFERENCE"])
    roots = [REPO]
    try:
        common = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        roots.append(Path(common).parent)
    except (OSError, subprocess.CalledProcessError):
        pass
    for root in roots:
        if (root.parent / "shared" / "reference" / "musetalk").is_dir():
            return root.parent / "shared" / "reference"
    return None


def musetalk_reference() -> Path:
    """upstream MuseTalk's snapshot; skips when absent, except in CI, where it fails."""
    ref = reference_dir()
    if ref is None or not (ref / "musetalk" / "musetalk").is_dir():
        reason = "upstream MuseTalk snapshot (../shared/reference/musetalk) is absent"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must have it")
        pytest.skip(reason)
    return ref / "musetalk"


def _torchvision_stand_in() -> None:
    """torchvision.transforms.ToTensor/Normalize, with torchvision's float32 arithmetic
    (the only parts upstream's face parsing and VAE modules use)."""
    import numpy as np
    import torch

    class ToTensor:
        def __call__(self, pic):
            img = torch.from_numpy(np.array(pic, np.uint8, copy=True)).permute(2, 0, 1)
            return img.contiguous().to(torch.get_default_dtype()).div(255)

    class Normalize:
        def __init__(self, mean, std):
            self.mean, self.std = mean, std

        def __call__(self, t):
            mean = torch.as_tensor(self.mean, dtype=t.dtype)[:, None, None]
            std = torch.as_tensor(self.std, dtype=t.dtype)[:, None, None]
            return t.sub(mean).div(std)

    class Compose:
        def __init__(self, steps):
            self.steps = steps

        def __call__(self, x):
            for step in self.steps:
                x = step(x)
            return x

    transforms = types.ModuleType("torchvision.transforms")
    transforms.ToTensor, transforms.Normalize, transforms.Compose = ToTensor, Normalize, Compose
    tv = types.ModuleType("torchvision")
    tv.transforms = transforms
    sys.modules.setdefault("torchvision", tv)
    sys.modules.setdefault("torchvision.transforms", transforms)


def import_upstream(module: str):
    """Import `module` (e.g. "musetalk.utils.blending") from the upstream snapshot."""
    import importlib

    root = musetalk_reference()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        import torchvision  # noqa: F401
    except ImportError:
        _torchvision_stand_in()
    if "librosa" not in sys.modules:
        try:
            import librosa  # noqa: F401
        except ImportError:  # only get_audio_feature (file reading) calls it
            sys.modules["librosa"] = types.ModuleType("librosa")
    return importlib.import_module(module)


def save_upstream_models(root: Path, version: str = "v1.5", seed: int = 0) -> Path:
    """Tiny random MuseTalk weights laid out as upstream's download_weights.sh does:
    musetalkV15/{musetalk.json,unet.pth} (or musetalk/{musetalk.json,pytorch_model.bin}
    for v1.0), sd-vae/ (config.json, diffusion_pytorch_model.bin), whisper/ (config.json,
    pytorch_model.bin, preprocessor_config.json; 4 encoder layers, so 5 hidden states as
    whisper-tiny) and face-parse-bisent/{79999_iter.pth,resnet18-5c106cde.pth}."""
    import torch
    from diffusers import UNet2DConditionModel

    from testkit.render_fixtures import TINY_UNET, tiny_sd_vae, tiny_whisper

    root = Path(root)
    torch.manual_seed(seed)
    folder, weights = (
        ("musetalkV15", "unet.pth") if version == "v1.5" else ("musetalk", "pytorch_model.bin")
    )
    (root / folder).mkdir(parents=True, exist_ok=True)
    (root / folder / "musetalk.json").write_text(json.dumps(TINY_UNET, indent=2))
    unet = UNet2DConditionModel(**TINY_UNET)
    with torch.no_grad():  # diffusers zero-initialises conv_out: make the output depend on input
        unet.conv_out.weight.normal_(0, 0.05)
    torch.save(unet.state_dict(), root / folder / weights)
    tiny_sd_vae().save_pretrained(root / "sd-vae", safe_serialization=False)
    whisper, extractor = tiny_whisper(encoder_layers=4)
    whisper.config.save_pretrained(root / "whisper")
    torch.save(whisper.state_dict(), root / "whisper" / "pytorch_model.bin")  # upstream's name
    extractor.save_pretrained(root / "whisper")
    save_bisenet(root / "face-parse-bisent", seed)
    return root


def save_bisenet(folder: Path, seed: int = 0) -> Path:
    """A random BiSeNet under upstream's key names (79999_iter.pth) and the ResNet18
    backbone file upstream's constructor reads first (resnet18-5c106cde.pth). The last
    layer favours skin (1), nose (10) and the lips (12), so every mode has work to do."""
    import torch

    from pipeline.nets.bisenet import build_bisenet

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    net = build_bisenet()
    with torch.no_grad():
        w = net.conv_out.conv_out.weight
        w.normal_(0, 1)
        w[1] += 0.5
        w[10] += 0.3
        w[12] += 0.3
    state = net.state_dict()
    torch.save(state, folder / "79999_iter.pth")
    backbone = {
        k.removeprefix("cp.resnet."): v for k, v in state.items() if k.startswith("cp.resnet.")
    }
    backbone["fc.weight"], backbone["fc.bias"] = torch.zeros(1000, 512), torch.zeros(1000)
    torch.save(backbone, folder / "resnet18-5c106cde.pth")
    return folder / "79999_iter.pth"
