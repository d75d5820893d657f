"""The mouth, as precompile (the mouth bank) and the renderers both see it.

- `lips`: lip geometry from whatever landmarks the avatar carries (the 68-point scheme,
  which the dense mesh is mapped onto), the canonical face frame every mouth is aligned
  to, and a mouth's shape (opening, width, rounding);
- `features`: the audio features of a video frame (log-mel), vectorised;
- `bank`: the mouth bank of a talking clip: built at precompile, read at render.
"""
