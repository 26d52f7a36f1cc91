"""Where Ray-placed stages run: one placement group for the deployment, a bundle per stage.

``RayPlacement.place(stages)`` connects to the cluster (``ray.init`` semantics: ``address``, else
``RAY_ADDRESS``, else a cluster on this machine), checks that every stage's bundle fits on some
node, creates the placement group (PACK by default) and waits for it, so a deployment gets all
its stages or fails at start with one line naming what could not be placed. It then knows the
node of every stage, which decides the transport to it (shared memory only on the runtime's own
node). ``watch(on_lost)`` follows the cluster's GCS (``ray_watch.GcsWatch``). ``remove()`` frees
the group (and leaves Ray if it connected to it), unless the cluster is lost: then nothing is left
to free, and a call to the GCS would wait for Ray's reconnect timeout.
"""

from __future__ import annotations

import atexit
import json
from dataclasses import dataclass, field
from typing import Any

from omni_core.pipeline.ray_watch import GcsWatch, lost_after_s
from omni_core.platforms import platform_for

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
PLACE_TIMEOUT_S = 60.0


class RayPlacementError(RuntimeError):
    """The deployment cannot be placed on the cluster; the message says what and why."""


@dataclass
class RayOptions:
    """``address``: the cluster (None: ``RAY_ADDRESS`` or ``ray.init()``'s own search);
    ``strategy``: of the placement group; ``resources``: a stage's bundle (Ray resource names:
    ``CPU``, ``GPU``, custom ones) replacing the default (1 CPU, plus 1 GPU on a cuda device);
    ``remote_transport``: the transport to stages on other nodes than the runtime's, used when
    the pipeline's own transport cannot cross hosts; ``place_timeout_s``: how long the group may
    take to be placed; ``lost_after_s``: how long the cluster's GCS may stay unreachable before
    the cluster counts as lost (None: 30 s; at most Ray's own reconnect timeout less 5 s)."""

    address: str | None = None
    strategy: str = "PACK"
    resources: dict[str, dict[str, float]] = field(default_factory=dict)
    remote_transport: str = "zmq"
    place_timeout_s: float = PLACE_TIMEOUT_S
    lost_after_s: float | None = None

    def __post_init__(self) -> None:
        self.strategy = self.strategy.upper()
        if self.strategy not in STRATEGIES:
            raise ValueError(f"ray strategy must be one of {list(STRATEGIES)}, got {self.strategy!r}")
        for stage, bundle in self.resources.items():
            bad = {k: v for k, v in bundle.items() if not isinstance(v, (int, float)) or v < 0}
            if bad or not bundle:
                raise ValueError(
                    f"resources of stage {stage!r} must map resource names to amounts >= 0, got {bundle!r}"
                )


def default_bundle(device: str) -> dict[str, float]:
    """A stage process needs a CPU; a stage on an accelerator needs one of the Ray resource its
    platform counts as (``Platform.ray_resource``: ``GPU`` for CUDA)."""
    bundle = {"CPU": 1.0}
    resource = platform_for(device).ray_resource
    if resource:
        bundle[resource] = 1.0
    return bundle


def actor_device(device: str, bundle: dict[str, float]) -> str:
    """The device as the actor sees it: Ray shows an actor only the devices it was given, so a
    stage asking for ``cuda:3`` with a GPU in its bundle runs on that actor's ``cuda:0``."""
    platform = platform_for(device)
    if platform.ray_resource and bundle.get(platform.ray_resource, 0) > 0:
        return platform.device(0)
    return device


def import_ray():
    try:
        import ray
    except ImportError:
        raise RayPlacementError(
            "placement 'ray' needs Ray: pip install 'omni-core[ray]' (or pip install ray)"
        ) from None
    return ray


def _fits(bundle: dict[str, float], resources: dict[str, float]) -> bool:
    return all(resources.get(name, 0.0) >= amount for name, amount in bundle.items() if amount > 0)


def _short(resources: dict[str, float]) -> str:
    """Resources without Ray's per-node markers and byte counts, for one-line messages."""
    shown = {
        k: v
        for k, v in resources.items()
        if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }
    return json.dumps(shown, sort_keys=True)


class RayPlacement:
    def __init__(self, options: RayOptions):
        self.options = options
        self.ray = import_ray()
        self.group = None
        self.nodes: dict[str, str] = {}  # stage -> node id
        self.bundles: dict[str, dict[str, float]] = {}
        self.bundle_index: dict[str, int] = {}
        self.runtime_node = ""
        self.runtime_address = ""  # the runtime's node address: where stage actors reach it
        self._connected_here = False
        self.gcs_address = ""
        self._watch: GcsWatch | None = None

    def connect(self) -> None:
        ray = self.ray
        if not ray.is_initialized():
            try:
                ray.init(address=self.options.address, log_to_driver=True, include_dashboard=False)
            except Exception as exc:  # ConnectionError, RuntimeError, ValueError by cause
                where = self.options.address or "RAY_ADDRESS or this machine"
                raise RayPlacementError(f"cannot connect to the Ray cluster at {where}: {exc}") from None
            self._connected_here = True
        self.runtime_node = ray.get_runtime_context().get_node_id()
        self.gcs_address = ray.get_runtime_context().gcs_address
        for node in ray.nodes():
            if node["NodeID"] == self.runtime_node:
                self.runtime_address = node["NodeManagerAddress"]
        if not self.runtime_address:
            raise RayPlacementError(
                "this process is not on a node of the Ray cluster (a Ray client cannot host the runtime)"
            )

    def place(self, stages: dict[str, str]) -> None:
        """``stages``: stage name -> its device. Raises ``RayPlacementError`` naming what cannot be placed."""
        ray = self.ray
        from ray.util.placement_group import placement_group, placement_group_table

        self.connect()
        names = list(stages)
        unknown = sorted(set(self.options.resources) - set(names))
        if unknown:
            raise RayPlacementError(
                f"resources name stages not placed on ray: {unknown}; ray stages: {names}"
            )
        self.bundles = {n: dict(self.options.resources.get(n) or default_bundle(stages[n])) for n in names}
        self.bundle_index = {n: i for i, n in enumerate(names)}
        self._check_feasible(ray)
        group = placement_group(
            [self.bundles[n] for n in names],
            strategy=self.options.strategy,
            name=f"omni-{'-'.join(names)}"[:100],
        )
        self.group = group
        if not group.wait(timeout_seconds=self.options.place_timeout_s):
            wanted = ", ".join(f"{n} {_short(self.bundles[n])}" for n in names)
            self.remove()
            raise RayPlacementError(
                f"the Ray cluster could not place the stages ({self.options.strategy}: {wanted}) within "
                f"{self.options.place_timeout_s:.0f} s; available now: {_short(ray.available_resources())}"
            )
        placed = placement_group_table(group)["bundles_to_node_id"]
        self.nodes = {n: placed[self.bundle_index[n]] for n in names}

    def _check_feasible(self, ray) -> None:
        """A bundle no node could ever hold fails now, naming the stage, not after a timeout."""
        alive = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        nodes = "; ".join(f"{node[:8]} {_short(res)}" for node, res in alive.items())
        for stage, bundle in self.bundles.items():
            if not any(_fits(bundle, res) for res in alive.values()):
                raise RayPlacementError(
                    f"stage {stage!r} needs {_short(bundle)} on one node, and no node of the Ray cluster has it "
                    f"(nodes: {nodes})"
                )
        if self.options.strategy == "STRICT_SPREAD" and len(self.bundles) > len(alive):
            raise RayPlacementError(
                f"STRICT_SPREAD puts each of {len(self.bundles)} stages on its own node; the cluster has {len(alive)}"
            )
        if self.options.strategy == "STRICT_PACK":
            total: dict[str, float] = {}
            for bundle in self.bundles.values():
                for name, amount in bundle.items():
                    total[name] = total.get(name, 0.0) + amount
            if not any(_fits(total, res) for res in alive.values()):
                raise RayPlacementError(
                    f"STRICT_PACK puts every stage on one node: {_short(total)}, more than any node has (nodes: {nodes})"
                )

    def scheduling(self, stage: str) -> dict[str, Any]:
        """``actor.options(...)`` keywords that put a stage's actor in its bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.bundles[stage]
        return {
            "num_cpus": bundle.get("CPU", 0.0),
            "num_gpus": bundle.get("GPU", 0.0),
            "resources": {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=self.bundle_index[stage]
            ),
        }

    def watch(self, on_lost) -> None:
        """Follow the cluster's GCS; ``on_lost(reason)`` once it is lost."""
        self._watch = GcsWatch(self.gcs_address, lost_after_s(self.options.lost_after_s), on_lost).start()

    def problem(self) -> str | None:
        """Why the cluster cannot serve now: its GCS unreachable, or lost (None: it can)."""
        return self._watch.problem() if self._watch is not None else None

    @property
    def lost(self) -> str | None:
        return self._watch.lost if self._watch is not None else None

    def same_node(self, stage: str) -> bool:
        return self.nodes.get(stage) == self.runtime_node

    def remove(self) -> None:
        """Free the placement group; leave Ray if this placement connected to it."""
        ray = self.ray
        if self._watch is not None:
            self._watch.stop()
        if self.lost:
            # gone with the cluster; Ray's calls, its own ray.shutdown at exit included, would wait
            # for the GCS until Ray ends the process
            self.group = None
            atexit.unregister(ray.shutdown)
            return
        if self.group is not None and ray.is_initialized():
            try:
                ray.util.remove_placement_group(self.group)
            except Exception:  # the cluster may already be gone: nothing is left to free
                pass
        self.group = None
        if self._connected_here and ray.is_initialized():
            ray.shutdown()
            self._connected_here = False
