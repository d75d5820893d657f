"""The recipe: every parameter that changes what precompile produces.

A recipe is plain data. Its fields feed the stage keys (see `pipeline/precompile/plan.py`),
so a change of any field here is a cache miss for the stages that read it and
for nothing else.

`effective_recipe` is the one rule for which recipe a request precompiles under; the CLI,
`lip_sync`, the HTTP service, `ls`/`gc`/`resolve` and the watcher all call it, so the same
request gives the same avatar key through every front end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DETECTORS = ("retinaface", "dlib", "s3fd")
LANDMARKERS = ("facemesh", "retinaface", "dlib", "fan", "dwpose")
MASKERS = ("landmarks", "bisenet")
PARSING_MODES = ("jaw", "raw", "neck")  # upstream MuseTalk's BiSeNet mask modes
CROP_RULES = ("hotplate", "v1.5", "v1.0")  # half-face box rules: hotplate's, or MuseTalk's
FACE_HINTS = ("auto", "largest", "central")  # or "x,y": the face nearest that point
# auto: a loop whose mouth moves (shot while the presenter spoke) is stilled, a quiet one
# and a still are left as they are (pipeline/precompile/still.py); off: never
STILL_MODES = ("auto", "off")


@dataclass(frozen=True)
class Recipe:
    """Parameters of precompilation; defaults are the offline default."""

    max_frames: int = 250  # 0 = every frame
    stride: int = 4  # keyframe stride S
    proxy: int = 480  # longer side of the detection proxy, px
    refine_iou: float = (
        0.6  # neighbouring keyframes below this IoU are refined (dlib box noise alone reaches 0.69)
    )
    refine_shift: float = (
        0.15  # ... or whose centres moved more than this x box size (one HOG cell is ~0.1)
    )
    face: str = "auto"  # which face is the presenter: see parse_face_hint
    detector: str = "retinaface"
    landmarks: str = "facemesh"
    mask: str = "landmarks"
    bbox_shift: int = 0
    crop_size: int = 256
    mask_feather: float = 0.1  # Gaussian blur width as a fraction of the blend square
    vae: str = ""  # name of a VAE directory under the models dir; "" = no latents
    parsing_mode: str = "jaw"  # BiSeNet mask mode (mask="bisenet" only)
    crop_rules: str = "hotplate"  # v1.5: bbox_shift 0, extra_margin 10; v1.0: bbox_shift kept
    still: str = "auto"  # take a talking loop's own mouth motion out (STILL_MODES)
    models_dir: Path | None = field(default=None, compare=False)
    # the fields the settings set (hotplate.toml, HOTPLATE_*), even to their default value:
    # what a backend implies never replaces them (`for_backend`); not part of any key
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    def check(self) -> None:
        """Raise ValueError naming the field, the value and the fix."""
        choices = {
            "detector": DETECTORS,
            "landmarks": LANDMARKERS,
            "mask": MASKERS,
            "parsing_mode": PARSING_MODES,
            "crop_rules": CROP_RULES,
            "still": STILL_MODES,
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")
        parse_face_hint(self.face)
        if self.stride < 1:
            raise ValueError(f"stride={self.stride} must be >= 1")
        if self.max_frames < 0:
            raise ValueError(f"max_frames={self.max_frames} must be >= 0 (0 = all frames)")
        if not 32 <= self.proxy <= 4096:
            raise ValueError(f"proxy={self.proxy} must be between 32 and 4096 px")

    def fields(self) -> dict[str, object]:
        """The fields that decide the output, as plain data (models_dir is where weights
        are found, not what they are: backend identities carry that)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}

    def replace(self, **changes: object) -> Recipe:
        return dataclasses.replace(self, **changes)

    def for_persona(
        self, options: Mapping[str, object], source: str = "persona.toml", keep_shift: bool = False
    ) -> Recipe:
        """This recipe with a persona.toml's overrides (face, bbox_shift; `keep_shift`: a
        --bbox-shift flag was given, so only the face hint applies). A step of
        `effective_recipe`; front ends call that."""
        recipe = self
        if "face" in options:
            try:
                parse_face_hint(options["face"])
            except ValueError as e:
                raise ValueError(f"{source}: {e}") from None
            recipe = recipe.replace(face=str(options["face"]))
        if keep_shift or "bbox_shift" not in options or self.crop_rules == "v1.5":  # v1.5: 0
            return recipe
        try:
            return recipe.replace(bbox_shift=int(options["bbox_shift"]))
        except (TypeError, ValueError):
            raise ValueError(
                f"{source}: bbox_shift={options['bbox_shift']!r} is not a whole number of pixels"
            ) from None


def parse_face_hint(hint: object) -> tuple[float, float] | str:
    """A persona's `face` hint: "auto", "largest", "central", or "x,y", a point given as
    fractions of the frame's width and height (0,0 top left) that the presenter's face
    is nearest to. Raises ValueError naming the value and the choices."""
    text = str(hint).strip()
    if text in FACE_HINTS:
        return text
    try:
        x, y = (float(v) for v in text.split(","))
    except ValueError:
        x = y = -1.0
    if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
        raise ValueError(
            f"face={hint!r} is not one of {', '.join(FACE_HINTS)} or 'x,y' "
            "(fractions of the frame, e.g. '0.3,0.4')"
        )
    return (x, y)


# What `--backend musetalk` implies: upstream's own preprocessing (scripts/realtime_inference.py)
MUSETALK_PARTS = (
    "detector",
    "landmarks",
    "mask",
    "parsing_mode",
    "crop_rules",
    "vae",
    "bbox_shift",
    "still",
)


def effective_recipe(
    settings: Recipe,
    options: Mapping[str, object] | None = None,
    backend: str = "",
    flags: Mapping[str, object] | None = None,
    source: str = "persona.toml",
) -> Recipe:
    """The recipe one request precompiles under. In order:

    1. `settings`: the settings' recipe (hotplate.toml, HOTPLATE_*; it carries models_dir
       and which fields the settings set, `Recipe.explicit`), with the recipe `flags` the
       caller gave over it (a None value: not given);
    2. what `backend` implies (musetalk: upstream's preprocessing, see `for_backend`) for
       the fields neither a flag nor the settings set ("": none);
    3. persona.toml's `options` (face, bbox_shift); a bbox_shift flag beats the persona's
       shift, never its face hint. `source` names the file in errors.

    Raises ValueError naming the field or the persona.toml value and the fix.
    """
    given = {name: value for name, value in (flags or {}).items() if value is not None}
    recipe = settings.replace(**given) if given else settings
    recipe.check()
    recipe = for_backend(recipe, backend, frozenset(given) | settings.explicit)
    return recipe.for_persona(options or {}, source, keep_shift="bbox_shift" in given)


def for_backend(recipe: Recipe, backend: str, explicit: frozenset[str] = frozenset()) -> Recipe:
    """The recipe a render with `backend` precompiles under (a step of `effective_recipe`).

    For musetalk: S3FD, DWPose, BiSeNet in the version's mode (v1.5 jaw, v1.0 raw), the
    version's crop rules (v1.5 also forces bbox_shift 0), the VAE MuseTalk decodes with and
    no stilling (upstream blends onto the frames as shot),
    the version read from the UNet files in the models dir. A field named in `explicit`
    (a flag or a setting gave it, even its default value: `HOTPLATE_LANDMARKS=facemesh`
    is a choice) or already off its default (a recipe made in code) is kept. Other
    backends: the recipe unchanged.
    """
    if backend != "musetalk":
        return recipe
    from pipeline.nets.models import default_vae, musetalk_version

    version = musetalk_version(recipe.models_dir)
    upstream = {
        "detector": "s3fd",
        "landmarks": "dwpose",
        "mask": "bisenet",
        "parsing_mode": "jaw" if version == "v1.5" else "raw",
        "crop_rules": version,
        "vae": default_vae(recipe.models_dir),
        "still": "off",
    }
    base = Recipe()
    explicit = explicit | recipe.explicit
    changes = {
        name: value
        for name, value in upstream.items()
        if name not in explicit and getattr(recipe, name) == getattr(base, name)
    }
    chosen = recipe.replace(**changes)
    if chosen.crop_rules == "v1.5":
        chosen = chosen.replace(bbox_shift=0)  # upstream ignores it: one key, not one per shift
    return chosen


SPEECH_MAX_FRAMES = 1500  # a speech clip's mouth bank reads up to 60 s at 25 fps


def for_speech(recipe: Recipe) -> Recipe:
    """The recipe a persona's talking footage (`speech.mp4`) precompiles its mouth bank
    under: the recipe's, reading up to SPEECH_MAX_FRAMES frames (a loop's max_frames is
    for a loop, not for a minute of reading aloud)."""
    if recipe.max_frames == 0 or recipe.max_frames >= SPEECH_MAX_FRAMES:
        return recipe
    return recipe.replace(max_frames=SPEECH_MAX_FRAMES)


def describe(recipe: Recipe) -> str:
    """One line naming the backends and rules a recipe precompiles with (for `resolve`)."""
    mask = f"bisenet ({recipe.parsing_mode})" if recipe.mask == "bisenet" else recipe.mask
    return (
        f"detector {recipe.detector}, landmarks {recipe.landmarks}, mask {mask}, crops "
        f"{recipe.crop_rules} (bbox_shift {recipe.bbox_shift}), vae {recipe.vae or 'none'}, "
        f"still {recipe.still}"
    )
