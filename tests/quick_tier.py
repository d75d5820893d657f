"""The quick tier (`just test-quick`, `pytest -m quick`) and what it goes without.

A quick test runs on a fresh clone with only the core install and the `dev` extra:
no torch (the `musetalk` extra), no aiortc (`webrtc`), no Pipecat, no Ray cluster, no
browser and no Debian package. `pytest -m quick` runs as such a machine would
(tests/conftest.py calls `go_without`): the modules below are not there (`import torch`
fails, `importlib.util.find_spec` finds nothing), `shutil.which` finds none of the tools,
and a quick test that finds one of those missing fails rather than skips (one that needs
root, say, still skips where it is not). tests/test_layers.py checks from the source that
no quick module imports one of them.
"""

from __future__ import annotations

import os
import shutil
import sys

# top-level module -> what brings it, which the quick tier goes without
WITHOUT = {
    "torch": "the musetalk extra",
    "torchvision": "the musetalk extra",
    "diffusers": "the musetalk extra",
    "transformers": "the musetalk extra",
    "face_alignment": "the musetalk extra",
    "openvino": "the musetalk extra",
    "aiortc": "the webrtc extra",
    "aioice": "the webrtc extra",
    "pipecat": "the pipecat extra",
    "ray": "a Ray cluster (dev installs ray for the whole suite)",
    "playwright": "a browser (dev installs playwright for the whole suite)",
}

# a command -> the Debian package `just setup` installs it from
TOOLS = {
    "chromium": "chromium",
    "chromium-browser": "chromium",
    "nginx": "nginx",
    "openssl": "openssl",
    "espeak-ng": "espeak-ng",
    "rsync": "rsync",
    "turnserver": "coturn",
    "ip": "iproute2",
    "nft": "nftables",
}

# the test faces a Debian package ships (testkit/faces.py reads this variable)
NO_DEBIAN_FILES = "HOTPLATE_NO_DEBIAN_FILES"

hidden: set[str] = set()  # the tools looked for and not found since the last clear()


def go_without() -> None:
    """Make this process look like a machine with only the core and `dev` installed (the
    processes it starts are not changed)."""
    for name in WITHOUT:
        sys.modules[name] = None  # `import` raises ImportError; find_spec returns None
    which = shutil.which

    def which_but_debian(cmd, mode=os.F_OK | os.X_OK, path=None):
        tool = os.path.basename(str(cmd))
        if tool in TOOLS:
            hidden.add(f"{tool} (Debian's {TOOLS[tool]})")
            return None
        return which(cmd, mode, path)

    shutil.which = which_but_debian
    os.environ[NO_DEBIAN_FILES] = "1"


def gone(reason: str) -> str:
    """What the quick tier went without that a precondition (`reason`) missed: the tools
    it hid since the last clear, or a Debian package the reason names; "" if neither."""
    if hidden:
        return ", ".join(sorted(hidden))
    return "a Debian package" if "apt-get" in reason else ""
