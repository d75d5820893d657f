"""The warp renderer's mouth: what the audio asks of it (`drive`), the interior drawn
where no footage shows it (`interior`), and mouths from the persona's bank
(`from_bank`)."""
