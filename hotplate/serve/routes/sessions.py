"""Conversation sessions over WebRTC (issue 47; sessions.py and talk.py do the work):

- `POST /v1/sessions` JSON {"persona", "attire", "motion"?, "profile"?} -> 201 JSON
  {"id", "whep", "speech", "interrupt", "switch"} (the URLs of its parts; `speech` is
  signed when the server has tokens, for a browser's WebSocket) and `Location`;
  `GET /v1/sessions/{id}` its figures; `DELETE /v1/sessions/{id}` ends it (204).
- `whep`: POST an SDP offer (`application/sdp`) -> 201 with the answer and a `Location`
  (`.../whep/peer`) whose DELETE ends the session; one peer per session (409 after).
  A PATCH of `.../whep/peer` trickles the player's later candidates (trickle.py).
- `speech`: a WebSocket: first text {"sample_rate", "channels", "format": "s16le"},
  then binary PCM as it is spoken, {"type": "end_of_turn"} between utterances (and
  {"type": "interrupt"}); the session outlives the socket and its turns. Or a POST of
  the PCM as the body (chunked as it is spoken) with `?sample_rate=&channels=`: the end
  of the body ends the turn.
- `interrupt`: POST (204): the queued speech is dropped, the next frame is at rest.
- `switch`: POST JSON {"attire", "motion"?} (the same persona): from the next loop point.

Every route needs the token (or the signed URL); a session answers only its creator
(or the admin token): 404 for anyone else. Bodies and messages are bounded (limits.py):
an offer or a fragment over its limit gets 413 before more than the limit is read; the
speech socket's limits and close codes are speech.py's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from hotplate.serve.deps import Caller, Svc, check_profile
from hotplate.serve.guard import LOCAL
from hotplate.serve.limits import MAX_CANDIDATES_PER_PATCH, MAX_OFFER, MAX_SDPFRAG
from hotplate.serve.problems import Problem
from hotplate.serve.speech import check_format

router = APIRouter(tags=["sessions"])


class SessionRequest(BaseModel):
    persona: str
    attire: str
    motion: str | None = None
    profile: str | None = None  # the encoder's: preview (default) or export (more bitrate)


class SwitchRequest(BaseModel):
    attire: str
    motion: str | None = None


def _urls(request: Request, session_id: str, client: Any) -> dict:
    base = f"/v1/sessions/{session_id}"
    speech = f"{base}/speech"
    policy = request.app.state.policy
    if policy.token_required:
        speech = policy.sign(speech, client, "WEBSOCKET")
    return {
        "id": session_id,
        "whep": f"{base}/whep",
        "speech": speech,
        "interrupt": f"{base}/interrupt",
        "switch": f"{base}/switch",
    }


@router.post("/v1/sessions", status_code=201)
async def create_session(
    svc: Svc, caller: Caller, body: SessionRequest, request: Request
) -> JSONResponse:
    """Start a conversation session: a hot avatar on a worker of its own until it ends."""
    from pipeline.nets.backends import ExtraMissingError, require_extra

    try:
        require_extra("webrtc", "a conversation session")
    except ExtraMissingError as exc:
        raise Problem(501, str(exc)) from None
    profile = check_profile(body.profile, "preview")
    cfg = svc.config
    fields = {
        "backend": cfg.settings.renderer,
        "profile": profile,
        "ice_addresses": list(svc.sessions.ice_addresses),
        "ice_servers": cfg.ice_server_entries(),
        "max_seconds": svc.sessions.max_seconds,
    }
    names = {"persona": body.persona, "attire": body.attire, "motion": body.motion}
    session = await svc.sessions.create(caller.id, names, fields)
    return JSONResponse(
        _urls(request, session.id, caller),
        status_code=201,
        headers={"Location": f"/v1/sessions/{session.id}"},
    )


@router.get("/v1/sessions/{session_id}")
async def session_status(svc: Svc, caller: Caller, session_id: str) -> dict:
    """The session's figures so far (frames, late and dropped frames, speech seconds,
    first frame after the offer, CPU seconds of its worker)."""
    s = svc.sessions.get(session_id, caller)
    figures = await svc.sessions.call(s, {"op": "stats"})
    figures.pop("id", None)
    return {"id": s.id, "connected": s.connected, **figures}


@router.delete("/v1/sessions/{session_id}", status_code=204)
async def delete_session(svc: Svc, caller: Caller, session_id: str) -> Response:
    """End the session: its peer is closed, its worker and avatar lease freed."""
    s = svc.sessions.get(session_id, caller)
    await svc.sessions.end(s, "ended by DELETE")
    return Response(status_code=204)


@router.post(
    "/v1/sessions/{session_id}/whep",
    status_code=201,
    responses={201: {"content": {"application/sdp": {}}}},
)
async def whep_offer(svc: Svc, caller: Caller, session_id: str, request: Request) -> Response:
    """WHEP: an SDP offer in, the answer out (201, Location: the peer to DELETE)."""
    s = svc.sessions.get(session_id, caller)
    offer = await _sdp_body(request, "application/sdp", "an SDP offer", MAX_OFFER)
    answer = await svc.sessions.call(s, {"op": "offer", "sdp": offer})
    return Response(
        answer["sdp"],
        status_code=201,
        media_type="application/sdp",
        headers={"Location": f"/v1/sessions/{s.id}/whep/peer"},
    )


async def _sdp_body(request: Request, media_type: str, what: str, limit: int) -> str:
    """The request's body as text: 415 unless it is `media_type`; 413 over `limit` bytes,
    from its Content-Length before a byte is read, or as soon as a stream passes it (at
    most limit + one chunk is ever held)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != media_type:
        raise Problem(415, f"send {what} as {media_type}, not {kind or 'no type'!r}")
    too_big = f"{what} is over the {limit}-byte limit; send a shorter one"
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Problem(413, too_big)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk[: limit + 1 - len(body)]
        if len(body) > limit:
            raise Problem(413, too_big)
    return body.decode("utf-8", "replace")


@router.delete("/v1/sessions/{session_id}/whep/peer", status_code=204)
async def whep_delete(svc: Svc, caller: Caller, session_id: str) -> Response:
    """The WHEP resource: its DELETE closes the peer and so ends the session."""
    s = svc.sessions.get(session_id, caller)
    await svc.sessions.end(s, "the WHEP resource was deleted")
    return Response(status_code=204)


@router.patch("/v1/sessions/{session_id}/whep/peer", status_code=204)
async def whep_candidates(svc: Svc, caller: Caller, session_id: str, request: Request) -> Response:
    """WHEP's trickle ICE: the player's candidates after its offer, as an SDP fragment
    (`application/trickle-ice-sdpfrag`, RFC 8840) -> 204. An ICE restart (`If-Match: *`,
    or the fragment's ice-ufrag not the offer's) is not supported: 422."""
    from hotplate.serve.trickle import MEDIA_TYPE, NO_RESTART, TrickleError, parse_fragment

    s = svc.sessions.get(session_id, caller)
    fragment = await _sdp_body(request, MEDIA_TYPE, "an SDP fragment", MAX_SDPFRAG)
    if request.headers.get("if-match", "").strip() == "*":
        raise Problem(422, NO_RESTART)
    try:  # checked here too: a fragment the worker would refuse never reaches it
        parsed = parse_fragment(fragment)
    except TrickleError as exc:
        raise Problem(exc.status, str(exc)) from None
    if len(parsed.candidates) > MAX_CANDIDATES_PER_PATCH:
        raise Problem(
            413,
            f"{len(parsed.candidates)} candidates in one PATCH: send at most "
            f"{MAX_CANDIDATES_PER_PATCH}",
        )
    await svc.sessions.call(s, {"op": "candidates", "sdpfrag": fragment})
    return Response(status_code=204)


@router.post("/v1/sessions/{session_id}/interrupt", status_code=204)
async def interrupt(svc: Svc, caller: Caller, session_id: str) -> Response:
    """Drop the queued speech: the next frame's mouth is at rest and its audio silent."""
    await svc.sessions.interrupt(svc.sessions.get(session_id, caller))
    return Response(status_code=204)


@router.post("/v1/sessions/{session_id}/switch", status_code=204)
async def switch(svc: Svc, caller: Caller, session_id: str, body: SwitchRequest) -> Response:
    """Another attire or motion of the session's persona, from the next loop point on
    (a cold one is precompiled first; the session plays on meanwhile)."""
    from hotplate.serve.sessions import SWITCH_TIMEOUT

    s = svc.sessions.get(session_id, caller)
    op = {"op": "switch", "persona": s.job.persona, "attire": body.attire, "motion": body.motion}
    await svc.sessions.call(s, op, SWITCH_TIMEOUT)
    return Response(status_code=204)


@router.post("/v1/sessions/{session_id}/speech", status_code=204)
async def speech_post(
    svc: Svc, caller: Caller, session_id: str, request: Request, sample_rate: int, channels: int = 1
) -> Response:
    """One turn of PCM (s16le) as the body, sent as it is spoken (chunked); 429 when speech
    runs 60 s ahead or the worker's queue refused some of it (sessions.py)."""
    s = svc.sessions.get(session_id, caller)
    try:
        rate, channels = check_format(sample_rate, channels)
    except ValueError as exc:
        raise Problem(422, str(exc)) from None
    async for chunk in request.stream():
        if chunk:
            await svc.sessions.pcm(s, rate, channels, chunk)
    await svc.sessions.end_of_turn(s)
    return Response(status_code=204)


@router.websocket("/v1/sessions/{session_id}/speech")
async def speech_socket(ws: WebSocket, session_id: str) -> None:
    """PCM in as it is spoken (see the module doc, and speech.py for its limits)."""
    from hotplate.serve.speech import serve

    await ws.accept()
    client = ws.scope.get("state", {}).get("client", LOCAL)
    await serve(ws, ws.app.state.service, session_id, client)
