"""What one conversation session may hold and be sent, in one place: the server (uvicorn's
`ws_max_size` in drain.py, the routes in routes/sessions.py, the speech socket in
speech.py) and the render worker (talk_wire.py's control channel, talk.py) read these,
so that no hop takes a message the next one refuses (docs/serving.md lists them).

Message kinds and their limits, in bytes:
- a speech socket's binary message of PCM: MAX_PCM_MESSAGE (uvicorn closes a bigger
  message of any WebSocket with 1009, so it is also every socket's ceiling);
- a speech socket's text message (the format, end_of_turn, interrupt): MAX_TEXT_MESSAGE;
- an SDP offer (POST .../whep): MAX_OFFER, of at most MAX_OFFER_CANDIDATES candidates;
  a trickle PATCH's fragment: MAX_SDPFRAG, of at most MAX_CANDIDATES_PER_PATCH
  candidates, and MAX_TRICKLED_CANDIDATES over all of a peer's PATCHes (ICE sends checks
  to every address a candidate names: trickle.py);
- one frame of the control channel: MAX_WIRE_MESSAGE, the largest of the above once
  framed (an offer is sent JSON-escaped: up to 6 bytes a byte).
"""

from __future__ import annotations

import os

MAX_PCM_MESSAGE = 1 << 20  # 1 MiB: 21 s of 24 kHz mono s16le; a browser sends 20-200 ms
MAX_TEXT_MESSAGE = 4 << 10  # a format or control message is under 100 bytes
MAX_JSON_DEPTH = 4  # {"sample_rate": ...} is 1 deep; nothing a client sends is deeper
MAX_OFFER = 64 << 10  # a browser's offer is a few kB
MAX_SDPFRAG = 16 << 10  # a PATCH of candidates: each line is about 100 bytes
MAX_CANDIDATES_PER_PATCH = 32  # a browser gathers a few per interface and server
MAX_TRICKLED_CANDIDATES = 64  # a peer's in all, over its PATCHes (talk.py counts them)
MAX_OFFER_CANDIDATES = 64  # an offer's (rtc.py): a non-trickling player offers them all
MAX_WIRE_MESSAGE = max(MAX_PCM_MESSAGE + 16, 6 * MAX_OFFER + 4096)
SPEECH_SOCKETS_PER_SESSION = 1  # a newer socket replaces the older (speech.py)
# s without a message before a speech socket is closed (4408); HOTPLATE_SPEECH_IDLE_TIMEOUT
# sets another (the tests' servers use a short one)
SPEECH_IDLE_TIMEOUT = float(os.environ.get("HOTPLATE_SPEECH_IDLE_TIMEOUT", "120"))
SPEECH_START_TIMEOUT = 10.0  # s: for the speech socket's first message, the format
# s of speech a session's worker queues, not yet said; more is refused (talk.py tells the
# server, which answers the client's next message with 429 or a 1008 close);
# HOTPLATE_SPEECH_QUEUE_SECONDS sets another (a test's server, to reach it within the
# pace: 60 s ahead of what has played)
SPEECH_QUEUE_SECONDS = float(os.environ.get("HOTPLATE_SPEECH_QUEUE_SECONDS", "120"))
