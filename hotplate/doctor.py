"""`hotplate doctor`: every prerequisite, whether it is met, and what to do if not."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hotplate.settings import Settings
from pipeline.nets.backends import BACKENDS, EXTRAS, find_extra, missing_packages, package_present

# what the offline default imports: pyproject.toml's core dependencies (the rest: EXTRAS)
PACKAGES = (
    "lmdb",
    "msgpack",
    "xxhash",
    "numpy",
    "click",
    "watchdog",
    "av",
    "cv2",
    "simplejpeg",
    "onnxruntime",
    "ai_edge_litert",
    "fastapi",
    "uvicorn",
    "obstore",
)
DEFAULTS = {
    "detector": "retinaface",
    "landmarks": "facemesh",
    "mask": "landmarks",
    "renderer": "warp",
}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    optional: bool = False


def run_checks(settings: Settings) -> Iterator[Check]:
    yield Check(
        "python",
        sys.version_info >= (3, 11),
        sys.version.split()[0],
        "install Python 3.11 or newer",
    )
    for pkg in PACKAGES:
        present = package_present(pkg)
        yield Check(
            f"package {pkg}",
            present,
            "importable" if present else "missing",
            "reinstall hotplate (pip install hotplate; in a checkout `just setup`)",
        )
    yield from extra_checks()
    yield from codec_checks()
    yield cache_check(settings.cache)
    yield from backend_checks(settings.models, settings)
    yield from musetalk_checks(settings.models)
    yield from data_checks()


def _first(models: Path, alts: tuple[str, ...]) -> Path | None:
    """Where the first of `alts` lies: the models dir, then torch hub's caches."""
    from pipeline.nets.models import search_dirs

    return next((d / a for d in search_dirs(models) for a in alts if (d / a).is_file()), None)


def extra_checks() -> Iterator[Check]:
    """One row per extra (pyproject.toml's optional dependencies): installed, or which of
    its packages are missing and the command that adds it."""
    for extra in EXTRAS:
        missing = missing_packages(extra.packages)
        detail = "installed" if not missing else f"not installed ({', '.join(missing)} missing)"
        yield Check(
            f"extra {extra.name}", not missing, f"{detail}: {extra.gives}", extra.install, True
        )


FIX_INDENT = " " * 11  # under the text after `      fix: `, as `hotplate doctor` prints it


def where_to_put(models: Path, missing: list[tuple[str, ...]]) -> str:
    """The fix for missing weights: one path per line, the preferred name of each file
    first and its alternatives below it."""
    files = "this file" if len(missing) == 1 else "these files"
    lines = [f"put {files} there (nothing is downloaded; --models picks another folder):"]
    for alts in missing:
        lines.append(f"{FIX_INDENT}{models / alts[0]}")
        lines.extend(f"{FIX_INDENT}  or {models / alt}" for alt in alts[1:])
    return "\n".join(lines)


def backend_checks(models: Path, settings: Settings | None = None) -> Iterator[Check]:
    """One line per backend: ready (with the file each weight was found at) or what is
    missing. A renderer is ready only when the recipe it implies (with `settings`) has
    every weight too: musetalk's DWPose, S3FD, BiSeNet and VAE, unless a setting picks
    other backends."""
    for b in BACKENDS:
        default = DEFAULTS.get(b.kind) == b.name
        missing_pkgs = [p for p in b.packages if not package_present(p)]
        found = [_first(models, alts) for alts in b.weights]
        missing = [alts for alts, f in zip(b.weights, found, strict=True) if f is None]
        own = {alt for alts in b.weights for alt in alts}  # checked above already
        gaps = recipe_gaps(settings, b.name, own) if b.kind == "renderer" and settings else []
        ok = not missing_pkgs and not missing and not gaps
        if ok:
            where = (
                f"shipped in {b.embedded_in}"
                if not b.weights
                else ", ".join(str(f) for f in found if f is not None)
            )
            detail = f"ready ({where})"
        else:
            detail = "missing " + ", ".join(
                [f"package {p}" for p in missing_pkgs]
                + [alts[0] for alts in missing]
                + [gap.what for gap in gaps]
            )
        fixes = []
        if missing_pkgs:  # the extra (or the packages) first: weights alone would not do
            fixes.append(find_extra(b.extra).install if b.extra else b.install)
        if missing or any(g.files for g in gaps):
            fixes.append(where_to_put(models, missing + [alt for g in gaps for alt in g.files]))
        fixes += [gap.instead for gap in gaps]
        fix = f"\n{FIX_INDENT}".join(fixes) or "reinstall hotplate"
        yield Check(
            f"{b.kind} {b.name}{' (default)' if default else ''}",
            ok,
            detail
            + (f" - {b.note}" if b.note else "")
            + (f"; licence: {b.licence}" if b.licence else ""),
            fix,
            optional=not default,
        )


@dataclass
class Gap:
    """Something the recipe a renderer implies needs and does not have."""

    what: str  # the row's words: the file (or package), and which stage wants it
    files: list[tuple[str, ...]]  # the weights missing, alternatives preferred first
    instead: str  # the setting that picks a backend this machine has


STAGES = ("detector", "landmarks", "mask")  # recipe fields that name a backend with weights


def recipe_gaps(settings: Settings, renderer: str, own: set[str] = frozenset()) -> list[Gap]:
    """What the recipe `renderer` precompiles under (the settings' recipe and what the
    renderer implies: `effective_recipe`) lacks on this machine, stage by stage; files
    in `own` (the renderer's own weights) are left to the renderer's row."""
    from pipeline.nets.backends import find_backend
    from pipeline.nets.models import VAE_WEIGHTS, ModelMissingError, vae_files
    from pipeline.precompile.recipe import Recipe, effective_recipe

    recipe = effective_recipe(settings.recipe, backend=renderer)
    models, default = settings.models, Recipe()
    why = f"which the {renderer} renderer implies" if renderer != settings.renderer else "set"
    gaps = []
    for kind in STAGES:
        name = getattr(recipe, kind)
        b = find_backend(kind, name)
        files = [alts for alts in b.weights if _first(models, alts) is None]
        packages = [p for p in b.packages if not package_present(p)]
        if files or packages:
            need = ", ".join([*(a[0] for a in files), *(f"package {p}" for p in packages)])
            other = getattr(default, kind)
            gaps.append(
                Gap(
                    f"{need} ({kind} {name}, {why})",
                    files,
                    f"or pick other {kind}: HOTPLATE_{kind.upper()}={other} "
                    f'(or {kind} = "{other}" under [recipe] in hotplate.toml)',
                )
            )
    if recipe.vae and f"{recipe.vae}/config.json" not in own:
        try:
            vae_files(models, recipe.vae)
        except ModelMissingError:
            gaps.append(
                Gap(
                    f"{recipe.vae}/ (vae {recipe.vae}, {why})",
                    [
                        (f"{recipe.vae}/config.json",),
                        tuple(f"{recipe.vae}/{w}" for w in VAE_WEIGHTS),
                    ],
                    "or pick another VAE folder: HOTPLATE_VAE=NAME (vae under [recipe])",
                )
            )
    return gaps


def musetalk_checks(models: Path) -> Iterator[Check]:
    """MuseTalk's files one by one, as `--backend musetalk` will use them: the UNet's
    version and layout, where each file was found, what is missing."""
    from pipeline.nets.models import (
        ModelMissingError,
        default_vae,
        unet_files,
        vae_files,
        whisper_dir,
    )

    fix = f"copy upstream MuseTalk's models/ folder (download_weights.sh) to {models}, or set --models to it"
    try:
        u = unet_files(models)
        layout = "upstream json + state dict" if u.layout == "state_dict" else "diffusers folder"
        yield Check(
            "musetalk unet", True, f"{u.version} ({layout}): {u.config}, {u.weights}", fix, True
        )
    except ModelMissingError as e:
        yield Check("musetalk unet", False, e.missing, fix, True)
    try:
        yield Check("musetalk whisper", True, str(whisper_dir(models)), fix, True)
    except ModelMissingError as e:
        yield Check("musetalk whisper", False, e.missing, fix, True)
    vae = default_vae(models)
    try:
        config, weights = vae_files(models, vae)
        yield Check("musetalk vae", True, f"{vae}: {weights}", fix, True)
    except ModelMissingError as e:
        yield Check("musetalk vae", False, e.missing, fix, True)
    resnet = models / "face-parse-bisent" / "resnet18-5c106cde.pth"
    if resnet.is_file():
        yield Check(
            "musetalk resnet18",
            True,
            f"{resnet} (not read: 79999_iter.pth holds the whole BiSeNet)",
            optional=True,
        )


def codec_checks() -> Iterator[Check]:
    try:
        import av
    except ImportError:
        yield Check("PyAV codecs", False, "PyAV missing", "run `just setup`")
        return
    for codec in ("libx264", "aac", "h264"):
        ok = codec in av.codecs_available
        yield Check(
            f"codec {codec}",
            ok,
            f"PyAV {importlib.metadata.version('av')}",
            "install a PyAV wheel built with FFmpeg's libx264 and aac",
        )


def cache_check(cache: Path) -> Check:
    probe = cache if cache.exists() else next((p for p in cache.parents if p.exists()), Path("/"))
    ok = os.access(probe, os.W_OK)
    return Check(
        "cache dir",
        ok,
        f"{cache} ({'writable' if ok else 'not writable'})",
        "choose a writable --cache or HOTPLATE_CACHE",
    )


# The data shipped inside hotplate: where it came from and under what licence (each
# folder's SOURCES.md says it in full, with the sha256 of the file shipped and of every
# source video), so a studio can see what its renders carry and how to replace it.
CC_BY = "CC BY 4.0 https://creativecommons.org/licenses/by/4.0/legalcode"
GRID_S1 = (
    "GRID talker s1 via github TVR28/LipNet@7cdd534 (a copy with no licence of its own; "
    "GRID's record not reachable, its licence known second-hand)"
)
LIKENESS_DOC = 'docs/using.md, "Whose mouths a render shows"'
SHA_LINE = re.compile(r"^\s*([0-9a-f]{64})  (\S+)\s*$", re.MULTILINE)


def recorded_sha256(sources: Path) -> dict[str, str]:
    """file name -> the sha256 a SOURCES.md records for it (`<sha256>  <name>` lines)."""
    try:
        text = sources.read_text()
    except OSError:
        return {}
    return {name: digest for digest, name in SHA_LINE.findall(text)}


def sha256_of(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def as_recorded(path: Path) -> tuple[bool, str]:
    """Whether a shipped file is the one its SOURCES.md records, and the words for it."""
    sources = path.with_name("SOURCES.md")
    got, want = sha256_of(path), recorded_sha256(sources).get(path.name)
    if got is None:
        return False, f"{path} missing"
    if got != want:
        return False, f"{path} (its sha256 is not the one {sources} records: changed or damaged)"
    return True, f"{path} (sha256 as its SOURCES.md records)"


def data_checks() -> Iterator[Check]:
    """One row per data set shipped inside hotplate: the file a render reads, its source,
    its licence and how to replace it. The mouth library warns while it is the shipped
    one: a real man's mouths, composited onto other faces, which CC BY does not cover."""
    from pipeline.mouth.ear import WEIGHTS
    from pipeline.render.mouth.library import DATA, ENV, library_path

    ok, where = as_recorded(WEIGHTS)
    retrain = "python -m pipeline.mouth.ear train --data DIR (docs/using.md, the ear)"
    yield Check(
        "data ear",
        ok,
        f"{where}: speech-to-mouth weights, no picture; from {GRID_S1}; {CC_BY}; "
        f"to replace: {retrain}",
        f"reinstall hotplate, or if you retrained it, record its sha256 and sources in "
        f"{WEIGHTS.with_name('SOURCES.md')}",
        optional=True,
    )
    used = library_path()
    own = f"python -m pipeline.render.mouth.library_build VIDEO ... --out FILE, then {ENV}=FILE"
    if used is None:
        yield Check(
            "data mouth library",
            True,
            f"off ({ENV}=off): renders without a bank paint the mouth; the shipped one "
            f"({GRID_S1}) is not read",
            optional=True,
        )
    elif used.resolve() != DATA.resolve():
        present = used.is_file()
        yield Check(
            "data mouth library",
            present,
            f"{used} ({ENV}; the shipped one is not read)"
            if present
            else f"{used} ({ENV}) missing: renders without a bank paint the mouth",
            f"build it: {own} (or {ENV}=off: the painted mouth)",
            optional=True,
        )
    else:
        _, where = as_recorded(DATA)
        yield Check(
            "data mouth library",
            False,
            f"{where}: 32 real mouths of a real man, from {GRID_S1}; {CC_BY}, which covers "
            f"the footage's copyright, not his likeness on other faces",
            f"for renders you publish, use your own presenter's footage: {own} "
            f"(or {ENV}=off: the painted mouth); {LIKENESS_DOC}",
            optional=True,
        )
