"""The personas folder and how a request resolves to one source file.

Layout (see personas/README.md)::

    <persona>/portrait.(png|jpg|jpeg|webp)      canonical portrait, attire "default"
    <persona>/<attire>.(png|jpg|jpeg|webp)      attire still
    <persona>/<attire>.(mp4|mov|webm|mkv)       attire loop, motion "default"
    <persona>/<attire>/<motion>.(mp4|...)       several motion loops
    <persona>/speech.(mp4|mov|webm|mkv)         optional: the presenter reading aloud (10-60 s),
                                                the persona's mouth bank; not an attire
    <persona>/persona.toml                      optional overrides (bbox_shift, face, fps, loop)

Resolution order: explicit video; the attire's loop (the named motion, else the first
in sorted order); the attire still; the canonical portrait.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# one list for the layout, the watcher and the decoder (media.is_still)
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
VIDEO_EXTS = (".mp4", ".mov", ".webm", ".mkv")
MEDIA_EXTS = IMAGE_EXTS + VIDEO_EXTS
PORTRAIT = "portrait"
DEFAULT = "default"
SPEECH = "speech"  # <persona>/speech.mp4: talking footage for the mouth bank, not an attire


class PersonaError(ValueError):
    """A request that matches nothing, or a name that would leave the personas folder."""


@dataclass(frozen=True)
class Resolved:
    persona: str
    attire: str
    motion: str
    path: Path  # absolute source file
    rule: str  # which resolution rule matched: video, loop, still, portrait
    options: dict[str, Any] = field(default_factory=dict)  # persona.toml


@dataclass
class Persona:
    name: str
    stills: dict[str, Path] = field(default_factory=dict)  # attire -> still (portrait is "default")
    loops: dict[str, dict[str, Path]] = field(default_factory=dict)  # attire -> motion -> video
    speech: Path | None = None  # talking footage (the mouth bank's), when there is one

    @property
    def attires(self) -> list[str]:
        return sorted(set(self.stills) | set(self.loops))


def is_media(path: Path) -> bool:
    return path.suffix.lower() in MEDIA_EXTS and not path.name.startswith(".")


def is_speech(path: Path) -> bool:
    """A persona's talking footage (`<persona>/speech.mp4`): its mouth bank's clip."""
    path = Path(path)
    return path.stem == SPEECH and path.suffix.lower() in VIDEO_EXTS and is_media(path)


def _safe_name(kind: str, name: str) -> str:
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or os.path.isabs(name)
        or "\0" in name
    ):
        raise PersonaError(
            f"{kind} name {name!r} is not a plain folder or file name; use a name like 'ruby'"
        )
    return name


def inside(root: Path, path: Path) -> Path:
    """path resolved, refusing anything (a symlink, say) that points outside root."""
    real = path.resolve()
    if not real.is_relative_to(root.resolve()):
        raise PersonaError(
            f"{path} points outside the personas folder {root} (to {real}); refusing it"
        )
    return real


def scan_persona(root: Path, name: str) -> Persona:
    """Every still and loop of one persona, as the layout defines them."""
    folder = Path(root) / _safe_name("persona", name)
    persona = Persona(name)
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            motions = {
                m.stem: m
                for m in sorted(entry.iterdir())
                if m.is_file() and is_media(m) and m.suffix.lower() in VIDEO_EXTS
            }
            if motions:
                persona.loops.setdefault(entry.name, {}).update(motions)
        elif entry.is_file() and is_speech(entry):
            persona.speech = persona.speech or entry  # sorted: speech.mkv before speech.mp4
        elif entry.is_file() and is_media(entry):
            attire = DEFAULT if entry.stem == PORTRAIT else entry.stem
            if entry.suffix.lower() in VIDEO_EXTS:
                persona.loops.setdefault(attire, {})[DEFAULT] = entry
            else:
                persona.stills.setdefault(attire, entry)
    return persona


def list_personas(root: Path) -> list[str]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def read_options(root: Path, persona: str) -> dict[str, Any]:
    toml = Path(root) / persona / "persona.toml"
    if not toml.is_file():
        return {}
    try:
        return tomllib.loads(toml.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PersonaError(f"{toml} is not valid TOML ({exc}); fix or remove it") from exc


def resolve(
    root: Path,
    persona: str,
    attire: str = DEFAULT,
    motion: str | None = None,
    video: Path | None = None,
) -> Resolved:
    """The source file for (persona, attire, motion), by the design's resolution order."""
    root = Path(root)
    if video is not None:
        video = Path(video)
        if not video.is_file():
            raise PersonaError(f"--video {video} does not exist or is not a file")
        return Resolved(persona, attire, motion or DEFAULT, video.resolve(), "video")
    known = list_personas(root)
    if _safe_name("persona", persona) not in known:
        raise PersonaError(
            f"unknown persona {persona!r} in {root}; known: {', '.join(known) or 'none'}"
        )
    _safe_name("attire", attire)
    if motion is not None:
        _safe_name("motion", motion)
    found = scan_persona(root, persona)
    options = read_options(root, persona)
    loops = found.loops.get(attire, {})
    if motion is not None and loops and motion not in loops:
        raise PersonaError(
            f"persona {persona!r} attire {attire!r} has no motion {motion!r}; motions: {', '.join(sorted(loops))}"
        )
    if loops:
        chosen = motion if motion is not None else sorted(loops)[0]
        return Resolved(persona, attire, chosen, inside(root, loops[chosen]), "loop", options)
    if attire in found.stills:
        if motion not in (None, DEFAULT):  # "default": the motion the catalog gives a still
            raise PersonaError(
                f"persona {persona!r} attire {attire!r} is a still; it has no motion {motion!r}"
            )
        rule = "portrait" if attire == DEFAULT else "still"
        return Resolved(persona, attire, DEFAULT, inside(root, found.stills[attire]), rule, options)
    raise PersonaError(
        f"persona {persona!r} has no attire {attire!r}; attires: {', '.join(found.attires) or 'none'}"
    )
