"""``omni serve``: load a family and serve it behind the OpenAI-compatible HTTP API."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import sys

import click

from omni_core import logs

PLACEMENTS = ("inproc", "process", "ray")


def _console():
    from rich.console import Console

    return Console(stderr=True)


def _run_server(
    app, state, host: str, port: int, log_level: str, grace_s: float, receive_timeout_s: float, max_connections: int
) -> int:
    import uvicorn

    from omni_core.serve.connections import limited_protocol

    class DrainingServer(uvicorn.Server):
        """First SIGTERM/SIGINT: refuse new work, let admitted requests finish within the grace
        period, abort the rest, then stop. A second signal stops at once."""

        loop: asyncio.AbstractEventLoop | None = None
        draining = False

        async def serve(self, sockets=None):
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig, frame):
            # Not recorded in _captured_signals: uvicorn would re-raise it and turn exit 0 into a kill.
            if self.draining or self.loop is None:
                self.should_exit = True
                self.force_exit = self.draining
                return
            self.draining = True
            self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

        async def _drain(self):
            aborted = await state.drain(grace_s)
            logging.getLogger("omni.serve").info(
                "drained; %d request(s) aborted after the grace period", aborted
            )
            self.should_exit = True

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        log_config=None,  # uvicorn's loggers reach the root handler of omni_core.logs: one format
        timeout_graceful_shutdown=5,
        http=limited_protocol(receive_timeout_s, max_connections),
    )
    server = DrainingServer(config)
    app.state.uvicorn_server = server
    server.run()
    return 1 if state.load_error or state.fatal_error else 0


def _json_or_text(value: str):
    try:
        return json.loads(value)
    except ValueError:
        return value


def _placement_map(items: tuple[str, ...]) -> tuple[str | None, dict[str, str]]:
    """``--placement``: ``STAGE=WHERE`` for one stage, or a bare ``inproc|process|ray`` for every
    stage (as ``--stage-mode``); returns (that default or None, the per-stage map)."""
    bare = [item.strip() for item in items if "=" not in item and item.strip() in PLACEMENTS]
    per_stage = _stage_map(tuple(item for item in items if item.strip() not in bare), "--placement")
    return (bare[-1] if bare else None), per_stage


def _ray_options(address, strategy, stage_resources: dict[str, str], lost_after_s: float | None = None):
    """The RayOptions of --ray-address, --ray-strategy, --stage-resources (JSON objects) and
    --ray-lost-after."""
    from omni_core.pipeline.ray_placement import RayOptions

    resources = {}
    for stage, text in stage_resources.items():
        try:
            bundle = json.loads(text)
        except ValueError:
            bundle = None
        if not isinstance(bundle, dict):
            raise ValueError(f"--stage-resources {stage}= takes a JSON object such as '{{\"CPU\": 1, \"GPU\": 1}}', got {text!r}")
        resources[stage] = bundle
    return RayOptions(address=address, strategy=strategy, resources=resources, lost_after_s=lost_after_s)


def _stage_map(items: tuple[str, ...], option: str) -> dict[str, str]:
    """Parses repeated ``NAME=VALUE`` options."""
    mapping = {}
    for item in items:
        stage, sep, value = item.partition("=")
        if not sep or not stage.strip() or not value.strip():
            raise ValueError(f"{option} takes {'KEY' if option == '--option' else 'STAGE'}=VALUE, got {item!r}")
        mapping[stage.strip()] = value.strip()
    return mapping


class _FiniteRange(click.FloatRange):
    """A float range that also refuses nan and inf (click's lets nan through every bound)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _check_address(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (None: it can), found before the model loads
    (uvicorn would report it only after, with its own log lines)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"--host {host}: {exc.strerror or exc}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def _check_topology(spec, checkpoint: str, options: dict, stage_maps: dict[str, dict[str, str]], processes: bool = False) -> str | None:
    """Why the family's topology cannot be built with these options, or names no such stage as
    ``--placement``/``--stage-device`` do, or (``processes``: some stage runs in a process of its
    own) cannot be sent to a stage process (None: fine); ``build`` is cheap by contract, so this
    runs before anything loads."""
    from omni_core.api import topology_builder
    from omni_core.pipeline.runtime import check_picklable

    rebuild = topology_builder(spec, checkpoint, options)  # what Omni will build and send to stage processes
    try:
        names = [stage.name for stage in rebuild().stages]
        if processes:
            check_picklable(rebuild)
    except (ValueError, TypeError, KeyError) as exc:
        return f"cannot build the {spec.name} stages: {exc}"
    for flag, mapping in stage_maps.items():
        unknown = sorted(set(mapping) - set(names))
        if unknown:
            return f"{flag}: no stage named {', '.join(map(repr, unknown))}; the {spec.name} stages are {', '.join(names)}"
    return None


def _installed(kind: str) -> str:
    """The installed families or platforms, for help texts and errors."""
    from omni_core.hooks import get_plugin_manager

    manager = get_plugin_manager()
    names = manager.families() if kind == "families" else manager.platforms()
    return ", ".join(sorted(names)) or "none"


@click.command("serve")
@click.option("--family", default=None, help="Model family to serve (`omni families` lists them).")
@click.option(
    "--model",
    default=None,
    help="Checkpoint directory or Hugging Face id (default: the family's official one).",
)
@click.option(
    "--preset",
    default=None,
    help="Named preset instead of a checkpoint, e.g. 'tiny' (random weights: noise).",
)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@click.option(
    "--device", default="auto", show_default=True,
    help=f"auto (the best available), or an installed platform: {_installed('platforms')}; PLATFORM:N picks one of its devices.",
)
@click.option(
    "--api-key",
    envvar="OMNI_API_KEY",
    default=None,
    help="Require 'Authorization: Bearer KEY' on every route but /health and /metrics (env OMNI_API_KEY).",
)
@click.option("--public-docs", is_flag=True, default=False,
              help="Serve /openapi.json, /docs and /redoc without the API key.")
@click.option("--metrics-require-key", is_flag=True, default=False,
              help="Require the API key on /metrics too.")
@click.option(
    "--max-running",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="Requests processed at once.",
)
@click.option(
    "--max-queued",
    default=64,
    show_default=True,
    type=click.IntRange(min=0),
    help="Requests waiting; beyond: 429.",
)
@click.option("--stage-mode", type=click.Choice(PLACEMENTS), default="inproc", show_default=True,
              help="inproc: every stage in the server process; process: a process per stage; ray: a Ray actor per stage.")
@click.option(
    "--placement",
    multiple=True,
    metavar="[STAGE=]inproc|process|ray",
    help="Where one stage runs, overriding --stage-mode for it (repeatable), e.g. --placement flow=process; "
         "without STAGE=, every stage (--placement ray).",
)
@click.option("--ray-address", default=None,
              help="The Ray cluster for stages placed on ray (default: RAY_ADDRESS, else a cluster on this machine).")
@click.option("--ray-strategy", type=click.Choice(["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"], case_sensitive=False),
              default="PACK", show_default=True, help="How the placement group lays the ray stages over nodes.")
@click.option("--ray-lost-after", default=30.0, show_default=True, type=_FiniteRange(min=1),
              help="Seconds the Ray cluster's head (GCS) may stay unreachable before the server fails its "
                   "requests and exits 1 (at most Ray's gcs_rpc_server_reconnect_timeout_s less 5).")
@click.option(
    "--stage-resources",
    multiple=True,
    metavar="STAGE=JSON",
    help='The Ray resources of a ray stage (repeatable), e.g. --stage-resources llm=\'{"CPU": 2, "GPU": 1}\' '
         "(default: 1 CPU, and 1 GPU on cuda).",
)
@click.option(
    "--stage-device",
    multiple=True,
    metavar="STAGE=DEVICE",
    help="The device of one stage (repeatable), e.g. --stage-device llm=cuda:0 --stage-device flow=cuda:1.",
)
@click.option(
    "--option",
    "family_option",
    multiple=True,
    metavar="KEY=VALUE",
    help="A family build option (repeatable; VALUE read as JSON when it parses), e.g. --option dtype=bfloat16.",
)
@click.option(
    "--voices-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where saved voices live (default: under the omni cache).",
)
@click.option(
    "--served-model-name",
    default=None,
    help="The `model` clients send and /v1/models lists (default: the family name).",
)
@click.option("--max-input-chars", default=4096, show_default=True, type=click.IntRange(min=1),
              help="Longest speech input (413 beyond).")
@click.option("--max-upload-mb", default=25.0, show_default=True, type=_FiniteRange(min=0.001),
              help="Largest upload (413 beyond).")
@click.option("--max-audio-seconds", default=600.0, show_default=True, type=_FiniteRange(min=0.1),
              help="Longest audio a request brings: uploads, references, chat audio (413 beyond).")
@click.option("--receive-timeout", default=60.0, show_default=True, type=_FiniteRange(min=0.1),
              help="Seconds a request may take to arrive whole (headers and body); then it is dropped (408).")
@click.option("--request-timeout", default=600.0, show_default=True, type=_FiniteRange(min=0),
              help="Seconds a request may run once it has arrived, queue included; then it is stopped in every "
                   "stage (504, or an error event in a stream). 0: no limit. X-Request-Timeout asks for less.")
@click.option("--socket-idle-timeout", default=60.0, show_default=True, type=_FiniteRange(min=0),
              help="Seconds a WebSocket (/v1/realtime, /v1/audio/speech/stream) may go without a client message "
                   "while nothing of it runs; then it gets an error event and is closed. 0: no limit.")
@click.option("--max-connections", default=512, show_default=True, type=click.IntRange(min=1),
              help="Connections open at once; a new one past it gets 503 and is closed.")
@click.option(
    "--drain-seconds",
    default=30.0,
    show_default=True,
    type=_FiniteRange(min=0),
    help="Grace period for in-flight requests on SIGTERM.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"], case_sensitive=False),
    help="The least severe messages the server logs.",
)
@click.option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="text: one line a record; json: one JSON object a line (time, level, logger, message, pid), "
         "for log collectors. Stage processes log the same way.",
)
def serve(
    family,
    model,
    preset,
    host,
    port,
    device,
    api_key,
    public_docs,
    metrics_require_key,
    max_running,
    max_queued,
    stage_mode,
    placement,
    ray_address,
    ray_strategy,
    ray_lost_after,
    stage_resources,
    stage_device,
    family_option,
    voices_dir,
    served_model_name,
    max_input_chars,
    max_upload_mb,
    max_audio_seconds,
    receive_timeout,
    request_timeout,
    socket_idle_timeout,
    max_connections,
    drain_seconds,
    log_level,
    log_format,
):
    """Serve a model family behind an OpenAI-compatible HTTP API."""
    if family is None:
        click.echo(f"omni serve: --family is required; installed families: {_installed('families')}", err=True)
        sys.exit(2)
    # a first line at once: the imports below (torch, the HTTP stack) take seconds
    click.echo(f"omni serve: starting {family} ({preset + ' preset' if preset else model or 'its default checkpoint'}) "
               f"for http://{host}:{port}", err=True)
    from omni_core.api import Omni
    from omni_core.cache import cache_root
    from omni_core.hooks import UnknownNameError, check_option_names, get_plugin_manager
    from omni_core.platforms.select import PlatformUnavailableError, resolve_platform
    from omni_core.serve.app import create_app
    from omni_core.serve.state import ServeConfig
    from omni_core.surface.checkpoints import CheckpointNotFound, resolve_checkpoint
    from omni_core.surface.inputs import Limits
    try:
        every_stage, placement_map = _placement_map(placement)
        stage_mode = every_stage or stage_mode
        stage_devices = _stage_map(stage_device, "--stage-device")
        resources_map = _stage_map(stage_resources, "--stage-resources")
        on_ray = stage_mode == "ray" or "ray" in placement_map.values()
        ray_options = (
            _ray_options(ray_address, ray_strategy, resources_map, ray_lost_after) if on_ray else None
        )
        family_options = {key: _json_or_text(value) for key, value in _stage_map(family_option, "--option").items()}
    except ValueError as exc:
        click.echo(f"omni serve: {exc}", err=True)
        sys.exit(2)
    if api_key is not None and not api_key.strip():
        click.echo("omni serve: --api-key (or OMNI_API_KEY) is empty: give a key, or leave it unset to serve without one", err=True)
        sys.exit(2)
    problem = _check_address(host, port)
    if problem:
        click.echo(f"omni serve: {problem}", err=True)
        sys.exit(2)
    logs.configure(log_level, log_format)
    console = _console()
    log = logging.getLogger("omni.serve")
    manager = get_plugin_manager()
    try:
        spec = manager.family(family)
        check_option_names(spec, family_options)
    except (UnknownNameError, ValueError) as exc:
        click.echo(f"omni serve: {exc}", err=True)
        sys.exit(2)
    # a missing or unusable platform is a usage error, found before anything loads
    devices = {f"--device {device}": device, **{f"--stage-device {k}={v}": v for k, v in stage_devices.items()}}
    for given, wanted in devices.items():
        try:
            resolve_platform(wanted, manager)
        except (UnknownNameError, PlatformUnavailableError) as exc:
            click.echo(f"omni serve: {given}: {exc}", err=True)
            sys.exit(2)
    if model and preset:
        click.echo("omni serve: give either --model or --preset, not both", err=True)
        sys.exit(2)
    try:
        with console.status(f"resolving the {family} checkpoint"):
            checkpoint = resolve_checkpoint(spec, model, preset)
    except (CheckpointNotFound, ValueError) as exc:
        click.echo(f"omni serve: {exc}", err=True)
        sys.exit(2)
    log.info("%s: checkpoint %s", family, checkpoint)
    if resources_map and not on_ray:
        click.echo("omni serve: --stage-resources applies to stages placed on ray (--placement STAGE=ray)", err=True)
        sys.exit(2)
    if on_ray:
        from omni_core.pipeline.ray_placement import RayPlacementError, import_ray

        # Ray's driver installs a crash handler that prints a native stack dump on every SIGTERM
        # (read as a crash) before the server's own orderly shutdown: off in this process, unless set
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        try:
            import_ray()
        except RayPlacementError as exc:
            click.echo(f"omni serve: {exc}", err=True)
            sys.exit(2)
    processes = stage_mode in ("process", "ray") or bool({"process", "ray"} & set(placement_map.values()))
    stage_maps = {"--placement": placement_map, "--stage-device": stage_devices, "--stage-resources": resources_map}
    problem = _check_topology(spec, checkpoint, family_options, stage_maps, processes)
    if problem:
        click.echo(f"omni serve: {problem}", err=True)
        sys.exit(2)
    voices_dir = voices_dir or str(cache_root() / "voices" / spec.name)
    config = ServeConfig(
        family=spec.name,
        served_model_name=served_model_name or spec.name,
        api_key=api_key or None,
        max_running=max_running,
        max_queued=max_queued,
        limits=Limits(
            max_input_chars=max_input_chars, max_upload_mb=max_upload_mb, max_audio_seconds=max_audio_seconds
        ),
        drain_grace_s=drain_seconds,
        public_docs=public_docs,
        metrics_require_key=metrics_require_key,
        request_timeout_s=request_timeout or None,
        socket_idle_timeout_s=socket_idle_timeout or None,
    )

    def load():
        omni = Omni(
            spec.name,
            checkpoint_dir=checkpoint,
            device=device,
            stage_mode=stage_mode,
            placement=placement_map,
            stage_devices=stage_devices,
            ray=ray_options,
            options=family_options,
            voices_dir=voices_dir,
            limits=config.limits,
            plugin_manager=manager,
            progress=lambda message: log.info("%s: %s", spec.name, message),
        )
        log.info("serving %r on http://%s:%d", config.served_model_name, host, port)
        return omni

    def load_failed(error: str) -> None:
        click.echo(f"omni serve: loading failed: {error}", err=True)
        server = getattr(app.state, "uvicorn_server", None)
        if server is not None:
            server.should_exit = True

    def serving_ended(reason: str) -> None:
        click.echo(f"omni serve: {reason}; exiting", err=True)
        server = getattr(app.state, "uvicorn_server", None)
        if server is not None:
            server.should_exit = True

    app = create_app(config, load, on_load_failed=load_failed, on_fatal=serving_ended)
    code = _run_server(app, app.state.omni_state, host, port, log_level, drain_seconds, receive_timeout, max_connections)
    from omni_core.pipeline.process_exit import exit_without_finalizing

    # the pipeline is shut down: the interpreter's finalization would only add seconds (process_exit)
    exit_without_finalizing(code)
