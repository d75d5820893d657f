"""The store commands of the CLI as a user runs them: whole processes, real stores.

Every run gets a clean environment (no HOTPLATE_* variables, HOME in the test's
folder) and a working directory of its own, so a developer's settings never leak in.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cachestore.keys import hash_file
from cachestore.store import forget_store, open_store
from hotplate.cli import cli
from hotplate.settings import load_settings
from pipeline.catalog import plan_for

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

HOTPLATE = [sys.executable, "-c", "from hotplate.cli import main; main()"]
HEAVY = ("torch", "cv2", "dlib", "diffusers", "face_alignment", "transformers")


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, str]:
    """A clean environment for child processes, and the same for this one."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HOTPLATE_", "XDG_"))}
    clean["HOME"] = str(tmp_path / "home")
    for key in os.environ:
        if key.startswith(("HOTPLATE_", "XDG_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", clean["HOME"])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return clean


def hp(env: dict[str, str], *args: str, cwd: Path | None = None, **extra: str):
    """Run `hotplate ARGS` in a fresh process."""
    return subprocess.run(
        [*HOTPLATE, *args],
        capture_output=True,
        text=True,
        env={**env, **extra},
        cwd=cwd or Path.cwd(),
        timeout=120,
    )


def put(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def personas(tmp_path) -> Path:
    root = tmp_path / "personas"
    put(root / "ruby" / "portrait.png", b"ruby portrait bytes")
    put(root / "ruby" / "navy" / "M1.mp4", b"ruby navy M1 bytes")
    put(root / "omar" / "portrait.jpg", b"omar portrait bytes")
    return root


def make_hot(cache: Path, personas: Path, source: Path, seed: int = 0):
    """Write the avatar manifest a precompile of `source` would write, under its planned key."""
    settings = load_settings(None, personas=personas, cache=cache)
    store = open_store(cache)
    try:
        plan = plan_for(store, source, settings.recipe)
        for i, (name, key) in enumerate(plan.stages.items()):
            arrays = {"x": np.random.default_rng(seed * 100 + i).random(64, dtype=np.float32)}
            store.put_stage(key, name, arrays, {"frames": 1})
        store.put_avatar(
            plan.avatar, {"stages": plan.stages, "source": plan.source_digest, "frames": 1}
        )
        return plan
    finally:
        forget_store(cache)


def one_error_line(result) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def contents(cache: Path) -> dict[str, int]:
    """Every avatar, stage and blob entry as "db:key" -> bytes, as gc measures them."""
    store = open_store(cache)
    try:
        out = {}
        with store.read() as r:
            for db in ("avatar", "stage", "blob"):
                with r.txn.cursor(db=store.dbs[db]) as cur:
                    out.update({f"{db}:{bytes(k).decode()}": len(k) + len(v) for k, v in cur})
        return out
    finally:
        forget_store(cache)


# -- help and start-up ----------------------------------------------------------------


def test_help_for_the_group_and_every_subcommand(env):
    runner = CliRunner()
    top = runner.invoke(cli, ["--help"])
    assert top.exit_code == 0
    assert set(cli.commands) >= {"resolve", "ls", "status", "gc", "verify", "doctor"}
    for name in cli.commands:
        assert name in top.output
        sub = runner.invoke(cli, [name, "--help"])
        assert sub.exit_code == 0, (name, sub.output)
        assert "Usage:" in sub.output
    whole = hp(env, "--help")
    assert whole.returncode == 0 and "Usage: hotplate" in whole.stdout and not whole.stderr


def test_importing_the_cli_imports_no_heavy_module(env):
    code = f"import sys, hotplate.cli; print(sorted(m for m in {HEAVY!r} if sys.modules.get(m)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_store_commands_run_without_heavy_modules(env, personas, tmp_path):
    cache = tmp_path / "cache"
    make_hot(cache, personas, personas / "ruby" / "portrait.png")
    script = (
        "import sys\n"
        "from hotplate.cli import cli\n"
        "base = ['--personas', sys.argv[1], '--cache', sys.argv[2]]\n"
        "for args in (['resolve', '--persona', 'ruby'], ['ls'], ['status'], ['verify'],\n"
        "             ['gc', '--dry-run']):\n"
        "    try:\n"
        "        cli.main(base + args, prog_name='hotplate', standalone_mode=False)\n"
        "    except SystemExit as exc:\n"
        "        assert not exc.code, (args, exc.code)\n"
        f"print('HEAVY', sorted(m for m in {HEAVY!r} if sys.modules.get(m)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(personas), str(cache)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"


# -- errors: one line, no traceback (unless --debug) ----------------------------------


def test_unknown_persona_is_one_line(env, personas, tmp_path):
    base = ["--personas", str(personas), "--cache", str(tmp_path / "c")]
    result = hp(env, *base, "resolve", "--persona", "zoe")
    line = one_error_line(result)
    assert "unknown persona 'zoe'" in line and "known: omar, ruby" in line


@pytest.mark.parametrize(
    "args", [["gc"], ["verify"], ["status"], ["ls"], ["resolve", "--persona", "ruby"]]
)
def test_cache_path_that_is_a_file_is_one_line(env, personas, tmp_path, args):
    cache = put(tmp_path / "cache", b"not a store")
    line = one_error_line(hp(env, "--personas", str(personas), "--cache", str(cache), *args))
    assert str(cache) in line and "is a file" in line
    assert cache.read_bytes() == b"not a store"


def garbage_store(cache: Path) -> None:
    put(cache / "data.mdb", np.random.default_rng(7).bytes(64 * 1024))


def damaged_pages_store(cache: Path, personas: Path) -> None:
    """A real store whose pages after the two meta pages are overwritten."""
    make_hot(cache, personas, personas / "ruby" / "portrait.png")
    data = cache / "data.mdb"
    size = data.stat().st_size
    with open(data, "r+b") as handle:
        handle.seek(2 * 4096)
        handle.write(np.random.default_rng(8).bytes(size - 2 * 4096))


@pytest.mark.parametrize("damage", ["garbage", "pages"])
@pytest.mark.parametrize(
    "args", [["verify"], ["status"], ["gc"], ["ls"], ["resolve", "--persona", "ruby"]]
)
def test_damaged_data_mdb_is_one_line_and_kept(env, personas, tmp_path, damage, args):
    cache = tmp_path / "cache"
    garbage_store(cache) if damage == "garbage" else damaged_pages_store(cache, personas)
    before = (cache / "data.mdb").read_bytes()
    line = one_error_line(hp(env, "--personas", str(personas), "--cache", str(cache), *args))
    assert str(cache / "data.mdb") in line and "move it aside" in line
    assert (cache / "data.mdb").read_bytes() == before  # never deleted or rewritten for you


def test_debug_shows_the_traceback(env, personas, tmp_path):
    cache = tmp_path / "cache"
    garbage_store(cache)
    result = hp(env, "--debug", "--cache", str(cache), "verify")
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in result.stderr
    assert "StoreDamagedError" in result.stderr
    result = hp(env, "--debug", "--personas", str(personas), "resolve", "--persona", "zoe")
    assert "Traceback" in result.stderr and "PersonaError" in result.stderr


# -- verify ------------------------------------------------------------------------------


def test_verify_exit_codes(env, personas, tmp_path):
    cache = tmp_path / "cache"
    plan = make_hot(cache, personas, personas / "ruby" / "portrait.png")
    store = open_store(cache)
    marker = np.full(20_000, 0xAB, np.uint8)  # a payload we can find in the file
    store.put_stage("marked", "crops", {"m": marker}, {})
    store.put_stage("doomed", "crops", {"d": np.arange(10)}, {})
    forget_store(cache)
    good = hp(env, "--cache", str(cache), "verify")
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.strip().endswith("0 problems")

    data = bytearray((cache / "data.mdb").read_bytes())
    hits = [m.start() for m in re.finditer(re.escape(marker.tobytes()), bytes(data))]
    assert hits
    for at in hits:
        data[at + 1234] ^= 0xFF
    (cache / "data.mdb").write_bytes(bytes(data))
    store = open_store(cache)
    store.delete("blob", store.get_stage("doomed").blobs["d"])
    store.delete("stage", plan.stages["track"])
    forget_store(cache)

    bad = hp(env, "--cache", str(cache), "verify")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    kinds = {line.split("\t")[0] for line in bad.stdout.splitlines() if "\t" in line}
    assert kinds == {"bad-blob", "missing-blob", "missing-stage"}
    assert bad.stdout.strip().endswith("3 problems")


# -- gc ------------------------------------------------------------------------------------

SUMMARY = re.compile(r"^(?:would delete|deleted) (\d+) of (\d+) entries, reclaimed (.+) of (.+)$")


def fill_unrooted(cache: Path, n: int, kib: int) -> None:
    store = open_store(cache)
    try:
        for i in range(n):
            rng = np.random.default_rng(1000 + i)
            stages = {}
            for name in ("track", "masks"):
                key = f"old-{i}-{name}"
                store.put_stage(key, name, {"a": rng.integers(0, 256, kib << 10, np.uint8)}, {})
                stages[name] = key
            store.put_avatar(f"old-avatar-{i}", {"stages": stages})
        store.put_stage("orphan", "track", {"a": np.arange(100)}, {})
    finally:
        forget_store(cache)


def test_gc_dry_run_output_agrees_with_gc(env, personas, tmp_path):
    cache = tmp_path / "cache"
    base = ["--personas", str(personas), "--cache", str(cache)]
    make_hot(cache, personas, personas / "ruby" / "portrait.png")
    fill_unrooted(cache, 3, 4)
    before = contents(cache)

    dry = hp(env, *base, "gc", "--grace", "0", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    *listed, summary = dry.stdout.strip().splitlines()
    listed = dict(line.split("\t") for line in listed)
    assert contents(cache) == before

    real = hp(env, *base, "gc", "--grace", "0")
    assert real.returncode == 0, real.stderr
    assert SUMMARY.match(summary).groups() == SUMMARY.match(real.stdout.strip()).groups()
    after = contents(cache)
    removed = set(before) - set(after)
    assert removed == set(listed) and len(removed) == 3 + 6 + 6 + 1 + 1
    assert all(int(listed[e]) == before[e] for e in removed)
    assert int(SUMMARY.match(summary).group(1)) == len(removed)

    resolved = hp(env, *base, "resolve", "--persona", "ruby")
    assert "state    hot" in resolved.stdout  # the rooted avatar survived
    again = hp(env, *base, "gc", "--grace", "0")
    assert again.stdout.startswith("deleted 0 of ") and contents(cache) == after


def test_gc_compact_shrinks_and_store_still_reads(env, personas, tmp_path):
    cache = tmp_path / "cache"
    base = ["--personas", str(personas), "--cache", str(cache)]
    make_hot(cache, personas, personas / "ruby" / "portrait.png")
    fill_unrooted(cache, 10, 256)
    size = (cache / "data.mdb").stat().st_size
    result = hp(env, *base, "gc", "--grace", "0", "--compact")
    assert result.returncode == 0, result.stderr
    assert "compacted" in result.stdout
    assert (cache / "data.mdb").stat().st_size < size / 4
    assert hp(env, *base, "verify").returncode == 0
    assert "state    hot" in hp(env, *base, "resolve", "--persona", "ruby").stdout


def test_gc_compact_refused_while_another_process_has_the_store(env, personas, tmp_path):
    cache = tmp_path / "cache"
    make_hot(cache, personas, personas / "ruby" / "portrait.png")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from cachestore.store import open_store; "
            "open_store(sys.argv[1]); print('ready', flush=True); sys.stdin.read()",
            str(cache),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        result = hp(env, "--personas", str(personas), "--cache", str(cache), "gc", "--compact")
        assert "another process" in one_error_line(result)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert (
        hp(env, "--personas", str(personas), "--cache", str(cache), "gc", "--compact").returncode
        == 0
    )


# -- resolve, ls, status -------------------------------------------------------------------


def resolve_fields(stdout: str) -> dict[str, str]:
    return {line[:8].strip(): line[9:] for line in stdout.splitlines()}


def test_resolve_prints_source_digest_avatar_state(env, personas, tmp_path):
    cache = tmp_path / "cache"
    base = ["--personas", str(personas), "--cache", str(cache)]
    source = personas / "ruby" / "navy" / "M1.mp4"
    expected = plan_for(None, source, load_settings(None, personas=personas).recipe)

    cold = hp(env, *base, "resolve", "--persona", "ruby", "--attire", "navy")
    assert cold.returncode == 0, cold.stderr
    fields = resolve_fields(cold.stdout)
    assert fields["source"] == f"{source.resolve()}  (loop)"
    assert fields["digest"] == hash_file(source)[0] == expected.source_digest
    assert fields["avatar"] == expected.avatar
    assert fields["state"] == "cold" and "why" not in fields  # no store yet

    make_hot(cache, personas, personas / "ruby" / "portrait.png")  # a store, but not this avatar
    cold = resolve_fields(hp(env, *base, "resolve", "--persona", "ruby", "--attire", "navy").stdout)
    assert cold["state"] == "cold" and "stage decode" in cold["why"]

    plan = make_hot(cache, personas, source)
    hot = resolve_fields(
        hp(env, *base, "resolve", "--persona", "ruby", "--attire", "navy", "--motion", "M1").stdout
    )
    assert hot["avatar"] == plan.avatar == expected.avatar and hot["state"] == "hot"

    clip = put(tmp_path / "take.mov", b"explicit video")
    video = resolve_fields(
        hp(env, *base, "resolve", "--persona", "ruby", "--video", str(clip)).stdout
    )
    assert video["source"] == f"{clip.resolve()}  (video)" and video["state"] == "cold"


def test_ls_and_status_show_the_store(env, personas, tmp_path):
    cache = tmp_path / "cache"
    base = ["--personas", str(personas), "--cache", str(cache)]
    make_hot(cache, personas, personas / "ruby" / "portrait.png")
    ls = hp(env, *base, "ls")
    assert ls.returncode == 0, ls.stderr
    rows = {tuple(line.split()[:5]) for line in ls.stdout.splitlines()[2:]}
    assert rows == {
        ("omar", "default", "default", "still", "cold"),
        ("ruby", "default", "default", "still", "hot"),
        ("ruby", "navy", "M1", "loop", "cold"),
    }
    status = hp(env, *base, "status")
    assert status.returncode == 0, status.stderr
    assert re.search(r"^avatar\s+1\s", status.stdout, re.M)
    empty = hp(env, "--cache", str(tmp_path / "nothing"), "status")
    assert empty.returncode == 0 and "empty" in empty.stdout


def test_doctor_runs_without_a_traceback(env, tmp_path):
    result = hp(env, "--cache", str(tmp_path / "cache"), "doctor")
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr
    assert "cache dir" in result.stdout and "detector retinaface (default)" in result.stdout
    # every model's licence is stated; dlib's 68-point model is not for studios' ads
    assert "landmarks facemesh (default)" in result.stdout and "licence: MIT" in result.stdout
    lines = result.stdout.splitlines()
    dlib_line = next(x for x in lines if "landmarks dlib" in x)
    assert "not for commercial use" in dlib_line
    mesh_line = next(x for x in lines if "landmarks facemesh" in x)
    assert "licence: Apache-2.0" in mesh_line and "ready" in mesh_line
    assert "licence:" in next(x for x in lines if "landmarks retinaface" in x)
    # every backend's row names the licence of its model
    rows = [x for x in lines if x[6:].startswith(("detector ", "landmarks ", "mask ", "vae "))]
    assert len(rows) >= 10 and all("licence:" in x for x in rows), rows


# -- settings precedence: hotplate.toml < HOTPLATE_* < flags ----------------------------------


def test_settings_precedence(env, tmp_path):
    roots = {}
    for layer in ("toml", "env", "flag"):
        roots[layer] = tmp_path / f"personas-{layer}"
        put(roots[layer] / "ruby" / "portrait.png", f"portrait from {layer}".encode())
    work = Path.cwd()
    (work / "hotplate.toml").write_text(
        f'personas = "{roots["toml"]}"\ncache = "{tmp_path / "cache-toml"}"\n'
        "[recipe]\nbbox_shift = 3\n"
    )

    def resolved(*flags: str, **extra: str) -> dict[str, str]:
        result = hp(env, *flags, "resolve", "--persona", "ruby", **extra)
        assert result.returncode == 0, result.stderr
        return resolve_fields(result.stdout)

    def store_of(*flags: str, **extra: str) -> str:
        return hp(env, *flags, "status", **extra).stdout.splitlines()[0].split(None, 1)[1]

    by_toml = resolved()
    assert by_toml["source"].startswith(str(roots["toml"].resolve()))
    assert store_of() == str(tmp_path / "cache-toml")
    by_env = resolved(HOTPLATE_PERSONAS=str(roots["env"]))
    assert by_env["source"].startswith(str(roots["env"].resolve()))
    assert store_of(HOTPLATE_CACHE=str(tmp_path / "cache-env")) == str(tmp_path / "cache-env")
    by_flag = resolved("--personas", str(roots["flag"]), HOTPLATE_PERSONAS=str(roots["env"]))
    assert by_flag["source"].startswith(str(roots["flag"].resolve()))
    flag_cache = str(tmp_path / "cache-flag")
    assert store_of("--cache", flag_cache, HOTPLATE_CACHE=str(tmp_path / "cache-env")) == flag_cache

    # Recipe fields: the file's [recipe] table, then HOTPLATE_<FIELD>.
    source = roots["toml"] / "ruby" / "portrait.png"
    recipe = load_settings(None).recipe
    assert recipe.bbox_shift == 3
    assert by_toml["avatar"] == plan_for(None, source, recipe).avatar
    shifted = resolved(HOTPLATE_BBOX_SHIFT="5")
    assert shifted["avatar"] == plan_for(None, source, recipe.replace(bbox_shift=5)).avatar
    assert shifted["avatar"] != by_toml["avatar"]

    # An explicit --config replaces ./hotplate.toml.
    other = put(tmp_path / "other.toml", f'personas = "{roots["env"]}"\n'.encode())
    assert resolved("--config", str(other))["source"].startswith(str(roots["env"].resolve()))
