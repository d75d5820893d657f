"""`hotplate render` through the real CLI: hot path reads only the store, JIT, bad input."""

import json
import shlex
import subprocess
import sys
import textwrap

import av
import pytest

from hotplate.cli.common import invocation
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav

SIZE = (540, 960)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("render")
    personas = root / "personas"
    (personas / "astro").mkdir(parents=True)
    write_loop_video(personas / "astro" / "studio.mp4", n_frames=10, size=SIZE)
    write_wav(root / "speech.wav", make_speech_audio(2.0), 16000)
    return root


def hotplate(world, *args, check=False):
    cmd = invocation(world / "personas", world / "cache", *args)
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=world)
    if check and result.returncode:
        raise AssertionError(result.stderr)
    return result


def render_args(world, out, *extra):
    return [
        "render",
        "--persona",
        "astro",
        "--attire",
        "studio",
        "--audio",
        str(world / "speech.wav"),
        "-o",
        str(out),
        *extra,
    ]


def test_no_jit_on_cold_prints_a_fix_that_works_when_pasted(world, tmp_path):
    """The printed `hotplate precompile` carries the folders and the recipe flags: run as
    printed, from another directory, it makes the very avatar the render wanted hot."""
    flags = ("--no-jit", "--stride", "2", "--bbox-shift", "3", "--max-frames", "6")
    result = hotplate(world, *render_args(world, world / "cold.mp4", *flags))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert not (world / "cold.mp4").exists()
    command = result.stderr.split("`")[1]
    words = shlex.split(command)
    assert words[0] == "hotplate" and "precompile" in words
    for flag in ("--personas", "--cache", "--stride", "--bbox-shift", "--max-frames"):
        assert flag in words, command
    # paste it (`hotplate` is this interpreter's `-m hotplate.cli`) somewhere else
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pasted = subprocess.run(
        [sys.executable, "-m", "hotplate.cli", *words[1:]],
        capture_output=True,
        text=True,
        cwd=elsewhere,
    )
    assert pasted.returncode == 0, pasted.stderr
    again = hotplate(world, *render_args(world, world / "cold.mp4", *flags))
    assert again.returncode == 0, again.stderr
    assert "cache hit" in again.stdout


def test_cold_render_precompiles_just_in_time_then_hot_reads_only_the_store(world):
    out = world / "jit.mp4"
    first = hotplate(world, *render_args(world, out), check=True)
    assert "JIT precompile" in first.stdout
    with av.open(str(out)) as c:
        assert (
            c.streams.video[0].codec_context.name == "h264"
            and c.streams.audio[0].codec_context.name == "aac"
        )

    # the hot render, with an audit hook recording every file opened under personas/
    script = textwrap.dedent(f"""
        import json, sys
        personas = {str(world / "personas")!r}
        opened = []
        def hook(event, args):
            if event == "open" and isinstance(args[0], str) and args[0].startswith(personas):
                opened.append(args[0])
        sys.addaudithook(hook)
        from cachestore.store import open_store
        from cachestore.stats import store_stats
        before = store_stats(open_store({str(world / "cache")!r}))
        from hotplate.cli import cli
        try:
            cli.main(["--personas", personas, "--cache", {str(world / "cache")!r}, "render", "--persona", "astro",
                      "--attire", "studio", "--audio", {str(world / "speech.wav")!r}, "-o", {str(world / "hot.mp4")!r}],
                     standalone_mode=False)
        finally:
            after = store_stats(open_store({str(world / "cache")!r}))
            print(json.dumps({{"opened": opened, "stages": [before.entries["stage"], after.entries["stage"]],
                              "misses": [before.counters.get("misses", 0), after.counters.get("misses", 0)]}}))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=world
    )
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert "cache hit" in result.stdout
    assert facts["opened"] == [], "a hot render opened files in the personas folder"
    assert facts["stages"][0] == facts["stages"][1] and facts["misses"][0] == facts["misses"][1]
    assert (world / "hot.mp4").stat().st_size > 0


def test_unknown_persona_lists_known_ones(world):
    result = hotplate(
        world,
        "render",
        "--persona",
        "nobody",
        "--audio",
        str(world / "speech.wav"),
        "-o",
        str(world / "x.mp4"),
    )
    assert (
        result.returncode == 1
        and "astro" in result.stderr
        and len(result.stderr.strip().splitlines()) == 1
    )


def test_unknown_attire_and_motion_list_what_exists(world):
    result = hotplate(
        world,
        "render",
        "--persona",
        "astro",
        "--attire",
        "navy",
        "--audio",
        str(world / "speech.wav"),
        "-o",
        str(world / "x.mp4"),
    )
    assert result.returncode == 1 and "studio" in result.stderr
    result = hotplate(world, *render_args(world, world / "x.mp4", "--motion", "M9"))
    assert result.returncode == 1 and "default" in result.stderr


@pytest.mark.parametrize(
    "out", ["missing-dir/out.mp4", "/proc/out.mp4"], ids=["missing-dir", "not-writable"]
)
def test_bad_output_path_refused_before_any_work(world, out):
    target = out if out.startswith("/") else str(world / out)
    result = hotplate(world, *render_args(world, target))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "JIT" not in result.stdout


def test_empty_or_garbage_audio(world):
    (world / "empty.wav").write_bytes(b"")
    (world / "junk.wav").write_bytes(b"RIFF" + bytes(300))
    for name in ("empty.wav", "junk.wav"):
        result = hotplate(
            world,
            "render",
            "--persona",
            "astro",
            "--attire",
            "studio",
            "--audio",
            str(world / name),
            "-o",
            str(world / "a.mp4"),
        )
        assert result.returncode == 1 and name in result.stderr and "Traceback" not in result.stderr
        assert not (world / "a.mp4").exists()


@pytest.mark.slow
def test_musetalk_backend_end_to_end_through_the_cli(world, tmp_path):
    """--backend musetalk: weights checked first, JIT precompile adds VAE latents, valid MP4."""
    from testkit.render_fixtures import save_tiny_musetalk_models

    models = tmp_path / "models"
    missing = hotplate(
        world,
        "--models",
        str(models),
        *render_args(world, world / "mt.mp4", "--backend", "musetalk"),
    )
    assert (
        missing.returncode == 1
        and "hotplate doctor" in missing.stderr
        and "whisper-tiny" in missing.stderr
    )

    save_tiny_musetalk_models(models)
    # musetalk implies S3FD, DWPose and BiSeNet; each part can be overridden by its flag
    overrides = ("--detector", "dlib", "--landmarks", "dlib", "--mask", "landmarks")
    args = render_args(world, world / "mt.mp4", "--backend", "musetalk", *overrides)
    # 0.6 s of speech, not the module's 2 s: each musetalk frame costs whisper and the
    # UNet on the CPU, and 15 frames go through the same path as 50
    short = write_wav(tmp_path / "short.wav", make_speech_audio(0.6), 16000)
    args[args.index("--audio") + 1] = str(short)
    result = hotplate(world, "--models", str(models), *args)
    assert result.returncode == 0, result.stderr
    assert "JIT precompile" in result.stdout
    with av.open(str(world / "mt.mp4")) as c:
        video = c.streams.video[0]
        assert (video.codec_context.width, video.codec_context.height) == SIZE
        assert sum(1 for _ in c.decode(video=0)) == 15  # 0.6 s at 25 fps


def x264_options(path) -> bytes:
    """The settings x264 wrote into the stream (its SEI user data: "options: ...")."""
    data = path.read_bytes()
    at = data.index(b"options: ")
    return data[at : data.index(b"\x00", at)]


def test_profile_chooses_the_encoder_and_an_unknown_one_is_one_line(world, tmp_path):
    hotplate(world, *render_args(world, tmp_path / "export.mp4"), check=True)
    got = hotplate(world, *render_args(world, tmp_path / "p.mp4", "--profile", "preview"))
    assert got.returncode == 0, got.stderr
    assert "preview profile" in got.stdout
    export, preview = x264_options(tmp_path / "export.mp4"), x264_options(tmp_path / "p.mp4")
    # export: superfast (CABAC, B-frames); preview: ultrafast + zerolatency (neither)
    assert b"cabac=1" in export and b"bframes=3" in export, export
    assert b"cabac=0" in preview and b"bframes=0" in preview, preview
    bad = hotplate(world, *render_args(world, tmp_path / "x.mp4", "--profile", "fast"))
    assert bad.returncode == 2 and "'fast' is not one of 'preview', 'export'" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "x.mp4").exists()


def test_a_render_prints_only_lines_the_project_writes(world, tmp_path):
    """A cold render runs the face mesh, whose LiteRT logs "INFO: Created TensorFlow Lite
    XNNPACK delegate for CPU." from C++ straight to fd 2 on every load: hidden on a normal
    run, every line printed is the render's own summary; --debug shows LiteRT's line."""
    runs = {}
    for name, flags in (("normal", ()), ("debug", ("--debug",))):
        cache = tmp_path / f"cache-{name}"  # cold: the JIT precompile loads the face mesh
        cmd = invocation(world / "personas", cache, *flags, *render_args(world, tmp_path / "o.mp4"))
        runs[name] = subprocess.run(cmd, capture_output=True, text=True, cwd=world, check=True)
    lines = (runs["normal"].stdout + runs["normal"].stderr).splitlines()
    assert lines and all(
        line.startswith("JIT precompile ") and " wrote " in line for line in lines
    ), lines
    assert "XNNPACK" in runs["debug"].stderr
