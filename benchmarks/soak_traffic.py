"""The mixed requests of a soak run, each ending in one ``Outcome``: speech streamed (SSE) and
whole, transcriptions, and voices created, listed and deleted, with a ledger of which voices
must exist, so that a lost (or returned) voice is found.

Speech and transcriptions go through ``omni bench``'s own request code (``RequestSender``), so
a status here means what it means in ``omni bench serve``.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from omni_core.bench.dataset import BUILTIN_TEXTS, BenchItem, spoken
from omni_core.bench.endpoints import RequestOptions, RequestSender

# Kinds of traffic and their shares of the arrivals.
MIX = {"speech_stream": 0.35, "speech_whole": 0.25, "transcription": 0.25, "voice": 0.15}
SPEECH_TEXTS = BUILTIN_TEXTS[:4]  # the shorter prompts: the CPU is small and the weights random
REFERENCE_TEXT = "A short reference clip for a saved voice."
PINNED_VOICE = "soak-pinned"  # saved first, used by speech, never deleted: it must outlive the run
LIVE_VOICES = 3  # voices the churn keeps saved at most


@dataclass
class Outcome:
    kind: str
    server: str
    start_s: float  # seconds into the run
    end_s: float | None = None  # None: the request never ended
    status: str = "pending"  # "200", another HTTP status, or timeout / connect / protocol / stream_error
    detail: str | None = None

    @property
    def latency_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s


@dataclass
class VoiceLedger:
    """What the client knows the server must hold. ``doubtful``: saves whose answer never came
    (the voice may or may not exist), reported but not counted as lost."""

    live: dict[str, str] = field(default_factory=dict)  # id -> name, oldest first: the churn deletes these
    kept: dict[str, str] = field(default_factory=dict)  # id -> name: saved once, never deleted
    deleted: set[str] = field(default_factory=set)
    doubtful: set[str] = field(default_factory=set)  # names
    created: int = 0
    mismatches: list[str] = field(default_factory=list)  # what a listing contradicted, and when
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def check(self, listed: dict[str, str], at_s: float) -> None:
        for voice_id, name in {**self.kept, **self.live}.items():
            if voice_id not in listed:
                self.mismatches.append(f"{at_s:.1f} s: saved voice {name} ({voice_id}) is missing")
        for voice_id in self.deleted & listed.keys():
            self.mismatches.append(f"{at_s:.1f} s: deleted voice {voice_id} is listed again")


class Traffic:
    """Sends one request of a kind and returns its outcome; never raises for a failed request."""

    def __init__(self, urls: dict[str, str], models: dict[str, str], audio_dir: Path, clock, seed: int,
                 timeout_s: float):
        self.urls, self.models, self.clock = urls, models, clock
        # One client per server: RequestSender posts to paths. No pool limit: an open loop.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
        self.clients = {name: httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(timeout_s, connect=10.0),
                                                limits=limits) for name, url in urls.items()}
        self.rng = random.Random(seed)
        self.ledger = VoiceLedger()
        self.pinned: str | None = None
        self.builtin_voice: str | None = None  # a family may need one: cosyvoice3 does
        self.clips = [BenchItem(text=t, audio=spoken(t, audio_dir)) for t in BUILTIN_TEXTS[:4]]
        self.reference = spoken(REFERENCE_TEXT, audio_dir).read_bytes()

    def kinds(self) -> dict[str, float]:
        """The mix, less the kinds whose server is not running."""
        return {kind: share for kind, share in MIX.items()
                if self.urls.get(server_of(kind))}

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()

    async def send(self, kind: str) -> list[Outcome]:
        if kind == "voice":
            return await self._voice_step(self.clients["speech"])
        server = server_of(kind)
        outcome = Outcome(kind, server, self.clock())
        if kind == "transcription":
            options = RequestOptions("transcriptions", self.models[server], stream=False)
            item = self.rng.choice(self.clips)
        else:
            # A third of the speech clones the pinned saved voice; the rest the built-in default.
            voice = self.pinned if self.pinned and self.rng.random() < 1 / 3 else self.builtin_voice
            options = RequestOptions("speech", self.models[server], stream=kind == "speech_stream",
                                     stream_format="sse", voice=voice)
            item = BenchItem(text=self.rng.choice(SPEECH_TEXTS))
        record = await RequestSender(options).send(self.clients[server], item)
        outcome.end_s = self.clock()
        outcome.status = "200" if record.ok else record.error_key
        outcome.detail = None if record.ok else record.detail
        return [outcome]

    async def prepare(self) -> None:
        """Finds the first built-in voice and saves the pinned one, before the clock matters."""
        listing = (await self.clients["speech"].get("/v1/audio/voices")).json()
        builtin = [v["id"] for v in listing.get("data", []) if v.get("type") == "builtin"]
        self.builtin_voice = builtin[0] if builtin else None
        outcome, voice_id = await self._create(self.clients["speech"], PINNED_VOICE)
        if voice_id is None:
            raise SystemExit(f"could not save the pinned voice: {outcome.status} {outcome.detail}")
        self.pinned = voice_id
        self.ledger.kept[voice_id] = self.ledger.live.pop(voice_id)

    async def _voice_step(self, client: httpx.AsyncClient) -> list[Outcome]:
        """One change (a save while fewer than LIVE_VOICES, else a delete of the oldest), then a
        listing checked against the ledger. Serialised, so the ledger is exact."""
        async with self.ledger.lock:
            if len(self.ledger.live) < LIVE_VOICES:
                self.ledger.created += 1
                change, _ = await self._create(client, f"soak-{self.ledger.created}")
            else:
                change = await self._delete(client, next(iter(self.ledger.live)))
            return [change, await self._list(client)]

    async def _create(self, client: httpx.AsyncClient, name: str) -> tuple[Outcome, str | None]:
        outcome = Outcome("voice_save", "speech", self.clock())
        files = {"file": ("reference.wav", self.reference, "audio/wav")}
        response = await self._call(outcome, client.post("/v1/audio/voices",
                                                         data={"name": name, "text": REFERENCE_TEXT}, files=files))
        if response is not None and response.status_code == 200:
            voice_id = response.json()["id"]
            self.ledger.live[voice_id] = name
            return outcome, voice_id
        if response is None or response.status_code >= 500:
            self.ledger.doubtful.add(name)
        return outcome, None

    async def _delete(self, client: httpx.AsyncClient, voice_id: str) -> Outcome:
        outcome = Outcome("voice_delete", "speech", self.clock())
        response = await self._call(outcome, client.delete(f"/v1/audio/voices/{voice_id}"))
        if response is not None and response.status_code in (200, 404):
            if response.status_code == 404:  # the server no longer had it: lost before its delete
                self.ledger.mismatches.append(f"{outcome.start_s:.1f} s: deleting {voice_id} found no such voice")
            self.ledger.deleted.add(voice_id)
            del self.ledger.live[voice_id]
        return outcome

    async def _list(self, client: httpx.AsyncClient) -> Outcome:
        outcome = Outcome("voice_list", "speech", self.clock())
        response = await self._call(outcome, client.get("/v1/audio/voices"))
        if response is not None and response.status_code == 200:
            self.ledger.check(saved_voices(response.json()), outcome.start_s)
        return outcome

    async def _call(self, outcome: Outcome, request) -> httpx.Response | None:
        try:
            response = await request
            outcome.status = str(response.status_code)
            if response.status_code != 200:
                outcome.detail = response.text[:300]
        except httpx.HTTPError as exc:
            response = None
            outcome.status = "timeout" if isinstance(exc, httpx.TimeoutException) else "connect"
            outcome.detail = repr(exc)[:300]
        outcome.end_s = self.clock()
        return response


def server_of(kind: str) -> str:
    return "transcription" if kind == "transcription" else "speech"


def saved_voices(listing: dict) -> dict[str, str]:
    return {v["id"]: v.get("name", "") for v in listing.get("data", []) if v.get("type") == "saved"}


def now_since(start: float):
    return lambda: time.monotonic() - start
