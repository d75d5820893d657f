"""Trickle ICE into a session's peer: the candidates a WHEP player sends after its offer,
as WHIP and WHEP carry them (an HTTP PATCH of the peer's resource whose body is an SDP
fragment, `application/trickle-ice-sdpfrag`, RFC 8840):

    a=ice-ufrag:...        the offer's ICE credentials (others ask for an ICE restart)
    a=ice-pwd:...
    m=audio 9 UDP/TLS/RTP/SAVPF 0
    a=mid:0                the bundle's m-line the candidates are for
    a=candidate:...        any number
    a=end-of-candidates    optional: no more will come

The answer still carries every server candidate (rtc.py): only the player trickles.
An ICE restart (new credentials, or `If-Match: *`) is not supported: 422, as WHIP says
for a server that trickles but does not restart; the player makes a new session.

ICE sends a check to every address a candidate names, so a peer takes
limits.MAX_TRICKLED_CANDIDATES trickled candidates at most (a browser gathers a
handful; talk.py counts them, the route caps one PATCH), and none that names an
address no peer can be reached at: unspecified (0.0.0.0, ::), multicast, or the
broadcast address. Which of loopback, private and public addresses a player offers is
its own business. Either refusal is a 400 that adds none of the fragment's candidates.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from hotplate.serve.limits import MAX_TRICKLED_CANDIDATES

MEDIA_TYPE = "application/trickle-ice-sdpfrag"
NO_RESTART = "ICE restarts are not supported: end this session and start another"


class TrickleError(ValueError):
    """A fragment this peer cannot take; `status` is the HTTP answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Fragment:
    ufrag: str | None = None
    mid: str | None = None  # the first m-line's, where the fragment names several
    candidates: list[str] = field(default_factory=list)  # each "a=candidate:" value
    end: bool = False


def parse_fragment(text: str) -> Fragment:
    """The fragment's lines; TrickleError (400) for one that is not an SDP fragment."""
    frag = Fragment()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line[1:2] != "=":
            raise TrickleError(f"line {number} of the SDP fragment is not an SDP line: {line!r}")
        name, _, value = line[2:].partition(":")
        if line.startswith("m="):
            continue
        if not line.startswith("a="):
            raise TrickleError(
                f"line {number} of the SDP fragment: only a= and m= lines belong in "
                f"{MEDIA_TYPE}, not {line[:2]!r}"
            )
        if name == "ice-ufrag":
            frag.ufrag = value
        elif name == "mid" and frag.mid is None:
            frag.mid = value
        elif name == "candidate":
            frag.candidates.append(value)
        elif name == "end-of-candidates":
            frag.end = True
    return frag


def offered_ufrag(sdp: str) -> str | None:
    """The ICE username fragment of an SDP description (the first, as bundled)."""
    for line in sdp.splitlines():
        if line.startswith("a=ice-ufrag:"):
            return line.split(":", 1)[1].strip()
    return None


async def add_candidates(pc, text: str, room: int = MAX_TRICKLED_CANDIDATES) -> int:
    """Give the fragment's candidates (and its end) to `pc`, whose remote description is
    the offer; the number of candidates added. TrickleError: 422 for an ICE restart,
    400 for a fragment or candidate that does not parse, names an address no peer is
    at (`unreachable`), or is one more than the `room` this peer has left."""
    from aiortc.sdp import candidate_from_sdp

    frag = parse_fragment(text)
    offer = pc.remoteDescription
    if frag.ufrag is not None and frag.ufrag != offered_ufrag(offer.sdp):
        raise TrickleError(f"the fragment's ice-ufrag is not the offer's: {NO_RESTART}", 422)
    mid = frag.mid or next((t.mid for t in pc.getTransceivers() if t.mid is not None), None)
    added = []
    for value in frag.candidates:
        try:
            candidate = candidate_from_sdp(value)
        except (AssertionError, ValueError, IndexError):
            raise TrickleError(
                f"a=candidate:{value[:80]} is not an ICE candidate (RFC 8839: foundation, "
                "component, transport, priority, address, port, typ and a type)"
            ) from None
        if (why := unreachable(candidate.ip)) is not None:
            raise TrickleError(f"a=candidate:{value[:80]} names {why}: ICE checks no such address")
        candidate.sdpMid = mid
        added.append(candidate)
    if len(added) > room:
        raise TrickleError(
            f"this peer takes {MAX_TRICKLED_CANDIDATES} trickled candidates in all and has "
            f"room for {max(room, 0)}, not {len(added)}: send fewer (a browser gathers a "
            "handful)"
        )
    ended = _ended(offer.sdp)
    if added and ended:
        raise TrickleError("this peer's end-of-candidates came already: it takes no more")
    for candidate in added:  # all parsed first: a bad line adds none
        await pc.addIceCandidate(candidate)
    if frag.end and not ended:
        await pc.addIceCandidate(None)
    return len(added)


def unreachable(address: str) -> str | None:
    """What kind of address `address` is where no peer can be reached at it (unspecified,
    multicast, broadcast), or None: any other address, or a name (an mDNS .local name
    is looked up by aioice)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.is_unspecified:
        return f"the unspecified address {address}"
    if ip.is_multicast:
        return f"the multicast address {address}"
    if ip == ipaddress.IPv4Address("255.255.255.255"):
        return f"the broadcast address {address}"
    return None


def _ended(sdp: str) -> bool:
    """Whether the player said end-of-candidates already (aioice refuses it twice):
    aiortc writes it into the remote description's every m-line."""
    media = sdp.count("\r\nm=") + sdp.startswith("m=")
    return media > 0 and sdp.count("a=end-of-candidates") >= media


def remote_candidate_types(pc) -> dict[str, int]:
    """How many of each type of the player's candidates ICE knows: those of the offer and
    the PATCHes (host, srflx, relay), and "prflx" for an address it learnt only from the
    player's checks (a candidate that was never sent, or came after its check)."""
    counts: dict[str, int] = {}
    ice = _ice(pc)
    if ice is not None:
        for candidate in ice.getRemoteCandidates():
            counts[candidate.type] = counts.get(candidate.type, 0) + 1
    return counts


def selected_candidate_type(pc) -> str | None:
    """The type of the player's candidate on the pair ICE chose, the one the media flows
    to ("host"; "prflx" through a NAT the offer did not know; "relay" through a TURN
    server), or None before one is chosen. aioice keeps the pair in a private field
    (aioice is pinned with the `webrtc` extra)."""
    ice = _ice(pc)
    pair = None if ice is None else ice._connection._nominated.get(1)  # component 1: RTP
    return None if pair is None else pair.remote_candidate.type


def _ice(pc):
    """The peer's ICE transport, or None before it has one: bundled, the first m-line's
    transport is every m-line's."""
    transports = [t.receiver.transport for t in pc.getTransceivers()]
    return transports[0].transport if transports else None
