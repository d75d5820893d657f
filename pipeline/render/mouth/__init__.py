"""The warp renderer's mouth: what the audio asks of it (`drive`), real mouths where no
footage of the presenter shows one (`library`, built by `library_build`), the interior
painted where the library cannot be read (`interior`), and mouths from the persona's
bank (`from_bank`)."""
